#include "algorithms/collectives/bucket_scheduler.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace shoal {

std::vector<GradBucket> PlanGradBuckets(const std::vector<int64_t>& sizes, int64_t bucket_elems) {
  std::vector<GradBucket> out;
  GradBucket cur;
  int64_t offset = 0;
  for (size_t k = sizes.size(); k-- > 0;) {
    if (cur.n > 0 && sizes[k] > 0 && cur.n + sizes[k] > bucket_elems) {
      offset += cur.n;
      out.push_back(std::move(cur));
      cur = GradBucket();
      cur.offset = offset;
    }
    cur.tensors.push_back(k);
    cur.n += sizes[k];
  }
  if (!cur.tensors.empty()) out.push_back(std::move(cur));
  return out;
}

BucketScheduler::BucketScheduler(Communicator& comm, int64_t bucket_bytes, DType wire, bool overlap, DeviceOps* device)
    : comm_(comm),
      bucket_elems_(std::max<int64_t>(1, bucket_bytes / 4)),
      wire_(wire),
      overlap_(overlap),
      device_(device) {}

BucketScheduler::~BucketScheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  // A bucket in flight (the step was abandoned by an exception) ends within the
  // communicator's timeout; no new one starts.
  if (thread_.joinable()) thread_.join();
  if (dev_buf_) device_->Free(dev_buf_);
}

void BucketScheduler::CopyFloats(float* dst, const float* src, int64_t n) {
  if (n <= 0) return;
  if (on_device_)
    device_->Copy(dst, src, n);
  else
    memcpy(dst, src, size_t(n) * 4);
}

void BucketScheduler::Plan(const std::vector<ParamView>& params) {
  std::vector<int64_t> sizes;
  for (auto& p : params) sizes.push_back(p.n);
  buckets_ = PlanGradBuckets(sizes, bucket_elems_);
  bucket_of_.assign(params.size(), 0);
  offset_of_.assign(params.size(), 0);
  int64_t total = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    int64_t off = buckets_[b].offset;
    for (size_t t : buckets_[b].tensors) {
      bucket_of_[t] = b;
      offset_of_[t] = off;
      off += params[t].n;
    }
    total += buckets_[b].n;
  }
  on_device_ = !params.empty() && params[0].on_device;
  for (auto& p : params)
    SHOAL_CHECK(p.on_device == on_device_, "bucket scheduler: tensor \"" + p.name + "\" is in " +
                                               (p.on_device ? "device" : "host") + " memory, tensor \"" +
                                               params[0].name + "\" is not (all or none on the device)");
  SHOAL_CHECK(!on_device_ || device_, "bucket scheduler: the gradients are in device memory, and no DeviceOps");
  SHOAL_CHECK(!on_device_ || comm_.HandlesDeviceBuffers(),
              "bucket scheduler: the gradients are in device memory, and communicator " + comm_.Name() +
                  " reduces host buffers only");
  if (dev_buf_) device_->Free(dev_buf_);
  dev_buf_ = nullptr;
  if (on_device_) {
    buf_.clear();
    dev_buf_ = device_->Alloc(total);
  } else {
    buf_.assign(size_t(total), 0.f);
  }
}

void BucketScheduler::Begin(const std::vector<ParamView>& params) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
  }
  bool same = bucket_of_.size() == params.size() && (params.empty() || params[0].on_device == on_device_);
  for (size_t b = 0; same && b < buckets_.size(); ++b) {
    int64_t n = 0;
    for (size_t t : buckets_[b].tensors) n += params[t].n;
    same = n == buckets_[b].n;
  }
  if (!same) Plan(params);
  packed_.assign(params.size(), 0);
  missing_.clear();
  for (auto& b : buckets_) missing_.push_back(b.tensors.size());
  launches_.clear();
  packed_at_.assign(buckets_.size(), nullptr);
  ready_calls_ = 0;
  next_launch_ = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    launched_ = reduced_ = 0;
  }
  in_step_ = true;
}

void BucketScheduler::Pack(const std::vector<ParamView>& params, size_t index) {
  if (packed_[index]) return;
  const ParamView& p = params[index];
  // The copy's stream waits, device-side, for the kernels that wrote g (common/device_fence.h).
  // Overlapped: the copy is queued (the backward pass never waits on the host) and the
  // communication thread waits for its bucket's marker (LaunchCompleted) before reducing it;
  // otherwise the copy is finished when it returns.
  if (on_device_) device_->After(p.ready.get());
  if (on_device_ && overlap_ && p.n > 0)
    device_->CopyQueued(Buf() + offset_of_[index], p.g, p.n);
  else
    CopyFloats(Buf() + offset_of_[index], p.g, p.n);
  packed_[index] = 1;
  --missing_[bucket_of_[index]];
}

void BucketScheduler::Ready(const std::vector<ParamView>& params, size_t index) {
  SHOAL_CHECK(in_step_, "bucket scheduler: gradient ready outside a step (Begin first)");
  SHOAL_CHECK(index < packed_.size() && params.size() == packed_.size(),
              "bucket scheduler: tensor " + std::to_string(index) + " outside the " + std::to_string(packed_.size()) +
                  " planned");
  if (packed_[index]) return;
  Pack(params, index);
  ++ready_calls_;
  if (overlap_ && missing_[bucket_of_[index]] == 0) LaunchCompleted(ready_calls_);
}

void BucketScheduler::LaunchCompleted(int64_t after) {
  size_t from = next_launch_;
  while (next_launch_ < buckets_.size() && missing_[next_launch_] == 0) {
    launches_.push_back(Launch{next_launch_, after});
    ++next_launch_;
  }
  if (next_launch_ == from) return;
  // One marker for the queued copies of every bucket launched here (the last is the latest).
  if (on_device_) {
    auto packed = device_->Record();
    for (size_t b = from; b < next_launch_; ++b) packed_at_[b] = packed;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    launched_ = next_launch_;
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  cv_.notify_all();
}

void BucketScheduler::Reduce(size_t b) {
  const GradBucket& g = buckets_[b];
  // The bucket's queued copies (the communication thread waits, never the backward pass).
  if (b < packed_at_.size() && packed_at_[b]) packed_at_[b]->Wait();
  comm_.AllReduce(Buf() + g.offset, g.n, ReduceOp::kMean, wire_);
}

void BucketScheduler::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (!error_ && reduced_ < launched_); });
    if (stop_) return;
    const size_t b = reduced_;
    lock.unlock();
    std::exception_ptr err;
    try {
      Reduce(b);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (err)
      error_ = err;
    else
      ++reduced_;
    cv_.notify_all();
  }
}

void BucketScheduler::Finish(const std::vector<ParamView>& params) {
  if (!in_step_) Begin(params);  // no Ready calls this step (the caller skipped them)
  SHOAL_CHECK(params.size() == packed_.size(), "bucket scheduler: " + std::to_string(params.size()) +
                                                   " tensors at Finish, " + std::to_string(packed_.size()) +
                                                   " at Begin");
  in_step_ = false;
  // What no Ready announced, in the order the backward pass would have.
  for (size_t k = params.size(); k-- > 0;) Pack(params, k);
  if (overlap_) {
    LaunchCompleted(-1);
    std::unique_lock<std::mutex> lock(mu_);
    // Bounded: each collective fails by itself past the communicator's timeout.
    cv_.wait(lock, [&] { return error_ || reduced_ == buckets_.size(); });
    if (error_) std::rethrow_exception(error_);
  } else {
    for (; next_launch_ < buckets_.size(); ++next_launch_) {
      launches_.push_back(Launch{next_launch_, -1});
      try {
        Reduce(next_launch_);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = std::current_exception();
        throw;
      }
    }
  }
  for (size_t k = 0; k < params.size(); ++k) CopyFloats(params[k].g, Buf() + offset_of_[k], params[k].n);
}

}  // namespace shoal
