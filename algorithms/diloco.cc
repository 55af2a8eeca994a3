// "diloco": DiLoCo (Douillard et al. 2023). Every worker runs `sync_every` inner steps of the
// job's [optimizer] (typically adamw; its state stays on the worker, as in the paper) from
// the global weights, then the workers average their pseudo-gradients (global minus local,
// weighted by the samples each processed) over the ring and every worker applies the same
// outer step (algorithms/outer_optimizer.h: Nesterov momentum or SGD) to the global weights,
// from which all continue. Built on bmuf's block bookkeeping (algorithms/local_block.h).
// outer_wire picks how pseudo-gradients travel: fp32 or bf16 through the ring's all-reduce,
// or int8 / int4 with a scale per block of 256 (algorithms/compressors/block_quant.h) through
// Communicator::AllReduceQuantized; every worker applies the same decoded values.
#include <cstdio>

#include "algorithms/algorithm.h"
#include "algorithms/compressors/block_quant.h"
#include "algorithms/local_block.h"
#include "algorithms/outer_optimizer.h"
#include "common/error.h"

namespace shoal {
namespace {

OuterRule ParseOuterRule(const ConfigSection& a) {
  const std::string rule = a.GetString("outer_optimizer", "nesterov");
  if (rule == "nesterov") return OuterRule::kNesterov;
  if (rule == "sgd") return OuterRule::kSgd;
  throw InputError(a.Where("outer_optimizer") + ": \"" + rule + "\" is no outer optimizer (nesterov | sgd)");
}

enum class OuterWire { kFp32, kBf16, kInt8, kInt4 };

OuterWire ParseOuterWire(const ConfigSection& a) {
  const std::string wire = a.GetString("outer_wire", "fp32");
  if (wire == "fp32") return OuterWire::kFp32;
  if (wire == "bf16") return OuterWire::kBf16;
  if (wire == "int8") return OuterWire::kInt8;
  if (wire == "int4") return OuterWire::kInt4;
  throw InputError(a.Where("outer_wire") + ": \"" + wire + "\" is no outer wire format (fp32 | bf16 | int8 | int4)");
}

class Diloco : public LocalBlockAlgorithm {
 public:
  explicit Diloco(const AlgorithmEnv& env) : LocalBlockAlgorithm(env, "diloco", "sync_every", 100) {
    const ConfigSection& a = env.config->algorithm_opts;
    outer_.rule = ParseOuterRule(a);
    outer_.lr = float(a.GetDouble("outer_lr", 0.7, 0, 1000));
    outer_.momentum = float(a.GetDouble("outer_momentum", outer_.rule == OuterRule::kNesterov ? 0.9 : 0.0, 0, 0.9999));
    wire_ = ParseOuterWire(a);
    wire_name_ = a.GetString("outer_wire", "fp32");
  }
  std::string Name() const override { return "diloco"; }

  void Init(const std::vector<ParamView>& params) override {
    StartFirstBlock(params);
    momentum_.assign(size_t(block_.elements()), 0.f);
  }
  void Step(const std::vector<ParamView>& params, const StepInfo& info) override { LocalStep(params, info); }
  void Finish(const std::vector<ParamView>& params) override {
    LocalBlockAlgorithm::Finish(params);
    if (env_.rank == 0)
      printf("diloco: %lld outer steps, %s pseudo-gradients, %lld bytes sent per outer step by rank 0\n",
             (long long)block_.blocks(), wire_name_.c_str(), (long long)BytesPerOuterStep());
  }

  std::string ReshapeNote() const override { return "diloco starts its round again from the shared global weights"; }
  void AddMetrics(JsonObject* out) const override {
    out->Add("outer_steps", block_.blocks()).Add("bytes_per_outer_step", BytesPerOuterStep());
  }
  // Each worker's own weights and inner optimizer state (mid-round they differ) and the
  // shared global weights (the block's start), outer momentum and place in the round.
  void SaveState(const std::vector<ParamView>& params, CheckpointState* out) override {
    SaveBlock(params, out);
    out->PutFloats("diloco/momentum", momentum_);
    out->PutInt("diloco/outer_bytes", outer_bytes_);
  }
  void LoadState(const std::vector<ParamView>& params, const CheckpointState& in) override {
    momentum_ = in.GetFloatVector("diloco/momentum", momentum_.size());
    outer_bytes_ = in.GetInt("diloco/outer_bytes");
    LoadBlock(params, in);
  }

 private:
  // This worker's bytes on the wire per outer step, on average (the stop votes not counted).
  int64_t BytesPerOuterStep() const { return block_.blocks() > 0 ? outer_bytes_ / block_.blocks() : 0; }

  // The outer step: the mean pseudo-gradient through the outer optimizer into the global
  // weights, from which every worker goes on.
  void EndBlock(const std::vector<ParamView>& params) override {
    std::vector<float> delta = block_.WeightedDelta(params, comm_->size());
    const int64_t before = comm_->bytes_sent();
    MeanOverWorkers(delta);
    outer_bytes_ += comm_->bytes_sent() - before;
    ApplyOuterStep(outer_, delta.data(), block_.elements(), block_.start().data(), momentum_.data());
    block_.Restart(params);
  }

  // delta becomes the mean of every worker's delta as outer_wire carries it: the same bits on
  // every worker.
  void MeanOverWorkers(std::vector<float>& delta) {
    const int64_t n = block_.elements();
    switch (wire_) {
      case OuterWire::kFp32:
        return comm_->AllReduce(delta.data(), n, ReduceOp::kMean);
      case OuterWire::kBf16:
        return comm_->AllReduce(delta.data(), n, ReduceOp::kMean, DType::kBF16);
      case OuterWire::kInt8:
        return comm_->AllReduceQuantized(delta.data(), n, ReduceOp::kMean, BlockQuant::kInt8);
      case OuterWire::kInt4:
        return comm_->AllReduceQuantized(delta.data(), n, ReduceOp::kMean, BlockQuant::kInt4);
    }
  }

  OuterOptimizerParams outer_;
  OuterWire wire_ = OuterWire::kFp32;
  std::string wire_name_;
  std::vector<float> momentum_;  // the outer optimizer's buffer b
  int64_t outer_bytes_ = 0;      // sent in outer steps so far
};

const bool kRegistered =
    RegisterAlgorithm("diloco", [](const AlgorithmEnv& env) { return std::unique_ptr<Algorithm>(new Diloco(env)); });

}  // namespace
}  // namespace shoal
