// "diloco": DiLoCo (Douillard et al. 2023). Every worker runs `sync_every` inner steps of the
// job's [optimizer] (typically adamw; its state stays on the worker, as in the paper) from
// the global weights, then the workers average their pseudo-gradients (global minus local,
// weighted by the samples each processed) over the ring and every worker applies the same
// outer step (algorithms/outer_optimizer.h: Nesterov momentum or SGD) to the global weights,
// from which all continue. Built on bmuf's block bookkeeping (algorithms/local_block.h).
// outer_wire picks how pseudo-gradients travel: fp32 or bf16 through the ring's all-reduce,
// or int8 / int4 with a scale per block of 256 (algorithms/compressors/block_quant.h) through
// Communicator::AllReduceQuantized; every worker applies the same decoded values.
//
// streaming = N (Streaming DiLoCo, Douillard et al. 2025): the model in N fragments of equal
// size, fragment f exchanged after the steps s with s mod sync_every = f x sync_every / N
// (staggered, so each exchange carries about 1/N of the model). Its exchange runs on a thread
// of its own communicator while the inner steps go on; overlap_steps later every worker waits
// for it, applies the outer step to the fragment's global weights and merges them into its
// local weights (local = merge_alpha x local + (1 - merge_alpha) x global). A fixed delay, not
// "whenever it arrives", so runs repeat bit for bit and a checkpoint resumes exactly. Finish
// lands the exchange in flight, exchanges every fragment that moved since its last exchange,
// and every worker ends on the global weights.
//
// elastic = true: the outer steps run among the live workers (algorithms/live_quorum.h): a
// worker lost between two of them drops out of the average (weighted by the samples each
// member processed, over the members only), and one restarted alone (--rejoin) joins at the
// next outer step: the lowest other member broadcasts the global weights, the outer momentum,
// the rounds done and the step, it adds nothing to that step's average and trains on from
// there (its shard at that global step). The stop votes are rounds of their own.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <thread>

#include "algorithms/algorithm.h"
#include "algorithms/compressors/block_quant.h"
#include "algorithms/job_keys.h"
#include "algorithms/live_quorum.h"
#include "algorithms/local_block.h"
#include "algorithms/outer_optimizer.h"
#include "common/error.h"
#include "common/int_list.h"
#include "common/metrics.h"

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

// A fragment: flat elements [begin, end) of the model (the outer step is elementwise, so a
// fragment may cut a tensor; fragment k of N is [k n / N, (k+1) n / N)).
struct Fragment {
  int64_t begin = 0, end = 0;
  int64_t steps = 0, samples = 0, global_samples = 0;  // since its last exchange: steps, mine, everyone's
};

// fn(w, i, count): the weights of flat elements [i, i + count) of `params` within [begin, end).
template <typename Fn>
void ForRange(const std::vector<ParamView>& params, int64_t begin, int64_t end, Fn fn) {
  int64_t off = 0;
  for (auto& p : params) {
    const int64_t b = std::max(begin, off), e = std::min(end, off + p.n);
    if (b < e) fn(p.w + (b - off), b, e - b);
    off += p.n;
  }
}

class Diloco : public LocalBlockAlgorithm {
 public:
  explicit Diloco(const AlgorithmEnv& env)
      : LocalBlockAlgorithm(env, "diloco", "sync_every", 100, !SurvivesLostWorkers(*env.config)),
        elastic_(SurvivesLostWorkers(*env.config)) {
    const ConfigSection& a = env.config->algorithm_opts;
    outer_.rule = ParseOuterRule(a);
    outer_.lr = float(a.GetDouble("outer_lr", 0.7, 0, 1000));
    outer_.momentum = float(a.GetDouble("outer_momentum", outer_.rule == OuterRule::kNesterov ? 0.9 : 0.0, 0, 0.9999));
    wire_ = ParseOuterWire(a);
    wire_name_ = a.GetString("outer_wire", "fp32");
    const int64_t H = block_.steps();
    streaming_ = a.GetInt("streaming", 0, 0, H);
    if (streaming_ > 0) {
      overlap_steps_ = a.GetInt("overlap_steps", 1, 0, H / streaming_ - 1);
      merge_alpha_ = float(a.GetDouble("merge_alpha", 0.5, 0, 1));
      stream_comm_ = env.make_communicator("diloco_stream");
    } else {
      for (const char* k : {"overlap_steps", "merge_alpha"})
        if (a.Has(k)) throw InputError(a.Where(k) + ": only with streaming = N (N >= 1)");
    }
  }
  ~Diloco() override {
    if (thread_.joinable()) thread_.join();
  }
  std::string Name() const override { return "diloco"; }

  void Init(const std::vector<ParamView>& params) override {
    if (elastic_) {
      quorum_ = std::make_unique<LiveQuorum>(env_, "diloco-live");
      block_.StartAt(params);
      momentum_.assign(size_t(block_.elements()), 0.f);
      if (env_.rejoin) return Rejoin(params);
      // --resume starts every worker together: a ring of all hands a worker absent from the
      // checkpoint a holder's copy (WorkerCheckpoints::Resume); LoadState drops it.
      if (env_.resume) comm_ = env_.make_communicator("diloco");
      RoundAmongMembers(/*admit_joiners=*/false, [&](Communicator& ring) {  // round 0: every worker that started
        StartFromRankZero(ring, params);
      });
      block_.StartAt(params);
      return;
    }
    StartFirstBlock(params);
    momentum_.assign(size_t(block_.elements()), 0.f);
    for (int64_t k = 0; k < streaming_; ++k)
      fragments_.push_back(Fragment{k * block_.elements() / streaming_, (k + 1) * block_.elements() / streaming_});
  }
  void Step(const std::vector<ParamView>& params, const StepInfo& info) override {
    next_step_ = info.step + 1;
    if (streaming_ == 0) return LocalStep(params, info);
    updater_.Apply(params, info.step);
    for (auto& f : fragments_) {
      ++f.steps;
      f.samples += info.samples;
      f.global_samples += info.global_samples;
    }
    const int64_t done = info.step + 1, H = block_.steps();
    if (pending_ >= 0 && done == merge_after_) Land(params);
    for (size_t k = 0; k < fragments_.size(); ++k)
      if (done % H == int64_t(k) * H / streaming_) {
        Send(params, k, done);
        if (overlap_steps_ == 0) Land(params);
      }
  }
  void Finish(const std::vector<ParamView>& params) override {
    finishing_ = true;  // a newcomer would start training after everyone stopped
    if (streaming_ == 0) {
      LocalBlockAlgorithm::Finish(params);
      if (quorum_) quorum_->End();
    } else {
      if (pending_ >= 0) Land(params);
      for (size_t k = 0; k < fragments_.size(); ++k) {  // a last exchange of what moved since
        if (fragments_[k].steps == 0) continue;
        Send(params, k, 0);
        Join();
        pending_ = -1;
      }
      const float* global = block_.start().data();  // every worker ends on the global model
      ForRange(params, 0, block_.elements(),
               [&](float* w, int64_t i, int64_t count) { std::copy(global + i, global + i + count, w); });
    }
    if (env_.rank == 0)
      printf("diloco: %lld outer steps%s, %s pseudo-gradients, %lld bytes sent per outer step by rank 0\n",
             (long long)OuterSteps(), streaming_ ? " (one fragment each)" : "", wire_name_.c_str(),
             (long long)BytesPerOuterStep());
  }
  int64_t bytes_sent() const override {
    return (quorum_ ? quorum_->bytes_sent() : comm_->bytes_sent()) + stream_bytes_;
  }
  bool AgreeToStop(bool mine) override {
    if (!elastic_) return LocalBlockAlgorithm::AgreeToStop(mine);
    bool any = false;
    RoundAmongMembers(/*admit_joiners=*/false, [&](Communicator& ring) { any = AnyRank(ring, mine); });
    return any;
  }
  int64_t ResumedStep() const override { return std::max<int64_t>(0, rejoined_at_); }
  // Elastic: the workers that were no members of the last round (lost, or restarted and not
  // yet back), and those it took in at this very step (they train from the step after it).
  std::vector<uint32_t> CheckpointAbsent(int64_t step) const override {
    if (!quorum_) return {};
    std::vector<uint32_t> out;
    const std::vector<int>& m = quorum_->members();
    const std::vector<int>& j = quorum_->joiners();
    for (int r = 0; r < env_.world; ++r)
      if (std::find(m.begin(), m.end(), r) == m.end() || (round_step_ == step && std::count(j.begin(), j.end(), r)))
        out.push_back(uint32_t(r));
    return out;
  }

  int OutputRank() const override {
    if (!quorum_ || quorum_->members().empty()) return 0;
    const std::vector<int>& m = quorum_->members();
    return *std::min_element(m.begin(), m.end());
  }

  std::string ReshapeNote() const override { return "diloco starts its round again from the shared global weights"; }
  void AddMetrics(JsonObject* out) const override {
    out->Add("outer_steps", OuterSteps()).Add("bytes_per_outer_step", BytesPerOuterStep());
  }
  // Each worker's own weights and inner optimizer state (mid-round they differ) and the
  // shared global weights (the block's start), outer momentum and place in the round.
  // Streaming: an exchange in flight is settled (its outer step applied) and its merge saved
  // as due, with every fragment's samples since its last exchange.
  void SaveState(const std::vector<ParamView>& params, CheckpointState* out) override {
    if (pending_ >= 0) Join();
    SaveBlock(params, out);
    out->PutFloats("diloco/momentum", momentum_);
    out->PutInt("diloco/outer_bytes", outer_bytes_);
    if (streaming_ == 0) return;
    out->PutInt("diloco/exchanges", exchanges_);
    out->PutInt("diloco/stream_bytes", stream_bytes_);
    out->PutInt("diloco/pending", pending_);
    out->PutInt("diloco/merge_after", merge_after_);
    for (size_t k = 0; k < fragments_.size(); ++k) {
      out->PutInt("diloco/steps/" + std::to_string(k), fragments_[k].steps);
      out->PutInt("diloco/samples/" + std::to_string(k), fragments_[k].samples);
      out->PutInt("diloco/global_samples/" + std::to_string(k), fragments_[k].global_samples);
    }
  }
  void LoadState(const std::vector<ParamView>& params, const CheckpointState& in) override {
    momentum_ = in.GetFloatVector("diloco/momentum", momentum_.size());
    if (elastic_) comm_.reset();  // its resume is done: from here on the rounds meet the live workers
    // Written by another worker (this one was not a member of its round): the global state only.
    if (std::count(in.record.absent.begin(), in.record.absent.end(), uint32_t(env_.rank)) > 0)
      return LoadSharedBlock(params, in);
    outer_bytes_ = in.GetInt("diloco/outer_bytes");
    LoadBlock(params, in);
    if (streaming_ == 0) return;
    SHOAL_CHECK(in.Has("diloco/pending"),
                "checkpoint " + std::to_string(in.record.id) +
                    ": written without streaming, this job has streaming = " + std::to_string(streaming_));
    exchanges_ = in.GetInt("diloco/exchanges");
    stream_bytes_ = in.GetInt("diloco/stream_bytes");
    if (in.record.shards != uint32_t(env_.world)) return;  // LoadBlock put every worker on the global model
    pending_ = in.GetInt("diloco/pending");
    merge_after_ = in.GetInt("diloco/merge_after");
    SHOAL_CHECK(pending_ >= -1 && pending_ < int64_t(fragments_.size()),
                "checkpoint " + std::to_string(in.record.id) + ": fragment " + std::to_string(pending_) + " of " +
                    std::to_string(fragments_.size()) + " (was streaming changed?)");
    joined_ = true;
    for (size_t k = 0; k < fragments_.size(); ++k) {
      fragments_[k].steps = in.GetInt("diloco/steps/" + std::to_string(k));
      fragments_[k].samples = in.GetInt("diloco/samples/" + std::to_string(k));
      fragments_[k].global_samples = in.GetInt("diloco/global_samples/" + std::to_string(k));
    }
  }

 private:
  int64_t OuterSteps() const { return streaming_ ? exchanges_ : block_.blocks(); }
  // This worker's bytes on the wire per outer step, on average (the stop votes not counted).
  int64_t BytesPerOuterStep() const { return OuterSteps() > 0 ? outer_bytes_ / OuterSteps() : 0; }

  // Starts fragment k's exchange (after `done` steps): its sample-weighted pseudo-gradient,
  // averaged on a thread over the streaming communicator.
  void Send(const std::vector<ParamView>& params, size_t k, int64_t done) {
    SHOAL_CHECK(pending_ < 0, "diloco: fragment " + std::to_string(k) + "'s exchange would start while fragment " +
                                  std::to_string(pending_) + "'s is in flight");
    Fragment& f = fragments_[k];
    const float* global = block_.start().data();
    buf_.resize(size_t(f.end - f.begin));
    ForRange(params, f.begin, f.end, [&](const float* w, int64_t i, int64_t count) {
      for (int64_t j = 0; j < count; ++j) buf_[size_t(i - f.begin + j)] = global[i + j] - w[j];
    });
    StepInfo round;
    round.samples = f.samples;
    round.global_samples = f.global_samples;
    const float weight = float(GradientWeight(round, stream_comm_->size()));
    if (weight != 1.f)
      for (auto& d : buf_) d *= weight;
    f.steps = f.samples = f.global_samples = 0;
    pending_ = int64_t(k);
    merge_after_ = done + overlap_steps_;
    joined_ = false;
    sent_before_ = stream_comm_->bytes_sent();
    thread_ = std::thread([this] {
      try {
        MeanOverWorkers(*stream_comm_, buf_.data(), int64_t(buf_.size()));
      } catch (...) {
        error_ = std::current_exception();
      }
    });
  }
  // Waits for the exchange in flight and applies its outer step to the fragment's global
  // weights (once).
  void Join() {
    if (joined_) return;
    thread_.join();
    joined_ = true;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    const Fragment& f = fragments_[size_t(pending_)];
    ApplyOuterStep(outer_, buf_.data(), f.end - f.begin, block_.start().data() + f.begin, momentum_.data() + f.begin);
    const int64_t sent = stream_comm_->bytes_sent() - sent_before_;
    outer_bytes_ += sent;
    stream_bytes_ += sent;
    ++exchanges_;
  }
  // The exchange lands: the fragment's local weights merge with its new global ones.
  void Land(const std::vector<ParamView>& params) {
    Join();
    const Fragment& f = fragments_[size_t(pending_)];
    const float* global = block_.start().data();
    ForRange(params, f.begin, f.end, [&](float* w, int64_t i, int64_t count) {
      for (int64_t j = 0; j < count; ++j) w[j] = merge_alpha_ * w[j] + (1 - merge_alpha_) * global[i + j];
    });
    pending_ = -1;
  }

  // The outer step: the mean pseudo-gradient through the outer optimizer into the global
  // weights, from which every worker goes on.
  void EndBlock(const std::vector<ParamView>& params) override {
    if (elastic_) {
      std::vector<float> delta;
      RoundAmongMembers(/*admit_joiners=*/!finishing_, [&](Communicator& ring) {
        if (!quorum_->joiners().empty()) ShareState(ring, params);
        delta = MeanAmongMembers(ring, params);
      });
      ApplyOuterStepAndRestart(delta, params);
      if (!quorum_->joiners().empty()) LogJoinRound("join_round", params);
      return;
    }
    std::vector<float> delta = block_.WeightedDelta(params, comm_->size());
    const int64_t before = comm_->bytes_sent();
    MeanOverWorkers(*comm_, delta.data(), block_.elements());
    outer_bytes_ += comm_->bytes_sent() - before;
    ApplyOuterStepAndRestart(delta, params);
  }

  // elastic: `fn(ring)` in rounds among the live workers until one completed on every member
  // (a member lost in it: again among those left). fn must leave no state changed that a
  // second call would not set again.
  template <typename Fn>
  void RoundAmongMembers(bool admit_joiners, Fn&& fn) {
    while (true) {
      Communicator& ring = quorum_->Enter(admit_joiners, next_step_);
      if (quorum_->Settle(Attempt(ring, fn))) break;
    }
    round_step_ = next_step_;
  }
  template <typename Fn>
  bool Attempt(Communicator& ring, Fn&& fn) {
    try {
      fn(ring);
      return true;
    } catch (const Error& e) {
      fprintf(stderr, "worker %d: outer round %lld: %s\n", env_.rank, (long long)quorum_->round(), e.what());
      return false;
    }
  }
  // The members' pseudo-gradients, each weighted by its share of the samples the members
  // processed in the round (a newcomer's share is 0), summed over the ring.
  std::vector<float> MeanAmongMembers(Communicator& ring, const std::vector<ParamView>& params) {
    const int64_t before = ring.bytes_sent();
    const int64_t mine = block_.block_samples();
    std::vector<int64_t> samples(size_t(ring.size()));
    ring.AllGather(&mine, sizeof mine, samples.data());
    int64_t total = 0;
    for (int64_t s : samples) total += s;
    std::vector<float> delta = block_.Delta(params, total > 0 ? float(double(mine) / double(total)) : 0.f);
    Reduce(ring, delta.data(), block_.elements(), ReduceOp::kSum);
    outer_bytes_ += ring.bytes_sent() - before;
    return delta;
  }
  void ApplyOuterStepAndRestart(const std::vector<float>& delta, const std::vector<ParamView>& params) {
    ApplyOuterStep(outer_, delta.data(), block_.elements(), block_.start().data(), momentum_.data());
    block_.Restart(params);
  }
  // A round with newcomers: the lowest other member hands every member the global weights,
  // the outer momentum, the rounds done and the step the next round starts at (the others
  // receive their own bits); a newcomer takes them.
  void ShareState(Communicator& ring, const std::vector<ParamView>& params) {
    const int root = quorum_->StateRoot();
    ring.Broadcast(block_.start().data(), block_.elements() * 4, root);
    ring.Broadcast(momentum_.data(), block_.elements() * 4, root);
    int64_t place[2] = {block_.blocks(), next_step_};
    ring.Broadcast(place, sizeof place, root);
    if (!joining_) return;
    block_.Adopt(params, place[0]);
    rejoined_at_ = place[1];
  }
  // A worker restarted alone: it joins the next round that takes newcomers, takes the state,
  // adds nothing to that round's outer step and trains on from the step the others are at.
  void Rejoin(const std::vector<ParamView>& params) {
    joining_ = true;
    std::vector<float> delta;
    while (true) {
      Communicator& ring = quorum_->EnterAsJoiner();
      const bool done = Attempt(ring, [&](Communicator& r) {
        ShareState(r, params);
        delta = MeanAmongMembers(r, params);
      });
      if (quorum_->Settle(done)) break;
    }
    joining_ = false;
    round_step_ = rejoined_at_;
    ApplyOuterStepAndRestart(delta, params);
    printf(
        "worker %d: rejoined at outer round %lld (step %lld) among workers %s: took the global weights and "
        "outer momentum from worker %d\n",
        env_.rank, (long long)quorum_->round(), (long long)rejoined_at_, JoinIntList(quorum_->members(), ", ").c_str(),
        quorum_->members()[size_t(quorum_->StateRoot())]);
    fflush(stdout);
    LogJoinRound("rejoin", params);
  }
  // Every member of a round with newcomers, after its outer step: the weights all now hold.
  void LogJoinRound(const char* event, const std::vector<ParamView>& params) {
    if (!env_.metrics) return;
    env_.metrics->Write(event, next_step_ > 0 ? next_step_ : rejoined_at_,
                        JsonObject()
                            .Add("rank", env_.rank)
                            .Add("round", quorum_->round())
                            .Add("joiners", JoinIntList(quorum_->joiners()))
                            .Add("outer_steps", block_.blocks())
                            .Add("weights_hash", WeightsHash(params)));
  }

  // delta becomes the mean of every worker's delta as outer_wire carries it: the same bits on
  // every worker.
  void MeanOverWorkers(Communicator& comm, float* delta, int64_t n) const { Reduce(comm, delta, n, ReduceOp::kMean); }
  void Reduce(Communicator& comm, float* delta, int64_t n, ReduceOp op) const {
    switch (wire_) {
      case OuterWire::kFp32:
        return comm.AllReduce(delta, n, op);
      case OuterWire::kBf16:
        return comm.AllReduce(delta, n, op, DType::kBF16);
      case OuterWire::kInt8:
        return comm.AllReduceQuantized(delta, n, op, BlockQuant::kInt8);
      case OuterWire::kInt4:
        return comm.AllReduceQuantized(delta, n, op, BlockQuant::kInt4);
    }
  }

  bool elastic_;
  std::unique_ptr<LiveQuorum> quorum_;  // elastic: the rounds among the live workers and their ring
  int64_t next_step_ = 0;               // the step after the last one trained
  int64_t rejoined_at_ = -1;            // a newcomer: the step it took up training at
  int64_t round_step_ = -1;             // the step the last committed round was at
  bool joining_ = false;                // a newcomer before its first round completed
  bool finishing_ = false;
  OuterOptimizerParams outer_;
  OuterWire wire_ = OuterWire::kFp32;
  std::string wire_name_;
  std::vector<float> momentum_;  // the outer optimizer's buffer b
  int64_t outer_bytes_ = 0;      // sent in outer steps so far
  // Streaming (0: off).
  int64_t streaming_ = 0, overlap_steps_ = 1;
  float merge_alpha_ = 0.5f;
  std::vector<Fragment> fragments_;
  std::unique_ptr<Communicator> stream_comm_;  // the exchanges' own ring: the thread's alone
  std::thread thread_;
  std::exception_ptr error_;
  std::vector<float> buf_;   // the fragment in flight: pseudo-gradient, then its mean
  int64_t pending_ = -1;     // that fragment, -1 for none
  int64_t merge_after_ = 0;  // merged after this many steps
  bool joined_ = true;       // its exchange is done and its outer step applied
  int64_t sent_before_ = 0, stream_bytes_ = 0, exchanges_ = 0;
};

const bool kRegistered =
    RegisterAlgorithm("diloco", [](const AlgorithmEnv& env) { return std::unique_ptr<Algorithm>(new Diloco(env)); });

}  // namespace
}  // namespace shoal
