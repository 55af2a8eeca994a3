// Batch-norm running statistics are model state: a resnet20 job resumed at its last
// checkpoint evaluates exactly as the run that wrote it (the buffers come back bit for bit),
// the ranks of a synchronous job evaluate the same buffers, and the export carries them.
// Balanced batches give no worker of a batch-norm model less than its floor.
// Real processes through the launcher, collective (checkpoints on the workers) and PS
// (checkpoints on the shards). A fresh model loaded from the export, or the ONNX export
// imported, evaluates as the job did.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>

#include "common/json_fields.h"
#include "tests/training/job_runner.h"
#include "worker/data/data_loader.h"
#include "worker/data/dataset.h"
#include "worker/engine/backend.h"
#include "worker/engine/model.h"
#include "worker/engine/onnx/onnx_import.h"

namespace shoal {
namespace testing {
namespace {

// resnet20 on Fashion-MNIST (1x28x28, 10 classes): its parameters and its 21 batch norms'
// running means and variances (784 channels).
constexpr size_t kResnet20Params = 272186;
constexpr size_t kResnet20BufferFloats = 2 * 784;

// 2 workers x batch 32 over 1024 samples: 16 steps, one epoch, checkpointed at its last step.
std::string Job(const std::string& name, const std::string& dir, const std::string& algorithm) {
  std::string t = FmnistJob(
      name, dir + "/out", 2, "resnet20", 1024, 1,
      "[algorithm]\nname = \"" + algorithm + "\"\n\n[optimizer]\nname = \"momentum\"\nlr = 0.05\nmomentum = 0.9\n");
  t.replace(t.find("max_test_samples = 2000"), 23, "max_test_samples = 500");
  t.insert(t.find("seed = 42\n") + 10, "checkpoint_dir = \"" + dir + "/ckpt\"\ncheckpoint_every_steps = 16\n" +
                                           "export_weights = \"" + dir + "/weights.bin\"\n" + "export_onnx = \"" + dir +
                                           "/model.onnx\"\n");
  return t;
}

// `model` in evaluation on `test`, batched as the trainer does: accuracy and loss.
std::pair<double, double> Evaluate(Model& model, Backend& be, std::shared_ptr<Dataset> test) {
  DataLoaderOptions lo;
  lo.batch_size = 256;
  lo.shuffle = false;
  lo.drop_last = false;
  DataLoader loader(test, lo);
  loader.StartEpoch(0);
  Batch b;
  int64_t correct = 0, seen = 0;
  double loss = 0;
  Tensor x;
  while (loader.Next(&b)) {
    Shape shape = {b.n};
    for (int64_t d : test->sample_shape()) shape.push_back(d);
    x = be.Empty(shape);
    be.CopyFromHost(x, b.images.data());
    StepResult r = model.EvalStep(x, b.labels.data());
    loss += double(r.loss) * double(b.n);
    correct += r.correct;
    seen += b.n;
  }
  return {double(correct) / double(seen), loss / double(seen)};
}

// The job's test set, normalized as the trainer does.
std::shared_ptr<Dataset> TestSet() {
  DatasetOptions o;
  o.seed = 42;
  o.max_samples = 1024;
  auto train = LoadDataset("idx", "/usr/share/datasets/fashion-mnist/train", o);
  o.max_samples = 500;
  std::shared_ptr<Dataset> test = LoadDataset("idx", "/usr/share/datasets/fashion-mnist/t10k", o);
  test->UseNormalizationOf(*train);
  return test;
}

// The [job] export_onnx file imported and evaluated on the job's test set.
std::pair<double, double> EvaluateOnnxExport(const std::string& path) {
  std::shared_ptr<Dataset> test = TestSet();
  auto be = MakeCpuBackend(1);
  OnnxOptions o;
  o.input_shape = test->sample_shape();
  o.num_classes = test->num_classes();
  o.batch = 256;
  auto model = ImportOnnx(path, *be, o);
  model->InitParameters(0);  // the file's values
  return Evaluate(*model, *be, test);
}

// The exported file evaluated by a fresh resnet20 (parameters, then the running statistics)
// on the job's test set.
std::pair<double, double> EvaluateExport(const std::vector<float>& exported) {
  std::shared_ptr<Dataset> test = TestSet();
  auto be = MakeCpuBackend(1);
  ModelOptions mo;
  mo.input_shape = test->sample_shape();
  mo.num_classes = test->num_classes();
  auto model = MakeModel("resnet20", *be, mo);
  EXPECT_EQ(size_t(model->NumParams()), kResnet20Params);
  model->CopyParamsFromHost(exported.data());
  const float* at = exported.data() + model->NumParams();
  for (Buffer& b : model->buffers()) {
    be->CopyFromHost(b.value, at);
    at += b.value.numel();
  }
  EXPECT_EQ(at, exported.data() + exported.size());
  return Evaluate(*model, *be, test);
}

// The last `n` events named `event` (metrics.jsonl is appended to by a resumed run).
std::vector<std::string> Last(const JobRun& r, const std::string& event, size_t n) {
  std::vector<std::string> all = Events(r, event);
  if (all.size() < n) return all;
  return std::vector<std::string>(all.end() - int64_t(n), all.end());
}

void ResumedAtTheEndEvaluatesAsBefore(const std::string& algorithm) {
  const std::string dir = FreshDir("bn_" + algorithm);
  const std::string job = Job("bn-" + algorithm, dir, algorithm);
  JobRun whole = RunJob(dir, job, 600);
  ASSERT_EQ(whole.exit_code, 0) << whole.stderr_text;
  ASSERT_EQ(JsonNumber(whole.done_line, "steps").value_or(-1), 16) << whole.done_line;

  // Every rank evaluated the same buffers (same weights, so the same loss to the bit).
  std::vector<std::string> ends = Last(whole, "end", 2);
  ASSERT_EQ(ends.size(), 2u);
  std::set<std::string> hashes;
  for (auto& e : ends) hashes.insert(JsonField(e, "buffers_hash").value_or("missing"));
  EXPECT_EQ(hashes.size(), 1u) << ends[0] << "\n" << ends[1];
  EXPECT_EQ(hashes.count("missing"), 0u);
  std::set<double> losses;
  for (auto& e : Events(whole, "eval")) losses.insert(JsonNumber(e, "test_loss").value_or(-1));
  // allreduce's workers hold one model and split each evaluation (every other sample of the 500
  // each, the counts added up); ps_sync's each score all 500. The accuracy is checked against
  // the export scored whole below.
  const double share = algorithm == "allreduce" ? 250 : 500;
  for (auto& e : Events(whole, "eval")) EXPECT_EQ(JsonNumber(e, "test_samples").value_or(-1), share) << e;
  EXPECT_EQ(losses.size(), 1u) << "the ranks evaluated different running statistics";

  // The export holds the weights and then the running statistics, trained (not 0 and 1).
  std::vector<float> exported = ReadFloats(dir + "/weights.bin");
  EXPECT_EQ(exported.size(), kResnet20Params + kResnet20BufferFloats);
  size_t trained = 0;
  for (size_t i = kResnet20Params; i < exported.size(); ++i) trained += exported[i] != 0.f && exported[i] != 1.f;
  EXPECT_GT(trained, kResnet20BufferFloats / 2);
  // And they reproduce the network: the job's accuracy and loss from the file alone.
  if (exported.size() == kResnet20Params + kResnet20BufferFloats) {
    auto [accuracy, loss] = EvaluateExport(exported);
    EXPECT_EQ(accuracy, JsonNumber(whole.done_line, "test_accuracy").value_or(-1)) << whole.done_line;
    EXPECT_NEAR(loss, *losses.begin(), 1e-4 * std::fabs(*losses.begin()));
  }
  // The ONNX export is the same network: imported back, it evaluates as the job did (the
  // graph's Gemm and Conv may round apart from the zoo's layers: one sample of 500 may flip).
  auto [onnx_accuracy, onnx_loss] = EvaluateOnnxExport(dir + "/model.onnx");
  EXPECT_NEAR(onnx_accuracy, JsonNumber(whole.done_line, "test_accuracy").value_or(-1), 0.0021) << whole.done_line;
  EXPECT_NEAR(onnx_loss, *losses.begin(), 1e-4 * std::fabs(*losses.begin()));

  // Resumed at the checkpoint of its last step: nothing left to train, and the evaluation
  // must be the uninterrupted run's (with fresh running statistics, mean 0 and variance 1,
  // it is not).
  JobRun resumed = RunJob(dir, job, 600, {"--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.stderr_text;
  printf("uninterrupted: %s\nresumed:       %s\n", whole.done_line.c_str(), resumed.done_line.c_str());
  EXPECT_EQ(JsonNumber(resumed.done_line, "steps").value_or(-1), 16) << resumed.done_line;
  EXPECT_EQ(JsonNumber(resumed.done_line, "test_accuracy").value_or(-1),
            JsonNumber(whole.done_line, "test_accuracy").value_or(-2))
      << "whole: " << whole.done_line << "\nresumed: " << resumed.done_line;
  std::vector<std::string> evals = Last(resumed, "eval", 1);
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_EQ(JsonNumber(evals[0], "test_loss").value_or(-1), *losses.begin()) << evals[0];
  // The restored buffers are the saved ones, bit for bit, on every rank.
  for (auto& e : Last(resumed, "end", 2))
    EXPECT_EQ(JsonField(e, "buffers_hash").value_or("missing"), *hashes.begin()) << e;
}

// Checkpoints on the workers; the ranks average their statistics.
TEST(BatchNormState, AllReduceResumedAtItsLastCheckpointEvaluatesAsBefore) {
  ResumedAtTheEndEvaluatesAsBefore("allreduce");
}

// Checkpoints on the shards: rank 0 keeps its statistics there, and every worker of the
// synchronous job evaluates rank 0's.
TEST(BatchNormState, PsSyncResumedAtItsLastCheckpointEvaluatesAsBefore) { ResumedAtTheEndEvaluatesAsBefore("ps_sync"); }

// Killed in its last epoch after a checkpoint at step 8 of 16 (worker 1, SIGKILL): shoal run
// restarts from it (allreduce: every process; ps_sync: worker 1 alone, the other rolls back
// to it) and the job ends as the uninterrupted one did: the same weights, running
// statistics, and so accuracy. With fresh statistics at the restart it does not.
void KilledInItsLastEpochEndsAsTheUninterruptedRun(const std::string& algorithm) {
  auto job = [&](const std::string& dir) {
    std::string t = Job("bn-killed-" + algorithm, dir, algorithm);
    t.replace(t.find("checkpoint_every_steps = 16"), 27, "checkpoint_every_steps = 8\nmax_restarts = 1");
    return t;
  };
  WholeAndKilled runs = RunWholeAndKilledAtCheckpoint("bn_" + algorithm, job, 600);
  ASSERT_TRUE(runs.failure.empty()) << runs.failure;
  const JobRun &whole = runs.whole, &run = runs.killed;
  printf("uninterrupted: %s\nkilled:        %s\n", whole.done_line.c_str(), run.done_line.c_str());
  EXPECT_EQ(JsonNumber(run.done_line, "test_accuracy").value_or(-1),
            JsonNumber(whole.done_line, "test_accuracy").value_or(-2));
  auto hashes = [](const JobRun& r, const std::string& key) {
    std::set<std::string> h;
    for (auto& e : Last(r, "end", 2)) h.insert(JsonField(e, key).value_or("missing"));
    return h;
  };
  EXPECT_EQ(hashes(run, "weights_hash"), hashes(whole, "weights_hash"));
  EXPECT_EQ(hashes(run, "buffers_hash"), hashes(whole, "buffers_hash"));
  EXPECT_EQ(hashes(whole, "buffers_hash").size(), 1u);
}

TEST(BatchNormState, AllReduceKilledInItsLastEpochEndsAsTheUninterruptedRun) {
  KilledInItsLastEpochEndsAsTheUninterruptedRun("allreduce");
}
TEST(BatchNormState, PsSyncKilledInItsLastEpochEndsAsTheUninterruptedRun) {
  KilledInItsLastEpochEndsAsTheUninterruptedRun("ps_sync");
}

// Every other algorithm that trains one model over a communicator ends with the same running
// statistics on every rank (adpsgd's gossip and bmuf's blocks included: the trainer
// averages them before each evaluation, over a communicator of its own).
TEST(BatchNormState, EveryCollectiveAlgorithmEndsWithOneSetOfRunningStatistics) {
  for (const char* algorithm : {"double_buffer", "bmuf", "dgc", "adpsgd", "auto"}) {
    const std::string dir = FreshDir(std::string("bn_same_") + algorithm);
    std::string t = Job(std::string("bn-same-") + algorithm, dir, algorithm);
    t.replace(t.find("max_train_samples = 1024"), 24, "max_train_samples = 512");
    t.replace(t.find("max_test_samples = 500"), 22, "max_test_samples = 100");
    JobRun r = RunJob(dir, t, 600);
    ASSERT_EQ(r.exit_code, 0) << algorithm << "\n" << r.stderr_text;
    std::set<std::string> hashes;
    for (auto& e : Events(r, "end")) hashes.insert(JsonField(e, "buffers_hash").value_or("missing"));
    EXPECT_EQ(hashes.size(), 1u) << algorithm;
    EXPECT_EQ(hashes.count("missing"), 0u) << algorithm;
  }
}

// Balanced batches: a worker 40x slower than the other would get 1 of the 8 samples; resnet20
// normalizes 7x7 maps here, so its floor is 2 samples (algorithms/balance.h).
TEST(BatchNormState, BalancedSharesOfABatchNormModelStayAtOrAboveTheFloor) {
  const std::string dir = FreshDir("bn_balance");
  std::string t = FmnistJob("bn-balance", dir + "/out", 2, "resnet20", 160, 1,
                            "[algorithm]\nname = \"allreduce\"\nbalance = true\nbalance_every_steps = 2\n\n"
                            "[optimizer]\nname = \"momentum\"\nlr = 0.05\nmomentum = 0.9\n");
  t.replace(t.find("batch_size = 32"), 15, "batch_size = 4");
  t.replace(t.find("max_test_samples = 2000"), 23, "max_test_samples = 100");
  t.replace(t.find("workers = 2"), 11, "workers = [{slowdown = 40.0}, {}]");
  JobRun r = RunJob(dir, t, 600);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  std::vector<std::string> splits = Events(r, "balance");
  ASSERT_GE(splits.size(), 2u) << "the slow worker's share never changed";
  std::string last;
  for (auto& e : splits) {
    last = JsonField(e, "sizes").value_or("");
    const int64_t slow = std::stoll(last.substr(0, last.find(',')));
    EXPECT_GE(slow, 2) << e;
  }
  EXPECT_EQ(last, "2,6") << "the slow worker ends at the floor";
}

}  // namespace
}  // namespace testing
}  // namespace shoal
