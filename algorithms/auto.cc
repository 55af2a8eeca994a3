// "auto": picks the algorithm from what it measures, not from a guess. It runs synchronous
// all-reduce while timing each worker's compute (the time between two Step calls) and the
// exchange, and from its third step agrees on the figures so far (each worker's means, its
// slowest step left out) in each step's gradient all-reduce (every worker decides the same). The
// probe ends once `probe_settle_steps` steps in a row give the same choice, weighed on at least
// 4 intervals and `probe_settle_s` seconds, or after `probe_steps` (its dense steps are the
// dearest where links are slow, which is where the choice settles soonest), and hands over to:
//   diloco    when the exchange costs > diloco_ratio x compute (the exchange dwarfs compute:
//             one exchange per sync_every steps, whatever the optimizer),
//   else the candidate with the least estimated time to target, seconds per step x steps:
//     allreduce  1 x (slowest compute + exchange); balanced (batches split by throughput,
//                the update still exact) when workers are uneven (slowest compute >
//                uneven_ratio x fastest) and the slowest's share stays above env.min_share,
//                then 1 x (harmonic-mean compute + exchange),
//     bmuf       bmuf_factor x (compute + exchange / block_steps), weighed when the
//                exchange costs > bmuf_ratio x compute,
//     adpsgd     adpsgd_factor x (harmonic-mean compute + exchange / 2), always weighed
//                (nobody waits at a barrier; one peer, half the bytes),
//     dgc        dgc_factor x (3 x slowest compute + exchange / 250), weighed when the
//                exchange costs > dgc_ratio x compute and the optimizer is momentum or SGD
//                (its top-k and sparse exchange cost about two computes more per step).
//   each plus the seconds per step its evaluations cost (EvaluationSeconds: allreduce and dgc
//   split them over the workers, the others do not). The factors (time to target beyond the
//   per-step estimate, relative to all-reduce: extra steps, waits the estimate leaves out) are
//   measured defaults, documented in docs/algorithms.md ("How auto chooses").
// The "auto" metrics event carries the figures behind the choice: measured compute and
// exchange, each candidate's estimated seconds per global step, the factors, the reason.
// Weights are identical on every worker at the hand-over (synchronous probe), which is the
// start point every algorithm's Init expects. The chosen algorithm's first communicator is
// auto's own, already wired: a new ring's rendezvous and CurveZMQ handshakes cost seconds on
// slow links (bench algorithms, scenario (d)).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>

#include "algorithms/algorithm.h"
#include "algorithms/collectives/fusion.h"
#include "algorithms/compressors/dgc_compressor.h"
#include "common/cpu_cgroup.h"

namespace shoal {
namespace {

using Clock = std::chrono::steady_clock;

// Auto's communicator lent to the algorithm it chose (auto itself no longer uses it); its
// bytes are those sent since the loan.
class LentCommunicator : public Communicator {
 public:
  explicit LentCommunicator(Communicator& c) : c_(c), base_(c.bytes_sent()) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  std::string Name() const override { return c_.Name(); }
  bool HandlesDeviceBuffers() const override { return c_.HandlesDeviceBuffers(); }
  void AllReduce(float* data, int64_t n, ReduceOp op, DType wire) override { c_.AllReduce(data, n, op, wire); }
  void AllReduceQuantized(float* data, int64_t n, ReduceOp op, BlockQuant q) override {
    c_.AllReduceQuantized(data, n, op, q);
  }
  void AllGather(const void* in, int64_t bytes, void* out) override { c_.AllGather(in, bytes, out); }
  void Broadcast(void* data, int64_t bytes, int root) override { c_.Broadcast(data, bytes, root); }
  void Barrier() override { c_.Barrier(); }
  int64_t bytes_sent() const override { return c_.bytes_sent() - base_; }

 private:
  Communicator& c_;
  const int64_t base_;
};

// What each candidate's time to target costs beyond its estimated seconds per step, relative
// to synchronous all-reduce: the extra steps (block averaging, staleness) and the waits the
// per-step estimate leaves out (an adpsgd worker whose gossip partner is the slow one waits
// for it). Measured with `./shoal bench heterogeneous`: docs/algorithms.md, "How auto chooses".
constexpr double kBmufFactor = 1.3;
constexpr double kAdpsgdFactor = 1.15;
// dgc at 99.9% sparsity took 1.6x bmuf's steps to target (about 2x all-reduce's) on the slow
// links of `./shoal bench algorithms`, and each of its steps cost 3x the probe's compute (21-22
// ms of training time a step against 6-7 ms, top-k and the sparse all-gather on the host; 1.8x
// was read against the compute the probe once inflated with its agreement's wait); its bytes per
// step were 293x fewer than a dense all-reduce's. docs/algorithms.md, "How auto chooses".
constexpr double kDgcFactor = 2.0;
constexpr double kDgcStepCompute = 3.0;
constexpr double kDgcBytesRatio = 250.0;
// The first probe step whose figures are weighed: two compute intervals (the first step has
// none before it).
constexpr int64_t kFirstWeighedStep = 3;
// Each worker's figures at the end of a weighed step's all-reduce: the mean compute and exchange
// seconds of its probe steps, the seconds it has measured, and its own CPU quota in cores.
constexpr int kFigures = 4;
// The fewest compute intervals a choice may settle on (the probe's own bound aside), so that
// one slow step left out leaves three. It also waits for `probe_settle_s` of measured steps on
// some worker (by default 1 s where a worker runs under a CPU quota: ten of its periods, whose
// throttled steps a few steps can miss; none elsewhere, as on slow links dense steps are dear).
constexpr int64_t kMinSettledIntervals = 4;

// The mean of a worker's probe intervals without the slowest of them (from three on). One slow
// step (a moment of load beside the job, a page-in) is not the worker's speed: a plain mean over
// a few steps read it so (seen once: beside a compile, links about 50x compute weighed under
// 10x). Not a median: a worker under a CPU quota runs a few steps fast, then waits out the
// quota's period, and a median reads the fast steps; the mean is its throughput.
double MeanWithoutSlowest(const std::vector<float>& v) {
  if (v.empty()) return 0;
  double sum = 0;
  for (float x : v) sum += x;
  if (v.size() < 3) return sum / double(v.size());
  return (sum - *std::max_element(v.begin(), v.end())) / double(v.size() - 1);
}

class Auto : public Algorithm {
 public:
  explicit Auto(const AlgorithmEnv& env)
      : env_(env),
        updater_(env),
        fusion_(env.config->algorithm_opts.GetInt("bucket_bytes", 4 << 20, 1024, int64_t(1) << 32)) {
    const ConfigSection& a = env.config->algorithm_opts;
    probe_steps_ = a.GetInt("probe_steps", 20, 2, 1 << 20);
    probe_settle_steps_ = a.GetInt("probe_settle_steps", 3, 1, 1 << 20);
    // A worker under a CPU quota runs in bursts (its quota, then the rest of the period
    // throttled), which a few short steps can miss: the probe then spans ten periods. Steady
    // workers need no such wait, and on slow links it cost 3-4 dense steps. A worker's quota is
    // the job file's for it, else one set outside Shoal (a container's, Slurm's) that only it can
    // read; each sends its own with its figures, and by default the probe waits where any has one.
    const std::vector<WorkerSpec>& workers = env.config->workers;
    const double file_quota = size_t(env.rank) < workers.size() ? workers[size_t(env.rank)].cpu_quota : 0.0;
    const double own = file_quota > 0 ? 0.0 : OwnCpuQuota();
    // A limit of every core the process may run on throttles nothing.
    cpu_quota_ = file_quota > 0 ? file_quota : own < double(AllowedCores()) ? own : 0.0;
    probe_settle_s_ = a.Has("probe_settle_s") ? a.GetDouble("probe_settle_s", 1.0, 0, 1e6) : -1;
    uneven_ratio_ = a.GetDouble("uneven_ratio", 1.5, 1, 1e6);
    bmuf_ratio_ = a.GetDouble("bmuf_ratio", 1.0, 0, 1e6);
    dgc_ratio_ = a.GetDouble("dgc_ratio", 4.0, 0, 1e6);
    diloco_ratio_ = a.GetDouble("diloco_ratio", 100.0, 0, 1e6);
    sync_every_ = a.GetInt("sync_every", 100, 1, 1 << 30);
    may_balance_ = a.GetBool("balance", true);
    block_steps_ = a.GetInt("block_steps", 8, 1, 1 << 30);
    bmuf_factor_ = a.GetDouble("bmuf_factor", kBmufFactor, 0.01, 100);
    adpsgd_factor_ = a.GetDouble("adpsgd_factor", kAdpsgdFactor, 0.01, 100);
    dgc_factor_ = a.GetDouble("dgc_factor", kDgcFactor, 0.01, 100);
    comm_ = env.make_communicator("auto");
  }
  std::string Name() const override { return chosen_ ? "auto:" + chosen_->Name() : "auto"; }

  void Init(const std::vector<ParamView>& params) override {
    StartFromRankZero(*comm_, params);
    last_step_end_ = Clock::now();
  }

  void Step(const std::vector<ParamView>& params, const StepInfo& info) override {
    if (chosen_) return chosen_->Step(params, info);
    auto t0 = Clock::now();
    if (probed_ > 0) compute_s_.push_back(float(std::chrono::duration<double>(t0 - last_step_end_).count()));
    fusion_.Pack(params);
    // From the weighed steps on, this worker's figures so far ride at the end of the gradients'
    // all-reduce, each worker in its own slot: every worker then weighs the same figures. A
    // collective of their own after the step (an all-gather, until 2026-11-26) waits for the
    // worker whose all-reduce ended last (on slow links a ring's workers end a chunk's transfer
    // apart), and that wait read as the next step's compute: 10-25x the others' on CI's loaded
    // cores. Left out of the interval instead, a quota's throttling that fell in it went unseen.
    std::vector<float>& fused = fusion_.buffer();
    const size_t grads = fused.size();
    const bool weigh = probed_ + 1 >= std::min<int64_t>(kFirstWeighedStep, probe_steps_);
    const int W = comm_->size();
    if (weigh) {
      fused.resize(grads + size_t(kFigures * W), 0.0f);
      const float mine[kFigures] = {float(MeanWithoutSlowest(compute_s_)), float(MeanWithoutSlowest(comm_s_)),
                                    Measured(), float(cpu_quota_)};
      std::copy(mine, mine + kFigures, fused.begin() + std::ptrdiff_t(grads + size_t(kFigures * env_.rank)));
    }
    fusion_.Run(*comm_, DType::kF32);
    std::vector<double> all;  // [compute, comm, measured, cpu quota] of every worker
    for (size_t i = grads; i < fused.size(); ++i) all.push_back(double(fused[i]) * W);  // the mean's W-th undone
    fused.resize(grads);
    fusion_.UnpackInto(params);
    auto t1 = Clock::now();
    if (probed_ > 0) comm_s_.push_back(float(std::chrono::duration<double>(t1 - t0).count()));
    updater_.Apply(params, info.step);
    ++probed_;
    if (weigh) {
      Verdict v = Weigh(all);
      const std::string key = v.choice + (v.balance ? "+balance" : "");
      settled_ = key == last_key_ ? settled_ + 1 : 1;
      last_key_ = key;
      const double settle_s = probe_settle_s_ >= 0 ? probe_settle_s_ : v.any_cpu_quota ? 1.0 : 0.0;
      const bool settled = settled_ >= probe_settle_steps_ && int64_t(compute_s_.size()) >= kMinSettledIntervals &&
                           v.probe_s >= settle_s;
      if (settled || probed_ >= probe_steps_) return HandOver(v, params);
    }
    last_step_end_ = Clock::now();
  }

  void Finish(const std::vector<ParamView>& params) override {
    if (chosen_) chosen_->Finish(params);
  }
  bool ModelChangedAtFinish() const override { return chosen_ && chosen_->ModelChangedAtFinish(); }
  int64_t skipped_steps() const override { return updater_.skipped() + (chosen_ ? chosen_->skipped_steps() : 0); }
  bool AgreeToStop(bool mine) override {
    if (chosen_) return chosen_->AgreeToStop(mine);
    const bool stop = AnyRank(*comm_, mine);
    // Asked after each evaluation: the evaluation and this agreement's wait for the slowest
    // evaluator are no step's compute (EvaluationSeconds weighs them apart).
    last_step_end_ = Clock::now();
    return stop;
  }
  Communicator* peers() override { return comm_.get(); }
  // The probe's steps leave identical weights; after the hand-over, the choice says.
  Communicator* EvaluationPeers() override { return chosen_ ? chosen_->EvaluationPeers() : comm_.get(); }
  int OutputRank() const override { return chosen_ ? chosen_->OutputRank() : 0; }
  // On another number of workers: the mean of the workers' models (adpsgd's differ; the
  // synchronous choices' agree).
  std::vector<std::string> AveragedOnReshape() const override { return {"w/", "adpsgd/model"}; }
  std::string ReshapeNote() const override { return chosen_ ? chosen_->ReshapeNote() : ""; }
  int64_t bytes_sent() const override { return chosen_ ? probe_bytes_ + chosen_->bytes_sent() : comm_->bytes_sent(); }
  // Its choice, so a resumed job runs what was chosen (measuring again could choose
  // otherwise midway), and the chosen algorithm's state; while probing, the probe's.
  void SaveState(const std::vector<ParamView>& params, CheckpointState* out) override {
    out->Put("auto/choice", chosen_ ? chosen_->Name() : std::string());
    out->PutInt("auto/balance", balanced_ ? 1 : 0);
    if (chosen_) return chosen_->SaveState(params, out);
    updater_.Save(params, "opt/", out);
    out->PutInt("auto/probed", probed_);
    out->PutFloats("auto/compute_steps_s", compute_s_);
    out->PutFloats("auto/comm_steps_s", comm_s_);
  }
  void LoadState(const std::vector<ParamView>& params, const CheckpointState& in) override {
    const std::string choice = in.Get("auto/choice");
    if (!choice.empty()) {
      probed_ = probe_steps_;
      balanced_ = in.Has("auto/balance") && in.GetInt("auto/balance") != 0;
      chosen_ = MakeChosen(choice);
      chosen_->Init(params);       // wires its communicator; sets weights to rank 0's
      RestoreWeights(in, params);  // each worker's own again
      chosen_->LoadState(params, in);
      return;
    }
    updater_.Load(params, "opt/", in);
    probed_ = in.GetInt("auto/probed");
    const size_t n = size_t(std::max<int64_t>(0, probed_ - 1));
    if (in.Has("auto/compute_steps_s")) {
      compute_s_ = in.GetFloatVector("auto/compute_steps_s", n);
      comm_s_ = in.GetFloatVector("auto/comm_steps_s", n);
    } else {  // written before the per-step figures: their sums, spread evenly
      compute_s_.assign(n, float(in.GetDouble("auto/compute_s") / double(std::max<size_t>(1, n))));
      comm_s_.assign(n, float(in.GetDouble("auto/comm_s") / double(std::max<size_t>(1, n))));
    }
    last_step_end_ = Clock::now();
  }
  bool BalancesBatches() const override { return chosen_ && chosen_->BalancesBatches(); }
  // Overlap ([algorithm] overlap) is the chosen algorithm's; the probe steps exchange after
  // the backward pass.
  bool WantsGradReady() const override { return chosen_ && chosen_->WantsGradReady(); }
  void BeginBackward(const std::vector<ParamView>& params) override { chosen_->BeginBackward(params); }
  void GradReady(const std::vector<ParamView>& params, size_t index) override { chosen_->GradReady(params, index); }
  void AddMetrics(JsonObject* out) const override {
    out->Add("auto_choice", chosen_ ? chosen_->Name() : std::string("probing"));
    if (chosen_) chosen_->AddMetrics(out);
  }

 private:
  // The chosen algorithm, balancing batches when Weigh said so (else as the job says). Its
  // first communicator is auto's (the flag is shared by the copies of the env it may keep).
  std::unique_ptr<Algorithm> MakeChosen(const std::string& choice) {
    AlgorithmEnv e = env_;
    if (balanced_) e.balance = 1;
    probe_bytes_ = comm_->bytes_sent();
    auto lent = std::make_shared<bool>(false);
    e.make_communicator = [this, lent, make = env_.make_communicator](const std::string& name) {
      if (*lent) return make(name);
      *lent = true;
      return std::unique_ptr<Communicator>(new LentCommunicator(*comm_));
    };
    return MakeAlgorithm(choice, e);
  }

  // One algorithm auto may hand over to, with what the model says it costs.
  struct Candidate {
    std::string name;
    double step_s;      // estimated seconds per global step (what the probe measured)
    double factor;      // its time to target / (step_s x all-reduce's steps): extra steps, unmodelled waits
    double eval_s = 0;  // its evaluations' seconds per step (EvaluationSeconds)
    double to_target() const { return (step_s + eval_s) * factor; }
  };

  // Seconds per step the job waits for evaluations: every eval_every_steps steps and at each
  // epoch's end the workers score the test set, and the others wait for the slowest (bmuf and
  // adpsgd too: the next exchange meets it). A forward pass costs about a third of a training
  // step (the backward pass twice the forward), so a worker scores a sample in about c / (3 b).
  // Where the workers hold one model (allreduce, dgc) each scores a world-th of the set
  // (Algorithm::EvaluationPeers); elsewhere each scores all of it. With an evaluation every
  // 10 steps on 5,000 samples, that was most of the time to target under CPU quotas.
  double EvaluationSeconds(double cmax, bool split) const {
    const JobConfig& c = *env_.config;
    const double per_step = (c.eval_every_steps > 0 ? 1.0 / double(c.eval_every_steps) : 0.0) +
                            1.0 / double(std::max<int64_t>(1, env_.steps_per_epoch));
    const double scored = double(env_.test_samples) / (split ? double(comm_->size()) : 1.0);
    return per_step * scored * cmax / (3.0 * double(std::max<int64_t>(1, c.batch_size)));
  }

  // What the figures so far say, agreed by every worker.
  struct Verdict {
    std::string choice, reason;
    bool balance = false;
    double compute_min = 0, compute_max = 0, exchange = 0;
    double probe_s = 0;          // the longest a worker has measured (its steps' compute and exchange)
    bool any_cpu_quota = false;  // some worker runs under a CPU quota
    std::vector<std::pair<const char*, double>> figures;  // what it weighed, for the auto event
  };

  // Seconds this worker has measured so far (its steps' compute and exchange).
  float Measured() const {
    double measured = 0;
    for (float x : compute_s_) measured += x;
    for (float x : comm_s_) measured += x;
    return float(measured);
  }

  // `all`: kFigures of every worker, the same on every worker, which so decides the same.
  Verdict Weigh(const std::vector<double>& all) {
    const int W = comm_->size();
    double cmax = 0, cmin = 1e300, comm = 0, inv_sum = 0, probe_s = 0;
    int quotas = 0;  // workers under a CPU quota
    for (int r = 0; r < W; ++r) {
      const double c = all[size_t(kFigures * r)];
      cmax = std::max(cmax, c);
      cmin = std::min(cmin, c);
      comm = std::max(comm, all[size_t(kFigures * r + 1)]);
      probe_s = std::max(probe_s, all[size_t(kFigures * r + 2)]);
      quotas += all[size_t(kFigures * r + 3)] > 0 ? 1 : 0;
      inv_sum += c > 0 ? 1.0 / c : 0;
    }
    // Exchange time beyond what waiting for the slowest explains.
    double exchange = std::max(0.0, comm - (cmax - cmin));
    // Balanced compute per global step: the batch split by throughput (samples/s = b/c_r)
    // takes W b / sum(b/c_r), the harmonic mean of the per-worker step times.
    const double hmean = inv_sum > 0 ? double(W) / inv_sum : cmax;
    const int64_t global = env_.config->batch_size * W;
    // The slowest worker's share of the global batch once balanced.
    const double slowest_share = inv_sum > 0 && cmax > 0 ? double(global) * (1.0 / cmax) / inv_sum : 0;
    const bool uneven = W > 1 && cmin > 0 && cmax / cmin > uneven_ratio_;
    const bool can_balance = may_balance_ && slowest_share >= double(std::max<int64_t>(1, env_.min_share));
    const bool balance = uneven && can_balance;
    // Estimated seconds per global step: what the probe measured (adpsgd gossips one model
    // with one peer, about half a ring all-reduce's bytes, and nobody waits for the slowest;
    // bmuf exchanges 1/block_steps the bytes).
    const double compute = balance ? hmean : cmax;
    const double est_allreduce = cmax + exchange, est_balanced = hmean + exchange;
    const double est_bmuf = compute + exchange / double(block_steps_);
    const double est_adpsgd = hmean + exchange / 2;
    const double est_diloco = cmax + exchange / double(sync_every_);  // chosen unbalanced
    // dgc's top-k and sparse exchange on the host cost about two computes more per step (measured,
    // not seen by the probe); its bytes are a few hundredth of dense. Unbalanced.
    const double est_dgc = kDgcStepCompute * cmax + exchange / kDgcBytesRatio;
    // Candidates, each at its seconds per step x its steps to target (docs/algorithms.md, "How
    // auto chooses"); bmuf is weighed where the exchange costs more than bmuf_ratio x compute,
    // dgc (momentum or SGD only: it corrects momentum itself) where it costs dgc_ratio x.
    // adpsgd always: on equal workers too its half-sized exchange without a barrier can beat
    // all-reduce once the exchange is a third of compute (bench algorithms, scenario (a)).
    const double eval_split = EvaluationSeconds(cmax, true), eval_whole = EvaluationSeconds(cmax, false);
    std::vector<Candidate> candidates = {{"allreduce", balance ? est_balanced : est_allreduce, 1.0, eval_split}};
    if (exchange > bmuf_ratio_ * compute) candidates.push_back({"bmuf", est_bmuf, bmuf_factor_, eval_whole});
    candidates.push_back({"adpsgd", est_adpsgd, adpsgd_factor_, eval_whole});
    if (DgcRunsUnder(env_.config->optimizer) && exchange > dgc_ratio_ * cmax)
      candidates.push_back({"dgc", est_dgc, dgc_factor_, eval_split});
    const Candidate* best = &candidates[0];
    for (auto& c : candidates)
      if (c.to_target() < best->to_target()) best = &c;
    std::string choice = best->name, reason;
    if (W == 1) {
      choice = "allreduce", reason = "one worker";
    } else if (exchange > diloco_ratio_ * cmax) {
      choice = "diloco";
      reason = "exchange > diloco_ratio x compute";
    } else {
      char buf[256];
      std::string others;
      for (auto& c : candidates)
        if (&c != best) {
          snprintf(buf, sizeof buf, "%s%s %.1f", others.empty() ? "" : ", ", c.name.c_str(), c.to_target() * 1e3);
          others += buf;
        }
      snprintf(buf, sizeof buf, "%s%s: lowest est. ms per all-reduce step to target (%.1f%s%s)%s",
               uneven ? "uneven workers, " : "", choice.c_str(), best->to_target() * 1e3, others.empty() ? "" : " vs ",
               others.c_str(),
               uneven && !can_balance ? (may_balance_ ? "; balanced share under min_share" : "; balance = false") : "");
      reason = buf;
    }
    // allreduce and bmuf balance as weighed (adpsgd waits for nobody; diloco is chosen for its
    // links, before the workers' speeds are weighed; dgc's top-k is per worker).
    Verdict v;
    v.balance = balance && (choice == "allreduce" || choice == "bmuf");
    v.choice = choice;
    v.reason = reason;
    v.compute_min = cmin, v.compute_max = cmax, v.exchange = exchange, v.probe_s = probe_s;
    v.any_cpu_quota = quotas > 0;
    v.figures = {{"compute_min_s", cmin},
                 {"compute_max_s", cmax},
                 {"compute_balanced_s", hmean},
                 {"exchange_s", exchange},
                 {"slowest_share", slowest_share},
                 {"est_allreduce_s", est_allreduce},
                 {"est_balanced_allreduce_s", est_balanced},
                 {"est_bmuf_s", est_bmuf},
                 {"est_adpsgd_s", est_adpsgd},
                 {"est_diloco_s", est_diloco},
                 {"est_dgc_s", est_dgc},
                 {"eval_split_s", eval_split},
                 {"eval_whole_s", eval_whole},
                 {"cpu_quota_workers", double(quotas)},
                 {"bmuf_factor", bmuf_factor_},
                 {"adpsgd_factor", adpsgd_factor_},
                 {"dgc_factor", dgc_factor_}};
    return v;
  }

  void HandOver(const Verdict& v, const std::vector<ParamView>& params) {
    balanced_ = v.balance;
    const auto t0 = Clock::now();
    chosen_ = MakeChosen(v.choice);
    chosen_->Init(params);
    const double handover = std::chrono::duration<double>(Clock::now() - t0).count();
    if (env_.rank == 0)
      printf(
          "auto: compute %.1f-%.1f ms/step, exchange %.1f ms/step over %d workers, %lld probe steps -> %s%s (%s; "
          "handed over in %.0f ms)\n",
          v.compute_min * 1e3, v.compute_max * 1e3, v.exchange * 1e3, comm_->size(), (long long)probed_,
          v.choice.c_str(), balanced_ ? ", balanced" : "", v.reason.c_str(), handover * 1e3);
    if (env_.metrics) {
      JsonObject e = JsonObject().Add("rank", env_.rank).Add("choice", v.choice).Add("balance", balanced_);
      e.Add("reason", v.reason).Add("probe_steps", probed_).Add("handover_s", handover);
      for (auto& [key, value] : v.figures) e.Add(key, value);
      env_.metrics->Write("auto", probed_, e);
    }
  }

  AlgorithmEnv env_;
  LocalUpdater updater_;
  FusedAllReduce fusion_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Algorithm> chosen_;
  int64_t probe_steps_ = 20, probe_settle_steps_ = 3, probed_ = 0;
  double probe_settle_s_ = 1.0;  // below 0: 1 s if some worker runs under a CPU quota, else 0
  double cpu_quota_ = 0;         // this worker's, in cores (the job file's, else OwnCpuQuota); 0: none
  std::string last_key_;         // the last weighed choice (with "+balance") and how many steps in a row gave it
  int64_t settled_ = 0;
  double uneven_ratio_, bmuf_ratio_, dgc_ratio_, diloco_ratio_;
  bool may_balance_ = true, balanced_ = false;
  int64_t block_steps_ = 8, sync_every_ = 100;
  double bmuf_factor_, adpsgd_factor_, dgc_factor_;
  std::vector<float> compute_s_, comm_s_;  // this worker's seconds per probe step (from the second)
  int64_t probe_bytes_ = 0;                // auto's communicator's bytes before the loan
  Clock::time_point last_step_end_;
};

const bool kRegistered =
    RegisterAlgorithm("auto", [](const AlgorithmEnv& env) { return std::unique_ptr<Algorithm>(new Auto(env)); });

}  // namespace
}  // namespace shoal
