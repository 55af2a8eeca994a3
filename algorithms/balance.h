// Batch balancing for the synchronous algorithms ([algorithm] balance = true): each
// worker's share of the global batch follows its measured throughput, so a slow worker
// (a weaker device, a busier host) takes fewer samples and every worker finishes a step
// together. The global batch stays [data] batch_size x workers (or [train] batch_schedule's); the algorithms weight
// each worker's gradient by its sample count (GradientWeight), so the update equals one step on the global batch
// exactly, for models without batch norm (with it, each worker normalizes over its own share, so the step depends on
// the split; MinBalancedShare bounds how small).
//
// Agreement: every balance_every_steps steps (a deterministic step boundary) each worker
// all-gathers its samples/s (smoothed over windows) over its own communicator ("balance", so it never interleaves
// with an algorithm's exchange in flight) and every worker computes the same split from the
// same gathered bytes (SplitBatch is a pure function). Not thread-safe: the trainer's
// thread only.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "algorithms/algorithm.h"

namespace shoal {

// Integer shares of `global` proportional to `rates`, each at least `floor` (>= 1) and
// summing to `global` (largest remainders, ties to the lower rank). Rates that are not all
// positive and finite give the equal split. Requires global >= floor x rates.size() >= 1.
std::vector<int64_t> SplitBatch(int64_t global, const std::vector<double>& rates, int64_t floor = 1);

// The fewest samples a balanced worker may get when its model's batch norm normalizes over
// `values` values per channel per sample at its smallest map (Model::MinStatisticsValues;
// 0: no batch norm): 1 without batch norm; with it at least 2 samples (one sample of a 1x1
// map has zero variance, and one sample alone is no batch statistic) and at least
// kMinBatchNormValues values per channel, so no worker's normalization is much noisier than
// an unbalanced batch would make it. Capped at `batch_size` (the equal share always fits).
constexpr int64_t kMinBatchNormValues = 16;
int64_t MinBalancedShare(int64_t values, int64_t batch_size);

class Balancer {
 public:
  // Makes its communicator (all ranks together). Starts from the equal split; no share is
  // ever below env.min_share.
  explicit Balancer(const AlgorithmEnv& env);
  const std::vector<int64_t>& sizes() const { return sizes_; }
  int64_t mine() const { return sizes_[size_t(rank_)]; }
  int64_t offset() const;  // where this rank's slice starts in the global batch
  int64_t global() const { return global_; }
  // Batch-size control: the global batch becomes `global` (>= floor x workers), split in
  // proportion to the current split (the same on every rank, no exchange).
  void SetGlobal(int64_t global);
  // One finished step: its samples and the time this worker spent computing them.
  void Observe(int64_t samples, double compute_s);
  // After step `step` (1-based count of steps done): at every balance_every_steps-th,
  // re-measures and re-splits on every rank; true when the split changed.
  bool MaybeRebalance(int64_t steps_done);
  void Save(CheckpointState* out) const;  // the split ("balance/sizes")
  void Load(const CheckpointState& in);

 private:
  int rank_, world_;
  int64_t global_, every_, floor_;
  std::unique_ptr<Communicator> comm_;
  std::vector<int64_t> sizes_;
  int64_t window_samples_ = 0;
  double window_s_ = 0;
  double rate_ = 0;  // this worker's smoothed samples/s
};

}  // namespace shoal
