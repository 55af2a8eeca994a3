// "allreduce": synchronous data parallelism. Every step the workers average their
// gradients (fused buckets over the ring, optional fp16/bf16 wire) and each applies the
// same optimizer step (sgd, momentum, lars, lamb, still...) locally, so weights stay
// identical on every worker, bit for bit. With [algorithm] overlap = true the buckets are
// exchanged while the backward pass still runs (algorithms/collectives/bucket_scheduler.h),
// with the same bits as without. On GPU workers with NCCL it takes device params: gradients,
// fusion buffer, weights and optimizer state never leave the GPU.
#include "algorithms/algorithm.h"
#include "algorithms/collectives/bucket_scheduler.h"

namespace shoal {
namespace {

class AllReduce : public Algorithm {
 public:
  explicit AllReduce(const AlgorithmEnv& env)
      : env_(env),
        updater_(env),
        comm_(env.make_communicator("allreduce")),
        buckets_(*comm_, env.config->algorithm_opts.GetInt("bucket_bytes", 4 << 20, 1024, int64_t(1) << 32),
                 ParseDType(env.config->algorithm_opts.GetString("wire_dtype", "fp32")),
                 env.config->algorithm_opts.GetBool("overlap", false), env.device.get()) {}
  std::string Name() const override { return "allreduce"; }

  void Init(const std::vector<ParamView>& params) override { StartFromRankZero(*comm_, params); }
  // Balanced batches weight each gradient by this step's sample count before the exchange;
  // buckets sent during the backward pass would go unweighted, so balancing turns overlap off.
  bool WantsGradReady() const override { return buckets_.overlap() && !balance_; }
  void BeginBackward(const std::vector<ParamView>& params) override { buckets_.Begin(params); }
  void GradReady(const std::vector<ParamView>& params, size_t index) override { buckets_.Ready(params, index); }
  void Step(const std::vector<ParamView>& params, const StepInfo& info) override {
    ScaleGradients(params, GradientWeight(info, comm_->size()), env_.device.get());  // uneven batches
    buckets_.Finish(params);
    updater_.Apply(params, info.step);
  }
  // On a GPU worker with NCCL: the model's own device tensors, reduced and updated there.
  bool TakesDeviceParams() const override { return env_.device && comm_->HandlesDeviceBuffers(); }
  bool AgreeToStop(bool mine) override { return AnyRank(*comm_, mine); }
  int64_t skipped_steps() const override { return updater_.skipped(); }
  Communicator* peers() override { return comm_.get(); }
  Communicator* EvaluationPeers() override { return comm_.get(); }  // every step leaves identical weights
  int64_t bytes_sent() const override { return comm_->bytes_sent(); }
  bool BalancesBatches() const override { return balance_; }
  // Of the last step's buckets, how many left during the backward pass (the rest in Step).
  void AddMetrics(JsonObject* out) const override {
    int64_t early = 0;
    for (auto& l : buckets_.launches()) early += l.after_ready_calls >= 0;
    out->Add("buckets", int64_t(buckets_.buckets().size())).Add("overlapped_buckets", early);
  }
  void SaveState(const std::vector<ParamView>& params, CheckpointState* out) override {
    updater_.Save(params, "opt/", out);
  }
  void LoadState(const std::vector<ParamView>& params, const CheckpointState& in) override {
    updater_.Load(params, "opt/", in);
  }

 private:
  AlgorithmEnv env_;
  bool balance_ = BalanceOn(env_);
  LocalUpdater updater_;
  std::unique_ptr<Communicator> comm_;
  BucketScheduler buckets_;  // after comm_: its thread stops before the communicator goes
};

const bool kRegistered = RegisterAlgorithm(
    "allreduce", [](const AlgorithmEnv& env) { return std::unique_ptr<Algorithm>(new AllReduce(env)); });

}  // namespace
}  // namespace shoal
