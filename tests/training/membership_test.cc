// Membership and the end of a job, with real processes on loopback: the stop decision of
// asynchronous PS jobs, the final model's evaluation, finishing workers never taken for
// dead, a ps_ssp worker restarted alone, and a coordinator busy with a long RELOAD.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "common/json_fields.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

const char* kOpt = "[optimizer]\nname = \"momentum\"\nlr = 0.05\nmomentum = 0.9\n\n";

// The accuracy on the last progress line on stderr ("... test_acc 0.8123 ..."), or -1.
double LastProgressAccuracy(const std::string& err) {
  std::istringstream in(err);
  std::string line;
  double acc = -1;
  while (std::getline(in, line)) {
    size_t at = line.find(" test_acc ");
    if (at != std::string::npos) acc = atof(line.c_str() + at + 10);
  }
  return acc;
}

int64_t EndStep(const JobRun& r, int rank, size_t from_line = 0) {
  int64_t step = -1;
  for (size_t i = from_line; i < r.metrics.size(); ++i) {
    const std::string& l = r.metrics[i];
    if (JsonField(l, "event").value_or("") == "end" && JsonNumber(l, "rank").value_or(-1) == rank)
      step = int64_t(JsonNumber(l, "step").value_or(-1));
  }
  return step;
}

// ps_async resumed: rank 0 reaches the target at the end of its epoch while rank 1 (four
// times slower) is early in it. Rank 1 stops there too (the decision is the job's, also
// right after a resume, where a decision restored with the checkpoint must not count),
// and the done line's accuracy is the final model's, the one the last progress line shows.
TEST(Membership, AsyncTargetStopsEveryWorkerAndTheDoneLineIsTheFinalModel) {
  std::string dir = FreshDir("async_target");
  // 12000 samples, 2 workers, batch 32: 187 steps an epoch each.
  std::string t = FmnistJob("async_target", dir + "/out", 2, "mlp", 12000, 3,
                            std::string("[algorithm]\nname = \"ps_async\"\n\n") + kOpt);
  t.insert(t.find("seed = 42\n") + 10, "checkpoint_dir = \"" + dir + "/ckpt\"\ncheckpoint_every_steps = 20\n");
  t.replace(t.find("workers = 2"), 11, "workers = [{}, {slowdown = 4.0}]");
  // First run: 40 steps (rank 0's max_steps stops both), final checkpoint at its end.
  std::string first_toml = t;
  first_toml.insert(first_toml.find("[train]\n") + 8, "max_steps = 40\n");
  JobRun first = RunJob(dir, first_toml, 300);
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;

  std::string second_toml = t;
  second_toml.insert(second_toml.find("[train]\n") + 8, "target_accuracy = 0.5\n");
  JobRun r = RunJob(dir, second_toml, 300, {"--resume"});
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  ASSERT_EQ(Events(r, "resume").size() - Events(first, "resume").size(), 2u) << r.stderr_text;
  const size_t from = first.metrics.size();
  // Rank 0 trained to its epoch's end (the target is reached there, not before).
  EXPECT_GE(EndStep(r, 0, from), 187) << r.stderr_text;
  // Rank 1 stopped with it, in its first epoch, instead of training that epoch alone.
  EXPECT_LT(EndStep(r, 1, from), 187) << "rank 1 trained on after rank 0 reached the target\n" << r.stderr_text;
  // One evaluation of the final model, whose figure the done line and the last progress
  // line carry.
  std::vector<std::string> finals;
  for (size_t i = from; i < r.metrics.size(); ++i)
    if (JsonField(r.metrics[i], "event").value_or("") == "eval" &&
        JsonField(r.metrics[i], "final").value_or("") == "true")
      finals.push_back(r.metrics[i]);
  ASSERT_EQ(finals.size(), 1u) << "the final model is evaluated once\n" << r.stderr_text;
  const double acc = JsonNumber(r.done_line, "test_accuracy").value_or(-1);
  EXPECT_DOUBLE_EQ(acc, JsonNumber(finals[0], "test_accuracy").value_or(-2)) << r.done_line << "\n" << finals[0];
  EXPECT_GE(acc, 0.5) << r.done_line;
  EXPECT_NEAR(LastProgressAccuracy(r.stderr_text), acc, 6e-5) << r.stderr_text << r.done_line;
  EXPECT_EQ(ProcessesOf(dir), 0);
}

// bmuf and adpsgd end with a final average and evaluate it. Rank 1's final evaluation is
// held (a failpoint) well past the heartbeat timeout, after rank 0 has finished and its
// coordinator has stopped acknowledging heartbeats: rank 1 must still finish (no
// membership exit), and with max_restarts the finished job must not run again.
TEST(Membership, AFinishingWorkerIsNeverKilledByMembership) {
  setenv("SHOAL_FAILPOINT_SLOW_FINAL_EVAL", "1:4000", 1);
  for (const char* algo : {"bmuf", "adpsgd"}) {
    std::string dir = FreshDir(std::string("slow_final_") + algo);
    std::string t = FmnistJob(std::string("slow_final_") + algo, dir + "/out", 2, "mlp", 4000, 1,
                              std::string("[algorithm]\nname = \"") + algo + "\"\n\n" + kOpt);
    t.insert(t.find("[cluster]\n") + 10, "heartbeat_ms = 100\nheartbeat_timeout_ms = 1000\n");
    t.insert(t.find("seed = 42\n") + 10, "max_restarts = 1\n");
    JobRun r = RunJob(dir, t, 240);
    EXPECT_EQ(r.exit_code, 0) << algo << "\n" << r.stderr_text;
    EXPECT_TRUE(Events(r, "restart").empty()) << algo << ": a finished job ran again\n" << r.stderr_text;
    EXPECT_EQ(r.stderr_text.find("the job cannot go on"), std::string::npos) << algo << "\n" << r.stderr_text;
    int ends = 0;
    for (auto& l : Events(r, "end")) ends += JsonNumber(l, "rank").value_or(-1) == 1;
    EXPECT_EQ(ends, 1) << algo << ": rank 1's end record\n" << r.stderr_text;
    EXPECT_EQ(ProcessesOf(dir), 0);
  }
  unsetenv("SHOAL_FAILPOINT_SLOW_FINAL_EVAL");
}

}  // namespace
}  // namespace testing
}  // namespace shoal
