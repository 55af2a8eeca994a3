#include "worker/trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unistd.h>

#include "algorithms/algorithm.h"
#include "algorithms/balance.h"
#include "algorithms/env.h"
#include "algorithms/job_keys.h"
#include "algorithms/worker_checkpoints.h"
#include "common/checkpoint/checkpoint_store.h"
#include "common/error.h"
#include "common/int_list.h"
#include "common/metrics.h"
#include "worker/data/data_loader.h"
#include "worker/data/file_util.h"
#include "worker/engine/backend.h"
#include "worker/engine/model.h"
#include "worker/engine/onnx/onnx_export.h"
#include "worker/engine/onnx/onnx_import.h"
#include "worker/loss_scaler.h"
#include "worker/smoothout.h"

namespace shoal {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The model's parameters and gradients as views for the algorithm layer. On the CPU they
// alias the model's tensors; on a GPU they are host mirrors copied each step, unless the
// algorithm takes device params: then they alias the model's device tensors (on_device)
// and only checkpoints, the weights' hash and the export copy weights to the host. Host
// mirrors are the backend's staging memory (pinned on CUDA), and a whole model's copies
// are queued before one wait.
class ParamViews {
 public:
  ParamViews(Model& model, Backend& backend, bool device_params = false) : model_(model), backend_(backend) {
    host_ = backend.device().is_cpu();
    device_ = !host_ && device_params;
    float* mirror = nullptr;
    if (!host_ && !device_) {
      size_t floats = 0;
      for (auto& p : model.parameters()) floats += size_t(p.value.numel()) * 2;
      mirrors_ = backend.AllocHost(floats * sizeof(float));
      mirror = static_cast<float*>(mirrors_.get());
    }
    for (auto& p : model.parameters()) {
      ParamView v;
      v.name = p.name;
      v.n = p.value.numel();
      v.no_weight_decay = p.no_weight_decay;
      v.shape = p.value.shape();
      if (host_ || device_) {
        v.w = p.value.data<float>();
        v.g = p.grad.data<float>();
        v.on_device = device_;
      } else {
        v.w = mirror;
        v.g = v.w + v.n;
        mirror += 2 * v.n;
      }
      views_.push_back(v);
    }
  }
  const std::vector<ParamView>& views() const { return views_; }
  // Device -> host before the algorithm runs (the gradients too unless GradsToHost already
  // brought each of them over during the backward pass). Device params: the backward
  // kernels finish, nothing is copied.
  void PullWeightsAndGrads(bool grads = true) {
    if (host_) return;
    if (device_) return backend_.Synchronize();
    auto& ps = model_.parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      Down(ps[i].value, views_[i].w);
      if (grads) Down(ps[i].grad, views_[i].g);
    }
    backend_.Synchronize();
  }
  // Final gradients [first, last) (one node's), device -> host (waits for the backward
  // kernels that produce them). Device params: no host wait; one marker of the kernels
  // queued so far becomes every view's `ready`, and the algorithm's device ops wait on it
  // device-side (common/device_fence.h).
  void GradsToHost(size_t first, size_t last) {
    if (device_) {
      auto fence = backend_.RecordFence();
      for (size_t i = first; i < last; ++i) views_[i].ready = fence;
    } else if (!host_) {
      for (size_t i = first; i < last; ++i) Down(model_.parameters()[i].grad, views_[i].g);
      backend_.Synchronize();
    }
  }
  // Host -> device after it.
  void PushWeights() {
    if (host_ || device_) return;
    auto ps = model_.parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      backend_.CopyFromHostAsync(ps[i].value, views_[i].w);
      copied_bytes_ += ps[i].value.bytes();
    }
    backend_.Synchronize();
  }
  // Host views of the weights for code that reads or writes them on the host (checkpoints,
  // hash, export): the views themselves, or with device params host copies (g left null),
  // written back to the device by WeightsFromHost.
  const std::vector<ParamView>& HostWeights() {
    if (!device_) return views_;
    if (host_views_.empty()) {
      for (auto& v : views_) {
        weight_copies_.emplace_back(size_t(v.n));
        ParamView h = v;
        h.w = weight_copies_.back().data();
        h.g = nullptr;
        h.on_device = false;
        host_views_.push_back(h);
      }
    }
    auto& ps = model_.parameters();
    for (size_t i = 0; i < ps.size(); ++i) backend_.CopyToHost(ps[i].value, host_views_[i].w);
    return host_views_;
  }
  void WeightsFromHost() {
    if (!device_) return;
    auto& ps = model_.parameters();
    for (size_t i = 0; i < ps.size(); ++i) backend_.CopyFromHost(ps[i].value, host_views_[i].w);
  }
  bool on_device() const { return device_; }
  // Parameter and gradient bytes copied between host and device by the step path so far
  // (0 on the CPU and with device params); checkpoints and exports are not counted.
  int64_t copied_bytes() const { return copied_bytes_; }

 private:
  // Queued; the caller synchronizes.
  void Down(const Tensor& t, float* dst) {
    backend_.CopyToHostAsync(t, dst);
    copied_bytes_ += t.bytes();
  }

  Model& model_;
  Backend& backend_;
  bool host_;
  bool device_ = false;
  std::shared_ptr<void> mirrors_;  // weights and gradients, w then g per parameter
  std::vector<ParamView> views_;
  std::vector<std::vector<float>> weight_copies_;  // device params: HostWeights' memory
  std::vector<ParamView> host_views_;
  int64_t copied_bytes_ = 0;
};

// The model's buffers (batch-norm running statistics) as host views: on the CPU they alias
// the model's tensors; on a GPU they are copies, refreshed by ToHost and written back by
// FromHost.
class HostBuffers : public ModelBuffers {
 public:
  HostBuffers(Model& model, Backend& backend) : model_(model), backend_(backend) {
    host_ = backend.device().is_cpu();
    for (auto& b : model.buffers()) {
      ParamView v;
      v.name = b.name;
      v.n = b.value.numel();
      v.shape = b.value.shape();
      if (host_) {
        v.w = b.value.data<float>();
      } else {
        copies_.emplace_back(size_t(v.n));
        v.w = copies_.back().data();
      }
      views_.push_back(v);
    }
  }
  const std::vector<ParamView>& ToHost() override {
    if (!host_)
      for (size_t i = 0; i < views_.size(); ++i) backend_.CopyToHost(model_.buffers()[i].value, views_[i].w);
    return views_;
  }
  void FromHost() override {
    if (!host_)
      for (size_t i = 0; i < views_.size(); ++i) backend_.CopyFromHost(model_.buffers()[i].value, views_[i].w);
  }
  bool empty() const override { return views_.empty(); }

 private:
  Model& model_;
  Backend& backend_;
  bool host_;
  std::vector<std::vector<float>> copies_;
  std::vector<ParamView> views_;
};

struct EvalResult {
  double accuracy = 0;
  double loss = 0;
  int64_t scored = 0;  // test samples this worker scored (its share where the evaluation is split)
};

// What one pass over (a share of) the test set counted: summed across workers as they are.
struct EvalCounts {
  double correct = 0, seen = 0, loss_sum = 0;
};

EvalCounts CountTestSet(Model& model, Backend& backend, DataLoader& test) {
  test.StartEpoch(0);
  Batch b;
  EvalCounts c;
  Tensor x;
  while (test.Next(&b)) {
    Shape shape = {b.n};
    for (int64_t d : test.dataset().sample_shape()) shape.push_back(d);
    if (!x.defined() || x.shape() != shape) x = backend.Empty(shape);
    backend.CopyFromHost(x, b.images.data());
    StepResult r = model.EvalStep(x, b.labels.data());
    c.loss_sum += double(r.loss) * double(b.n);
    c.correct += double(r.correct);
    c.seen += double(b.n);
  }
  return c;
}

EvalResult Rate(const EvalCounts& c, int64_t labels_per_sample) {
  EvalResult r;
  if (c.seen > 0) {
    // Token windows count a hit per position (the next token predicted right), so accuracy
    // is the fraction of positions; the loss is already a per-position mean in each batch.
    r.accuracy = c.correct / (c.seen * double(labels_per_sample));
    r.loss = c.loss_sum / c.seen;
  }
  return r;
}

// One worker's run, in the order Train() calls the phases. Each phase leaves what the next
// needs in the members.
class Trainer {
 public:
  Trainer(const JobConfig& cfg, const TrainerOptions& opts)
      : cfg_(cfg),
        opts_(opts),
        rank_(opts.rank),
        world_(cfg.world_size()),
        scaler_(LossScaler::FromConfig(cfg)),
        smoothout_(cfg.optimizer_opts.GetDouble("smoothout", 0, 0, 1), cfg.seed) {
    if (rank_ < 0 || rank_ >= world_)
      throw Error(cfg.path + ": [cluster] workers: rank " + std::to_string(rank_) + " is outside the job's " +
                  std::to_string(world_) + " worker(s)");
    // Checked now rather than at the end: a path that cannot be written would lose the
    // whole run's weights after the run.
    // Where worker 0 may be lost, another worker may have to write the exports: every one checks.
    const bool may_export = rank_ == 0 || SurvivesLostWorkers(cfg);
    if (may_export && !cfg.export_weights.empty()) CheckExportPath(cfg, "export_weights", cfg.export_weights);
    if (may_export && !cfg.export_onnx.empty()) CheckExportPath(cfg, "export_onnx", cfg.export_onnx);
  }

  // The backend of this worker's device and its shard of the data.
  void LoadData() {
    const WorkerSpec& spec = cfg_.workers[size_t(rank_)];
    int threads = opts_.threads > 0 ? opts_.threads : int(cfg_.threads);
    try {
      backend_ = MakeBackend(ParseDevice(spec.device), threads, ParsePrecision(cfg_.precision));
    } catch (const Error& e) {
      throw Error(cfg_.path + ": worker " + std::to_string(rank_) + ": " + e.what());
    }

    DatasetOptions dopt;
    dopt.seed = cfg_.seed;
    // CheckJobLimits bounds the product; a hand-built config must not wrap it either.
    if (__builtin_mul_overflow(cfg_.synthetic_samples, int64_t(world_), &dopt.synthetic_samples) ||
        dopt.synthetic_samples > kMaxSamples)
      throw Error(cfg_.path + ": [data] synthetic_samples: " + std::to_string(cfg_.synthetic_samples) + " x " +
                  std::to_string(world_) + " workers is more than " + std::to_string(kMaxSamples) + " samples");
    dopt.synthetic_image_size = cfg_.synthetic_image_size;
    dopt.synthetic_channels = cfg_.data_channels;
    dopt.synthetic_classes = cfg_.synthetic_classes;
    dopt.cifar100_coarse = cfg_.data_label == "coarse";
    if (cfg_.data_format != "synthetic") dopt.num_classes = cfg_.data_classes;
    dopt.max_samples = cfg_.max_train_samples;
    dopt.image_size = cfg_.synthetic_image_size;
    dopt.channels = cfg_.data_channels;
    dopt.skip_bad = cfg_.skip_bad;
    dopt.mean.assign(cfg_.data_mean.begin(), cfg_.data_mean.end());
    dopt.stddev.assign(cfg_.data_std.begin(), cfg_.data_std.end());
    dopt.seq_len = cfg_.seq_len;
    train_set_ = LoadDataset(cfg_.data_format, cfg_.train_path, dopt);
    // In-memory formats normalize with their own statistics unless the job gives them.
    if (!train_set_->is_encoded() && (!cfg_.data_mean.empty() || !cfg_.data_std.empty())) {
      const size_t C = size_t(train_set_->channels());
      for (auto [key, v] : {std::make_pair("mean", &dopt.mean), std::make_pair("std", &dopt.stddev)})
        if (!v->empty() && v->size() != C)
          throw InputError(cfg_.path + ": [data] " + key + ": " + std::to_string(v->size()) + " values, but " +
                           train_set_->source() + " has " + std::to_string(C) + " channel(s)");
      train_set_->SetNormalization(dopt.mean.empty() ? train_set_->mean() : dopt.mean,
                                   dopt.stddev.empty() ? train_set_->stddev() : dopt.stddev);
    }
    dopt.max_samples = cfg_.max_test_samples;
    dopt.synthetic_samples = std::max<int64_t>(cfg_.batch_size, cfg_.synthetic_samples / 4);
    dopt.classes = train_set_->class_names();
    std::shared_ptr<Dataset> test_set = LoadDataset(cfg_.data_format, cfg_.test_path, dopt);
    test_set->UseNormalizationOf(*train_set_);
    // Bad inputs the readers left out: the same on every worker, so counted once.
    if (rank_ == 0) load_skipped_ = train_set_->load_skipped() + test_set->load_skipped();

    DataLoaderOptions lo;
    lo.batch_size = cfg_.batch_size;
    lo.rank = rank_;
    lo.world_size = world_;
    lo.seed = cfg_.seed;
    lo.shuffle = true;
    lo.drop_last = true;
    lo.augment = cfg_.augment;
    // Balanced batches slice each step's global batch (the layout must be fixed before the
    // first step: auto may turn balancing on after its probe), and so does a batch schedule
    // (each epoch's global batch tiles that epoch's permutation, whatever its size).
    lo.global_slices = MayBalance() || !cfg_.batch_schedule.empty();
    lo.crop_fraction = cfg_.crop_fraction;
    lo.skip_bad = cfg_.skip_bad;
    lo.shuffle_buffer = cfg_.shuffle_buffer;
    lo.token_offsets = true;  // tokens only: each epoch cuts the text at other places
    // Batches wait in the backend's staging memory: page-locked on CUDA workers, so copying
    // one to the device is an asynchronous DMA; plain memory on CPU workers.
    lo.host_memory = std::make_shared<HostMemory>([be = backend_.get()](size_t n) { return be->AllocHost(n); });
    lo.build_threads = int(cfg_.loader_threads);
    if (lo.build_threads == 0 && train_set_->is_encoded()) {
      // Decoding is the work here: the cores of this host, shared with the workers on it.
      int on_host = 0;
      for (const WorkerSpec& w : cfg_.workers) on_host += w.host == spec.host;
      lo.build_threads = std::max(1, std::min(8, int(std::thread::hardware_concurrency()) / std::max(1, on_host)));
    }
    train_ = std::make_unique<DataLoader>(train_set_, lo);
    if (train_->batches_per_epoch() < 1)
      throw Error(cfg_.path + ": [data] batch_size: " + std::to_string(cfg_.batch_size) + " x " +
                  std::to_string(world_) + " workers is larger than the training set (" +
                  std::to_string(train_set_->size()) + " samples)");
    batch_plan_ = std::make_unique<BatchSchedule>(
        cfg_.batch_schedule.empty()
            ? BatchSchedule::Constant(cfg_.batch_size * world_, train_->batches_per_epoch())
            : BatchSchedule(cfg_.batch_schedule, train_->total_samples(), cfg_.path + ": [train] batch_schedule"));
    DataLoaderOptions to = lo;
    to.rank = 0;
    to.world_size = 1;
    to.shuffle = false;
    to.drop_last = false;
    to.augment = false;
    to.global_slices = false;
    to.token_offsets = false;  // every evaluation scores the same windows
    // After the first evaluation each worker keeps the decoded batches of what it scores (up to
    // the bound) for the next ones.
    to.cache_bytes = cfg_.test_cache_mb << 20;
    to.batch_size = std::max<int64_t>(cfg_.batch_size, 256);
    test_ = std::make_unique<DataLoader>(test_set, to);
    test_share_options_ = to;
    test_share_options_.rank = rank_;
    test_share_options_.world_size = world_;
    test_set_ = test_set;
  }

  // The test set's accuracy and loss for the model this worker holds. Where every worker holds
  // the same model (EvaluationPeers) each scores every world-th sample and all add up the counts,
  // in rank order, so all report the same figures: the evaluation costs a world-th, and a
  // synchronous job no longer waits for its slowest worker to score the whole set. Elsewhere
  // each scores the whole set alone. Called by every worker at the same step where shared.
  EvalResult ScoreTestSet() {
    const int64_t per_sample = test_->dataset().labels_per_sample();
    Communicator* peers = world_ > 1 ? algo_->EvaluationPeers() : nullptr;
    if (peers && !test_share_) test_share_ = std::make_unique<DataLoader>(test_set_, test_share_options_);
    const EvalCounts mine = CountTestSet(*model_, *backend_, peers ? *test_share_ : *test_);
    EvalCounts sum = mine;
    if (peers) {
      std::vector<EvalCounts> all(size_t(peers->size()));
      peers->AllGather(&mine, sizeof mine, all.data());
      sum = EvalCounts();
      for (const EvalCounts& c : all) {
        sum.correct += c.correct;
        sum.seen += c.seen;
        sum.loss_sum += c.loss_sum;
      }
    }
    EvalResult r = Rate(sum, per_sample);
    r.scored = int64_t(mine.seen);
    return r;
  }

  // The model, initialized with the job's seed: the same start on every worker.
  void BuildModel() {
    ModelOptions mo;
    mo.input_shape = train_set_->sample_shape();
    mo.num_classes = train_set_->num_classes();
    mo.zero_gamma_init = cfg_.zero_gamma_init;
    mo.label_smoothing = float(cfg_.label_smoothing);
    if (cfg_.weight_init == "he_normal") mo.init = WeightInit::kHeNormal;
    if (cfg_.weight_init == "uniform") mo.init = WeightInit::kFanInUniform;
    if (train_set_->is_tokens() && cfg_.onnx_model.empty())
      throw InputError(cfg_.path + ": [data] format = \"tokens\" needs a sequence model: [model] onnx (the zoo's " +
                       "models classify images)");
    if (!cfg_.onnx_model.empty()) {
      OnnxOptions oo;
      oo.sequence_output = train_set_->is_tokens();
      oo.input_shape = mo.input_shape;
      oo.num_classes = mo.num_classes;
      oo.seed = cfg_.seed * 1000003 + uint64_t(opts_.rank);  // dropout: each worker its own masks
      oo.constants = cfg_.onnx_constants;
      oo.label_smoothing = mo.label_smoothing;
      oo.batch = cfg_.batch_size;
      model_ = ImportOnnx(cfg_.onnx_model, *backend_, oo);
    } else {
      model_ = MakeModel(cfg_.model, *backend_, mo);
    }
    model_->InitParameters(cfg_.seed);
  }

  // The algorithm, connected to its peers, with the starting weights (its own, rank 0's,
  // the servers' or a checkpoint's).
  void StartAlgorithm() {
    // An elastic diloco worker restarted alone keeps its store as it is (the job's checkpoints
    // go on); it resumes nothing from it: the others hand it the global state.
    const bool elastic_rejoin = opts_.rejoin && SurvivesLostWorkers(cfg_);
    if (elastic_rejoin && opts_.resume)
      throw InputError(cfg_.path +
                       ": --rejoin with --resume: a diloco worker with elastic = true restarted alone "
                       "takes the global state from the others at the next outer step, not from a checkpoint; "
                       "drop --resume");
    const CheckpointStart start =
        elastic_rejoin ? CheckpointStart::kResume : CheckpointStartFrom(opts_.resume, opts_.fresh);
    if (opts_.resume && cfg_.checkpoint_dir.empty())
      throw Error(cfg_.path + ": --resume: [job] checkpoint_dir is not set, so there is no checkpoint to resume from");
    // An earlier run's checkpoints, refused before this worker joins anyone (the store opens
    // only after the algorithm has met its peers): InputError, exit 2, never restarted.
    if (start == CheckpointStart::kNew && !FactsOf(cfg_.algorithm).needs_servers && !cfg_.checkpoint_dir.empty()) {
      const std::string path = cfg_.checkpoint_dir + "/worker-" + std::to_string(rank_);
      std::optional<HeldCheckpoints> held = CheckpointStore::Peek(path);
      if (held && !held->empty()) throw InputError(EarlierRunError("worker " + std::to_string(rank_), path, *held));
    }
    metrics_.Open(cfg_.output_dir + "/metrics.jsonl");
    // A member that stopped answering ends this worker at once with one line naming it (a
    // collective would otherwise wait out its own timeout).
    const int rank = rank_;
    auto finished = finished_;
    auto on_member_failure = [rank, finished](const std::string& why) {
      // Past the algorithm's Finish this worker needs nobody: rank 0's coordinator may
      // already be gone (it waits for the others only so long), and the final evaluation
      // and end record must not die with it (a restart would run a finished job again).
      if (finished->load()) {
        fprintf(stderr, "shoal-worker %d: after this worker's training ended: %s (no matter now)\n", rank, why.c_str());
        return;
      }
      fprintf(stderr, "shoal-worker %d: the job cannot go on: %s\n", rank, why.c_str());
      fflush(stderr);
      fflush(stdout);
      _exit(1);
    };
    env_ = MakeAlgorithmEnv(cfg_, rank_, *batch_plan_, &metrics_, opts_.resume, on_member_failure);
    // Restarted alone: with --resume in ps_sync; a job that survives lost workers needs no
    // checkpoint (the others hand it the global state at the next outer step).
    env_.rejoin = opts_.rejoin && (opts_.resume || SurvivesLostWorkers(cfg_));
    // Balanced batches give no worker fewer samples than batch norm needs (balance.h).
    env_.min_share = MinBalancedShare(model_->MinStatisticsValues(), cfg_.batch_size);
    env_.test_samples = test_->total_samples();
    algo_ = MakeAlgorithm(cfg_.algorithm, env_);
    buffers_ = std::make_unique<HostBuffers>(*model_, *backend_);
    // Averaging the buffers meets every worker, and the live ones may be fewer.
    if (SurvivesLostWorkers(cfg_) && !buffers_->empty())
      throw InputError(cfg_.algorithm_opts.Where("elastic") + ": model \"" + cfg_.model +
                       "\" has batch-norm statistics, which every worker averages; not with elastic = true");
    algo_->SetBuffers(buffers_.get());
    // Workers that train one model over a communicator (every algorithm without servers but
    // local, whose workers are independent) average their buffers over one of their own (an
    // algorithm's exchange may be in flight at an evaluation: double_buffer).
    const auto keys = KnownAlgorithmKeys(cfg_.algorithm);
    const bool collective = std::find(keys.begin(), keys.end(), "collective") != keys.end();
    if (collective && world_ > 1 && !buffers_->empty()) buffers_comm_ = env_.make_communicator("buffers");
    // A CUDA worker whose algorithm takes device params hands it the model's own tensors.
    params_ = std::make_unique<ParamViews>(*model_, *backend_, algo_->TakesDeviceParams());
    // Overlap: each node's gradients go to the algorithm as soon as the backward pass has
    // finished them (the engine only calls back; it knows nothing of algorithms).
    // Asked again every step: auto wants them only once it has chosen an algorithm that does.
    model_->set_grad_ready_hook([this](size_t first, size_t last) {
      if (!overlap_ || first >= last) return;
      params_->GradsToHost(first, last);
      for (size_t i = first; i < last; ++i) {
        // The exchange carries true gradients. Queued on the device: the buckets that read
        // them are ordered after it (BucketScheduler), and the backward pass goes on.
        scaler_.Unscale(params_->views()[i], env_.device.get(), /*queued=*/true);
        algo_->GradReady(params_->views(), i);
      }
    });
    // Jobs without servers keep their checkpoints on the workers, each its own.
    if (!FactsOf(cfg_.algorithm).needs_servers && !cfg_.checkpoint_dir.empty())
      checkpoints_ = std::make_unique<WorkerCheckpoints>(cfg_, rank_, world_, env_.store.get(), start,
                                                         SurvivesLostWorkers(cfg_), elastic_rejoin);
    params_->PullWeightsAndGrads();
    algo_->Init(params_->views());
    if (checkpoints_ && elastic_rejoin) checkpoints_->Joined(algo_->ResumedStep());  // it holds the global state
    if (checkpoints_ && opts_.resume) {
      CheckpointState st = checkpoints_->Resume(algo_->peers(), algo_->AveragedOnReshape());
      const bool reshaped = st.record.shards != uint32_t(world_);
      const std::string reshape_line = reshaped ? ReshapePosition(&st) : "";
      RestoreWeights(st, params_->HostWeights());
      params_->WeightsFromHost();
      RestoreBuffers(st, buffers_->ToHost());
      buffers_->FromHost();
      buffers_synced_at_ = st.record.step;  // they were made the job's before being saved
      algo_->LoadState(params_->views(), st);
      if (reshaped) {
        const std::string note = algo_->ReshapeNote();
        printf("worker %d: %s%s\n", rank_, reshape_line.c_str(), note.empty() ? "" : ("; " + note).c_str());
        fflush(stdout);
      }
      scaler_.Load(st);
      resumed_step_ = st.record.step;
      step_ = resumed_step_;  // the balance record names the step it applies from
      // The split saved is of the last step trained; the next epoch's batch applies at its start.
      UseGlobalBatch(batch_plan_->BatchAt(std::max<int64_t>(0, step_ - 1)));
      StartBalancing(reshaped ? nullptr : &st);  // a split of other workers is void
    }
    StartBalancing(nullptr);
    params_->PushWeights();
    copied_at_window_ = params_->copied_bytes();  // the first train record counts steps only
    printf("worker %d/%d: %s on %s, %s, %lld samples, %lld steps/epoch, algorithm %s, optimizer %s\n", rank_, world_,
           cfg_.model.c_str(), backend_->Name().c_str(), cfg_.data_format.c_str(), (long long)train_set_->size(),
           (long long)env_.steps_per_epoch, algo_->Name().c_str(), env_.optimizer->Name().c_str());
    fflush(stdout);
  }

  // Epochs of steps, an evaluation after each, until the last epoch, max_steps or the
  // target accuracy (agreed among the workers by the algorithm), then Finish.
  TrainResult TrainEpochs() {
    // A resumed job continues at the checkpoint's data position: the same batches, in the
    // same order, as if it had never stopped.
    step_ = checkpoints_ && opts_.resume ? resumed_step_ : algo_->ResumedStep();
    const int64_t first_epoch = batch_plan_->EpochOfStep(step_);
    const int64_t first_batch = step_ - batch_plan_->FirstStepOfEpoch(first_epoch);
    if (step_ > 0 && env_.rejoin && !opts_.resume) {  // the algorithm wrote its own record
      printf("worker %d: takes up training at step %lld (epoch %lld, batch %lld), where the others are\n", rank_,
             (long long)step_, (long long)first_epoch, (long long)first_batch);
    } else if (step_ > 0) {
      const std::string from = checkpoints_ ? checkpoints_->resumed_from() : "";
      printf("worker %d: resumed at step %lld (epoch %lld, batch %lld)%s\n", rank_, (long long)step_,
             (long long)first_epoch, (long long)first_batch, from.empty() ? "" : (" from " + from).c_str());
      JsonObject resume;
      resume.Add("rank", rank_).Add("epoch", first_epoch).Add("batch", first_batch);
      if (!from.empty()) resume.Add("from", from);
      metrics_.Write("resume", step_, resume);
    }
    t_start_ = Clock::now();
    while (true) {
      try {
        EpochsFrom(step_);
        return Finish();
      } catch (const RewindTo& r) {
        // The algorithm went back (ps_sync after a shard or worker was restarted alone, in
        // a step or at the finish barrier): its weights are the checkpoint's, so go on
        // from that checkpoint's data position and finish again.
        params_->PushWeights();
        printf("worker %d: rewound from step %lld to step %lld: %s\n", rank_, (long long)step_, (long long)r.step,
               r.why.c_str());
        fflush(stdout);
        metrics_.Write("rewind", r.step, JsonObject().Add("rank", rank_).Add("from_step", step_).Add("why", r.why));
        step_ = r.step;
        buffers_synced_at_ = -1;  // the servers' buffers were pulled; sync again where due
        epoch_loss_sum_ = 0;      // the steps rolled back are trained again
        epoch_loss_n_ = 0;
      }
    }
  }

  // The epochs from step `from` on (its epoch and batch within it).
  void EpochsFrom(int64_t from) {
    const int64_t first_epoch = batch_plan_->EpochOfStep(from);
    const int64_t first_batch = from - batch_plan_->FirstStepOfEpoch(first_epoch);
    bool stop = cfg_.max_steps > 0 && step_ >= cfg_.max_steps;
    for (int64_t epoch = first_epoch; epoch < cfg_.epochs && !stop; ++epoch) {
      UseGlobalBatch(batch_plan_->BatchOfEpoch(epoch));
      if (epoch == first_epoch && first_batch > 0)
        train_->Seek({epoch, first_batch});
      else
        train_->StartEpoch(epoch);
      while (!stop && TrainStep(epoch)) {
        stop = (cfg_.max_steps > 0 && step_ >= cfg_.max_steps) || algo_->StopRequested();
        // Every rank is at the same step here, so the collectives inside come in the same order.
        // The epoch's last step is left to the evaluation at its end; agreeing to stop here ends
        // the training with this evaluation as its last.
        if (!stop && cfg_.eval_every_steps > 0 && step_ % cfg_.eval_every_steps == 0 &&
            step_ != batch_plan_->FirstStepOfEpoch(epoch + 1) && EvaluateAndAgree(epoch, /*epoch_end=*/false, false))
          return;
      }
      // Another worker reached the target: the job's final model is evaluated at Finish.
      if (algo_->StopRequested()) break;
      stop = EvaluateAndAgree(epoch, /*epoch_end=*/true, stop);
    }
  }

  // Evaluates the model on the test set, records it, and agrees with every worker whether to
  // stop (this worker's `stop`, or the target reached). At an epoch's end it also checks for
  // a dead network over that epoch's losses.
  bool EvaluateAndAgree(int64_t epoch, bool epoch_end, bool stop) {
    SyncBuffers();
    const auto t_eval = Clock::now();
    EvalResult ev = ScoreTestSet();
    const double eval_s = Since(t_eval);
    if (cfg_.skip_bad) ReportSkips();
    accuracy_ = ev.accuracy;
    evaluated_ = true;
    double sps = double(samples_) / std::max(1e-9, Since(t_start_));
    metrics_.Write("eval", step_,
                   JsonObject()
                       .Add("rank", rank_)
                       .Add("epoch", epoch + 1)
                       .Add("epoch_end", epoch_end)
                       .Add("test_accuracy", ev.accuracy)
                       .Add("test_loss", ev.loss)
                       .Add("eval_s", eval_s)
                       .Add("test_samples", ev.scored)
                       .Add("samples_per_s", sps)
                       .Add("bytes_sent", algo_->bytes_sent()));
    printf("worker %d: epoch %lld%s step %lld test_accuracy %.4f test_loss %.4f samples/s %.0f\n", rank_,
           (long long)epoch + 1, epoch_end ? "" : " (part)", (long long)step_, ev.accuracy, ev.loss, sps);
    fflush(stdout);
    if (epoch_end) WarnIfDead(epoch, ev.accuracy);
    bool reached = cfg_.target_accuracy > 0 && ev.accuracy >= cfg_.target_accuracy;
    return algo_->AgreeToStop(stop || reached);
  }

  // The algorithm's final sync, a last evaluation if it changed the model, the weights'
  // hash and export, and the end record.
  TrainResult Finish() {
    params_->PullWeightsAndGrads();
    algo_->Finish(params_->views());
    finished_->store(true);
    params_->PushWeights();
    if (algo_->skipped_steps() > skipped_seen_) scaler_.Update(true);  // double_buffer's last step
    skipped_seen_ = algo_->skipped_steps();
    // A run resumed from the checkpoint at its very end trained no epoch here, and still
    // reports the model's accuracy.
    // Every rank: making the buffers the job's may be a collective.
    if (algo_->ModelChangedAtFinish() || !evaluated_) SyncBuffers();
    if (algo_->EvaluatesFinalModel() && (algo_->ModelChangedAtFinish() || !evaluated_)) {
      SlowFinalEvaluationFailpoint();
      EvalResult ev = ScoreTestSet();
      if (cfg_.skip_bad) ReportSkips();
      accuracy_ = ev.accuracy;
      metrics_.Write("eval", step_,
                     JsonObject()
                         .Add("rank", rank_)
                         .Add("final", true)
                         .Add("test_accuracy", ev.accuracy)
                         .Add("test_loss", ev.loss)
                         .Add("test_samples", ev.scored)
                         .Add("bytes_sent", algo_->bytes_sent()));
      printf("worker %d: final model test_accuracy %.4f\n", rank_, ev.accuracy);
    }
    params_->PullWeightsAndGrads();
    std::string hash = WeightsHash();
    // Worker 0 writes the exports, or where it may have been lost the lowest member that finished.
    const bool writes_outputs = rank_ == algo_->OutputRank();
    if (writes_outputs && !cfg_.export_weights.empty()) ExportWeights();
    // The model's own tensors hold what was just hashed and evaluated: the final weights and
    // the synchronized statistics.
    if (writes_outputs && !cfg_.export_onnx.empty()) ExportOnnx(*model_, *backend_, cfg_.export_onnx, cfg_.onnx_model);

    TrainResult res;
    res.steps = step_;
    res.test_accuracy = accuracy_;
    res.samples_per_s = double(samples_) / std::max(1e-9, Since(t_start_));
    res.bytes_sent = algo_->bytes_sent();
    JsonObject end;
    end.Add("rank", rank_)
        .Add("steps", step_)
        .Add("test_accuracy", accuracy_)
        .Add("samples_per_s", res.samples_per_s)
        .Add("bytes_sent", res.bytes_sent)
        .Add("compute_s", compute_s_)
        .Add("comm_s", comm_s_)
        .Add("wait_s", wait_s_)
        .Add("loss_scale", scaler_.scale_double())
        .Add("skipped_steps", scaler_.skipped_steps())
        .Add("weights_hash", hash)
        .Add("buffers_hash", shoal::WeightsHash(buffers_->ToHost()))
        .Add("data_skipped", DataSkipped());
    algo_->AddMetrics(&end);  // the algorithm's own totals (diloco's bytes per outer step)
    metrics_.Write("end", step_, end);
    return res;
  }

 private:
  // One step: next batch, forward/backward, the algorithm, a train record every
  // log_every_steps. False when the epoch has no batch left.
  bool TrainStep(int64_t epoch) {
    auto t0 = Clock::now();
    if (batch_copied_) batch_copied_->Wait();  // Next hands the last batch's buffer back to the loader
    batch_copied_ = nullptr;
    if (!train_->Next(&batch_)) return false;
    wait_s_ += Since(t0);
    if (cfg_.skip_bad) ReportSkips();
    auto t1 = Clock::now();
    Shape shape = {batch_.n};
    for (int64_t d : train_set_->sample_shape()) shape.push_back(d);
    if (!x_.defined() || x_.shape() != shape) x_ = backend_->Empty(shape);
    backend_->CopyFromHostAsync(x_, batch_.images.data());
    batch_copied_ = backend_->RecordFence();
    model_->ZeroGrad();
    overlap_ = algo_->WantsGradReady();
    if (overlap_) algo_->BeginBackward(params_->views());
    smoothout_.Perturb(*model_, step_);
    float loss = model_->TrainStep(x_, batch_.labels.data(), scaler_.scale()).loss;
    smoothout_.Restore(*model_);  // the algorithm updates the unperturbed weights
    if (!std::isfinite(loss))
      throw Error("training diverged: loss is " + std::to_string(loss) + " at step " + std::to_string(step_) +
                  " (lower [optimizer] lr?)");
    params_->PullWeightsAndGrads(/*grads=*/!overlap_);
    if (!overlap_)  // with overlap the hook unscaled each gradient as it became final
      for (auto& v : params_->views()) scaler_.Unscale(v, env_.device.get());
    // A slowed worker stands for a slower device: its extra time counts as compute, so
    // its compute_s (and the launcher's straggler figures) show what such a device would.
    const double slowdown = cfg_.workers[size_t(rank_)].slowdown;
    const double compute = Since(t1);
    if (slowdown > 0) std::this_thread::sleep_for(std::chrono::duration<double>(slowdown * compute));
    const double busy = Since(t1);  // what this worker's throughput is measured on
    compute_s_ += busy;
    auto t2 = Clock::now();
    StepInfo info;
    info.step = step_;
    info.epoch = epoch;
    info.loss = loss;
    info.samples = batch_.n;
    info.global_samples = balancer_ ? balancer_->global() : 0;
    algo_->Step(params_->views(), info);
    params_->PushWeights();
    const int64_t skipped = algo_->skipped_steps();  // its guard met a NaN or inf
    scaler_.Update(skipped > skipped_seen_);
    skipped_seen_ = skipped;
    comm_s_ += Since(t2);
    ++step_;
    if (balancer_) {
      balancer_->Observe(batch_.n, busy);
      if (balancer_->MaybeRebalance(step_)) ApplyShare();
    } else {
      StartBalancing(nullptr);  // auto may have handed over to a balanced algorithm
    }
    samples_ += batch_.n;
    window_samples_ += batch_.n;
    loss_sum_ += loss;
    ++loss_n_;
    epoch_loss_sum_ += loss;
    ++epoch_loss_n_;
    if (step_ % cfg_.log_every_steps == 0) LogTrain(epoch);
    if (checkpoints_ && cfg_.checkpoint_every_steps > 0 && step_ % cfg_.checkpoint_every_steps == 0) SaveCheckpoint();
    return true;
  }

  // A network whose mean loss over a whole epoch stayed at ln(classes) with chance accuracy
  // predicts the same for every input: its ReLUs are all off (it diverged in its first steps)
  // and it will not recover. Said once, by rank 0, on the console (through the launcher)
  // and in metrics.
  void WarnIfDead(int64_t epoch, double accuracy) {
    const double n = double(epoch_loss_n_), mean = epoch_loss_sum_ / std::max(1.0, n);
    epoch_loss_sum_ = 0;
    epoch_loss_n_ = 0;
    const double classes = double(train_set_->num_classes()), chance = std::log(classes);
    if (rank_ != 0 || warned_dead_ || n < 20 || mean < 0.97 * chance || accuracy > 1.5 / classes) return;
    warned_dead_ = true;
    char msg[640];
    snprintf(msg, sizeof msg,
             "the training loss never fell below ln(%d) = %.3f in epoch %lld (mean %.4f) and test accuracy is "
             "%.3f, chance: the network is dead (every output the same). Likely cause: a learning rate too "
             "large for the model's start (lr %g, optimizer %s) drove every ReLU off in the first steps; "
             "lower [optimizer] lr, add warmup_epochs, or keep [model] init = \"auto\"/\"uniform\"",
             int(classes), chance, (long long)epoch + 1, mean, accuracy,
             env_.schedule->At(std::max<int64_t>(0, step_ - 1)), cfg_.optimizer.c_str());
    printf("worker %d: warning: %s\n", rank_, msg);
    fflush(stdout);
    metrics_.Write("warning", step_, JsonObject().Add("rank", rank_).Add("kind", "dead_network").Add("message", msg));
  }

  // Tests: SHOAL_FAILPOINT_SLOW_FINAL_EVAL="RANK:MS" holds that rank's final evaluation
  // for MS milliseconds (a slower device's evaluation, while the others have left).
  void SlowFinalEvaluationFailpoint() const {
    const char* fp = getenv("SHOAL_FAILPOINT_SLOW_FINAL_EVAL");
    int r = -1, ms = 0;
    if (fp && sscanf(fp, "%d:%d", &r, &ms) == 2 && r == rank_ && ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(ms, 600000)));
  }

  // Whether this job may balance batches: [algorithm] balance, or an algorithm that may
  // choose a balanced one (auto) unless balance = false.
  bool MayBalance() const {
    const auto keys = KnownAlgorithmKeys(cfg_.algorithm);
    if (std::find(keys.begin(), keys.end(), "balance") == keys.end()) return false;
    return cfg_.algorithm_opts.GetBool("balance", !FactsOf(cfg_.algorithm).may_choose.empty());
  }

  // Starts the balancer once the algorithm balances batches (at Init, at a resume, or at
  // auto's hand-over: the same step on every rank, as making its communicator needs);
  // `resumed` restores the checkpoint's split.
  void StartBalancing(const CheckpointState* resumed) {
    if (balancer_ || !algo_->BalancesBatches()) return;
    SHOAL_CHECK(train_->options().global_slices,
                cfg_.path + ": [algorithm] balance: the data loader was not set up for balanced batches");
    balancer_ = std::make_unique<Balancer>(env_);
    balancer_->SetGlobal(train_->options().batch_size * world_);  // the loader's: the current stage's
    if (resumed) balancer_->Load(*resumed);
    ApplyShare();
  }

  // Batch-size control: every worker's loader at `global` samples a step (the equal share,
  // or the balancer's split of it scaled to the new size), from the next StartEpoch or Seek.
  void UseGlobalBatch(int64_t global) {
    if (!train_->options().global_slices || train_->options().batch_size * world_ == global) return;
    train_->SetBatchSize(global / world_);
    if (!balancer_) return;
    balancer_->SetGlobal(global);
    ApplyShare();
  }

  // This worker's slice of the global batch from the next step on.
  void ApplyShare() {
    train_->SetShare(balancer_->offset(), balancer_->mine());
    if (rank_ != 0) return;
    std::string sizes;
    for (int64_t v : balancer_->sizes()) sizes += (sizes.empty() ? "" : ",") + std::to_string(v);
    metrics_.Write("balance", step_, JsonObject().Add("rank", rank_).Add("sizes", sizes));
  }

  // A checkpoint written by another number of workers: the same epoch and, in it, the batch
  // with as many samples behind it (OnOtherWorkers). Later checkpoint ids go on from the
  // resumed one. Returns the console's account of it.
  std::string ReshapePosition(CheckpointState* st) {
    const CheckpointRecord old = st->record;
    if (!cfg_.batch_schedule.empty()) {
      // The schedule fixes the global batch whatever the worker count: the position holds.
      checkpoints_->ContinueFrom(old.id, old.step);
      return "checkpoint " + std::to_string(old.id) + " was written by " + std::to_string(old.shards) +
             " workers, this job has " + std::to_string(world_) + ": the batch schedule's global batch is the same, " +
             "so training goes on at step " + std::to_string(old.step);
    }
    st->record = OnOtherWorkers(old, cfg_.batch_size, int(old.shards), world_, env_.steps_per_epoch);
    checkpoints_->ContinueFrom(old.id, st->record.step);
    return OnOtherWorkersLine(old, st->record, cfg_.batch_size, int(old.shards), world_);
  }

  // This worker's weights, its algorithm's state and the data position, committed once
  // every worker has written the same step.
  void SaveCheckpoint() {
    auto t0 = Clock::now();
    CheckpointState st;
    st.record.id = checkpoints_->IdAt(step_);
    st.record.step = step_;
    st.record.epoch = batch_plan_->EpochOfStep(step_);
    st.record.batch = step_ - batch_plan_->FirstStepOfEpoch(st.record.epoch);
    SaveWeights(params_->HostWeights(), &st);
    SyncBuffers();  // every rank saves the job's buffers, as an evaluation here would see them
    SaveBuffers(buffers_->ToHost(), &st);
    algo_->SaveState(params_->views(), &st);
    scaler_.Save(&st);
    if (balancer_) balancer_->Save(&st);
    uint64_t bytes = 0;
    for (auto& [k, v] : st.entries) bytes += v.size();
    const uint64_t id = st.record.id;
    st.record.absent = algo_->CheckpointAbsent(step_);
    const std::vector<uint32_t> absent = st.record.absent;
    if (!checkpoints_->Save(std::move(st))) return;  // elastic: a writer was lost first
    // Failpoint for tests: rank 0 dies once (the file named here marks it done) after every
    // worker wrote this checkpoint and before its log line: a launcher reading only the log
    // takes that moment for "no checkpoint yet".
    if (const char* once = getenv("SHOAL_FAILPOINT_DIE_BEFORE_CHECKPOINT_LOG"); once && rank_ == 0) {
      if (FILE* f = fopen(once, "wx")) {
        fclose(f);
        _exit(1);
      }
    }
    // The lowest worker that wrote it logs it (elastic diloco: worker 0 may be lost, or a
    // newcomer absent from the checkpoint of the step it joined at).
    uint32_t logger = 0;
    while (std::count(absent.begin(), absent.end(), logger)) ++logger;
    if (uint32_t(rank_) == logger) {
      JsonObject ev;
      ev.Add("rank", rank_).Add("id", int64_t(id)).Add("bytes", int64_t(bytes)).Add("write_s", Since(t0));
      if (!absent.empty()) ev.Add("absent", JoinIntList(absent));  // elastic: workers that wrote none of it
      metrics_.Write("checkpoint", step_, ev);
    }
  }

  void LogTrain(int64_t epoch) {
    double sps = double(window_samples_) / std::max(1e-9, Since(t_window_));
    JsonObject f;
    f.Add("rank", rank_).Add("epoch", epoch).Add("loss", loss_sum_ / double(loss_n_)).Add("samples_per_s", sps);
    f.Add("batch_size", batch_.n).Add("global_batch", batch_plan_->BatchAt(step_ - 1));
    f.Add("lr", env_.schedule->At(step_ - 1))
        .Add("compute_s", compute_s_)
        .Add("comm_s", comm_s_)
        .Add("wait_s", wait_s_);
    f.Add("bytes_sent", algo_->bytes_sent());
    f.Add("loss_scale", scaler_.scale_double()).Add("skipped_steps", scaler_.skipped_steps());
    if (cfg_.skip_bad) f.Add("data_skipped", DataSkipped());
    // Host<->device parameter traffic of the step path: 0 on the CPU and with device params.
    f.Add("param_copy_bytes_per_step", (params_->copied_bytes() - copied_at_window_) / std::max<int64_t>(1, loss_n_))
        .Add("device_params", params_->on_device());
    copied_at_window_ = params_->copied_bytes();
    algo_->AddMetrics(&f);
    metrics_.Write("train", step_, f);
    t_window_ = Clock::now();
    window_samples_ = 0;
    loss_sum_ = 0;
    loss_n_ = 0;
  }

  // skip_bad: each bad sample a loader met for the first time, as a line on stderr and a
  // data_skip event. The test set is every worker's whole test set: rank 0 alone counts it.
  void ReportSkips() {
    for (DataLoader* l : {train_.get(), test_.get()})
      for (const std::string& why : l->TakeSkipNotes()) {
        if (l == test_.get() && rank_ == 0) ++test_skipped_;
        fprintf(stderr, "shoal-worker %d: skipping bad data ([data] skip_bad): %s\n", rank_, why.c_str());
        metrics_.Write("data_skip", step_, JsonObject().Add("rank", rank_).Add("what", why));
      }
  }
  // Samples this worker's batches skipped (each time), and on rank 0 the bad inputs the
  // readers left out and the bad test images (each once): summed over workers, the job's.
  int64_t DataSkipped() const { return train_->skipped() + load_skipped_ + test_skipped_; }

  // FNV-1a of the final weights: synchronous algorithms must end bit-identical everywhere.
  std::string WeightsHash() const { return shoal::WeightsHash(params_->HostWeights()); }

  // Before an evaluation or a worker checkpoint, at most once a step (so a resumed run sees
  // the very buffers the uninterrupted one evaluated; the export follows the last
  // evaluation): the job's buffers. Collective jobs average the ranks' own (each of their
  // algorithms agrees to stop by a collective, so all ranks come here at the same steps);
  // PS algorithms do what their mode needs (Algorithm::SyncBuffers); local's workers keep
  // their own.
  void SyncBuffers() {
    if (buffers_->empty() || buffers_synced_at_ == step_) return;
    buffers_synced_at_ = step_;
    if (buffers_comm_) {
      AverageBuffers(*buffers_comm_, buffers_->ToHost());
      buffers_->FromHost();
    } else {
      algo_->SyncBuffers();
    }
  }

  static void CheckExportPath(const JobConfig& cfg, const std::string& key, const std::string& path) {
    const std::string where = cfg.path + ": [job] " + key + " = \"" + path + "\": ";
    if (data::DirExists(path)) throw Error(where + "is a directory (expected a file to write to)");
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    if (access(dir.c_str(), W_OK) != 0)
      throw Error(where + "cannot write in " + dir + ": " + std::string(strerror(errno)));
  }

  // Raw fp32: the parameters in the model's stable order (Model::ParamLayout()), then the
  // buffers (batch-norm running statistics) in Model::buffers() order, which evaluation
  // needs as much as the weights.
  void ExportWeights() const {
    FILE* f = fopen(cfg_.export_weights.c_str(), "wb");
    if (!f) throw Error(cfg_.export_weights + ": cannot write exported weights");
    bool ok = true;
    for (auto& v : params_->HostWeights()) ok = ok && fwrite(v.w, 4, size_t(v.n), f) == size_t(v.n);
    for (auto& v : buffers_->ToHost()) ok = ok && fwrite(v.w, 4, size_t(v.n), f) == size_t(v.n);
    ok = (fclose(f) == 0) && ok;
    if (!ok) throw Error(cfg_.export_weights + ": short write of exported weights");
  }

  const JobConfig& cfg_;
  const TrainerOptions opts_;
  const int rank_, world_;
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<Dataset> train_set_;
  std::unique_ptr<DataLoader> train_, test_;
  // Every world-th test sample from this rank's on (ScoreTestSet), made at the first shared evaluation.
  std::unique_ptr<DataLoader> test_share_;
  std::shared_ptr<Dataset> test_set_;
  DataLoaderOptions test_share_options_;
  std::unique_ptr<BatchSchedule> batch_plan_;  // the global batch of each epoch, and the step <-> epoch map
  std::unique_ptr<Model> model_;
  std::unique_ptr<ParamViews> params_;
  std::unique_ptr<HostBuffers> buffers_;  // outlives algo_, which may hold it
  MetricsWriter metrics_;
  AlgorithmEnv env_;
  std::unique_ptr<Algorithm> algo_;
  bool overlap_ = false;  // the algorithm takes gradients during the backward pass
  // Set once the algorithm's Finish returned; read by the membership's thread.
  std::shared_ptr<std::atomic<bool>> finished_ = std::make_shared<std::atomic<bool>>(false);
  LossScaler scaler_;
  SmoothOut smoothout_;           // [optimizer] smoothout: the weights perturbed for forward and backward
  int64_t skipped_seen_ = 0;      // algo_->skipped_steps() after the last step
  int64_t copied_at_window_ = 0;  // params_->copied_bytes() at the last train record
  std::unique_ptr<WorkerCheckpoints> checkpoints_;
  std::unique_ptr<Balancer> balancer_;          // while the algorithm balances batches
  std::unique_ptr<Communicator> buffers_comm_;  // jobs without servers: averages the buffers
  int64_t buffers_synced_at_ = -1;              // the step SyncBuffers last ran at
  int64_t resumed_step_ = 0;
  bool evaluated_ = false;
  double epoch_loss_sum_ = 0;  // this epoch's training losses, for WarnIfDead
  int64_t epoch_loss_n_ = 0;
  bool warned_dead_ = false;  // an epoch's evaluation ran in this process
  Tensor x_;
  std::shared_ptr<const DeviceFence> batch_copied_;  // the copy of batch_ to x_ (null: done)
  Batch batch_;
  int64_t step_ = 0, samples_ = 0, window_samples_ = 0, loss_n_ = 0;
  double compute_s_ = 0, comm_s_ = 0, wait_s_ = 0, loss_sum_ = 0, accuracy_ = 0;
  int64_t load_skipped_ = 0, test_skipped_ = 0;
  Clock::time_point t_start_ = Clock::now(), t_window_ = Clock::now();
};

}  // namespace

TrainResult Train(const JobConfig& cfg, const TrainerOptions& opts) {
  std::unique_ptr<Trainer> t;
  // Everything before the first message to another process depends only on the job, the
  // files and the machine: an error there is the input's (InputError), not a failure a
  // restart could get past, unless it says it is the machine's (TransientError: a read
  // error, a CUDA failure other than a missing device).
  try {
    t = std::make_unique<Trainer>(cfg, opts);
    t->LoadData();
    t->BuildModel();
  } catch (const InputError&) {
    throw;
  } catch (const TransientError&) {
    throw;
  } catch (const Error& e) {
    throw InputError(e.what());
  }
  t->StartAlgorithm();
  return t->TrainEpochs();
}

}  // namespace shoal
