// "bmuf": blockwise model-update filtering. Workers run block_steps local optimizer steps
// from the block's start, then average their block deltas (one fused ring all-reduce) and
// every worker applies the same block momentum (block_momentum, block_lr, Nesterov), so
// all start the next block from the same point. The seeds' post-local SGD is this after
// sync_warmup_epochs of synchronous SGD (gradients all-reduced every step).
#include <cstring>

#include "algorithms/algorithm.h"
#include "algorithms/block_momentum.h"
#include "algorithms/collectives/fusion.h"

namespace shoal {
namespace {

class Bmuf : public Algorithm {
 public:
  explicit Bmuf(const AlgorithmEnv& env)
      : env_(env),
        updater_(env),
        fusion_(env.config->algorithm_opts.GetInt("bucket_bytes", 4 << 20, 1024, int64_t(1) << 32)) {
    const ConfigSection& a = env.config->algorithm_opts;
    block_steps_ = a.GetInt("block_steps", 8, 1, 1 << 30);
    bp_.momentum = float(a.GetDouble("block_momentum", 0.9, 0, 0.9999));
    bp_.lr = float(a.GetDouble("block_lr", 1.0, 0, 1000));
    bp_.nesterov = a.GetBool("nesterov", true);
    warmup_steps_ = int64_t(a.GetDouble("sync_warmup_epochs", 0, 0, 1e6) * double(env.steps_per_epoch));
    comm_ = env.make_communicator("bmuf");
  }
  std::string Name() const override { return "bmuf"; }

  void Init(const std::vector<ParamView>& params) override {
    for (auto& p : params) comm_->Broadcast(p.w, p.n * 4, 0);
    for (auto& p : params) total_ += p.n;
    global_.resize(size_t(total_));
    start_.resize(size_t(total_));
    v_.assign(size_t(total_), 0.f);
    Gather(params, global_.data());
    start_ = global_;
  }

  void Step(const std::vector<ParamView>& params, const StepInfo& info) override {
    if (info.step < warmup_steps_) {  // synchronous SGD
      ScaleGradients(params, GradientWeight(info, comm_->size()));
      fusion_.Pack(params);
      fusion_.Run(*comm_, DType::kF32);
      fusion_.UnpackInto(params);
      updater_.Apply(params, info.step);
      Gather(params, global_.data());
      start_ = global_;
      return;
    }
    updater_.Apply(params, info.step);  // local steps: each worker's own batch mean
    block_samples_ += info.samples;
    block_global_ += info.global_samples;
    if (++in_block_ == block_steps_) SyncBlock(params);
  }

  void Finish(const std::vector<ParamView>& params) override {
    if (in_block_ > 0) SyncBlock(params);  // every worker ends on the same model
  }
  bool ModelChangedAtFinish() const override { return true; }
  bool AgreeToStop(bool mine) override {
    float v = mine ? 1.f : 0.f;
    comm_->AllReduce(&v, 1, ReduceOp::kSum);
    return v > 0;
  }
  int64_t skipped_steps() const override { return updater_.skipped(); }
  Communicator* peers() override { return comm_.get(); }
  std::string ReshapeNote() const override { return "bmuf starts its block again from the shared block start"; }
  int64_t bytes_sent() const override { return comm_->bytes_sent(); }
  bool BalancesBatches() const override { return balance_; }
  void AddMetrics(JsonObject* out) const override { out->Add("blocks", blocks_); }
  // Each worker's own weights (mid-block they differ) are the trainer's; here the block's
  // start, the global model, the block momentum and where in the block it is.
  void SaveState(const std::vector<ParamView>& params, CheckpointState* out) override {
    updater_.Save(params, "opt/", out);
    out->PutFloats("bmuf/global", global_);
    out->PutFloats("bmuf/start", start_);
    out->PutFloats("bmuf/momentum", v_);
    out->PutInt("bmuf/in_block", in_block_);
    out->PutInt("bmuf/blocks", blocks_);
    out->PutInt("bmuf/block_samples", block_samples_);
    out->PutInt("bmuf/block_global", block_global_);
  }
  void LoadState(const std::vector<ParamView>& params, const CheckpointState& in) override {
    updater_.Load(params, "opt/", in);
    global_ = in.GetFloatVector("bmuf/global", size_t(total_));
    start_ = in.GetFloatVector("bmuf/start", size_t(total_));
    v_ = in.GetFloatVector("bmuf/momentum", size_t(total_));
    in_block_ = in.GetInt("bmuf/in_block");
    blocks_ = in.GetInt("bmuf/blocks");
    if (in.Has("bmuf/block_samples")) {
      block_samples_ = in.GetInt("bmuf/block_samples");
      block_global_ = in.GetInt("bmuf/block_global");
    }
    SHOAL_CHECK(in_block_ >= 0 && in_block_ < block_steps_,
                "checkpoint: bmuf is " + std::to_string(in_block_) + " steps into a block of " +
                    std::to_string(block_steps_) + " (was block_steps changed?)");
    if (in.record.shards != uint32_t(env_.world)) {
      // Another set of workers: mid-block each worker's weights were its own, so every
      // worker starts the block again from its start (the last global model with block
      // momentum applied), which all of them shared.
      int64_t off = 0;
      for (auto& p : params) {
        memcpy(p.w, start_.data() + off, size_t(p.n) * 4);
        off += p.n;
      }
      in_block_ = 0;
      block_samples_ = block_global_ = 0;
    }
  }

 private:
  static void Gather(const std::vector<ParamView>& params, float* out) {
    for (auto& p : params) {
      memcpy(out, p.w, size_t(p.n) * 4);
      out += p.n;
    }
  }
  void SyncBlock(const std::vector<ParamView>& params) {
    std::vector<float> delta(static_cast<size_t>(total_));
    int64_t off = 0;
    for (auto& p : params) {
      for (int64_t i = 0; i < p.n; ++i) delta[size_t(off + i)] = start_[size_t(off + i)] - p.w[i];
      off += p.n;
    }
    // Uneven batches: each delta counts by the samples it saw in the block.
    StepInfo block;
    block.samples = block_samples_;
    block.global_samples = block_global_;
    const float weight = float(GradientWeight(block, comm_->size()));
    if (weight != 1.f)
      for (auto& d : delta) d *= weight;
    comm_->AllReduce(delta.data(), total_, ReduceOp::kMean);
    ApplyBlockMomentum(bp_, delta.data(), total_, global_.data(), v_.data(), start_.data());
    off = 0;
    for (auto& p : params) {
      memcpy(p.w, start_.data() + off, size_t(p.n) * 4);
      off += p.n;
    }
    in_block_ = 0;
    block_samples_ = block_global_ = 0;
    ++blocks_;
  }

  AlgorithmEnv env_;
  bool balance_ = BalanceOn(env_);
  LocalUpdater updater_;
  FusedAllReduce fusion_;
  std::unique_ptr<Communicator> comm_;
  BlockMomentumParams bp_;
  int64_t block_steps_ = 8, warmup_steps_ = 0, in_block_ = 0, blocks_ = 0, total_ = 0;
  int64_t block_samples_ = 0, block_global_ = 0;  // this block's samples: mine, everyone's
  std::vector<float> global_, start_, v_;
};

const bool kRegistered =
    RegisterAlgorithm("bmuf", [](const AlgorithmEnv& env) { return std::unique_ptr<Algorithm>(new Bmuf(env)); });

}  // namespace
}  // namespace shoal
