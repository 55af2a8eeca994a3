#include "algorithms/local_block.h"

#include <cstring>

#include "common/error.h"

namespace shoal {

void LocalBlock::StartAt(const std::vector<ParamView>& params) {
  int64_t total = 0;
  for (auto& p : params) total += p.n;
  start_.resize(size_t(total));
  float* out = start_.data();
  for (auto& p : params) {
    memcpy(out, p.w, size_t(p.n) * 4);
    out += p.n;
  }
}

bool LocalBlock::Count(const StepInfo& info) {
  block_samples_ += info.samples;
  block_global_ += info.global_samples;
  return ++in_block_ == block_steps_;
}

std::vector<float> LocalBlock::Delta(const std::vector<ParamView>& params, float weight) const {
  std::vector<float> delta(start_.size());
  size_t off = 0;
  for (auto& p : params) {
    for (int64_t i = 0; i < p.n; ++i) delta[off + size_t(i)] = start_[off + size_t(i)] - p.w[i];
    off += size_t(p.n);
  }
  if (weight != 1.f)
    for (auto& d : delta) d *= weight;
  return delta;
}

std::vector<float> LocalBlock::WeightedDelta(const std::vector<ParamView>& params, int world) const {
  StepInfo block;
  block.samples = block_samples_;
  block.global_samples = block_global_;
  return Delta(params, float(GradientWeight(block, world)));
}

void LocalBlock::Adopt(const std::vector<ParamView>& params, int64_t blocks) {
  Restart(params);
  blocks_ = blocks;
}

void LocalBlock::Restart(const std::vector<ParamView>& params) {
  const float* in = start_.data();
  for (auto& p : params) {
    memcpy(p.w, in, size_t(p.n) * 4);
    in += p.n;
  }
  in_block_ = 0;
  block_samples_ = block_global_ = 0;
  ++blocks_;
}

void LocalBlock::Save(CheckpointState* out) const {
  out->PutFloats(prefix_ + "start", start_);
  out->PutInt(prefix_ + "in_block", in_block_);
  out->PutInt(prefix_ + "blocks", blocks_);
  out->PutInt(prefix_ + "block_samples", block_samples_);
  out->PutInt(prefix_ + "block_global", block_global_);
}

void LocalBlock::Load(const std::vector<ParamView>& params, const CheckpointState& in, int world, bool own) {
  start_ = in.GetFloatVector(prefix_ + "start", start_.size());
  in_block_ = in.GetInt(prefix_ + "in_block");
  blocks_ = in.GetInt(prefix_ + "blocks");
  if (in.Has(prefix_ + "block_samples")) {
    block_samples_ = in.GetInt(prefix_ + "block_samples");
    block_global_ = in.GetInt(prefix_ + "block_global");
  }
  SHOAL_CHECK(in_block_ >= 0 && in_block_ < block_steps_, "checkpoint: " + name_ + " is " + std::to_string(in_block_) +
                                                              " steps into a block of " + std::to_string(block_steps_) +
                                                              " (was [algorithm] " + steps_key_ + " changed?)");
  if (in.record.shards != uint32_t(world)) {
    Restart(params);
    --blocks_;        // the same block again, not a new one
  } else if (!own) {  // the others are in_block_ steps in: it ends the block with them
    const int64_t in_block = in_block_;
    Restart(params);
    --blocks_;
    in_block_ = in_block;
  }
}

LocalBlockAlgorithm::LocalBlockAlgorithm(const AlgorithmEnv& env, const std::string& name, const std::string& steps_key,
                                         int64_t default_steps, bool ring_of_all)
    : env_(env),
      balance_(BalanceOn(env)),
      updater_(env),
      comm_(ring_of_all ? env.make_communicator(name) : nullptr),
      block_(name, steps_key, env.config->algorithm_opts.GetInt(steps_key, default_steps, 1, 1 << 30)) {}

bool LocalBlockAlgorithm::AgreeToStop(bool mine) { return AnyRank(*comm_, mine); }

void LocalBlockAlgorithm::StartFirstBlock(const std::vector<ParamView>& params) {
  StartFromRankZero(*comm_, params);
  block_.StartAt(params);
}

void LocalBlockAlgorithm::LocalStep(const std::vector<ParamView>& params, const StepInfo& info) {
  updater_.Apply(params, info.step);  // this worker's own batch mean
  if (block_.Count(info)) EndBlock(params);
}

void LocalBlockAlgorithm::SaveBlock(const std::vector<ParamView>& params, CheckpointState* out) const {
  updater_.Save(params, "opt/", out);
  block_.Save(out);
}

void LocalBlockAlgorithm::LoadBlock(const std::vector<ParamView>& params, const CheckpointState& in) {
  updater_.Load(params, "opt/", in);
  block_.Load(params, in, env_.world);
}

}  // namespace shoal
