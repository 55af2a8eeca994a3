// Algorithm: how workers agree on the model. One per job, chosen by [algorithm] name.
// The trainer computes gradients and calls Step once per step; the algorithm leaves the
// weights to use for the next step in ParamView::w (applying an optimizer locally,
// pushing to servers, all-reducing, gossiping...). Adding one = a source in algorithms/,
// its row in the facts table (algorithms/facts.cc) and one RegisterAlgorithm line.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/collectives/communicator.h"
#include "algorithms/facts.h"
#include "algorithms/optimizers/optimizer.h"
#include "common/checkpoint/checkpoint_state.h"
#include "common/config.h"
#include "common/device_fence.h"
#include "common/metrics.h"

namespace shoal {

// One model tensor as fp32 memory: weights and this step's gradient. Host memory, unless
// on_device: then w and g point into the worker's CUDA device memory (the trainer gives such
// views only to an algorithm whose TakesDeviceParams() is true). The work that wrote them
// is finished when Step is called; in GradReady it may still be queued: then `ready` marks
// it, and device ops on g must be ordered after it (DeviceOps::After; the contract is in
// common/device_fence.h). Null `ready`: nothing to wait for.
struct ParamView {
  std::string name;
  float* w = nullptr;
  float* g = nullptr;
  int64_t n = 0;
  bool no_weight_decay = false;
  std::vector<int64_t> shape;  // servers infer "no weight decay" from rank-1 shapes
  bool on_device = false;
  std::shared_ptr<const DeviceFence> ready;
};

// The optimizer on on-device tensors, one device state per tensor index (created zeroed on
// first use); made by DeviceOps::NewUpdater.
class DeviceUpdater {
 public:
  virtual ~DeviceUpdater() = default;
  // w -= update(g) for tensor `index`, enqueued on the device; Sync waits for all of them.
  virtual void Apply(const ParamView& p, size_t index, const StepContext& ctx) = 0;
  virtual void Sync() = 0;
  // Tensor `index`'s state in the host form (checkpoints); HasState false before its first
  // update or upload.
  virtual bool HasState(size_t index) const = 0;
  virtual OptimizerState Download(size_t index) const = 0;
  virtual void Upload(size_t index, int64_t n, const OptimizerState& s) = 0;
  virtual void Clear() = 0;  // forget every state
};

// What the algorithm layer does to on-device views: the optimizer, the fusion buffer's
// memory and copies, gradient scaling. An interface so CPU-only targets never link CUDA:
// the implementation is //algorithms:cuda_device_ops (algorithms/cuda_device_ops.h), which
// MakeAlgorithmEnv plugs into AlgorithmEnv::device for a CUDA worker. Calls may come from
// any thread; each is finished on the device when it returns.
class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual std::unique_ptr<DeviceUpdater> NewUpdater(const Optimizer& optimizer) = 0;
  virtual float* Alloc(int64_t n) = 0;  // n floats of device memory, zeroed
  virtual void Free(float* p) = 0;
  virtual void Copy(float* dst, const float* src, int64_t n) = 0;  // device to device
  virtual void Scale(float* p, int64_t n, float f) = 0;            // p[i] *= f, the host's float product
  // Whether every float of every span (device memory) is finite: one answer for the lot.
  virtual bool AllFinite(const std::vector<std::pair<const float*, int64_t>>& spans) = 0;
  // Orders every later call after the work `fence` marks, device-side (a stream wait, not
  // a host wait); a null fence is a no-op.
  virtual void After(const DeviceFence* fence) = 0;
  // Copy and Scale queued instead: in call order with every call here, but maybe unfinished
  // on return, so the caller's thread never waits (the backward pass keeps the device fed).
  // Record marks what was queued so far, for whoever reads the result (Wait on the host, or
  // a stream wait); null where every call finishes on return.
  virtual void CopyQueued(float* dst, const float* src, int64_t n) { Copy(dst, src, n); }
  virtual void ScaleQueued(float* p, int64_t n, float f) { Scale(p, n, f); }
  virtual std::shared_ptr<const DeviceFence> Record() { return nullptr; }
};

struct StepInfo {
  int64_t step = 0;  // global step, 0-based
  int64_t epoch = 0;
  double loss = 0;
  // Samples this worker's gradient is the mean over, and the step's global batch; 0 when
  // unknown (all equal). With balanced batches they differ per worker (GradientWeight).
  int64_t samples = 0;
  int64_t global_samples = 0;
};

// A model's buffers (batch-norm running statistics): model state that no gradient reaches
// and no optimizer touches, so it is kept beside the weights in every checkpoint and
// export, and made the same on every worker before an evaluation. Host views (ParamView::g
// null) of the trainer's model; on a GPU they are copies, so callers bracket their use:
// ToHost() fills the views with the model's current values and returns them, FromHost()
// writes the views back into the model after a change. The trainer's thread only.
class ModelBuffers {
 public:
  virtual ~ModelBuffers() = default;
  virtual const std::vector<ParamView>& ToHost() = 0;
  virtual void FromHost() = 0;
  virtual bool empty() const = 0;
};

class Client;  // the parameter-server client (common/ps/client.h)
struct ClientOptions;
class Store;  // the rendezvous store (common/rendezvous/store.h)

// What an algorithm may use: the job, this worker's place in it, the optimizer and
// schedule built from [optimizer], the metrics sink, and its ways to reach the other
// processes. Built once per worker by MakeAlgorithmEnv (algorithms/env.h); tests fill the
// factories with in-process fakes, so no algorithm builds its own connections.
struct AlgorithmEnv {
  const JobConfig* config = nullptr;
  int rank = 0;
  int world = 1;
  int64_t steps_per_epoch = 1;
  int64_t total_steps = 1;
  std::shared_ptr<Optimizer> optimizer;
  std::shared_ptr<LrSchedule> schedule;
  MetricsWriter* metrics = nullptr;
  bool resume = false;  // continue from the job's newest complete checkpoint
  // This worker was restarted alone while the job's other processes run: with resume in
  // ps_sync (its resume query starts a new recovery generation; algorithms/ps), or in a job
  // that survives lost workers (diloco elastic: it joins at the next outer step).
  bool rejoin = false;
  // Batch balancing (algorithms/balance.h): -1 = as [algorithm] balance says; 0 or 1 =
  // decided by the code that builds the algorithm (auto's choice). Read it with BalanceOn.
  int balance = -1;
  // The fewest samples of the global batch a balanced worker may get (MinBalancedShare,
  // algorithms/balance.h: more than 1 for models with batch norm). Set by the trainer.
  int64_t min_share = 1;
  // The samples one evaluation scores (the test set, after max_test_samples; 0: unknown). Set
  // by the trainer: auto weighs what evaluating costs each candidate.
  int64_t test_samples = 0;
  // A Communicator among the job's workers; `name` keeps the rendezvous keys of two
  // communicators of one job apart (one per use: "allreduce", "adpsgd", ...).
  std::function<std::unique_ptr<Communicator>(const std::string& name)> make_communicator;
  // A ring among some of the job's workers only (`members`: ranks, ascending, this one
  // among them; ring rank i is members[i]): diloco's outer steps among the live workers.
  std::function<std::unique_ptr<Communicator>(const std::string& name, const std::vector<int>& members)>
      make_member_ring;
  // A client of the job's parameter servers.
  std::function<std::unique_ptr<Client>(const ClientOptions& opts)> make_ps_client;
  // Where peers publish and find endpoints (adpsgd's gossip listeners).
  std::shared_ptr<Store> store;
  // Keeps the job's coordinator serving while this environment lives (worker rank 0 of a
  // job without servers); empty elsewhere.
  std::shared_ptr<void> coordinator;
  // Device work for on-device views (a CUDA worker); null elsewhere.
  std::shared_ptr<DeviceOps> device;
};

// Thrown by Step or AgreeToStop when the job went back to an earlier step (ps_sync after a
// shard was restarted alone: every shard restored the checkpoint at `step`, and the weights
// in the params are that checkpoint's). The trainer continues from `step`'s data position
// in the same process.
struct RewindTo {
  int64_t step = 0;
  std::string why;
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual std::string Name() const = 0;
  // Called once with freshly initialized weights (same seed on every worker); may replace
  // them (e.g. pull from servers, broadcast from rank 0, restore a checkpoint).
  virtual void Init(const std::vector<ParamView>& params) { (void)params; }
  virtual void Step(const std::vector<ParamView>& params, const StepInfo& info) = 0;
  // Overlap with the backward pass. An algorithm that answers true gets BeginBackward
  // before each step's backward pass and GradReady(params, i) as soon as params[i].g holds
  // its final gradient (reverse layer order, on the trainer's thread), so it may start
  // exchanging gradients before Step. Step must give the same bits whether or not any
  // GradReady came (a caller may skip them).
  virtual bool WantsGradReady() const { return false; }
  virtual void BeginBackward(const std::vector<ParamView>& params) { (void)params; }
  virtual void GradReady(const std::vector<ParamView>& params, size_t index) {
    (void)params;
    (void)index;
  }
  // Training ended (normally or early): flush, final sync, leave the final weights in w.
  virtual void Finish(const std::vector<ParamView>& params) { (void)params; }
  // True when Finish replaced the weights (e.g. a final average): evaluate again.
  virtual bool ModelChangedAtFinish() const { return false; }
  // False when another worker evaluates the job's final model for everyone (asynchronous
  // PS jobs: every worker holds the same final weights, one evaluation is the job's).
  virtual bool EvaluatesFinalModel() const { return true; }
  // True when Step, Init, Finish and checkpoints take on-device views (ParamView::on_device):
  // a CUDA worker then hands over its model's own device tensors, no host mirrors.
  virtual bool TakesDeviceParams() const { return false; }
  // Extra figures for progress lines and metrics (bytes_sent, staleness, ...).
  virtual int64_t bytes_sent() const { return 0; }
  // Steps so far whose gradients were not all finite and so were not applied (the guard:
  // no NaN or inf reaches weights or optimizer state). Where the weights must agree, the
  // ranks agree on the skip. The trainer's loss scaler halves its scale when this grows.
  virtual int64_t skipped_steps() const { return 0; }
  virtual void AddMetrics(JsonObject* out) const { (void)out; }
  // Checkpoints on the servers (PS algorithms): they resume in Init when env.resume is set
  // and say here how many global steps the restored model has done.
  virtual int64_t ResumedStep() const { return 0; }
  // Checkpoints on the workers (every algorithm without servers; the trainer keeps the
  // weights): SaveState adds what else this algorithm needs to continue exactly (optimizer
  // slots, an exchange in flight, block momentum, residuals, random streams) and may settle
  // work in flight to do so. LoadState runs after Init with the checkpoint's weights
  // already in params, on every rank in the same order (it may use its communicator).
  virtual void SaveState(const std::vector<ParamView>& params, CheckpointState* out) {
    (void)params;
    (void)out;
  }
  virtual void LoadState(const std::vector<ParamView>& params, const CheckpointState& in) {
    (void)params;
    (void)in;
  }
  // The workers that write no part of the checkpoint taken after `step` steps (elastic
  // diloco: those not members of the outer round it belongs to); none by default.
  virtual std::vector<uint32_t> CheckpointAbsent(int64_t step) const {
    (void)step;
    return {};
  }
  // The rank that writes the job's final exports (export_weights, export_onnx): worker 0, except
  // where worker 0 may be lost (elastic diloco: the lowest member of the last outer round, the
  // same on every member).
  virtual int OutputRank() const { return 0; }
  // The collective this algorithm's ranks share (nullptr: none): a job resumed on another
  // number of workers gets its checkpoint through it (WorkerCheckpoints::Resume).
  virtual Communicator* peers() { return nullptr; }
  // The workers an evaluation is split over (nullptr: each scores the whole test set alone).
  // Only where every worker holds the same model whenever it evaluates and nothing is in flight
  // on the collective between steps: each then scores a share and they add up the counts. Asked
  // by every worker at the same step.
  virtual Communicator* EvaluationPeers() { return nullptr; }
  // Checkpoint entries (key prefixes) that differ between workers, averaged over the workers
  // that hold them when the job resumes on another number of workers. Everything else is
  // one worker's, and LoadState sees `in.record.shards` (the writers' count) differ from the
  // world and resets what belonged to a worker alone.
  virtual std::vector<std::string> AveragedOnReshape() const { return {}; }
  // After such a LoadState: what it dropped or changed, for the resume line ("" for nothing).
  virtual std::string ReshapeNote() const { return ""; }
  // Rank 0 of a collective job stops everyone at the target: all ranks must agree when to
  // stop, so algorithms that synchronize decide it together.
  virtual bool AgreeToStop(bool mine) { return mine; }
  // True once another worker decided to stop (asynchronous algorithms, asked after every
  // step): end the epoch now and Finish, without this epoch's evaluation.
  virtual bool StopRequested() const { return false; }
  // True when the trainer should balance the workers' batches (algorithms/balance.h): the
  // algorithm weights each gradient by StepInfo::samples. May turn true after a step
  // (auto's hand-over), on every rank at the same step.
  virtual bool BalancesBatches() const { return false; }
  // The model's buffers (batch-norm running statistics), given once before Init; they
  // outlive the algorithm. An algorithm whose model lives on servers keeps them there: rank
  // 0 stores its buffers with every checkpoint and a resumed worker starts from them. Jobs
  // without servers need nothing here: the trainer checkpoints them on the workers and
  // averages them over its own communicator.
  virtual void SetBuffers(ModelBuffers* buffers) { (void)buffers; }
  // Before an evaluation: make the buffers the job's where every worker must evaluate the
  // same model (ps_sync: rank 0's, through the servers, as PyTorch DDP broadcasts them).
  // Called by every worker at the same step where the algorithm is synchronous.
  virtual void SyncBuffers() {}
};

// Whether this env's algorithm balances batches ([algorithm] balance, or env.balance).
bool BalanceOn(const AlgorithmEnv& env);
// The factor that makes a mean over workers of this worker's gradient the mean over the
// global batch: world x samples / global_samples (1 when the batches are equal or unknown).
double GradientWeight(const StepInfo& info, int world);
// Multiplies every gradient by `weight` (nothing for 1); on-device views through `device`.
void ScaleGradients(const std::vector<ParamView>& params, double weight, DeviceOps* device = nullptr);
// One gradient times f (the float product); an on-device one through `device`, after the
// kernels that wrote it (its `ready` fence); queued: DeviceOps::ScaleQueued, for a caller
// whose readers order themselves after a later Record (the overlapped buckets).
void ScaleGradient(const ParamView& p, float f, DeviceOps* device, bool queued = false);
// Whether every gradient of `params` is finite (no NaN, no inf); on-device views through
// `device`.
bool GradientsFinite(const std::vector<ParamView>& params, DeviceOps* device = nullptr);

// FNV-1a over the bits of every host weight (views in order, one 32-bit word per float), as
// 16 hex digits: the `weights_hash` of end records, equal where the weights are identical.
std::string WeightsHash(const std::vector<ParamView>& views);
uint64_t WeightsHashValue(const std::vector<ParamView>& views);

// Every rank of `comm` takes rank 0's weights, so all start from one point. Ranks that built
// the model from the job's seed hold that point already: an all-gather of each rank's weights
// hash (8 bytes) finds that, and the model is broadcast only when some rank differs (or holds
// on-device weights, which the hash cannot read here).
void StartFromRankZero(Communicator& comm, const std::vector<ParamView>& params);

// Whether any rank of `comm` says yes (one all-reduce of a float): the stop vote, where the
// first worker whose model reaches the target stops the whole job. Every rank must call it.
bool AnyRank(Communicator& comm, bool mine);

using AlgorithmFactory = std::function<std::unique_ptr<Algorithm>(const AlgorithmEnv&)>;

// Registration from static initializers. Throws shoal::Error for a name already registered
// or missing from the facts table (a programming error: the binary stops at start-up).
bool RegisterAlgorithm(const std::string& name, AlgorithmFactory f);
// Throws shoal::Error "unknown algorithm "x" (known: ...)" for names not registered.
std::unique_ptr<Algorithm> MakeAlgorithm(const std::string& name, const AlgorithmEnv& env);

// The weights of every tensor as checkpoint entries "w/<name>", and back (sizes checked).
void SaveWeights(const std::vector<ParamView>& params, CheckpointState* out);
void RestoreWeights(const CheckpointState& in, const std::vector<ParamView>& params);
// A model's buffers as checkpoint entries "b/<name>", and back (a checkpoint without them
// was written by another model: the error names the entry).
void SaveBuffers(const std::vector<ParamView>& buffers, CheckpointState* out);
void RestoreBuffers(const CheckpointState& in, const std::vector<ParamView>& buffers);
// Every rank's buffers replaced by their mean over `comm`, the same bits on every rank (the
// Communicator contract); one all-reduce for all of them.
void AverageBuffers(Communicator& comm, const std::vector<ParamView>& buffers);

// Applies env.optimizer to every tensor with this step's LR (shared by algorithms that
// update locally). States are kept per tensor index: host states for host views, device
// states (env.make_device_updater) for on-device views, saved and loaded in one form so a
// checkpoint moves between CPU and GPU workers.
class LocalUpdater {
 public:
  explicit LocalUpdater(const AlgorithmEnv& env) : env_(env) {}
  // The guard: when any gradient is not finite the step is skipped (weights and states
  // untouched), counted, and Apply returns false. With an averaged gradient (allreduce)
  // every rank sees the same bits and so skips the same steps.
  bool Apply(const std::vector<ParamView>& params, int64_t step);
  int64_t skipped() const { return skipped_; }
  std::vector<OptimizerState>& states() { return states_; }
  // Its states as checkpoint entries "<prefix><tensor name>", and back.
  void Save(const std::vector<ParamView>& params, const std::string& prefix, CheckpointState* out) const;
  void Load(const std::vector<ParamView>& params, const std::string& prefix, const CheckpointState& in);

 private:
  DeviceUpdater& Device(const ParamView& p);

  AlgorithmEnv env_;
  std::vector<OptimizerState> states_;
  std::unique_ptr<DeviceUpdater> device_;  // made on the first on-device view
  int64_t skipped_ = 0;
};

}  // namespace shoal
