// "double_buffer" (ChainerMN, seed 002): step t's gradients are averaged on a background
// thread while step t+1 computes; the update at step t+1 uses that 1-step-stale average.
// Exchange time hides behind compute; all workers still apply identical updates.
#include <future>

#include "algorithms/algorithm.h"
#include "algorithms/collectives/fusion.h"

namespace shoal {
namespace {

class DoubleBuffer : public Algorithm {
 public:
  explicit DoubleBuffer(const AlgorithmEnv& env)
      : env_(env),
        updater_(env),
        fusion_(env.config->algorithm_opts.GetInt("bucket_bytes", 4 << 20, 1024, int64_t(1) << 32)),
        wire_(ParseDType(env.config->algorithm_opts.GetString("wire_dtype", "fp32"))) {
    comm_ = env.make_communicator("double_buffer");
  }
  ~DoubleBuffer() override {
    if (pending_.valid()) pending_.wait();
  }
  std::string Name() const override { return "double_buffer"; }

  void Init(const std::vector<ParamView>& params) override { StartFromRankZero(*comm_, params); }
  void Step(const std::vector<ParamView>& params, const StepInfo& info) override {
    ScaleGradients(params, GradientWeight(info, comm_->size()));  // uneven batches: the global mean
    bool have_stale = Wait();                                     // the exchange of step t-1 has finished
    if (have_stale) {
      stale_.swap(fusion_.buffer());
    }
    fusion_.Pack(params);  // step t's gradients, exchanged while step t+1 computes
    pending_ = std::async(std::launch::async, [this] { fusion_.Run(*comm_, wire_); });
    if (have_stale) {
      Unpack(stale_, params);
      updater_.Apply(params, stale_step_);
    }
    stale_step_ = info.step;
  }
  void Finish(const std::vector<ParamView>& params) override {
    if (Wait()) {  // the last step's gradients still have to be applied
      Unpack(fusion_.buffer(), params);
      updater_.Apply(params, stale_step_);
    }
  }
  bool AgreeToStop(bool mine) override {
    // The ring carries one collective at a time: settle the exchange in flight first.
    bool had = Wait();
    bool any = AnyRank(*comm_, mine);
    if (had) pending_ = std::async(std::launch::deferred, [] {});  // keep the result for the next Step
    return any;
  }
  int64_t skipped_steps() const override { return updater_.skipped(); }
  Communicator* peers() override { return comm_.get(); }
  int64_t bytes_sent() const override { return comm_->bytes_sent(); }
  bool BalancesBatches() const override { return balance_; }
  // The exchange in flight is settled and its result kept: it is the update of the next
  // step, so a resume applies it exactly where the run would have.
  void SaveState(const std::vector<ParamView>& params, CheckpointState* out) override {
    updater_.Save(params, "opt/", out);
    bool had = Wait();
    out->PutInt("double_buffer/pending", had ? 1 : 0);
    out->PutInt("double_buffer/stale_step", stale_step_);
    if (had) {
      out->PutFloats("double_buffer/gradients", fusion_.buffer());
      pending_ = std::async(std::launch::deferred, [] {});
    }
  }
  void LoadState(const std::vector<ParamView>& params, const CheckpointState& in) override {
    updater_.Load(params, "opt/", in);
    stale_step_ = in.GetInt("double_buffer/stale_step");
    if (in.GetInt("double_buffer/pending")) {
      int64_t total = 0;
      for (auto& p : params) total += p.n;
      fusion_.buffer() = in.GetFloatVector("double_buffer/gradients", size_t(total));
      pending_ = std::async(std::launch::deferred, [] {});
    }
  }

 private:
  // Waits for the exchange in flight; true if there was one (its result is in fusion_).
  bool Wait() {
    if (!pending_.valid()) return false;
    pending_.get();  // rethrows a failed exchange (e.g. a peer died)
    return true;
  }
  static void Unpack(const std::vector<float>& buf, const std::vector<ParamView>& params) {
    int64_t off = 0;
    for (auto& p : params) {
      std::copy(buf.begin() + off, buf.begin() + off + p.n, p.g);
      off += p.n;
    }
  }

  AlgorithmEnv env_;
  bool balance_ = BalanceOn(env_);
  LocalUpdater updater_;
  FusedAllReduce fusion_;
  DType wire_;
  std::unique_ptr<Communicator> comm_;
  std::future<void> pending_;
  std::vector<float> stale_;
  int64_t stale_step_ = 0;
};

const bool kRegistered = RegisterAlgorithm(
    "double_buffer", [](const AlgorithmEnv& env) { return std::unique_ptr<Algorithm>(new DoubleBuffer(env)); });

}  // namespace
}  // namespace shoal
