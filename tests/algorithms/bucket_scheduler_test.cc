// The overlap scheduler (algorithms/collectives/bucket_scheduler.h): bucket layout in
// reverse tensor order, each bucket handed to the communication thread as soon as its last
// tensor is ready and never before the buckets ahead of it, the all-reduce really running
// before Finish, and the same averaged bits with overlap on and off.
#include "algorithms/collectives/bucket_scheduler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "tests/algorithms/fake_communicator.h"

namespace shoal {
namespace {

// Forwards to a fake communicator and records every all-reduce: its size and thread.
class Recording : public Communicator {
 public:
  explicit Recording(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string Name() const override { return "recording"; }
  void AllReduce(float* data, int64_t n, ReduceOp op, DType wire) override {
    inner_->AllReduce(data, n, op, wire);
    std::lock_guard<std::mutex> lock(mu_);
    sizes_.push_back(n);
    threads_.push_back(std::this_thread::get_id());
    cv_.notify_all();
  }
  void AllGather(const void* in, int64_t bytes, void* out) override { inner_->AllGather(in, bytes, out); }
  void Broadcast(void* data, int64_t bytes, int root) override { inner_->Broadcast(data, bytes, root); }
  void Barrier() override { inner_->Barrier(); }
  int64_t bytes_sent() const override { return inner_->bytes_sent(); }

  // Bounded: false when fewer than `calls` all-reduces finished within 10 s.
  bool WaitForCalls(size_t calls) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return sizes_.size() >= calls; });
  }
  std::vector<int64_t> sizes() {
    std::lock_guard<std::mutex> lock(mu_);
    return sizes_;
  }
  std::vector<std::thread::id> threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }

 private:
  std::unique_ptr<Communicator> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int64_t> sizes_;
  std::vector<std::thread::id> threads_;
};

// Tensors of the given sizes with gradients g[k][i] = seed + k + i / 7.
struct Tensors {
  std::vector<std::vector<float>> w, g;
  std::vector<ParamView> views;
  Tensors(const std::vector<int64_t>& sizes, float seed) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      w.emplace_back(size_t(sizes[k]), 0.f);
      g.emplace_back(size_t(sizes[k]));
      for (int64_t i = 0; i < sizes[k]; ++i) g[k][size_t(i)] = seed + float(k) + float(i) / 7.f;
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      ParamView v;
      v.name = "t" + std::to_string(k);
      v.w = w[k].data();
      v.g = g[k].data();
      v.n = sizes[k];
      views.push_back(v);
    }
  }
};

TEST(PlanGradBuckets, ReverseOrderWholeTensorsAtMostTheBucketSize) {
  auto b = PlanGradBuckets({10, 20, 30, 40}, 50);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].tensors, (std::vector<size_t>{3}));
  EXPECT_EQ(b[1].tensors, (std::vector<size_t>{2, 1}));
  EXPECT_EQ(b[2].tensors, (std::vector<size_t>{0}));
  EXPECT_EQ(b[0].offset, 0);
  EXPECT_EQ(b[1].offset, 40);
  EXPECT_EQ(b[2].offset, 90);
  EXPECT_EQ(b[1].n, 50);
  // A tensor bigger than a bucket is a bucket of its own; empty tensors ride along.
  b = PlanGradBuckets({5, 0, 100, 5}, 8);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].tensors, (std::vector<size_t>{3}));
  EXPECT_EQ(b[1].tensors, (std::vector<size_t>{2, 1}));
  EXPECT_EQ(b[1].n, 100);
  EXPECT_EQ(b[2].tensors, (std::vector<size_t>{0}));
  EXPECT_TRUE(PlanGradBuckets({}, 8).empty());
}

TEST(BucketScheduler, LaunchesEachBucketWhenItsLastTensorIsReadyInBucketOrder) {
  FakeCluster cluster(1);
  Recording comm(cluster.Join("x", 0));
  Tensors t({10, 20, 30, 40}, 1.f);  // buckets {3}, {2, 1}, {0} at 200 bytes
  BucketScheduler s(comm, 200, DType::kF32, /*overlap=*/true);
  for (int step = 0; step < 2; ++step) {
    s.Begin(t.views);
    s.Ready(t.views, 3);  // bucket 0 complete: launched at once
    ASSERT_EQ(s.launches().size(), 1u);
    EXPECT_EQ(s.launches()[0].bucket, 0u);
    EXPECT_EQ(s.launches()[0].after_ready_calls, 1);
    // The all-reduce runs while "the backward pass" goes on, on another thread.
    ASSERT_TRUE(comm.WaitForCalls(size_t(step) * 3 + 1)) << "bucket 0 was not reduced before Finish";
    EXPECT_NE(comm.threads().back(), std::this_thread::get_id());
    s.Ready(t.views, 2);  // bucket 1 still misses tensor 1
    EXPECT_EQ(s.launches().size(), 1u);
    s.Ready(t.views, 1);
    ASSERT_EQ(s.launches().size(), 2u);
    EXPECT_EQ(s.launches()[1].bucket, 1u);
    EXPECT_EQ(s.launches()[1].after_ready_calls, 3);
    s.Finish(t.views);  // tensor 0 never announced: Finish packs and launches it
    ASSERT_EQ(s.launches().size(), 3u);
    EXPECT_EQ(s.launches()[2].bucket, 2u);
    EXPECT_EQ(s.launches()[2].after_ready_calls, -1);
  }
  EXPECT_EQ(comm.sizes(), (std::vector<int64_t>{40, 50, 10, 40, 50, 10}));
}

TEST(BucketScheduler, ABucketCompleteEarlyWaitsForTheOnesAhead) {
  FakeCluster cluster(1);
  Recording comm(cluster.Join("x", 0));
  Tensors t({10, 20, 30, 40}, 1.f);
  BucketScheduler s(comm, 200, DType::kF32, true);
  s.Begin(t.views);
  s.Ready(t.views, 0);  // bucket 2 complete, but 0 and 1 are not
  s.Ready(t.views, 1);
  s.Ready(t.views, 2);  // bucket 1 complete, bucket 0 not
  EXPECT_TRUE(s.launches().empty());
  s.Ready(t.views, 3);  // now all three go, in order
  ASSERT_EQ(s.launches().size(), 3u);
  for (size_t b = 0; b < 3; ++b) {
    EXPECT_EQ(s.launches()[b].bucket, b);
    EXPECT_EQ(s.launches()[b].after_ready_calls, 4);
  }
  s.Finish(t.views);
  EXPECT_EQ(comm.sizes(), (std::vector<int64_t>{40, 50, 10}));
}

TEST(BucketScheduler, WithoutOverlapEverythingRunsInFinishOnTheCallersThread) {
  FakeCluster cluster(1);
  Recording comm(cluster.Join("x", 0));
  Tensors t({10, 20, 30, 40}, 1.f);
  BucketScheduler s(comm, 200, DType::kF32, false);
  s.Begin(t.views);
  for (size_t k = 4; k-- > 0;) s.Ready(t.views, k);
  EXPECT_TRUE(s.launches().empty());
  EXPECT_TRUE(comm.sizes().empty());
  s.Finish(t.views);
  EXPECT_EQ(comm.sizes(), (std::vector<int64_t>{40, 50, 10}));
  for (auto id : comm.threads()) EXPECT_EQ(id, std::this_thread::get_id());
}

// Three ranks: the mean arrives in every tensor, the same bits with overlap on (ready in
// backward order, one skipped) and off (Finish alone).
TEST(BucketScheduler, OverlapGivesTheSameBitsAsWithout) {
  const std::vector<int64_t> sizes = {7, 300, 1, 64, 0, 129};
  std::vector<std::vector<std::vector<float>>> out(2, std::vector<std::vector<float>>(3));
  for (int overlap = 0; overlap < 2; ++overlap) {
    FakeCluster cluster(3);
    RunRankThreads(3, [&](int rank) {
      auto comm = cluster.Join("x", rank);
      Tensors t(sizes, float(rank) * 0.37f);
      BucketScheduler s(*comm, 1024, DType::kF32, overlap == 1);
      for (int step = 0; step < 3; ++step) {
        s.Begin(t.views);
        if (overlap)
          for (size_t k = sizes.size(); k-- > 0;)
            if (k != 1) s.Ready(t.views, k);
        s.Finish(t.views);
      }
      for (auto& g : t.g)
        out[size_t(overlap)][size_t(rank)].insert(out[size_t(overlap)][size_t(rank)].end(), g.begin(), g.end());
    });
  }
  // Step 1 averaged; steps 2 and 3 average equal values again: the mean of the three seeds.
  Tensors r0(sizes, 0.f), r1(sizes, 0.37f), r2(sizes, 0.74f);
  std::vector<float> want;
  for (size_t k = 0; k < sizes.size(); ++k)
    for (int64_t i = 0; i < sizes[k]; ++i)
      want.push_back((r0.g[k][size_t(i)] + r1.g[k][size_t(i)] + r2.g[k][size_t(i)]) / 3);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(out[0][size_t(rank)], out[1][size_t(rank)]) << "rank " << rank;
    EXPECT_EQ(out[0][size_t(rank)], out[0][0]);
    ASSERT_EQ(out[0][size_t(rank)].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(out[0][size_t(rank)][i], want[i], 1e-5) << i;
  }
}

// A failed collective on the communication thread surfaces in Finish, and the scheduler
// refuses to go on (the ranks are no longer in step).
class Failing : public Recording {
 public:
  using Recording::Recording;
  void AllReduce(float*, int64_t, ReduceOp, DType) override { throw Error("ring rank 1: neighbour gone"); }
};

TEST(BucketScheduler, AFailedBucketIsRethrownByFinish) {
  FakeCluster cluster(1);
  Failing comm(cluster.Join("x", 0));
  Tensors t({10, 20}, 0.f);
  BucketScheduler s(comm, 40, DType::kF32, true);
  s.Begin(t.views);
  s.Ready(t.views, 1);
  try {
    s.Finish(t.views);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("neighbour gone"), std::string::npos) << e.what();
  }
  EXPECT_THROW(s.Begin(t.views), Error);
}

TEST(BucketScheduler, ReadyOutsideAStepIsRefused) {
  FakeCluster cluster(1);
  auto comm = cluster.Join("x", 0);
  Tensors t({4}, 0.f);
  BucketScheduler s(*comm, 1024, DType::kF32, true);
  EXPECT_THROW(s.Ready(t.views, 0), Error);
  s.Begin(t.views);
  EXPECT_THROW(s.Ready(t.views, 5), Error);
  s.Finish(t.views);
}

// "Device" memory that is host memory, with a device's asynchrony made visible: queued copies
// and scales run only when a marker recorded after them is waited on (or a finishing call
// comes), so a reader that does not wait for its marker sees stale memory.
class DeferredOps : public DeviceOps {
 public:
  std::unique_ptr<DeviceUpdater> NewUpdater(const Optimizer&) override { return nullptr; }
  float* Alloc(int64_t n) override { return new float[size_t(std::max<int64_t>(n, 1))](); }
  void Free(float* p) override { delete[] p; }
  void Copy(float* dst, const float* src, int64_t n) override {
    RunUpTo(Queue([=] { std::copy(src, src + n, dst); }));
  }
  void Scale(float* p, int64_t n, float f) override {
    RunUpTo(Queue([=] { Multiply(p, n, f); }));
  }
  bool AllFinite(const std::vector<std::pair<const float*, int64_t>>&) override { return true; }
  void After(const DeviceFence*) override {}
  void CopyQueued(float* dst, const float* src, int64_t n) override {
    Queue([=] { std::copy(src, src + n, dst); });
  }
  void ScaleQueued(float* p, int64_t n, float f) override {
    Queue([=] { Multiply(p, n, f); });
  }
  std::shared_ptr<const DeviceFence> Record() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++records_;
    return std::make_shared<Marker>(this, ops_.size());
  }
  size_t pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return ops_.size() - done_;
  }
  size_t records() {
    std::lock_guard<std::mutex> lock(mu_);
    return records_;
  }

 private:
  struct Marker : DeviceFence {
    Marker(DeferredOps* o, size_t upto) : ops(o), upto(upto) {}
    void Wait() const override { ops->RunUpTo(upto); }
    void* native() const override { return nullptr; }
    DeferredOps* ops;
    size_t upto;
  };
  static void Multiply(float* p, int64_t n, float f) {
    for (int64_t i = 0; i < n; ++i) p[i] *= f;
  }
  size_t Queue(std::function<void()> op) {
    std::lock_guard<std::mutex> lock(mu_);
    ops_.push_back(std::move(op));
    return ops_.size();
  }
  void RunUpTo(size_t upto) {
    std::lock_guard<std::mutex> lock(mu_);
    for (; done_ < upto; ++done_) ops_[done_]();
  }
  std::mutex mu_;
  std::vector<std::function<void()>> ops_;
  size_t done_ = 0, records_ = 0;
};

// Stands in for NCCL: takes "device" pointers.
class DeviceRecording : public Recording {
 public:
  using Recording::Recording;
  bool HandlesDeviceBuffers() const override { return true; }
};

// On-device gradients with overlap: Ready only queues the copies into the bucket (the
// backward pass never waits), one marker per launch, and the communication thread waits for
// it before reducing: the means still arrive, bit for bit as the host path's.
TEST(BucketScheduler, OnDeviceOverlapQueuesCopiesAndReducesAfterTheBucketsMarker) {
  const std::vector<int64_t> sizes = {7, 300, 1, 64, 129};
  std::vector<std::vector<float>> got(3), want(3);
  for (int device = 0; device < 2; ++device) {
    FakeCluster cluster(3);
    RunRankThreads(3, [&](int rank) {
      DeferredOps ops;
      DeviceRecording comm(cluster.Join("x", rank));
      Tensors t(sizes, float(rank) * 0.37f);
      for (auto& v : t.views) v.on_device = device == 1;
      BucketScheduler s(comm, 1024, DType::kF32, /*overlap=*/true, &ops);
      s.Begin(t.views);
      // Buckets {4, 3, 2}, {1}, {0} at 1024 bytes.
      s.Ready(t.views, 4);
      s.Ready(t.views, 3);
      if (device) {
        EXPECT_EQ(ops.records(), 0u);  // bucket 0 not complete yet
      }
      s.Ready(t.views, 2);  // complete: launched, its copies queued
      if (device) {
        EXPECT_EQ(ops.records(), 1u);
      }
      s.Ready(t.views, 1);
      s.Ready(t.views, 0);
      if (device) {
        EXPECT_EQ(ops.records(), 3u);  // one marker per launch
      }
      s.Finish(t.views);
      if (device) {
        EXPECT_EQ(ops.pending(), 0u);
      }
      auto& out = device ? got[size_t(rank)] : want[size_t(rank)];
      for (auto& g : t.g) out.insert(out.end(), g.begin(), g.end());
    });
  }
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(got[size_t(rank)], want[size_t(rank)]) << "rank " << rank;
}

}  // namespace
}  // namespace shoal
