// The large-batch table (seeds 000-003) on Fashion-MNIST: test accuracy after a fixed
// number of epochs at global batch 256, 2K and 8K for momentum SGD, LARS, LAMB and STiLL,
// with linear LR scaling and warm-up. Big batches are simulated workers: micro-batches of
// 256 whose gradients are accumulated, then one optimizer step, exactly what a synchronous
// all-reduce of 8 or 32 workers computes.
#include <gflags/gflags.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "algorithms/optimizers/optimizer.h"
#include "worker/data/data_loader.h"
#include "worker/data/dataset.h"
#include "worker/engine/backend.h"
#include "worker/engine/model.h"

DEFINE_string(model, "lenet", "model from the zoo");
DEFINE_string(batches, "256,2048,8192", "global batch sizes");
DEFINE_string(optimizers, "momentum,lars,lamb,still", "optimizers");
DEFINE_int32(epochs, 8, "epochs per run");
DEFINE_int32(micro, 256, "micro-batch (one simulated worker's batch)");
DEFINE_int32(threads, 0, "CPU threads (0: all)");
DEFINE_string(train, "/usr/share/datasets/fashion-mnist/train", "training set prefix");
DEFINE_string(test, "/usr/share/datasets/fashion-mnist/t10k", "test set prefix");

namespace shoal {
namespace {

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ','))
    if (!x.empty()) out.push_back(x);
  return out;
}

// Base hyper-parameters at batch 256 (scaled linearly with the batch by the schedule).
ConfigSection OptimizerSection(const std::string& name, int64_t batch) {
  ConfigSection s("largebatch", "optimizer");
  s.Set("base_batch_size", int64_t(256));
  s.Set("momentum", 0.9);
  s.Set("weight_decay", 5e-4);
  s.Set("schedule", std::string("poly"));
  // Warm-up grows with the batch (Goyal et al.): 0.5 epoch at 256, more for larger.
  s.Set("warmup_epochs", batch <= 256 ? 0.5 : batch <= 2048 ? 1.5 : 2.5);
  if (name == "momentum") s.Set("lr", 0.05);
  if (name == "lars") {
    s.Set("lr", 2.0);
    s.Set("trust_coefficient", 0.001);
  }
  if (name == "lamb") {
    s.Set("lr", 0.002);
    s.Set("weight_decay", 0.01);
  }
  if (name == "still") {
    s.Set("lr", 2.0);
    s.Set("trust_coefficient", 0.001);
    s.Set("lamb_lr_ratio", 0.001);
  }
  return s;
}

double Evaluate(Model& m, Backend& be, DataLoader& test) {
  test.StartEpoch(0);
  Batch b;
  int64_t correct = 0, n = 0;
  Tensor x;
  while (test.Next(&b)) {
    Shape s = {b.n, 1, 28, 28};
    s = {b.n};
    for (auto d : test.dataset().sample_shape()) s.push_back(d);
    if (!x.defined() || x.shape() != s) x = be.Empty(s);
    be.CopyFromHost(x, b.images.data());
    correct += m.EvalStep(x, b.labels.data()).correct;
    n += b.n;
  }
  return double(correct) / double(n);
}

int Main() {
  auto be = MakeCpuBackend(FLAGS_threads);
  auto train = LoadDataset("idx", FLAGS_train, {});
  auto test = LoadDataset("idx", FLAGS_test, {});
  test->UseNormalizationOf(*train);
  DataLoaderOptions to;
  to.batch_size = 1000;
  to.shuffle = false;
  to.drop_last = false;
  DataLoader test_loader(test, to);
  std::map<std::pair<std::string, int64_t>, double> acc;
  auto batches = Split(FLAGS_batches);
  auto opts = Split(FLAGS_optimizers);
  for (auto& opt_name : opts) {
    for (auto& bs : batches) {
      int64_t B = std::stoll(bs), k = std::max<int64_t>(1, B / FLAGS_micro);
      ModelOptions mo;
      mo.input_shape = train->sample_shape();
      mo.num_classes = train->num_classes();
      auto model = MakeModel(FLAGS_model, *be, mo);
      model->InitParameters(42);
      DataLoaderOptions lo;
      lo.batch_size = FLAGS_micro;
      lo.seed = 42;
      DataLoader loader(train, lo);
      int64_t steps_per_epoch = loader.batches_per_epoch() / k;
      ConfigSection sec = OptimizerSection(opt_name, B);
      auto opt = MakeOptimizer(opt_name, sec);
      LrSchedule sched = LrSchedule::FromConfig(sec, B, steps_per_epoch, steps_per_epoch * FLAGS_epochs);
      std::vector<OptimizerState> states(model->parameters().size());
      auto t0 = std::chrono::steady_clock::now();
      int64_t step = 0;
      Tensor x;
      Batch b;
      for (int e = 0; e < FLAGS_epochs; ++e) {
        loader.StartEpoch(e);
        for (int64_t s = 0; s < steps_per_epoch; ++s) {
          model->ZeroGrad();
          for (int64_t j = 0; j < k; ++j) {  // one micro-batch per simulated worker
            if (!loader.Next(&b)) break;
            Shape sh = {b.n};
            for (auto d : train->sample_shape()) sh.push_back(d);
            if (!x.defined() || x.shape() != sh) x = be->Empty(sh);
            be->CopyFromHost(x, b.images.data());
            model->TrainStep(x, b.labels.data());
          }
          StepContext c;
          c.lr = float(sched.At(step));
          c.step = step;
          c.warmup_steps = sched.options().warmup_steps;
          auto& ps = model->parameters();
          for (size_t i = 0; i < ps.size(); ++i) {
            float* g = ps[i].grad.data<float>();
            int64_t n = ps[i].grad.numel();
            for (int64_t t = 0; t < n; ++t) g[t] /= float(k);  // mean over simulated workers
            opt->Apply(ps[i].value.data<float>(), g, n, !ps[i].no_weight_decay, c, &states[i]);
          }
          ++step;
        }
      }
      double a = Evaluate(*model, *be, test_loader);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      acc[{opt_name, B}] = a;
      printf("%-9s batch %5lld: %3lld steps, peak lr %.4g, test accuracy %.4f (%.0f s)\n", opt_name.c_str(),
             (long long)B, (long long)step, sched.peak_lr(), a, secs);
      fflush(stdout);
    }
  }
  printf("\n| optimizer |");
  for (auto& bs : batches) printf(" batch %s |", bs.c_str());
  printf("\n|---|");
  for (size_t i = 0; i < batches.size(); ++i) printf("---|");
  printf("\n");
  for (auto& o : opts) {
    printf("| %s |", o.c_str());
    for (auto& bs : batches) printf(" %.4f |", acc[{o, std::stoll(bs)}]);
    printf("\n");
  }
  printf("{\"bench\":\"largebatch\",\"model\":\"%s\",\"epochs\":%d", FLAGS_model.c_str(), FLAGS_epochs);
  for (auto& [key, a] : acc) printf(",\"%s_%lld\":%.4f", key.first.c_str(), (long long)key.second, a);
  printf("}\n");
  return 0;
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return shoal::Main();
}
