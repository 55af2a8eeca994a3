// "auto": picks the algorithm from what it measures, not from a guess. It runs synchronous
// all-reduce for the first `probe_steps` steps while timing each worker's compute (the time
// between two Step calls) and the exchange, agrees on the figures over the ring (every
// worker decides the same), then hands over to:
//   dgc       when the exchange costs > dgc_ratio x compute (very slow links),
//   adpsgd    when workers are uneven (slowest compute > uneven_ratio x fastest): nobody
//             waits for the slowest,
//   bmuf      when it costs > bmuf_ratio x compute (slow links): 1/block_steps the traffic,
//   allreduce otherwise (fast links, equal workers).
// Weights are identical on every worker at the hand-over (synchronous probe), which is the
// start point every algorithm's Init expects.
#include <chrono>
#include <cstdio>

#include "algorithms/algorithm.h"
#include "algorithms/collectives/fusion.h"

namespace shoal {
namespace {

using Clock = std::chrono::steady_clock;

class Auto : public Algorithm {
 public:
  explicit Auto(const AlgorithmEnv& env)
      : env_(env),
        updater_(env),
        fusion_(env.config->algorithm_opts.GetInt("bucket_bytes", 4 << 20, 1024, int64_t(1) << 32)) {
    const ConfigSection& a = env.config->algorithm_opts;
    probe_steps_ = a.GetInt("probe_steps", 20, 2, 1 << 20);
    uneven_ratio_ = a.GetDouble("uneven_ratio", 1.5, 1, 1e6);
    bmuf_ratio_ = a.GetDouble("bmuf_ratio", 1.0, 0, 1e6);
    dgc_ratio_ = a.GetDouble("dgc_ratio", 4.0, 0, 1e6);
    comm_ = env.make_communicator("auto");
  }
  std::string Name() const override { return chosen_ ? "auto:" + chosen_->Name() : "auto"; }

  void Init(const std::vector<ParamView>& params) override {
    for (auto& p : params) comm_->Broadcast(p.w, p.n * 4, 0);
    last_step_end_ = Clock::now();
  }

  void Step(const std::vector<ParamView>& params, const StepInfo& info) override {
    if (chosen_) return chosen_->Step(params, info);
    auto t0 = Clock::now();
    if (probed_ > 0) compute_s_ += std::chrono::duration<double>(t0 - last_step_end_).count();
    fusion_.Pack(params);
    fusion_.Run(*comm_, DType::kF32);
    fusion_.UnpackInto(params);
    auto t1 = Clock::now();
    if (probed_ > 0) comm_s_ += std::chrono::duration<double>(t1 - t0).count();
    updater_.Apply(params, info.step);
    last_step_end_ = Clock::now();
    if (++probed_ == probe_steps_) Decide(params);
  }

  void Finish(const std::vector<ParamView>& params) override {
    if (chosen_) chosen_->Finish(params);
  }
  bool ModelChangedAtFinish() const override { return chosen_ && chosen_->ModelChangedAtFinish(); }
  bool AgreeToStop(bool mine) override {
    if (chosen_) return chosen_->AgreeToStop(mine);
    float v = mine ? 1.f : 0.f;
    comm_->AllReduce(&v, 1, ReduceOp::kSum);
    return v > 0;
  }
  int64_t bytes_sent() const override { return comm_->bytes_sent() + (chosen_ ? chosen_->bytes_sent() : 0); }
  // Its choice, so a resumed job runs what was chosen (measuring again could choose
  // otherwise midway), and the chosen algorithm's state; while probing, the probe's.
  void SaveState(const std::vector<ParamView>& params, CheckpointState* out) override {
    out->Put("auto/choice", chosen_ ? chosen_->Name() : std::string());
    if (chosen_) return chosen_->SaveState(params, out);
    updater_.Save(params, "opt/", out);
    out->PutInt("auto/probed", probed_);
    out->PutDouble("auto/compute_s", compute_s_);
    out->PutDouble("auto/comm_s", comm_s_);
  }
  void LoadState(const std::vector<ParamView>& params, const CheckpointState& in) override {
    const std::string choice = in.Get("auto/choice");
    if (!choice.empty()) {
      probed_ = probe_steps_;
      chosen_ = MakeAlgorithm(choice, env_);
      chosen_->Init(params);       // wires its communicator; sets weights to rank 0's
      RestoreWeights(in, params);  // each worker's own again
      chosen_->LoadState(params, in);
      return;
    }
    updater_.Load(params, "opt/", in);
    probed_ = in.GetInt("auto/probed");
    compute_s_ = in.GetDouble("auto/compute_s");
    comm_s_ = in.GetDouble("auto/comm_s");
    last_step_end_ = Clock::now();
  }
  void AddMetrics(JsonObject* out) const override {
    out->Add("auto_choice", chosen_ ? chosen_->Name() : std::string("probing"));
    if (chosen_) chosen_->AddMetrics(out);
  }

 private:
  void Decide(const std::vector<ParamView>& params) {
    int64_t n = probed_ - 1;  // the first step has no compute interval before it
    double mine_compute = compute_s_ / double(n), mine_comm = comm_s_ / double(n);
    // [max compute, -min compute, max comm] over all workers, with one all-gather.
    std::vector<double> all(size_t(comm_->size()) * 2);
    double me[2] = {mine_compute, mine_comm};
    comm_->AllGather(me, sizeof me, all.data());
    double cmax = 0, cmin = 1e300, comm = 0;
    for (int r = 0; r < comm_->size(); ++r) {
      cmax = std::max(cmax, all[size_t(2 * r)]);
      cmin = std::min(cmin, all[size_t(2 * r)]);
      comm = std::max(comm, all[size_t(2 * r + 1)]);
    }
    // Exchange time beyond what waiting for the slowest explains.
    double exchange = std::max(0.0, comm - (cmax - cmin));
    std::string choice = "allreduce";
    if (comm_->size() > 1) {
      // Links first: a slow exchange dwarfs compute jitter between workers.
      if (exchange > dgc_ratio_ * cmax)
        choice = "dgc";
      else if (cmin > 0 && cmax / cmin > uneven_ratio_)
        choice = "adpsgd";
      else if (exchange > bmuf_ratio_ * cmax)
        choice = "bmuf";
    }
    if (choice == "dgc" && env_.config->optimizer != "momentum" && env_.config->optimizer != "sgd") choice = "bmuf";
    if (env_.rank == 0)
      printf("auto: compute %.1f-%.1f ms/step, exchange %.1f ms/step over %d workers -> %s\n", cmin * 1e3, cmax * 1e3,
             exchange * 1e3, comm_->size(), choice.c_str());
    if (env_.metrics)
      env_.metrics->Write("auto", probed_,
                          JsonObject()
                              .Add("rank", env_.rank)
                              .Add("choice", choice)
                              .Add("compute_min_s", cmin)
                              .Add("compute_max_s", cmax)
                              .Add("exchange_s", exchange));
    chosen_ = MakeAlgorithm(choice, env_);
    chosen_->Init(params);
  }

  AlgorithmEnv env_;
  LocalUpdater updater_;
  FusedAllReduce fusion_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Algorithm> chosen_;
  int64_t probe_steps_ = 20, probed_ = 0;
  double uneven_ratio_, bmuf_ratio_, dgc_ratio_;
  double compute_s_ = 0, comm_s_ = 0;
  Clock::time_point last_step_end_;
};

const bool kRegistered =
    RegisterAlgorithm("auto", [](const AlgorithmEnv& env) { return std::unique_ptr<Algorithm>(new Auto(env)); });

}  // namespace
}  // namespace shoal
