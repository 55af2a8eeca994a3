// Gradient buckets all-reduced while the backward pass still runs (the speed trick of
// PyTorch DDP and Horovod). The tensors are laid out in reverse order, the order the
// backward pass finishes them, and cut into buckets of whole tensors of at most
// bucket_bytes (a bigger tensor is a bucket of its own). Each step:
//
//   Begin(params)            nothing is ready
//   Ready(params, i) ...     params[i].g is final: copied into its bucket; a bucket whose
//                            tensors are all in is handed to the communication thread
//   Finish(params)           the rest is packed, every bucket reduced, the means written
//                            back into ParamView::g
//
// Buckets go to the communicator strictly in bucket order (every rank must issue the same
// collectives in the same order), so a bucket that completes early waits for the ones
// before it. With overlap off, Finish runs the very same calls on the caller's thread:
// the same buffer, the same cuts, the same order, hence the same bits on the ring, NCCL or
// any communicator. Ready may be skipped for any tensor (Finish packs what is missing).
//
// Threads: Begin/Ready/Finish on one thread (the trainer's); the communication thread
// touches only launched buckets' ranges of the buffer, which Ready no longer writes. The
// communicator is used by that thread only between a launch and the end of Finish, so the
// owner may use it between steps (the hand-over goes through the mutex). Finish's wait is
// bounded by the communicator's own timeout: an exception there is rethrown by Finish,
// and the scheduler refuses further steps.
//
// On-device views (ParamView::on_device, an algorithm that TakesDeviceParams): the fusion
// buffer lives on the device, packing and unpacking are device-to-device copies through
// DeviceOps, and the communicator (one that HandlesDeviceBuffers) reduces it in place. The
// caller hands over gradients with their `ready` markers; with overlap the copies into a
// bucket are queued, one marker is recorded per launch, and the communication thread waits
// for it before reducing: no host wait during the backward pass.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/collectives/communicator.h"

namespace shoal {

struct GradBucket {
  std::vector<size_t> tensors;  // indices into params, in the order they sit in the buffer
  int64_t offset = 0;           // in floats, into the fusion buffer
  int64_t n = 0;
};

// The buckets for tensors of these sizes (floats): reverse order, whole tensors, at most
// bucket_elems each unless one tensor alone is bigger. Empty tensors join their neighbours.
std::vector<GradBucket> PlanGradBuckets(const std::vector<int64_t>& sizes, int64_t bucket_elems);

class BucketScheduler {
 public:
  // `device`: for on-device views (may be null where there are none); not owned.
  BucketScheduler(Communicator& comm, int64_t bucket_bytes, DType wire, bool overlap, DeviceOps* device = nullptr);
  ~BucketScheduler();
  BucketScheduler(const BucketScheduler&) = delete;
  BucketScheduler& operator=(const BucketScheduler&) = delete;

  void Begin(const std::vector<ParamView>& params);
  void Ready(const std::vector<ParamView>& params, size_t index);
  void Finish(const std::vector<ParamView>& params);

  bool overlap() const { return overlap_; }
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  // This step's launches, in order: for each, the bucket and how many Ready calls had
  // come when it was handed over (-1: by Finish). For tests and metrics.
  struct Launch {
    size_t bucket;
    int64_t after_ready_calls;
  };
  const std::vector<Launch>& launches() const { return launches_; }

 private:
  void Plan(const std::vector<ParamView>& params);
  void Pack(const std::vector<ParamView>& params, size_t index);
  void LaunchCompleted(int64_t after);  // hands over every complete bucket in order
  void Loop();                          // the communication thread
  void Reduce(size_t bucket);
  float* Buf() { return dev_buf_ ? dev_buf_ : buf_.data(); }
  void CopyFloats(float* dst, const float* src, int64_t n);  // host or device, as the views

  Communicator& comm_;
  const int64_t bucket_elems_;
  const DType wire_;
  const bool overlap_;
  DeviceOps* const device_;

  std::vector<GradBucket> buckets_;
  std::vector<size_t> bucket_of_;   // per tensor
  std::vector<int64_t> offset_of_;  // per tensor, in floats
  std::vector<float> buf_;
  float* dev_buf_ = nullptr;  // the fusion buffer of on-device views (DeviceOps memory)
  bool on_device_ = false;
  std::vector<char> packed_;     // per tensor, this step
  std::vector<size_t> missing_;  // per bucket: tensors not yet packed
  std::vector<Launch> launches_;
  // Per bucket, on-device views: the marker of its queued copies, set at launch (trainer's
  // thread, before the hand-over through the mutex) and read by the communication thread.
  std::vector<std::shared_ptr<const DeviceFence>> packed_at_;
  int64_t ready_calls_ = 0;
  size_t next_launch_ = 0;  // the next bucket to hand over (trainer's thread)
  bool in_step_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  size_t launched_ = 0;  // buckets handed to the thread (guarded by mu_)
  size_t reduced_ = 0;   // buckets it finished (guarded by mu_)
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace shoal
