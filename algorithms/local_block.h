// What bmuf and diloco share: every worker takes local optimizer steps from a common block
// start, and at the block's end the workers exchange how far each moved (start minus its
// weights) and all continue from one new start. LocalBlock keeps that start (the same on
// every worker), the steps and samples of the block so far and the blocks done; it computes
// the sample-weighted delta, puts a worker back at the start, and checkpoints all of it.
// LocalBlockAlgorithm is the Algorithm around it. What turns the averaged delta into the next
// start (block momentum, DiLoCo's outer optimizer) is each algorithm's. Not thread-safe: the
// trainer's thread only.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"

namespace shoal {

class LocalBlock {
 public:
  // `name` prefixes its checkpoint entries ("bmuf": bmuf/start, bmuf/in_block, ...);
  // `steps_key` is the [algorithm] key that set block_steps (for errors).
  LocalBlock(const std::string& name, std::string steps_key, int64_t block_steps)
      : name_(name), prefix_(name + "/"), steps_key_(std::move(steps_key)), block_steps_(block_steps) {}
  // The block starts at the weights in `params` (sizes them; call again to restart there).
  void StartAt(const std::vector<ParamView>& params);
  // One local step done (its samples counted); true when it completed the block.
  bool Count(const StepInfo& info);
  bool mid_block() const { return in_block_ > 0; }
  int64_t blocks() const { return blocks_; }
  int64_t elements() const { return int64_t(start_.size()); }
  int64_t steps() const { return block_steps_; }
  int64_t block_samples() const { return block_samples_; }
  std::vector<float>& start() { return start_; }
  // (start - w) x weight for every element.
  std::vector<float> Delta(const std::vector<ParamView>& params, float weight) const;
  // start - w for every element, each times the factor that makes a mean over `world`
  // workers the sample-weighted mean (uneven batches: each delta counts by the samples it
  // saw in the block; GradientWeight).
  std::vector<float> WeightedDelta(const std::vector<ParamView>& params, int world) const;
  // A worker joining a running job: start() holds the job's, and it is `blocks` blocks in.
  // Its weights become start() and it has no step in this block yet.
  void Adopt(const std::vector<ParamView>& params, int64_t blocks);
  // The block ends: every worker's weights become start() (the caller has moved it).
  void Restart(const std::vector<ParamView>& params);
  void Save(CheckpointState* out) const;
  // After the algorithm's own Load. A checkpoint of another number of workers (mid-block
  // each worker's weights were its own): every worker starts the block again from its start,
  // which all of them shared. `own` false: another worker's copy (this one wrote none of it:
  // elastic diloco); it takes the start and the place in the block, with no step of the block
  // yet. Throws when the checkpoint is further into a block than block_steps allows.
  void Load(const std::vector<ParamView>& params, const CheckpointState& in, int world, bool own = true);

 private:
  std::string name_, prefix_, steps_key_;
  int64_t block_steps_;
  std::vector<float> start_;
  int64_t in_block_ = 0, blocks_ = 0;
  int64_t block_samples_ = 0, block_global_ = 0;  // this block's samples: mine, everyone's
};

// An algorithm of local blocks: the job's optimizer steps locally on each worker (its state
// stays there), and EndBlock, the algorithm's, exchanges and moves block().start() on to the
// next block's start, then calls block().Restart. Every worker ends on one model (a final
// EndBlock for a partial block); stopping is agreed over the communicator.
class LocalBlockAlgorithm : public Algorithm {
 public:
  void Finish(const std::vector<ParamView>& params) override {
    if (block_.mid_block()) EndBlock(params);
  }
  bool ModelChangedAtFinish() const override { return true; }
  bool AgreeToStop(bool mine) override;
  int64_t skipped_steps() const override { return updater_.skipped(); }
  Communicator* peers() override { return comm_.get(); }
  int64_t bytes_sent() const override { return comm_->bytes_sent(); }
  bool BalancesBatches() const override { return balance_; }

 protected:
  // `name`: the communicator's and the checkpoint entries' name; block_steps read from
  // [algorithm] `steps_key` (default `default_steps`). Without `ring_of_all` no communicator
  // among every worker is built (comm_ stays null): the subclass meets its peers its own way
  // and overrides what uses comm_ (Init, AgreeToStop, peers, bytes_sent).
  LocalBlockAlgorithm(const AlgorithmEnv& env, const std::string& name, const std::string& steps_key,
                      int64_t default_steps, bool ring_of_all = true);
  virtual void EndBlock(const std::vector<ParamView>& params) = 0;
  // Every worker takes rank 0's weights; the first block starts there.
  void StartFirstBlock(const std::vector<ParamView>& params);
  // One local step of the job's optimizer; EndBlock when it completed the block.
  void LocalStep(const std::vector<ParamView>& params, const StepInfo& info);
  // The optimizer's states and the block's bookkeeping (the subclass adds its own).
  void SaveBlock(const std::vector<ParamView>& params, CheckpointState* out) const;
  void LoadBlock(const std::vector<ParamView>& params, const CheckpointState& in);
  // Where this worker wrote none of `in` (elastic diloco): the shared block only, its weights
  // the block's start, its optimizer fresh.
  void LoadSharedBlock(const std::vector<ParamView>& params, const CheckpointState& in) {
    block_.Load(params, in, env_.world, /*own=*/false);
  }

  AlgorithmEnv env_;
  bool balance_;
  LocalUpdater updater_;
  std::unique_ptr<Communicator> comm_;
  LocalBlock block_;
};

}  // namespace shoal
