// Parameter-server algorithms. The servers hold the weights and run the optimizer
// (server/aggregation.h); workers push gradients and pull weights through the client
// library, which talks to every shard at once.
//   ps_async: push, the shard applies at once, pull fresh weights; no waiting on others.
//   ps_ssp:   as async, but a worker more than `staleness` steps ahead of the slowest
//             waits (clocks kept on the servers as tiny control tensors).
//   ps_sync:  the shards sum all workers' gradients of a step and apply the mean once;
//             workers meet at a barrier before pulling, so every step is synchronous.
// A shard restarted alone (shoal run, [job] max_restarts) restores the newest committed
// checkpoint; the coordinator starts a new recovery generation, and each worker notices
// (a request that goes unanswered for a heartbeat period, or one refused as stale) and
// recovers in its process: the asynchronous modes re-pull and go on (the restarted shard's
// updates since the checkpoint are lost, counted in a `shard_restart` event); ps_sync
// rolls every shard and every worker back to that checkpoint, exactly (Recover). A ps_sync
// worker restarted alone (--resume --rejoin) starts a new generation the same way: it
// resumes at the checkpoint, and every shard and surviving worker goes back there with it.
#include <exception>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>

#include "algorithms/algorithm.h"
#include "common/error.h"
#include "common/ps/client.h"

namespace shoal {
namespace {

enum class Mode { kAsync, kSsp, kSync };

std::vector<int64_t> Shape(const ParamView& p) { return p.shape.empty() ? std::vector<int64_t>{p.n} : p.shape; }

const char* kStopName = kStopTensor;
// A model buffer (batch-norm running statistics) kept on the servers: a control tensor, so
// the shards assign what is pushed and checkpoint it with the weights.
std::string BufferName(const std::string& name) { return "__shoal/buffer/" + name; }

class ParameterServer : public Algorithm {
 public:
  ParameterServer(const AlgorithmEnv& env, Mode mode) : env_(env), mode_(mode) {
    const ConfigSection& a = env.config->algorithm_opts;
    staleness_ = a.GetInt("staleness", 3, 0, 1 << 30);
    ClientOptions o;
    o.rank = env.rank;
    o.timeout_ms = int(a.GetInt("timeout_ms", 60000, 100, 86400000));
    wait_timeout_ms_ = o.timeout_ms;
    checkpoints_ = !env.config->checkpoint_dir.empty();
    // Without checkpoints a restarted shard has nothing to restore: no point watching.
    o.watch_restarts = checkpoints_;
    o.rejoin = env.resume && env.rejoin;
    client_ = env.make_ps_client(o);
  }
  std::string Name() const override {
    return mode_ == Mode::kAsync ? "ps_async" : mode_ == Mode::kSsp ? "ps_ssp" : "ps_sync";
  }

  void Init(const std::vector<ParamView>& params) override {
    std::vector<TensorSpec>& specs = specs_;
    for (auto& p : params) {
      // The real shape: the server's optimizer exempts rank-1 tensors (bias, BN) from decay.
      specs.push_back({p.name, DType::kF32, Shape(p)});
      names_.push_back(p.name);
    }
    // Asynchronous workers read the stop decision with every pull (4 bytes more).
    if (mode_ != Mode::kSync) names_.push_back(kStopName);
    for (int r = 0; r < env_.world; ++r) specs.push_back({WorkerClockName(r), DType::kF32, {1}});
    specs.push_back({kStopName, DType::kF32, {1}});
    if (buffers_)
      for (auto& b : buffers_->ToHost()) {
        specs.push_back({BufferName(b.name), DType::kF32, Shape(b)});
        buffer_names_.push_back(BufferName(b.name));
      }
    // The shards learn the schedule and their update rule from this plan, never from data.
    TrainingPlan& plan = plan_;
    plan.steps_per_epoch = env_.steps_per_epoch;
    plan.total_steps = env_.total_steps;
    plan.workers = env_.world;
    plan.global_batch = env_.config->batch_size * env_.world;
    switch (FactsOf(Name()).server_update) {
      case ServerUpdate::kApplyEach:
        plan.rule = msg::ServerRule::APPLY_EACH;
        break;
      case ServerUpdate::kMeanOfWorkers:
        plan.rule = msg::ServerRule::MEAN_OF_WORKERS;
        break;
      case ServerUpdate::kNone:
        plan.rule = msg::ServerRule::NONE;
        break;
    }
    client_->Register(specs, &plan);
    CheckpointRecord rec;
    if (env_.resume) {
      // The shards loaded the committed checkpoint before serving: pull it, seed nothing.
      // With rejoin this query starts a new recovery generation (a ps_sync worker
      // restarted alone: the others notice and roll back to `rec` in Recover).
      rec = client_->NewestCheckpoint();
      SHOAL_CHECK(rec.id > 0, "--resume: the coordinator has no complete checkpoint in " + env_.config->checkpoint_dir);
      // A worker restarted alone joins the generation the job is in now.
      client_->SetGeneration(client_->latest_generation());
      const CheckpointRecord here = Here(rec);
      if (rec.workers > 0 && int(rec.workers) != env_.world) {
        // Written by another number of workers: the servers mapped their step the same way
        // when this job's plan reached them (Server::ReshapeLoaded).
        std::string note = "the servers keep the model and optimizer state";
        if (mode_ == Mode::kSsp) note += ", and every worker's clock starts at step " + std::to_string(here.step);
        printf("worker %d: %s; %s\n", env_.rank,
               OnOtherWorkersLine(rec, here, env_.config->batch_size, int(rec.workers), env_.world).c_str(),
               note.c_str());
        fflush(stdout);
      }
      // Later checkpoint ids go on from the resumed one (its id counts the steps of the
      // workers before), so they never meet an id the run before wrote.
      id_offset_ = int64_t(rec.id) - here.step;
      resumed_step_ = here.step;
      if (mode_ == Mode::kSsp) resumed_step_ = std::max(resumed_step_, OwnClock());
      last_step_ = resumed_step_;
      epoch_ = resumed_step_ / env_.steps_per_epoch;
    } else if (env_.rank == 0) {
      // Rank 0 seeds the servers with the initial weights (every worker built the same).
      std::vector<TensorRef> refs;
      for (auto& p : params) refs.push_back({p.name, DType::kF32, Shape(p), p.w, size_t(p.n) * 4, nullptr});
      zero_.assign(size_t(env_.world) + 1, 0.f);
      for (int r = 0; r < env_.world; ++r)
        refs.push_back({WorkerClockName(r), DType::kF32, {1}, &zero_[size_t(r)], 4, nullptr});
      refs.push_back({kStopName, DType::kF32, {1}, &zero_.back(), 4, nullptr});
      AddBufferRefs(&refs);
      client_->Wait(client_->Push(refs, msg::PushOp::ASSIGN));
    }
    // Resumed asynchronous workers need no meeting (nobody seeds): one restarted alone while
    // the others train would wait there for ever.
    if (env_.rejoin && mode_ == Mode::kSync) {
      // Restarted alone: meet the others where their Recover meets, after every shard
      // went back to `rec` (this worker reloads them when it is rank 0).
      if (env_.rank == 0) client_->Reload(rec);
      client_->Barrier("recovered");
    } else if (!env_.resume || mode_ == Mode::kSync) {
      client_->Barrier("init");
    }
    PullWeights(params);
    if (env_.resume) PullBuffers();  // rank 0's, saved with the checkpoint
  }

  void Step(const std::vector<ParamView>& params, const StepInfo& info) override {
    try {
      StepOnce(params, info);
    } catch (const Error& e) {
      Recover(params, AwaitRestart(e));
    }
  }

  void StepOnce(const std::vector<ParamView>& params, const StepInfo& info) {
    // The guard: a gradient that is not all finite is not pushed; zeros go in its place, so
    // the servers never see a NaN or inf while a synchronous step's accounting (every
    // worker's push) and the clocks still complete. The step is counted as skipped.
    if (!GradientsFinite(params)) {
      ++skipped_;
      for (auto& p : params) std::fill(p.g, p.g + p.n, 0.f);
    }
    std::vector<TensorRef> grads;
    for (auto& p : params) grads.push_back({p.name, DType::kF32, Shape(p), p.g, size_t(p.n) * 4, nullptr});
    if (mode_ == Mode::kSsp) {
      clock_ = float(info.step + 1);
      grads.push_back({WorkerClockName(env_.rank), DType::kF32, {1}, &clock_, 4, nullptr});
    }
    client_->Wait(client_->Push(grads, msg::PushOp::APPLY));
    if (mode_ == Mode::kSync) client_->Barrier("step-" + std::to_string(info.step));
    last_step_ = info.step + 1;
    int64_t every = env_.config->checkpoint_every_steps;
    if (checkpoints_ && every > 0 && last_step_ % every == 0) CheckpointNow();
    if (mode_ == Mode::kSsp) WaitForSlowest(info.step + 1);
    PullWeights(params);
  }

  void Finish(const std::vector<ParamView>& params) override {
    if (mode_ == Mode::kSsp) {  // a finished worker no longer holds the others back
      clock_ = 1e30f;
      client_->Wait(
          client_->Push({{WorkerClockName(env_.rank), DType::kF32, {1}, &clock_, 4, nullptr}}, msg::PushOp::APPLY));
    }
    if (mode_ != Mode::kSync) {
      FinishAsync(params);
    } else {
      try {
        client_->Barrier("finish");
      } catch (const Error& e) {
        // Nobody is past the barrier (a new generation fails it for all): everyone rolls
        // back as in a step (throws RewindTo; the trainer trains on and finishes again).
        Recover(params, AwaitRestart(e));
      }
      FinishSync(params);
    }
    client_->Leave();  // the servers go once every worker has
    left_ = true;
  }
  void SetBuffers(ModelBuffers* buffers) override { buffers_ = buffers; }
  // ps_sync: every worker evaluates rank 0's buffers (the synchronous steps keep the
  // weights identical; the running statistics are each worker's own otherwise).
  // Asynchronous workers evaluate their own. After Finish there is nobody to meet: every
  // worker then holds the checkpoint's, or its own at the same step.
  void SyncBuffers() override {
    if (mode_ != Mode::kSync || buffer_names_.empty() || left_) return;
    try {
      if (env_.rank == 0) {
        std::vector<TensorRef> refs;
        AddBufferRefs(&refs);
        client_->Wait(client_->Push(refs, msg::PushOp::ASSIGN));
      }
      client_->Barrier("buffers-" + std::to_string(last_step_));
      if (env_.rank != 0) PullBuffers();
    } catch (const Error& e) {
      Recover(*params_, AwaitRestart(e));  // throws RewindTo
      throw;
    }
  }
  int64_t ResumedStep() const override { return resumed_step_; }
  int64_t skipped_steps() const override { return skipped_; }
  // Every mode ends holding the servers' final weights, which no worker evaluated yet.
  // One worker evaluates them for the job: rank 0 in ps_sync (a death there ends or rolls
  // back the job), the lowest live rank in the asynchronous modes (FinishAsync).
  bool ModelChangedAtFinish() const override { return true; }
  bool EvaluatesFinalModel() const override { return mode_ == Mode::kSync ? env_.rank == 0 : evaluates_final_; }

  // Asynchronous workers: the first that reaches the target stops everyone. Its decision
  // goes to the servers (__shoal/stop holds the step it was taken at), where every other
  // worker sees it with its next pull and ends its epoch there (StopRequested).
  bool StopRequested() const override { return mode_ != Mode::kSync && stop_seen_ > float(resumed_step_); }

  bool AgreeToStop(bool mine) override {
    if (mode_ != Mode::kSync) {
      if (mine && !StopRequested()) {
        // Above the resumed step, so that a resumed job never takes a decision restored
        // with the checkpoint for its own (the run before stopped there; this one goes on).
        stop_flag_ = float(std::max(last_step_, resumed_step_ + 1));
        client_->Wait(client_->Push({{kStopName, DType::kF32, {1}, &stop_flag_, 4, nullptr}}, msg::PushOp::ASSIGN));
        stop_seen_ = stop_flag_;
      }
      return mine || StopRequested();
    }
    try {
      return AgreeToStopOnce(mine);
    } catch (const Error& e) {
      Recover(*params_, AwaitRestart(e));  // ps_sync: throws RewindTo
      throw;
    }
  }
  bool AgreeToStopOnce(bool mine) {
    // Synchronous: rank 0's evaluation decides for everyone.
    ++epoch_;
    if (env_.rank == 0) {
      stop_flag_ = mine ? 1.f : 0.f;
      client_->Wait(client_->Push({{kStopName, DType::kF32, {1}, &stop_flag_, 4, nullptr}}, msg::PushOp::ASSIGN));
    }
    client_->Barrier("stop-" + std::to_string(epoch_));
    std::vector<PulledTensor> out;
    client_->Wait(client_->Pull({kStopName}, &out));
    return out.at(0).ToFloats().at(0) > 0;
  }

  int64_t bytes_sent() const override { return int64_t(client_->bytes_sent()); }
  void AddMetrics(JsonObject* out) const override {
    out->Add("staleness", staleness_seen_);
    out->Add("max_staleness", max_staleness_);
  }

 private:
  // The ShardRestarted behind a failed request: `e` itself, or the coordinator's next
  // generation if it comes within 2 x heartbeat_timeout_ms (a refused barrier can arrive
  // before the restarted shard has asked what to restore). Anything else is rethrown: it
  // is not a failure this worker can ride out.
  ShardRestarted AwaitRestart(const Error& e) {
    if (auto* r = dynamic_cast<const ShardRestarted*>(&e)) return *r;
    std::exception_ptr original = std::current_exception();
    if (!checkpoints_) std::rethrow_exception(original);
    auto deadline = std::chrono::steady_clock::now() + 2 * std::chrono::milliseconds(env_.config->heartbeat_timeout_ms);
    do {
      try {
        client_->CheckRestarts();
      } catch (const ShardRestarted& r) {
        return r;
      } catch (const Error&) {
        std::rethrow_exception(original);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(env_.config->heartbeat_ms));
    } while (std::chrono::steady_clock::now() < deadline);
    std::rethrow_exception(original);
  }

  // Checkpoint `r` as a position of this job: the same one, or where OnOtherWorkers puts a
  // checkpoint that another number of workers wrote.
  CheckpointRecord Here(const CheckpointRecord& r) const {
    if (r.workers == 0 || int(r.workers) == env_.world) return r;
    return OnOtherWorkers(r, env_.config->batch_size, int(r.workers), env_.world, env_.steps_per_epoch);
  }

  // A shard was restarted alone and restored checkpoint r.from. Every worker registers
  // again (the new shard learns the training plan) and joins the new generation. The
  // asynchronous modes pull and go on, counting the updates the restarted shard lost.
  // ps_sync must stay exact, so it rolls back: rank 0 has every shard reload r.from (all
  // hold it: a commit follows every shard's synced write), everyone meets, pulls those
  // weights and throws RewindTo so the trainer continues from r.from's data position.
  void Recover(const std::vector<ParamView>& params, const ShardRestarted& r) {
    const int64_t ckpt = int64_t(r.from.id);
    fprintf(stderr, "worker %d: %s; recovering\n", env_.rank, r.what());
    client_->SetGeneration(r.generation);
    client_->Register(specs_, &plan_);
    JsonObject ev;
    ev.Add("rank", env_.rank)
        .Add("generation", int64_t(r.generation))
        .Add("from_checkpoint", ckpt)
        .Add("why", r.what());
    if (mode_ == Mode::kSync) {
      if (env_.rank == 0) client_->Reload(r.from);
      client_->Barrier("recovered");
      PullWeights(params);
      PullBuffers();  // the checkpoint's, so the rewound job evaluates as the first pass did
      const int64_t to = Here(r.from).step;
      ev.Add("rewound_steps", last_step_ - to);
      last_step_ = to;
      epoch_ = to / env_.steps_per_epoch;
      if (env_.metrics) env_.metrics->Write("shard_restart", to, ev);
      throw RewindTo{to, r.what()};
    }
    std::vector<uint64_t> before = versions_;
    PullWeights(params);
    uint64_t lost = 0;
    for (size_t i = 0; i < before.size() && i < versions_.size(); ++i)
      if (before[i] > versions_[i]) lost = std::max(lost, before[i] - versions_[i]);
    ev.Add("lost_updates", int64_t(lost));
    fprintf(stderr, "worker %d: re-pulled the model; the restarted shard lost %llu update(s) since checkpoint %lld\n",
            env_.rank, (unsigned long long)lost, (long long)ckpt);
    if (env_.metrics) env_.metrics->Write("shard_restart", last_step_, ev);
  }

  void PullWeights(const std::vector<ParamView>& params) {
    params_ = &params;
    std::vector<PulledTensor> out;
    client_->Wait(client_->Pull(names_, &out));
    if (mode_ != Mode::kSync) stop_seen_ = out.back().ToFloats().at(0);
    versions_.clear();
    for (auto& t : out) versions_.push_back(t.version);
    for (size_t i = 0; i < params.size(); ++i) {
      SHOAL_CHECK(out[i].size() == size_t(params[i].n) * 4, "pulled '" + params[i].name + "' has " +
                                                                std::to_string(out[i].size()) + " bytes, expected " +
                                                                std::to_string(params[i].n * 4));
      memcpy(params[i].w, out[i].data(), out[i].size());
    }
    if (mode_ == Mode::kAsync && !out.empty()) {
      // Others' updates that landed between my last two pulls (my own push is one).
      uint64_t v = out[0].version;
      if (last_version_ > 0) staleness_seen_ = double(v - last_version_) - 1.0;
      max_staleness_ = std::max(max_staleness_, staleness_seen_);
      last_version_ = v;
    }
  }

  // Rank 0's buffers as pushes (views fresh from the model).
  void AddBufferRefs(std::vector<TensorRef>* refs) {
    if (buffer_names_.empty()) return;
    const std::vector<ParamView>& views = buffers_->ToHost();
    for (size_t i = 0; i < views.size(); ++i)
      refs->push_back({buffer_names_[i], DType::kF32, Shape(views[i]), views[i].w, size_t(views[i].n) * 4, nullptr});
  }

  // The servers' buffers into the model.
  void PullBuffers() {
    if (buffer_names_.empty()) return;
    std::vector<PulledTensor> out;
    client_->Wait(client_->Pull(buffer_names_, &out));
    const std::vector<ParamView>& views = buffers_->ToHost();
    for (size_t i = 0; i < views.size(); ++i) {
      SHOAL_CHECK(out[i].size() == size_t(views[i].n) * 4, "pulled '" + buffer_names_[i] + "' has " +
                                                               std::to_string(out[i].size()) + " bytes, expected " +
                                                               std::to_string(views[i].n * 4));
      memcpy(views[i].w, out[i].data(), out[i].size());
    }
    buffers_->FromHost();
  }

  // ps_async, ps_ssp: the job's model is final once every live worker pushed its last
  // gradient, so they meet (a dead worker is not waited for), rank 0 writes the final
  // checkpoint, and every worker pulls the final weights. One worker evaluates them for
  // the job: the lowest live rank, whose end record the launcher's done line reads.
  void FinishAsync(const std::vector<ParamView>& params) {
    while (true) {
      try {
        client_->LiveBarrier("finished");
        break;
      } catch (const Error& e) {
        Recover(params, AwaitRestart(e));  // a shard restarted meanwhile: re-pull, meet again
      }
    }
    if (checkpoints_ && env_.rank == 0 && last_step_ > 0) WriteCheckpoint();
    PullWeights(params);
    evaluates_final_ = true;
    for (auto& m : client_->Members())
      if (m.role == msg::Role::WORKER && m.alive && m.rank < env_.rank) evaluates_final_ = false;
  }

  // ps_sync past the finish barrier: rank 0 writes the final checkpoint and every worker
  // pulls the final weights. A shard that dies now and is restarted alone restores the
  // newest committed checkpoint; when that holds the last step (a checkpoint was due at
  // it, or rank 0 had committed the final one) every shard again holds the final model:
  // join the new generation and pull again. Otherwise the shards no longer agree, and a
  // worker that already left cannot roll back with the others: this worker stops with an
  // error naming the checkpoint to resume from (the launcher restarts from it).
  void FinishSync(const std::vector<ParamView>& params) {
    bool write = checkpoints_ && env_.rank == 0 && last_step_ > 0;
    while (true) {
      try {
        if (write) WriteCheckpoint();
        write = false;
        PullWeights(params);
        return;
      } catch (const Error& e) {
        ShardRestarted r = AwaitRestart(e);
        if (Here(r.from).step != last_step_)
          throw Error("ps_sync: " + std::string(r.what()) + " while the job finished at step " +
                      std::to_string(last_step_) + ": the shards no longer hold the final model, and a worker that " +
                      "already left cannot roll back; the job's final committed checkpoint is " +
                      std::to_string(r.from.id) + " (step " + std::to_string(r.from.step) + "): resume from it");
        fprintf(stderr, "worker %d: %s during the job's finish; it holds the final step %lld: pulling again\n",
                env_.rank, r.what(), (long long)last_step_);
        client_->SetGeneration(r.generation);
        client_->Register(specs_, &plan_);
        write = false;  // the final step's checkpoint is committed
      }
    }
  }

  // Rank 0 asks the shards to write the checkpoint. Synchronous jobs do it at the step's
  // end while the others wait at a barrier, so it holds exactly `last_step_` steps;
  // asynchronous jobs do not stop (the checkpoint holds what the shards had then).
  void CheckpointNow() {
    if (env_.rank == 0) WriteCheckpoint();
    if (mode_ == Mode::kSync) client_->Barrier("checkpoint-" + std::to_string(last_step_));
  }
  void WriteCheckpoint() {
    CheckpointRecord rec;
    rec.id = uint64_t(last_step_ + id_offset_);
    rec.step = last_step_;
    rec.epoch = last_step_ / env_.steps_per_epoch;
    rec.batch = last_step_ % env_.steps_per_epoch;
    rec.shards = uint32_t(env_.config->servers.size());
    auto t0 = std::chrono::steady_clock::now();
    // The buffers are rank 0's at this step (ps_sync: every worker's at an evaluation).
    if (!buffer_names_.empty()) {
      std::vector<TensorRef> refs;
      AddBufferRefs(&refs);
      client_->Wait(client_->Push(refs, msg::PushOp::ASSIGN));
    }
    client_->Checkpoint(rec);
    if (env_.metrics)
      env_.metrics->Write(
          "checkpoint", last_step_,
          JsonObject()
              .Add("rank", env_.rank)
              .Add("id", int64_t(rec.id))
              .Add("write_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
  }

  // ps_ssp resumed: the steps this worker's clock on the servers counts. A worker
  // restarted alone while the others train goes on from there: its earlier pushes are in
  // the servers' weights, and resuming at the checkpoint's step instead would set its clock
  // back, holding every survivor until it trained those steps again. 0 when the clock is
  // not a step of this job (a whole job resumed from its final checkpoint: 1e30).
  int64_t OwnClock() {
    std::vector<PulledTensor> out;
    client_->Wait(client_->Pull({WorkerClockName(env_.rank)}, &out));
    const double c = out.at(0).ToFloats().at(0);
    if (!(c > 0) || c > double(env_.total_steps)) return 0;
    return int64_t(c);
  }

  // Who the coordinator says is dead now. A worker restarted alone answers again, and its
  // clock holds the others back again.
  void RefreshDead() {
    std::set<int> dead;
    for (auto& m : client_->Members())
      if (m.role == msg::Role::WORKER && !m.alive && m.rank != env_.rank) dead.insert(m.rank);
    for (int r : dead)
      if (!dead_.count(r))
        fprintf(stderr, "ps_ssp: worker %d stopped answering; its clock no longer holds the others back\n", r);
    for (int r : dead_)
      if (!dead.count(r)) fprintf(stderr, "ps_ssp: worker %d answers again; its clock counts again\n", r);
    dead_ = std::move(dead);
  }

  // SSP: wait until my clock is at most `staleness` ahead of the slowest live worker's. A
  // dead worker's clock never moves again, so while held back this asks the coordinator
  // (which tracks heartbeats) who is dead and leaves their clocks out: ps_ssp tolerates
  // deaths as ps_async does (facts: kAnyButLast). While some worker is left out, it asks
  // after every step too, so one that comes back counts again. The wait is bounded by the
  // slowest clock's progress: a worker catching up (restarted alone) is waited for as long
  // as it moves.
  void WaitForSlowest(int64_t mine) {
    std::vector<std::string> clocks;
    for (int r = 0; r < env_.world; ++r) clocks.push_back(WorkerClockName(r));
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_timeout_ms_);
    if (!dead_.empty() && std::chrono::steady_clock::now() >= next_members_) {
      next_members_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(env_.config->heartbeat_ms);
      RefreshDead();
    }
    double last_slowest = -1;
    while (true) {
      std::vector<PulledTensor> out;
      client_->Wait(client_->Pull(clocks, &out));
      double slowest = 1e300;
      int slowest_rank = 0;
      for (int r = 0; r < env_.world; ++r) {
        if (dead_.count(r)) continue;
        double c = out[size_t(r)].ToFloats().at(0);
        if (c < slowest) {
          slowest = c;
          slowest_rank = r;
        }
      }
      // The slowest clock moved (or a worker that came back is now the slowest): wait on.
      if (slowest != last_slowest) {
        if (last_slowest >= 0)
          deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_timeout_ms_);
        last_slowest = slowest;
      }
      double gap = double(mine) - slowest;
      if (gap <= double(staleness_)) {
        staleness_seen_ = std::max(0.0, gap);
        max_staleness_ = std::max(max_staleness_, staleness_seen_);
        return;
      }
      auto now = std::chrono::steady_clock::now();
      if (now >= next_members_) {
        // Held back: perhaps by a dead worker. At most once a heartbeat period per job,
        // so waiting at the bound costs the coordinator little.
        next_members_ = now + std::chrono::milliseconds(env_.config->heartbeat_ms);
        RefreshDead();
        continue;  // the slowest of those left
      }
      if (now > deadline)
        throw Error("ps_ssp: worker " + std::to_string(slowest_rank) + " has been more than " +
                    std::to_string(staleness_) + " steps behind for " + std::to_string(wait_timeout_ms_) +
                    " ms (stopped?)");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  AlgorithmEnv env_;
  Mode mode_;
  bool checkpoints_ = false;  // [job] checkpoint_dir is set
  int64_t resumed_step_ = 0, last_step_ = 0, skipped_ = 0;
  int64_t id_offset_ = 0;  // checkpoint id - step (Init, resumed)
  int64_t staleness_ = 3;
  int wait_timeout_ms_ = 60000;
  std::unique_ptr<Client> client_;
  std::vector<std::string> names_;         // what every pull asks for: the parameters (and the stop flag)
  ModelBuffers* buffers_ = nullptr;        // the trainer's (SetBuffers)
  std::vector<std::string> buffer_names_;  // their names on the servers; empty: none
  bool left_ = false;                      // Finish sent LEAVE
  std::vector<TensorSpec> specs_;          // registered again after a shard restart
  TrainingPlan plan_;
  std::vector<uint64_t> versions_;                  // of each tensor at the last pull
  const std::vector<ParamView>* params_ = nullptr;  // the trainer's, as last pulled into
  std::set<int> dead_;                              // workers the coordinator saw stop (ps_ssp ignores their clocks)
  std::chrono::steady_clock::time_point next_members_{};
  std::vector<float> zero_;
  float clock_ = 0, stop_flag_ = 0;
  float stop_seen_ = 0;           // __shoal/stop at the last pull (asynchronous modes)
  bool evaluates_final_ = false;  // FinishAsync: this worker evaluates the job's final model
  int64_t epoch_ = 0;
  uint64_t last_version_ = 0;
  double staleness_seen_ = 0, max_staleness_ = 0;
};

const bool kAsync = RegisterAlgorithm("ps_async", [](const AlgorithmEnv& env) {
  return std::unique_ptr<Algorithm>(new ParameterServer(env, Mode::kAsync));
});
const bool kSsp = RegisterAlgorithm(
    "ps_ssp", [](const AlgorithmEnv& env) { return std::unique_ptr<Algorithm>(new ParameterServer(env, Mode::kSsp)); });
const bool kSync = RegisterAlgorithm("ps_sync", [](const AlgorithmEnv& env) {
  return std::unique_ptr<Algorithm>(new ParameterServer(env, Mode::kSync));
});

}  // namespace
}  // namespace shoal
