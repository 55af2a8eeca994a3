// Batch-size control ([train] batch_schedule) through the real launcher and workers: each
// step's global batch, per-worker share and learning rate as the schedule and the linear
// scaling rule say; a run killed after a change and resumed ends with the uninterrupted
// run's weights; balancing re-splits each new global batch. (That every sample is used once
// per epoch across workers across a change is data_loader_test's
// BatchSizeChangeKeepsEverySampleOncePerEpoch, on the loader the workers use.)
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <thread>

#include "common/int_list.h"
#include "common/json_fields.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

// 2 workers, 1536 samples: epoch 0 at 64 a step (24 steps), epoch 1 at 128 (12), epochs 2-5
// at 256 (6 each): 60 steps.
const char* kSchedule = "batch_schedule = [[0, 64], [1, 128], [2, 256]]\n";
constexpr int64_t kSteps = 60;
int64_t BatchAt(int64_t step) { return step < 24 ? 64 : step < 36 ? 128 : 256; }
int64_t FirstStepOfEpoch(int64_t e) { return e == 0 ? 0 : e == 1 ? 24 : 36 + 6 * (e - 2); }

// lr 0.05 for 64 samples, warm-up 1.5 epochs (24 + 6 steps), then poly (power 2) to 0.
const char* kOptimizer =
    "[optimizer]\nname = \"momentum\"\nlr = 0.05\nbase_batch_size = 64\nmomentum = 0.9\nweight_decay = 1e-4\n"
    "warmup_epochs = 1.5\nschedule = \"poly\"\n\n";
double LrAt(int64_t step) {
  const int64_t warm = 30;
  const double peak = 0.05 * double(BatchAt(step)) / 64.0;
  if (step < warm) return peak * double(step + 1) / double(warm);
  return peak * std::pow(1.0 - double(step - warm) / double(kSteps - warm), 2.0);
}

std::string Job(const std::string& name, const std::string& dir, const std::string& algorithm, int every = 0,
                int max_restarts = 0, int workers = 2) {
  std::string t = FmnistJob(name, dir + "/out", workers, "mlp", 1536, 6, algorithm + kOptimizer);
  t.replace(t.find("batch_size = 32\n"), 16, "");  // the schedule's first stage gives it
  t.replace(t.find("log_every_steps = 20\n"), 21, std::string("log_every_steps = 1\n") + kSchedule);
  if (every > 0)
    t.insert(t.find("seed = 42\n") + 10, "checkpoint_dir = \"" + dir +
                                             "/ckpt\"\ncheckpoint_every_steps = " + std::to_string(every) +
                                             "\nmax_restarts = " + std::to_string(max_restarts) + "\n");
  return t;
}

// Every step of every worker: the global batch of its epoch, half of it each, and
// lr = 0.05 x batch / 64 x the warm-up and poly shape; an evaluation at each epoch's end.
TEST(BatchSchedule, EachStepsBatchAndLearningRateFollowTheFormula) {
  const std::string d = FreshDir("formula");
  JobRun run = RunJob(d, Job("formula", d, "[algorithm]\nname = \"allreduce\"\n\n"), 300);
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_EQ(JsonNumber(run.done_line, "steps").value_or(0), kSteps) << run.done_line;
  std::map<int, std::set<int64_t>> seen;  // rank -> steps logged
  for (auto& e : Events(run, "train")) {
    const int64_t step = int64_t(JsonNumber(e, "step").value_or(-1)) - 1;  // the step just trained
    const int rank = int(JsonNumber(e, "rank").value_or(-1));
    ASSERT_GE(step, 0) << e;
    seen[rank].insert(step);
    EXPECT_EQ(JsonNumber(e, "global_batch").value_or(0), BatchAt(step)) << e;
    EXPECT_EQ(JsonNumber(e, "batch_size").value_or(0), BatchAt(step) / 2) << e;
    // metrics.jsonl writes 6 significant digits
    EXPECT_NEAR(JsonNumber(e, "lr").value_or(-1), LrAt(step), 1e-5 * LrAt(step)) << e;
  }
  ASSERT_EQ(seen.size(), 2u);
  for (auto& [rank, steps] : seen) EXPECT_EQ(int64_t(steps.size()), kSteps) << "rank " << rank;
  std::set<int64_t> eval_steps;
  for (auto& e : Events(run, "eval"))
    if (!JsonField(e, "final")) eval_steps.insert(int64_t(JsonNumber(e, "step").value_or(-1)));
  EXPECT_EQ(eval_steps, (std::set<int64_t>{24, 36, 42, 48, 54, 60}));
  EXPECT_EQ(WeightsHashes(run).size(), 1u) << "the workers' weights differ";
  EXPECT_EQ(ProcessesOf(d), 0);
}

// The other synchronous algorithms take the schedule too: each finishes the schedule's steps
// with every step at its stage's batch and the workers' weights identical.
TEST(BatchSchedule, OtherSynchronousAlgorithmsFollowIt) {
  for (std::string algo : {"double_buffer", "bmuf", "dgc"}) {
    SCOPED_TRACE(algo);
    const std::string d = FreshDir(algo);
    JobRun run = RunJob(d, Job(algo, d, "[algorithm]\nname = \"" + algo + "\"\n\n"), 300);
    ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
    EXPECT_EQ(JsonNumber(run.done_line, "steps").value_or(0), kSteps) << run.done_line;
    for (auto& e : Events(run, "train"))
      EXPECT_EQ(JsonNumber(e, "global_batch").value_or(0), BatchAt(int64_t(JsonNumber(e, "step").value_or(0)) - 1))
          << e;
    EXPECT_EQ(WeightsHashes(run).size(), 1u);
    EXPECT_EQ(ProcessesOf(d), 0);
  }
}

// Killed after both changes (the fourth checkpoint, at step 40: epoch 2, batch 4 of 256; a
// constant 24 steps an epoch would make it epoch 1, batch 16) and restarted by shoal run: the
// resumed workers find that position and end with the weights of the run that never stopped.
// Rank 0 is slowed (no change to the numbers) so the kill lands well before the end.
TEST(BatchSchedule, RunKilledAfterAChangeResumesToTheUninterruptedWeights) {
  const std::string algo = "[algorithm]\nname = \"allreduce\"\n\n";
  const std::string a = FreshDir("whole");
  auto slowed = [](std::string job) {
    return job.replace(job.find("workers = 2"), 11, "workers = [{slowdown = 2.0}, {}]");
  };
  JobRun whole = RunJob(a, slowed(Job("whole", a, algo, 10, 0)), 300);
  ASSERT_EQ(whole.exit_code, 0) << whole.stderr_text;
  const std::set<std::string> want = WeightsHashes(whole);
  ASSERT_EQ(want.size(), 1u);

  const std::string b = FreshDir("killed");
  bool killed = false;
  std::thread killer([&] { killed = KillWhenLogged(b, "--rank 1", "checkpoint", 4); });
  JobRun run = RunJob(b, slowed(Job("killed", b, algo, 10, 1)), 300);
  killer.join();
  ASSERT_TRUE(killed) << "no fourth checkpoint was logged";
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  auto resumes = Events(run, "resume");
  ASSERT_EQ(resumes.size(), 2u) << run.stderr_text;
  for (auto& r : resumes) {
    const int64_t step = int64_t(JsonNumber(r, "step").value_or(-1));
    EXPECT_GE(step, 40) << r;
    const int64_t epoch = step < 24 ? 0 : step < 36 ? 1 : 2 + (step - 36) / 6;
    EXPECT_EQ(JsonNumber(r, "epoch").value_or(-1), epoch) << r;
    EXPECT_EQ(JsonNumber(r, "batch").value_or(-1), step - FirstStepOfEpoch(epoch)) << r;
  }
  EXPECT_EQ(JsonNumber(run.done_line, "steps").value_or(0), kSteps) << run.done_line;
  EXPECT_EQ(WeightsHashes(run), want) << "the resumed run did not end with the uninterrupted run's weights";
  EXPECT_EQ(ProcessesOf(b), 0);
}

// Balancing with a slowed worker: the balancer's split of each stage's global batch tiles
// it (the last split logged at a step sums to that step's batch), the slow worker keeps the
// smaller share after the change, and the workers end with the same weights.
TEST(BatchSchedule, BalancingSplitsEachStagesGlobalBatch) {
  const std::string d = FreshDir("balanced");
  std::string job = Job("balanced", d, "[algorithm]\nname = \"allreduce\"\nbalance = true\n\n");
  job.replace(job.find("workers = 2"), 11, "workers = [{slowdown = 3.0}, {}]");
  JobRun run = RunJob(d, job, 300);
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  EXPECT_EQ(JsonNumber(run.done_line, "steps").value_or(0), kSteps) << run.done_line;
  std::map<int64_t, std::vector<int64_t>> last;  // step -> the last split logged there
  for (auto& e : Events(run, "balance"))
    last[int64_t(JsonNumber(e, "step").value_or(-1))] =
        ParseIntList<int64_t>(JsonField(e, "sizes").value_or(""), "balance sizes");
  ASSERT_TRUE(last.count(24) && last.count(36)) << "no split at the changes";
  for (auto& [step, sizes] : last) {
    ASSERT_EQ(sizes.size(), 2u);
    EXPECT_EQ(sizes[0] + sizes[1], BatchAt(step)) << "the split at step " << step;
  }
  const std::vector<int64_t>& final_split = last.rbegin()->second;
  EXPECT_LT(final_split[0], final_split[1]) << "the slowed worker's share is not the smaller";
  for (auto& e : Events(run, "train")) {
    if (JsonNumber(e, "rank").value_or(-1) == 0) {
      EXPECT_EQ(JsonNumber(e, "global_batch").value_or(0), BatchAt(int64_t(JsonNumber(e, "step").value_or(0)) - 1));
    }
  }
  EXPECT_EQ(WeightsHashes(run).size(), 1u);
  EXPECT_EQ(ProcessesOf(d), 0);
}

// Balanced, killed after the checkpoint at step 36, the first step of the 256 stage (the split
// saved is the 128 stage's) and restarted: the resumed workers load that split, re-split it
// for 256 at the epoch's start, and finish; every split logged tiles its step's batch.
TEST(BatchSchedule, BalancedRunKilledAtAChangeResumesWithTheSplitScaled) {
  const std::string d = FreshDir("balanced_killed");
  std::string job = Job("balanced_killed", d, "[algorithm]\nname = \"allreduce\"\nbalance = true\n\n", 12, 1);
  job.replace(job.find("workers = 2"), 11, "workers = [{slowdown = 3.0}, {}]");
  bool killed = false;
  std::thread killer([&] { killed = KillWhenLogged(d, "--rank 1", "checkpoint", 3); });
  JobRun run = RunJob(d, job, 300);
  killer.join();
  ASSERT_TRUE(killed) << "no third checkpoint was logged";
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
  auto resumes = Events(run, "resume");
  ASSERT_EQ(resumes.size(), 2u) << run.stderr_text;
  const int64_t from = int64_t(JsonNumber(resumes[0], "step").value_or(-1));
  EXPECT_GE(from, 36) << resumes[0];
  printf("balanced run resumed at step %lld\n", (long long)from);
  EXPECT_EQ(JsonNumber(run.done_line, "steps").value_or(0), kSteps) << run.done_line;
  bool restarted = false, split_after = false;
  std::map<int64_t, std::vector<int64_t>> last;  // after the restart: step -> the last split logged there
  for (auto& e : run.metrics) {
    const std::string ev = JsonField(e, "event").value_or("");
    restarted = restarted || ev == "restart";
    if (ev != "balance" || !restarted) continue;
    const int64_t step = int64_t(JsonNumber(e, "step").value_or(-1));
    EXPECT_GE(step, from) << e;
    last[step] = ParseIntList<int64_t>(JsonField(e, "sizes").value_or(""), "balance sizes");
    split_after = true;
  }
  EXPECT_TRUE(split_after) << "the resumed workers logged no split";
  for (auto& [step, sizes] : last) {
    ASSERT_EQ(sizes.size(), 2u);
    EXPECT_EQ(sizes[0] + sizes[1], BatchAt(step)) << "the split at step " << step;
  }
  EXPECT_EQ(WeightsHashes(run).size(), 1u);
  EXPECT_EQ(ProcessesOf(d), 0);
}

// Resumed on 4 workers from a 2-worker run's checkpoint at step 40 (its max_steps): the
// schedule's global batch does not depend on the worker count, so the position (epoch 2,
// batch 4) holds, each of the 4 takes a quarter of it, and the job finishes its 60 steps.
TEST(BatchSchedule, ResumesOnMoreWorkersAtTheSamePosition) {
  const std::string d = FreshDir("reshape");
  const std::string algo = "[algorithm]\nname = \"allreduce\"\n\n";
  std::string first_job = Job("reshape", d, algo, 10, 0, 2);
  first_job.insert(first_job.find("[train]\n") + 8, "max_steps = 40\n");
  JobRun first = RunJob(d, first_job, 300);
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;
  JobRun again = RunJob(d, Job("reshape", d, algo, 10, 0, 4), 300, {"--resume"});
  ASSERT_EQ(again.exit_code, 0) << again.stderr_text;
  auto resumes = Events(again, "resume");
  ASSERT_EQ(resumes.size(), 4u) << again.stderr_text;
  for (auto& r : resumes) {
    EXPECT_EQ(JsonNumber(r, "step").value_or(-1), 40) << r;
    EXPECT_EQ(JsonNumber(r, "epoch").value_or(-1), 2) << r;
    EXPECT_EQ(JsonNumber(r, "batch").value_or(-1), 4) << r;
  }
  EXPECT_EQ(JsonNumber(again.done_line, "steps").value_or(0), kSteps) << again.done_line;
  bool resumed_train = false;
  for (auto& e : Events(again, "train")) {
    const int64_t step = int64_t(JsonNumber(e, "step").value_or(0));
    if (step <= 40) continue;  // the first run's records are in metrics.jsonl too
    resumed_train = true;
    EXPECT_EQ(JsonNumber(e, "batch_size").value_or(0), 64) << e;  // 256 over 4
  }
  EXPECT_TRUE(resumed_train);
  auto ends = Events(again, "end");
  ASSERT_GE(ends.size(), 4u);
  std::set<std::string> hashes;
  for (size_t i = ends.size() - 4; i < ends.size(); ++i) hashes.insert(JsonField(ends[i], "weights_hash").value_or(""));
  EXPECT_EQ(hashes.size(), 1u) << "the workers ended with different weights";
  EXPECT_EQ(ProcessesOf(d), 0);
}

// A parameter-server job's servers keep one global batch: refused before anything starts.
TEST(BatchSchedule, RefusedWithParameterServers) {
  const std::string d = FreshDir("ps");
  JobRun run = RunJob(d, Job("ps", d, "[algorithm]\nname = \"ps_sync\"\n\n"), 60);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.stderr_text.find("[train] batch_schedule: not supported with algorithm \"ps_sync\""), std::string::npos)
      << run.stderr_text;
  EXPECT_EQ(ProcessesOf(d), 0);
}

}  // namespace
}  // namespace testing
}  // namespace shoal
