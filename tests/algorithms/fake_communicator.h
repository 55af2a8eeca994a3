// An in-process Communicator for unit tests: the ranks of a job are threads of one process
// and every collective meets in shared memory. Results are computed in rank order, so
// every rank gets the same bits, as the ring guarantees. Every wait is bounded: a rank
// that never arrives makes the others throw instead of hanging the test.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/collectives/communicator.h"

namespace shoal {

// The shared state of one communicator of `size` ranks.
class FakeGroup {
 public:
  explicit FakeGroup(int size, int timeout_ms = 10000) : size_(size), timeout_ms_(timeout_ms), slots_(size_t(size)) {}
  int size() const { return size_; }
  // Every rank deposits `mine`; `combine` then runs on each rank with all deposits in rank
  // order, before anyone may deposit again.
  void Exchange(int rank, std::vector<uint8_t> mine,
                const std::function<void(const std::vector<std::vector<uint8_t>>&)>& combine);

 private:
  void Arrive(std::unique_lock<std::mutex>& lock);
  const int size_, timeout_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<uint8_t>> slots_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(int rank, std::shared_ptr<FakeGroup> group) : rank_(rank), group_(std::move(group)) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  std::string Name() const override { return "fake"; }
  void AllReduce(float* data, int64_t n, ReduceOp op, DType wire = DType::kF32) override;
  void AllGather(const void* in, int64_t bytes, void* out) override;
  void Broadcast(void* data, int64_t bytes, int root) override;
  void Barrier() override;
  int64_t bytes_sent() const override { return bytes_sent_; }

 private:
  int rank_;
  std::shared_ptr<FakeGroup> group_;
  int64_t bytes_sent_ = 0;
};

// One fake job: a group per communicator name, shared by the ranks that ask for it.
class FakeCluster {
 public:
  explicit FakeCluster(int world) : world_(world) {}
  std::unique_ptr<Communicator> Join(const std::string& name, int rank);
  // An environment for `rank` whose make_communicator joins this cluster (no PS client).
  AlgorithmEnv EnvFor(const JobConfig& cfg, int rank, int64_t steps_per_epoch);
  // The names of the communicators joined so far, sorted.
  std::vector<std::string> GroupNames();

 private:
  int world_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<FakeGroup>> groups_;
};

// One tensor "w" of w.size() elements over w and its gradient g (the same size), as the
// trainer hands an algorithm its parameters.
std::vector<ParamView> OneTensor(std::vector<float>& w, std::vector<float>& g);

// Runs fn(rank) on `world` threads and rethrows the first failure.
void RunRankThreads(int world, const std::function<void(int rank)>& fn);

}  // namespace shoal
