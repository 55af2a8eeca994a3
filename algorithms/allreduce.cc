// "allreduce": synchronous data parallelism. Every step the workers average their
// gradients (fused buckets over the ring, optional fp16/bf16 wire) and each applies the
// same optimizer step (sgd, momentum, lars, lamb, still...) locally, so weights stay
// identical on every worker, bit for bit.
#include "algorithms/algorithm.h"
#include "algorithms/collectives/fusion.h"

namespace shoal {
namespace {

class AllReduce : public Algorithm {
 public:
  explicit AllReduce(const AlgorithmEnv& env)
      : env_(env),
        updater_(env),
        fusion_(env.config->algorithm_opts.GetInt("bucket_bytes", 4 << 20, 1024, int64_t(1) << 32)),
        wire_(ParseDType(env.config->algorithm_opts.GetString("wire_dtype", "fp32"))) {
    comm_ = env.make_communicator("allreduce");
  }
  std::string Name() const override { return "allreduce"; }

  void Init(const std::vector<ParamView>& params) override {
    for (auto& p : params) comm_->Broadcast(p.w, p.n * 4, 0);  // one start point for all
  }
  void Step(const std::vector<ParamView>& params, const StepInfo& info) override {
    fusion_.Pack(params);
    fusion_.Run(*comm_, wire_);
    fusion_.UnpackInto(params);
    updater_.Apply(params, info.step);
  }
  bool AgreeToStop(bool mine) override {
    float v = mine ? 1.f : 0.f;
    comm_->AllReduce(&v, 1, ReduceOp::kSum);
    return v > 0;
  }
  int64_t bytes_sent() const override { return comm_->bytes_sent(); }
  void SaveState(const std::vector<ParamView>& params, CheckpointState* out) override {
    updater_.Save(params, "opt/", out);
  }
  void LoadState(const std::vector<ParamView>& params, const CheckpointState& in) override {
    updater_.Load(params, "opt/", in);
  }

 private:
  AlgorithmEnv env_;
  LocalUpdater updater_;
  FusedAllReduce fusion_;
  DType wire_;
  std::unique_ptr<Communicator> comm_;
};

const bool kRegistered = RegisterAlgorithm(
    "allreduce", [](const AlgorithmEnv& env) { return std::unique_ptr<Algorithm>(new AllReduce(env)); });

}  // namespace
}  // namespace shoal
