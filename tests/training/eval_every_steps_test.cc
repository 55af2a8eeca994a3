// [train] eval_every_steps through the real launcher and workers: evaluations within epochs at
// every N steps besides each epoch's end, training undisturbed by them (the same final weights
// as without), and target_accuracy stopping a job at the first such evaluation that reaches it,
// for a synchronous, a gossip and a parameter-server algorithm.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "common/json_fields.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

// 2 workers x 32 samples a step over 1536 samples: 24 steps an epoch, 48 in 2 epochs.
constexpr int64_t kStepsPerEpoch = 24, kEpochs = 2;

std::string Job(const std::string& name, const std::string& dir, const std::string& algorithm, int64_t every,
                double target = 0) {
  std::string t = FmnistJob(name, dir + "/out", 2, "mlp", 1536, int(kEpochs), algorithm);
  std::string train = "log_every_steps = 20\n";
  if (every > 0) train += "eval_every_steps = " + std::to_string(every) + "\n";
  if (target > 0) train += "target_accuracy = " + std::to_string(target) + "\n";
  return t.replace(t.find("log_every_steps = 20\n"), 21, train);
}

// Rank 0's evaluations (the final one left out): step -> [accuracy, at an epoch's end].
std::map<int64_t, std::pair<double, bool>> Rank0Evals(const JobRun& run) {
  std::map<int64_t, std::pair<double, bool>> out;
  for (auto& e : Events(run, "eval"))
    if (JsonNumber(e, "rank").value_or(-1) == 0 && !JsonField(e, "final"))
      out[int64_t(JsonNumber(e, "step").value_or(-1))] = {JsonNumber(e, "test_accuracy").value_or(-1),
                                                          JsonField(e, "epoch_end").value_or("") == "true"};
  return out;
}

const char* kAllReduce = "[algorithm]\nname = \"allreduce\"\n\n";

// Every 8 steps and at each epoch's end (24 and 48, also multiples of 8: once each, as the
// epoch's end); the weights end as in a run that evaluated only at epochs' ends. Then a target
// just under an accuracy first reached at a step within an epoch stops the job at exactly that
// step.
TEST(EvalEverySteps, EvaluatesWithinEpochsWithoutChangingTrainingAndStopsThere) {
  const std::string a = FreshDir("epochs_only"), b = FreshDir("every8");
  JobRun plain = RunJob(a, Job("plain", a, kAllReduce, 0), 300);
  ASSERT_EQ(plain.exit_code, 0) << plain.stderr_text;
  JobRun every = RunJob(b, Job("every", b, kAllReduce, 8), 300);
  ASSERT_EQ(every.exit_code, 0) << every.stderr_text;

  std::set<int64_t> plain_steps;
  for (auto& [step, ev] : Rank0Evals(plain)) plain_steps.insert(step);
  EXPECT_EQ(plain_steps, (std::set<int64_t>{24, 48}));
  const auto evals = Rank0Evals(every);
  std::set<int64_t> steps, ends;
  for (auto& [step, ev] : evals) {
    steps.insert(step);
    if (ev.second) ends.insert(step);
  }
  EXPECT_EQ(steps, (std::set<int64_t>{8, 16, 24, 32, 40, 48}));
  EXPECT_EQ(ends, (std::set<int64_t>{24, 48}));
  EXPECT_EQ(Events(every, "eval").size(), Events(plain, "eval").size() + 2 * 4) << "4 more on each of 2 ranks";
  ASSERT_EQ(WeightsHashes(every).size(), 1u);
  EXPECT_EQ(WeightsHashes(every), WeightsHashes(plain)) << "evaluating within an epoch changed the training";
  EXPECT_EQ(JsonNumber(every.done_line, "steps").value_or(0), kStepsPerEpoch * kEpochs);

  // The first evaluation within an epoch that beats every one before it: a target just under
  // its accuracy is first reached there (all-reduce runs alike from the same seed).
  int64_t stop_at = -1;
  double best = -1, target = 0;
  for (auto& [step, ev] : evals) {
    if (!ev.second && ev.first > best && step > 8) {
      stop_at = step, target = ev.first - 1e-4;  // under it by less than one test image (1/2000)
      break;
    }
    best = std::max(best, ev.first);
  }
  ASSERT_GT(stop_at, 0) << "no evaluation within an epoch improved on the ones before it";
  const std::string c = FreshDir("to_target");
  JobRun stopped = RunJob(c, Job("stopped", c, kAllReduce, 8, target), 300);
  ASSERT_EQ(stopped.exit_code, 0) << stopped.stderr_text;
  EXPECT_EQ(JsonNumber(stopped.done_line, "steps").value_or(0), stop_at) << stopped.done_line;
  EXPECT_EQ(Rank0Evals(stopped).rbegin()->first, stop_at);
  int rank0_evals = 0;  // each step's evaluation once: the stop ends the epoch without another
  for (auto& e : Events(stopped, "eval"))
    rank0_evals += JsonNumber(e, "rank").value_or(-1) == 0 && !JsonField(e, "final");
  EXPECT_EQ(rank0_evals, int(Rank0Evals(stopped).size()));
  EXPECT_EQ(WeightsHashes(stopped).size(), 1u);
  for (auto& d : {a, b, c}) EXPECT_EQ(ProcessesOf(d), 0);
}

// Workers that do not step together: the first evaluation at or above the target (every 4
// steps) ends the job well inside its first epoch, and every process exits.
TEST(EvalEverySteps, StopsGossipAndParameterServerJobsWithinAnEpoch) {
  for (std::string algo : {"adpsgd", "ps_async"}) {
    SCOPED_TRACE(algo);
    const std::string d = FreshDir(algo);
    // Chance is 0.1; mlp passes 0.3 within a few steps.
    JobRun run = RunJob(d, Job(algo, d, "[algorithm]\nname = \"" + algo + "\"\n\n", 4, 0.3), 300);
    ASSERT_EQ(run.exit_code, 0) << run.stderr_text;
    // Whichever worker reached it first stopped the others: every rank's evaluations count.
    int64_t last = -1;
    double best = 0;
    for (auto& e : Events(run, "eval")) {
      if (JsonField(e, "final")) continue;
      EXPECT_NE(JsonField(e, "epoch_end").value_or(""), "true") << e;
      last = std::max(last, int64_t(JsonNumber(e, "step").value_or(-1)));
      best = std::max(best, JsonNumber(e, "test_accuracy").value_or(0));
    }
    EXPECT_GT(last, 0) << "no evaluation within the epoch";
    EXPECT_LT(last, kStepsPerEpoch);
    EXPECT_GE(best, 0.3) << "stopped before the target";
    EXPECT_LT(JsonNumber(run.done_line, "steps").value_or(1e9), kStepsPerEpoch) << run.done_line;
    EXPECT_EQ(ProcessesOf(d), 0);
  }
}

}  // namespace
}  // namespace testing
}  // namespace shoal
