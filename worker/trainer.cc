#include "worker/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "algorithms/algorithm.h"
#include "algorithms/env.h"
#include "common/error.h"
#include "common/metrics.h"
#include "worker/data/data_loader.h"
#include "worker/engine/backend.h"
#include "worker/engine/model.h"

namespace shoal {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Host fp32 views of the model's parameters and gradients for the algorithm layer. On the
// CPU they alias the model's tensors; on a GPU they are mirrors copied each step.
class HostParams {
 public:
  HostParams(Model& model, Backend& backend) : model_(model), backend_(backend) {
    host_ = backend.device().is_cpu();
    for (auto& p : model.parameters()) {
      ParamView v;
      v.name = p.name;
      v.n = p.value.numel();
      v.no_weight_decay = p.no_weight_decay;
      v.shape = p.value.shape();
      if (host_) {
        v.w = p.value.data<float>();
        v.g = p.grad.data<float>();
      } else {
        mirrors_.emplace_back(size_t(v.n) * 2);
        v.w = mirrors_.back().data();
        v.g = v.w + v.n;
      }
      views_.push_back(v);
    }
  }
  const std::vector<ParamView>& views() const { return views_; }
  // Device -> host before the algorithm runs.
  void PullWeightsAndGrads() {
    if (host_) return;
    auto ps = model_.parameters();
    for (size_t i = 0; i < ps.size(); ++i) {
      backend_.CopyToHost(ps[i].value, views_[i].w);
      backend_.CopyToHost(ps[i].grad, views_[i].g);
    }
  }
  // Host -> device after it.
  void PushWeights() {
    if (host_) return;
    auto ps = model_.parameters();
    for (size_t i = 0; i < ps.size(); ++i) backend_.CopyFromHost(ps[i].value, views_[i].w);
  }

 private:
  Model& model_;
  Backend& backend_;
  bool host_;
  std::vector<std::vector<float>> mirrors_;
  std::vector<ParamView> views_;
};

struct EvalResult {
  double accuracy = 0;
  double loss = 0;
};

EvalResult Evaluate(Model& model, Backend& backend, DataLoader& test) {
  test.StartEpoch(0);
  Batch b;
  int64_t correct = 0, seen = 0;
  double loss_sum = 0;
  Tensor x;
  while (test.Next(&b)) {
    Shape shape = {b.n};
    for (int64_t d : test.dataset().sample_shape()) shape.push_back(d);
    if (!x.defined() || x.shape() != shape) x = backend.Empty(shape);
    backend.CopyFromHost(x, b.images.data());
    StepResult r = model.EvalStep(x, b.labels.data());
    loss_sum += double(r.loss) * double(b.n);
    correct += r.correct;
    seen += b.n;
  }
  EvalResult r;
  if (seen > 0) {
    r.accuracy = double(correct) / double(seen);
    r.loss = loss_sum / double(seen);
  }
  return r;
}

}  // namespace

TrainResult Train(const JobConfig& cfg, const TrainerOptions& opts) {
  const int rank = opts.rank, world = cfg.world_size();
  if (rank < 0 || rank >= world)
    throw Error(cfg.path + ": [cluster] workers: rank " + std::to_string(rank) + " is outside the job's " + std::to_string(world) + " worker(s)");
  const WorkerSpec& spec = cfg.workers[size_t(rank)];
  int threads = opts.threads > 0 ? opts.threads : int(cfg.threads);
  std::unique_ptr<Backend> backend = MakeBackend(ParseDevice(spec.device), threads);

  DatasetOptions dopt;
  dopt.seed = cfg.seed;
  dopt.synthetic_samples = cfg.synthetic_samples * world;
  dopt.synthetic_image_size = cfg.synthetic_image_size;
  dopt.synthetic_classes = cfg.synthetic_classes;
  dopt.max_samples = cfg.max_train_samples;
  std::shared_ptr<Dataset> train_set = LoadDataset(cfg.data_format, cfg.train_path, dopt);
  dopt.max_samples = cfg.max_test_samples;
  dopt.synthetic_samples = std::max<int64_t>(cfg.batch_size, cfg.synthetic_samples / 4);
  std::shared_ptr<Dataset> test_set = LoadDataset(cfg.data_format, cfg.test_path, dopt);
  test_set->UseNormalizationOf(*train_set);

  DataLoaderOptions lo;
  lo.batch_size = cfg.batch_size;
  lo.rank = rank;
  lo.world_size = world;
  lo.seed = cfg.seed;
  lo.shuffle = true;
  lo.drop_last = true;
  lo.augment = cfg.augment;
  DataLoader train(train_set, lo);
  if (train.batches_per_epoch() < 1)
    throw Error(cfg.path + ": [data] batch_size: " + std::to_string(cfg.batch_size) + " x " + std::to_string(world) +
                " workers is larger than the training set (" + std::to_string(train_set->size()) + " samples)");
  DataLoaderOptions to = lo;
  to.rank = 0;
  to.world_size = 1;
  to.shuffle = false;
  to.drop_last = false;
  to.augment = false;
  to.batch_size = std::max<int64_t>(cfg.batch_size, 256);
  DataLoader test(test_set, to);

  ModelOptions mo;
  mo.input_shape = train_set->sample_shape();
  mo.num_classes = train_set->num_classes();
  mo.zero_gamma_init = cfg.zero_gamma_init;
  mo.label_smoothing = float(cfg.label_smoothing);
  std::unique_ptr<Model> model = MakeModel(cfg.model, *backend, mo);
  model->InitParameters(cfg.seed);  // same seed on every worker: identical start

  if (opts.resume && !FactsOf(cfg.algorithm).keeps_checkpoints)
    throw Error("--resume: algorithm \"" + cfg.algorithm + "\" keeps no checkpoints (the parameter-server algorithms do)");
  MetricsWriter metrics;
  metrics.Open(cfg.output_dir + "/metrics.jsonl");
  AlgorithmEnv env = MakeAlgorithmEnv(cfg, rank, train.batches_per_epoch(), &metrics, opts.resume);
  std::unique_ptr<Algorithm> algo = MakeAlgorithm(cfg.algorithm, env);

  HostParams params(*model, *backend);
  params.PullWeightsAndGrads();
  algo->Init(params.views());
  params.PushWeights();

  printf("worker %d/%d: %s on %s, %s, %lld samples, %lld steps/epoch, algorithm %s, optimizer %s\n", rank, world,
         cfg.model.c_str(), backend->Name().c_str(), cfg.data_format.c_str(), (long long)train_set->size(),
         (long long)env.steps_per_epoch, algo->Name().c_str(), env.optimizer->Name().c_str());
  fflush(stdout);

  TrainResult res;
  // A resumed job continues at the checkpoint's data position: the same batches, in the
  // same order, as if it had never stopped.
  int64_t step = algo->ResumedStep();
  const int64_t first_epoch = step / env.steps_per_epoch, first_batch = step % env.steps_per_epoch;
  if (step > 0) {
    printf("worker %d: resumed at step %lld (epoch %lld, batch %lld)\n", rank, (long long)step, (long long)first_epoch,
           (long long)first_batch);
    metrics.Write("resume", step, JsonObject().Add("rank", rank).Add("epoch", first_epoch).Add("batch", first_batch));
  }
  double compute_s = 0, comm_s = 0, wait_s = 0;
  int64_t samples = 0;
  auto t_start = Clock::now();
  auto t_window = Clock::now();
  int64_t window_samples = 0;
  double loss_sum = 0;
  int64_t loss_n = 0;
  Tensor x;
  Batch b;
  bool stop = false;
  double acc = 0;
  if (cfg.max_steps > 0 && step >= cfg.max_steps) stop = true;
  for (int64_t epoch = first_epoch; epoch < cfg.epochs && !stop; ++epoch) {
    if (epoch == first_epoch && first_batch > 0)
      train.Seek({epoch, first_batch});
    else
      train.StartEpoch(epoch);
    while (!stop) {
      auto t0 = Clock::now();
      if (!train.Next(&b)) break;
      wait_s += Since(t0);
      auto t1 = Clock::now();
      Shape shape = {b.n};
      for (int64_t d : train_set->sample_shape()) shape.push_back(d);
      if (!x.defined() || x.shape() != shape) x = backend->Empty(shape);
      backend->CopyFromHost(x, b.images.data());
      model->ZeroGrad();
      float loss = model->TrainStep(x, b.labels.data()).loss;
      if (!std::isfinite(loss)) throw Error("training diverged: loss is " + std::to_string(loss) + " at step " + std::to_string(step) + " (lower [optimizer] lr?)");
      params.PullWeightsAndGrads();
      double compute = Since(t1);
      compute_s += compute;
      if (spec.slowdown > 0) std::this_thread::sleep_for(std::chrono::duration<double>(spec.slowdown * compute));
      auto t2 = Clock::now();
      StepInfo info;
      info.step = step;
      info.epoch = epoch;
      info.loss = loss;
      algo->Step(params.views(), info);
      params.PushWeights();
      comm_s += Since(t2);
      ++step;
      samples += b.n;
      window_samples += b.n;
      loss_sum += loss;
      ++loss_n;
      if (step % cfg.log_every_steps == 0) {
        double sps = double(window_samples) / std::max(1e-9, Since(t_window));
        JsonObject f;
        f.Add("rank", rank).Add("epoch", epoch).Add("loss", loss_sum / double(loss_n)).Add("samples_per_s", sps);
        f.Add("lr", env.schedule->At(step - 1)).Add("compute_s", compute_s).Add("comm_s", comm_s).Add("wait_s", wait_s);
        f.Add("bytes_sent", algo->bytes_sent());
        algo->AddMetrics(&f);
        metrics.Write("train", step, f);
        t_window = Clock::now();
        window_samples = 0;
        loss_sum = 0;
        loss_n = 0;
      }
      if (cfg.max_steps > 0 && step >= cfg.max_steps) stop = true;
    }
    EvalResult ev = Evaluate(*model, *backend, test);
    acc = ev.accuracy;
    double sps = double(samples) / std::max(1e-9, Since(t_start));
    metrics.Write("eval", step, JsonObject().Add("rank", rank).Add("epoch", epoch + 1).Add("test_accuracy", ev.accuracy)
                                    .Add("test_loss", ev.loss).Add("samples_per_s", sps).Add("bytes_sent", algo->bytes_sent()));
    printf("worker %d: epoch %lld step %lld test_accuracy %.4f test_loss %.4f samples/s %.0f\n", rank, (long long)epoch + 1,
           (long long)step, ev.accuracy, ev.loss, sps);
    fflush(stdout);
    bool reached = cfg.target_accuracy > 0 && ev.accuracy >= cfg.target_accuracy;
    stop = algo->AgreeToStop(stop || reached);
  }
  params.PullWeightsAndGrads();
  algo->Finish(params.views());
  params.PushWeights();
  if (algo->ModelChangedAtFinish()) {
    EvalResult ev = Evaluate(*model, *backend, test);
    acc = ev.accuracy;
    metrics.Write("eval", step, JsonObject().Add("rank", rank).Add("final", true).Add("test_accuracy", ev.accuracy)
                                    .Add("test_loss", ev.loss).Add("bytes_sent", algo->bytes_sent()));
    printf("worker %d: final model test_accuracy %.4f\n", rank, ev.accuracy);
  }

  // A hash of the final weights: synchronous algorithms must end bit-identical everywhere.
  uint64_t hash = 1469598103934665603ull;
  params.PullWeightsAndGrads();
  for (auto& v : params.views())
    for (int64_t i = 0; i < v.n; ++i) {
      uint32_t bits;
      memcpy(&bits, &v.w[i], 4);
      hash = (hash ^ bits) * 1099511628211ull;
    }
  char hash_hex[32];
  snprintf(hash_hex, sizeof hash_hex, "%016llx", (unsigned long long)hash);

  if (rank == 0 && !cfg.export_weights.empty()) {
    // Raw fp32, parameters in the model's stable order (Model::ParamLayout()).
    FILE* f = fopen(cfg.export_weights.c_str(), "wb");
    if (!f) throw Error(cfg.export_weights + ": cannot write exported weights");
    bool ok = true;
    for (auto& v : params.views()) ok = ok && fwrite(v.w, 4, size_t(v.n), f) == size_t(v.n);
    ok = (fclose(f) == 0) && ok;
    if (!ok) throw Error(cfg.export_weights + ": short write of exported weights");
  }

  res.steps = step;
  res.test_accuracy = acc;
  res.samples_per_s = double(samples) / std::max(1e-9, Since(t_start));
  res.bytes_sent = algo->bytes_sent();
  metrics.Write("end", step, JsonObject().Add("rank", rank).Add("steps", step).Add("test_accuracy", acc)
                                 .Add("samples_per_s", res.samples_per_s).Add("bytes_sent", res.bytes_sent)
                                 .Add("compute_s", compute_s).Add("comm_s", comm_s).Add("wait_s", wait_s)
                                 .Add("weights_hash", std::string(hash_hex)));
  return res;
}

}  // namespace shoal
