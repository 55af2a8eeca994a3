// Loss scaling through whole jobs (2 CPU workers, allreduce, real launcher and ring):
// a fixed power-of-two scale changes no bit (with the overlap path unscaling each gradient
// as it becomes final); a dynamic scale that starts beyond fp32's range overflows the first
// steps, which every worker skips alike (counted in metrics and on the progress line), S
// falls and training goes on to accuracy with identical finite weights; a worker killed
// after a checkpoint resumes with the checkpoint's S and ends bit-identical to a run that
// was never interrupted.
#include <gtest/gtest.h>

#include <cmath>

#include "common/json_fields.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

const char* kMomentum = "[optimizer]\nname = \"momentum\"\nlr = 0.05\nmomentum = 0.9\nweight_decay = 1e-4\n\n";
// 2^140: beyond fp32 (FLT_MAX < 2^128), so S x dlogits is inf until S has halved to 2^127.
const char* kBeyondFp32 = "loss_scale = \"dynamic\"\nloss_scale_init = 1.393796574908164e+42\n";

// 2 workers, batch 32: `samples` / 64 steps an epoch.
std::string Job(const std::string& name, const std::string& dir, const std::string& model,
                const std::string& model_keys, const std::string& algorithm_keys, int64_t samples, int epochs) {
  std::string t = FmnistJob(name, dir + "/out", 2, model, samples, epochs,
                            "[algorithm]\nname = \"allreduce\"\n" + algorithm_keys + "\n" + kMomentum);
  const std::string at = "name = \"" + model + "\"\n";
  t.insert(t.find(at) + at.size(), model_keys);
  return t;
}

TEST(LossScale, FixedPowerOfTwoScaleChangesNoBit) {
  std::string a = FreshDir("unscaled");
  JobRun plain = RunJob(a, Job("unscaled", a, "lenet", "", "", 3200, 1), 300);
  ASSERT_EQ(plain.exit_code, 0) << plain.stderr_text;
  std::string b = FreshDir("scaled");
  // Overlap: each gradient is unscaled in the backward pass's hook, before its bucket leaves.
  JobRun scaled = RunJob(
      b, Job("scaled", b, "lenet", "loss_scale = 1024\n", "overlap = true\nbucket_bytes = 65536\n", 3200, 1), 300);
  ASSERT_EQ(scaled.exit_code, 0) << scaled.stderr_text;
  ASSERT_EQ(WeightsHashes(plain).size(), 1u);
  EXPECT_EQ(WeightsHashes(scaled), WeightsHashes(plain)) << "scaling by 1024 and back changed the weights";
  auto trains = Events(scaled, "train");
  ASSERT_FALSE(trains.empty());
  EXPECT_EQ(JsonNumber(trains.back(), "loss_scale").value_or(0), 1024) << trains.back();
  EXPECT_EQ(JsonNumber(trains.back(), "skipped_steps").value_or(-1), 0) << trains.back();
  EXPECT_GT(JsonNumber(trains.back(), "overlapped_buckets").value_or(0), 0) << trains.back();
  EXPECT_EQ(JsonNumber(Events(plain, "train").back(), "loss_scale").value_or(0), 1);
}

TEST(LossScale, DynamicScaleSkipsOverflowingStepsAlikeAndTrainsOn) {
  std::string d = FreshDir("overflow");
  JobRun run = RunJob(d, Job("overflow", d, "lenet", kBeyondFp32, "", 6400, 1), 300);
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_GE(JsonNumber(run.done_line, "test_accuracy").value_or(0), 0.65) << run.done_line;
  auto ends = Events(run, "end");
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_EQ(WeightsHashes(run).size(), 1u) << "the workers skipped different steps";
  // 2^140 ... 2^128 overflow for certain: at least 13 skipped steps, the same on both.
  const double skipped = JsonNumber(ends[0], "skipped_steps").value_or(0);
  EXPECT_GE(skipped, 13) << ends[0];
  EXPECT_LT(skipped, 50) << ends[0];
  EXPECT_EQ(JsonNumber(ends[1], "skipped_steps").value_or(0), skipped) << ends[1];
  const double scale = JsonNumber(ends[0], "loss_scale").value_or(0);
  EXPECT_LE(scale, 1.8e38) << "S did not fall into fp32's range: " << ends[0];
  EXPECT_GE(scale, 1) << ends[0];
  // The loss falls once the steps apply; the final model is finite (its test loss is).
  auto trains = Events(run, "train");
  ASSERT_GE(trains.size(), 4u);
  EXPECT_LT(JsonNumber(trains.back(), "loss").value_or(9), JsonNumber(trains.front(), "loss").value_or(0) - 0.5);
  auto evals = Events(run, "eval");
  ASSERT_FALSE(evals.empty());
  EXPECT_TRUE(std::isfinite(JsonNumber(evals.back(), "test_loss").value_or(NAN))) << evals.back();
  // The launcher's progress line (stderr) says so.
  EXPECT_NE(run.stderr_text.find(" skipped_steps " + std::to_string(int(skipped)) + " ["), std::string::npos)
      << run.stderr_text;
}

// Killed right after the first checkpoint (step 20, with S already fallen from 2^140 to
// fp32's range): the resumed run must not start over at 2^140 (13 more skipped steps).
TEST(LossScale, ResumeContinuesWithTheCheckpointsScale) {
  auto job = [](const std::string& dir) {
    std::string t = Job("scaler", dir, "mlp", kBeyondFp32, "", 3200, 2);
    t.insert(t.find("seed = 42\n") + 10,
             "checkpoint_dir = \"" + dir + "/ckpt\"\ncheckpoint_every_steps = 20\nmax_restarts = 1\n");
    return t;
  };
  WholeAndKilled runs = RunWholeAndKilledAtCheckpoint("scaler", job, 300);
  ASSERT_TRUE(runs.failure.empty()) << runs.failure;
  const JobRun &whole = runs.whole, &run = runs.killed;
  ASSERT_EQ(WeightsHashes(whole).size(), 1u);
  EXPECT_EQ(WeightsHashes(run), WeightsHashes(whole)) << "the resumed run did not continue the scaler";
  auto ends = Events(run, "end"), want = Events(whole, "end");
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_EQ(JsonNumber(ends[0], "skipped_steps").value_or(-1), JsonNumber(want[0], "skipped_steps").value_or(-2));
  EXPECT_EQ(JsonNumber(ends[0], "loss_scale").value_or(-1), JsonNumber(want[0], "loss_scale").value_or(-2));
}

}  // namespace
}  // namespace testing
}  // namespace shoal
