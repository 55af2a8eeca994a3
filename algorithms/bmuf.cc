// "bmuf": blockwise model-update filtering. Workers run block_steps local optimizer steps
// from the block's start, then average their block deltas (one fused ring all-reduce) and
// every worker applies the same block momentum (block_momentum, block_lr, Nesterov), so
// all start the next block from the same point. The seeds' post-local SGD is this after
// sync_warmup_epochs of synchronous SGD (gradients all-reduced every step).
#include "algorithms/algorithm.h"
#include "algorithms/block_momentum.h"
#include "algorithms/collectives/fusion.h"
#include "algorithms/local_block.h"

namespace shoal {
namespace {

class Bmuf : public LocalBlockAlgorithm {
 public:
  explicit Bmuf(const AlgorithmEnv& env)
      : LocalBlockAlgorithm(env, "bmuf", "block_steps", 8),
        fusion_(env.config->algorithm_opts.GetInt("bucket_bytes", 4 << 20, 1024, int64_t(1) << 32)) {
    const ConfigSection& a = env.config->algorithm_opts;
    bp_.momentum = float(a.GetDouble("block_momentum", 0.9, 0, 0.9999));
    bp_.lr = float(a.GetDouble("block_lr", 1.0, 0, 1000));
    bp_.nesterov = a.GetBool("nesterov", true);
    warmup_steps_ = int64_t(a.GetDouble("sync_warmup_epochs", 0, 0, 1e6) * double(env.steps_per_epoch));
  }
  std::string Name() const override { return "bmuf"; }

  void Init(const std::vector<ParamView>& params) override {
    StartFirstBlock(params);
    global_ = block_.start();
    v_.assign(global_.size(), 0.f);
  }

  void Step(const std::vector<ParamView>& params, const StepInfo& info) override {
    if (info.step >= warmup_steps_) return LocalStep(params, info);
    // Synchronous SGD.
    ScaleGradients(params, GradientWeight(info, comm_->size()));
    fusion_.Pack(params);
    fusion_.Run(*comm_, DType::kF32);
    fusion_.UnpackInto(params);
    updater_.Apply(params, info.step);
    block_.StartAt(params);
    global_ = block_.start();
  }

  std::string ReshapeNote() const override { return "bmuf starts its block again from the shared block start"; }
  void AddMetrics(JsonObject* out) const override { out->Add("blocks", block_.blocks()); }
  // Each worker's own weights (mid-block they differ) are the trainer's; here the block's
  // start, the global model, the block momentum and where in the block it is.
  void SaveState(const std::vector<ParamView>& params, CheckpointState* out) override {
    SaveBlock(params, out);
    out->PutFloats("bmuf/global", global_);
    out->PutFloats("bmuf/momentum", v_);
  }
  void LoadState(const std::vector<ParamView>& params, const CheckpointState& in) override {
    global_ = in.GetFloatVector("bmuf/global", global_.size());
    v_ = in.GetFloatVector("bmuf/momentum", v_.size());
    LoadBlock(params, in);
  }

 private:
  void EndBlock(const std::vector<ParamView>& params) override {
    std::vector<float> delta = block_.WeightedDelta(params, comm_->size());
    comm_->AllReduce(delta.data(), block_.elements(), ReduceOp::kMean);
    ApplyBlockMomentum(bp_, delta.data(), block_.elements(), global_.data(), v_.data(), block_.start().data());
    block_.Restart(params);
  }

  FusedAllReduce fusion_;
  BlockMomentumParams bp_;
  int64_t warmup_steps_ = 0;
  std::vector<float> global_, v_;
};

const bool kRegistered =
    RegisterAlgorithm("bmuf", [](const AlgorithmEnv& env) { return std::unique_ptr<Algorithm>(new Bmuf(env)); });

}  // namespace
}  // namespace shoal
