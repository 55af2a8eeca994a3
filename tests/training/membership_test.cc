// Membership and the end of a job, with real processes on loopback: the stop decision of
// asynchronous PS jobs, the final model's evaluation, finishing workers never taken for
// dead, a ps_ssp worker restarted alone, and a coordinator busy with a long RELOAD.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "common/json_fields.h"
#include "tests/ps/ps_test_util.h"
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

// The train events of one rank from metrics.jsonl: (step, wall_s).
std::vector<std::pair<int64_t, double>> TrainSteps(const std::vector<std::string>& metrics, int rank) {
  std::vector<std::pair<int64_t, double>> out;
  for (auto& l : metrics)
    if (JsonField(l, "event").value_or("") == "train" && JsonNumber(l, "rank").value_or(-1) == rank)
      out.emplace_back(int64_t(JsonNumber(l, "step").value_or(0)), JsonNumber(l, "wall_s").value_or(0));
  return out;
}

// A ps_ssp job of 3 workers (staleness 2, 125 steps an epoch each, 250 in all) with
// checkpoints every `every` steps and a restart allowed; worker 2 is `slow` times slower.
std::string SspJob(const std::string& dir, int every, const std::string& speeds, int hb_timeout_ms) {
  std::string t =
      FmnistJob("ssp_alone", dir + "/out", 3, "mlp", 12000, 2,
                std::string("[algorithm]\nname = \"ps_ssp\"\nstaleness = 2\ntimeout_ms = 20000\n\n") + kOpt);
  t.insert(t.find("seed = 42\n") + 10, "checkpoint_dir = \"" + dir + "/ckpt\"\ncheckpoint_every_steps = " +
                                           std::to_string(every) + "\nmax_restarts = 1\n");
  t.insert(t.find("[cluster]\n") + 10,
           "heartbeat_ms = 100\nheartbeat_timeout_ms = " + std::to_string(hb_timeout_ms) + "\n");
  t.replace(t.find("workers = 3"), 11, "workers = " + speeds);
  t.replace(t.find("log_every_steps = 20"), 20, "log_every_steps = 1");
  return t;
}

// Waits (bounded) until checkpoint `ckpt` is committed and worker 2 has logged step `step`;
// then `before` runs and worker 2 is SIGKILLed. Returns the step worker 2 had logged, or -1.
int64_t KillWorker2After(const std::string& dir, int ckpt, int64_t step, const std::function<void()>& before) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream m(dir + "/out/metrics.jsonl");
    std::vector<std::string> lines;
    std::string l;
    while (std::getline(m, l)) lines.push_back(l);
    bool committed = false;
    for (auto& x : lines)
      committed =
          committed || (JsonField(x, "event").value_or("") == "checkpoint" && JsonNumber(x, "id").value_or(0) == ckpt);
    auto w2 = TrainSteps(lines, 2);
    if (committed && !w2.empty() && w2.back().first >= step) {
      if (before) before();
      const std::string cmd = "pkill -KILL -f -- '--confi[g] " + dir + "/job.toml --rank 2'";
      return system(cmd.c_str()) == 0 ? w2.back().first : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// Worker 2 (the slowest, four times slower) SIGKILLed 10+ steps past the checkpoint at step
// 100 and restarted alone, before anyone took it for dead (heartbeat timeout 5 s): it goes
// on from the clock the servers know for it, not from the checkpoint's step, which set its
// clock back and held the survivors until it had trained those steps again (until
// timeout_ms when that took long).
TEST(Membership, SspWorkerRestartedAloneGoesOnFromItsOwnClock) {
  std::string dir = FreshDir("ssp_clock");
  std::string t = SspJob(dir, 100, "[{}, {}, {slowdown = 3.0}]", 5000);
  int64_t killed_after = -1;
  std::thread killer([&] { killed_after = KillWorker2After(dir, 100, 110, nullptr); });
  JobRun r = RunJob(dir, t, 300);
  killer.join();
  ASSERT_GE(killed_after, 110) << r.stderr_text;
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  auto restarts = Events(r, "restart");
  ASSERT_EQ(restarts.size(), 1u) << r.stderr_text;
  EXPECT_EQ(JsonField(restarts[0], "alone").value_or("?"), "worker 2") << restarts[0];
  EXPECT_EQ(JsonNumber(restarts[0], "from_checkpoint").value_or(-1), 100) << restarts[0];
  int64_t resumed = -1;
  for (auto& l : Events(r, "resume"))
    if (JsonNumber(l, "rank").value_or(-1) == 2) resumed = int64_t(JsonNumber(l, "step").value_or(-1));
  EXPECT_GE(resumed, killed_after) << "resumed at the checkpoint's step, behind its own clock\n" << r.stderr_text;
  EXPECT_EQ(r.stderr_text.find("steps behind for"), std::string::npos) << r.stderr_text;
  EXPECT_EQ(ProcessesOf(dir), 0);
}

// Worker 2 (forty times slower; the others twenty) stopped until the survivors took it for
// dead and left its clock out, then SIGKILLed and restarted alone: once back, its clock
// holds them again, so no survivor takes its last step (clock 250) before worker 2's clock
// is within the staleness: worker 2 logs step 247 before it pushes clock 248. The survivors
// are slow enough that worker 2 is back long before they could finish without it (at four
// times slower they did, once, while a restart waited for a loaded machine).
TEST(Membership, SspWorkerSeenDeadCountsAgainOnceBack) {
  std::string dir = FreshDir("ssp_back");
  // 1.5 s: short enough to see worker 2 dead soon, long enough that a live worker starved of
  // CPU on a loaded 2-core machine (CI runs two tests at once) is not taken for dead.
  std::string t = SspJob(dir, 50, "[{slowdown = 19.0}, {slowdown = 19.0}, {slowdown = 39.0}]", 1500);
  const std::string stop = "pkill -STOP -f -- '--confi[g] " + dir + "/job.toml --rank 2'";
  bool seen_dead = false;
  int64_t killed_after = -1;
  std::thread killer([&] {
    killed_after = KillWorker2After(dir, 50, 60, [&] {
      if (system(stop.c_str()) != 0) return;
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!(seen_dead =
                   ReadFile(dir + "/out/logs/worker-0.log").find("worker 2 stopped answering") != std::string::npos) &&
             std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    });
  });
  JobRun r = RunJob(dir, t, 300);
  killer.join();
  ASSERT_GE(killed_after, 60) << r.stderr_text;
  ASSERT_TRUE(seen_dead) << r.stderr_text;
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  ASSERT_EQ(Events(r, "restart").size(), 1u) << r.stderr_text;
  double w2_at_247 = -1;
  for (auto& [step, wall] : TrainSteps(r.metrics, 2))
    if (step == 247) w2_at_247 = wall;
  ASSERT_GT(w2_at_247, 0) << r.stderr_text;
  for (int rank : {0, 1}) {
    double last = -1;
    for (auto& [step, wall] : TrainSteps(r.metrics, rank))
      if (step == 250) last = wall;
    EXPECT_GE(last + 0.01, w2_at_247) << "worker " << rank << " ran ahead of the rejoined worker 2\n" << r.stderr_text;
  }
  EXPECT_EQ(ProcessesOf(dir), 0);
}

}  // namespace
}  // namespace testing
}  // namespace shoal
