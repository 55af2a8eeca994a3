// Parameter-server jobs end to end: servers, workers and launcher as real processes on
// loopback, training on real Fashion-MNIST.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "common/json_fields.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

const char* kOpt = "[optimizer]\nname = \"momentum\"\nlr = 0.05\nmomentum = 0.9\n\n";

JobRun RunPs(const std::string& name, int workers, int64_t samples, int epochs, const std::string& extra,
             int timeout = 300) {
  std::string dir = FreshDir(name);
  return RunJob(dir, FmnistJob(name, dir + "/out", workers, "mlp", samples, epochs, extra), timeout);
}

double Accuracy(const JobRun& r) { return JsonNumber(r.done_line, "test_accuracy").value_or(-1); }

TEST(PsTraining, AsyncReachesTarget) {
  JobRun r = RunPs("ps_async", 4, 12000, 3, std::string("[algorithm]\nname = \"ps_async\"\n\n") + kOpt);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_GE(Accuracy(r), 0.78) << r.done_line;
  EXPECT_GT(JsonNumber(r.done_line, "bytes_sent").value_or(0), 0);
}

TEST(PsTraining, SyncReachesTarget) {
  JobRun r = RunPs("ps_sync", 3, 12000, 2, std::string("[algorithm]\nname = \"ps_sync\"\n\n") + kOpt);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_GE(Accuracy(r), 0.80) << r.done_line;
}

// N workers at batch b through ps_sync == one local worker at batch N*b: same samples per
// step (the shards of one global permutation), the mean gradient, one optimizer step.
TEST(PsTraining, SyncWithNWorkersEqualsOneWorkerWithNTimesTheBatch) {
  auto job = [](const std::string& name, const std::string& dir, int workers, int batch, const std::string& algo) {
    std::string t =
        FmnistJob(name, dir + "/out", workers, "mlp", 1920, 1, "[algorithm]\nname = \"" + algo + "\"\n\n" + kOpt);
    auto p = t.find("batch_size = 32");
    t.replace(p, 15, "batch_size = " + std::to_string(batch));
    p = t.find("seed = 42\n");
    t.insert(p + 10, "export_weights = \"" + dir + "/weights.bin\"\n");
    return t;
  };
  std::string d1 = FreshDir("sync4"), d2 = FreshDir("local1");
  JobRun a = RunJob(d1, job("sync4", d1, 4, 16, "ps_sync"), 300);
  JobRun b = RunJob(d2, job("local1", d2, 1, 64, "local"), 300);
  ASSERT_EQ(a.exit_code, 0) << a.stderr_text;
  ASSERT_EQ(b.exit_code, 0) << b.stderr_text;
  EXPECT_EQ(JsonNumber(a.done_line, "steps").value_or(-1), 30);
  EXPECT_EQ(JsonNumber(b.done_line, "steps").value_or(-2), 30);
  std::vector<float> wa = ReadFloats(d1 + "/weights.bin"), wb = ReadFloats(d2 + "/weights.bin");
  ASSERT_EQ(wa.size(), wb.size());
  ASSERT_GT(wa.size(), 200000u);
  // The server sums the workers' gradients in arrival order, so rounding differs from the
  // single worker's; compare to fp tolerance: relative L2 distance and the share of
  // elements off by more than 1e-4.
  double dist2 = 0, n2 = 0, max_w = 0;
  size_t off = 0;
  for (size_t i = 0; i < wa.size(); ++i) {
    double d = double(wa[i]) - wb[i];
    dist2 += d * d;
    n2 += double(wb[i]) * wb[i];
    off += std::fabs(d) > 1e-4;
    max_w = std::max(max_w, double(std::fabs(wb[i])));
  }
  EXPECT_LT(std::sqrt(dist2 / n2), 1e-4) << "relative L2 distance";
  EXPECT_LT(double(off), 1e-3 * double(wa.size())) << off << " elements differ by more than 1e-4";
  // And they really trained: the weights moved from their start.
  EXPECT_GT(max_w, 0.01);
}

TEST(PsTraining, SspNeverExceedsItsBound) {
  std::string extra = std::string("[algorithm]\nname = \"ps_ssp\"\nstaleness = 2\n\n") + kOpt;
  std::string dir = FreshDir("ssp");
  std::string t = FmnistJob("ssp", dir + "/out", 3, "mlp", 6000, 1, extra);
  // One worker three times slower: the fast ones must wait for it.
  auto p = t.find("workers = 3");
  t.replace(p, 11, "workers = [{slowdown = 3.0}, {}, {}]");
  t.replace(t.find("log_every_steps = 20"), 20, "log_every_steps = 1");
  JobRun r = RunJob(dir, t, 300);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  double worst = 0;
  for (auto& l : Events(r, "train")) worst = std::max(worst, JsonNumber(l, "max_staleness").value_or(0));
  EXPECT_LE(worst, 2.0);
  EXPECT_GE(worst, 1.0) << "the slow worker should have held the others back";
  EXPECT_GE(Accuracy(r), 0.70) << r.done_line;
}

TEST(PsTraining, AsyncGoesOnWhenAWorkerIsKilled) {
  std::string dir = FreshDir("async_kill");
  std::string t = FmnistJob("async_kill", dir + "/out", 3, "mlp", 30000, 2,
                            std::string("[algorithm]\nname = \"ps_async\"\n\n") + kOpt);
  std::thread killer([&] { KillWhenTraining(dir, "--rank 2", 6); });
  JobRun r = RunJob(dir, t, 300);
  killer.join();
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("worker 2 stopped: killed by signal"), std::string::npos) << r.stderr_text;
  EXPECT_EQ(JsonNumber(r.done_line, "workers_failed").value_or(0), 1) << r.done_line;
  EXPECT_GE(Accuracy(r), 0.75) << r.done_line;
}

// ps_ssp tolerates deaths too (facts: kAnyButLast): the survivors' staleness bound leaves
// out the killed worker's clock once the coordinator has seen its heartbeats stop, so they
// finish instead of waiting on it until timeout_ms.
TEST(PsTraining, SspGoesOnWhenAWorkerIsKilled) {
  std::string dir = FreshDir("ssp_kill");
  std::string t =
      FmnistJob("ssp_kill", dir + "/out", 3, "mlp", 12000, 2,
                std::string("[algorithm]\nname = \"ps_ssp\"\nstaleness = 1\ntimeout_ms = 30000\n\n") + kOpt);
  t.insert(t.find("[cluster]\n") + 10, "heartbeat_ms = 100\nheartbeat_timeout_ms = 1500\n");
  std::thread killer([&] { KillWhenTraining(dir, "--rank 2", 3); });
  auto t0 = std::chrono::steady_clock::now();
  JobRun r = RunJob(dir, t, 240);
  killer.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("worker 2 stopped: killed by signal"), std::string::npos) << r.stderr_text;
  EXPECT_EQ(JsonNumber(r.done_line, "workers_failed").value_or(0), 1) << r.done_line;
  // 125 steps an epoch, 250 in all: the survivors trained to the end.
  int64_t last = 0;
  for (auto& l : Events(r, "train")) last = std::max<int64_t>(last, int64_t(JsonNumber(l, "step").value_or(0)));
  EXPECT_GE(last, 240) << r.done_line;
  EXPECT_LT(secs, 30) << "waited on the dead worker's clock until timeout_ms";
}

int64_t MaxStep(const std::vector<std::string>& lines) {
  int64_t m = 0;
  for (auto& l : lines) m = std::max<int64_t>(m, int64_t(JsonNumber(l, "step").value_or(0)));
  return m;
}

// A parameter server SIGKILLed mid-training: the launcher stops the job naming it, and
// `--resume` restarts every process from the newest complete checkpoint; the job then
// finishes with its step count continuing from there and its accuracy on target.
TEST(PsTraining, ServerKilledMidTrainingResumesFromTheNewestCheckpoint) {
  std::string dir = FreshDir("resume");
  // 12000 samples, 2 workers, batch 32: 187 steps an epoch, 561 in all.
  std::string t =
      FmnistJob("resume", dir + "/out", 2, "mlp", 12000, 3, std::string("[algorithm]\nname = \"ps_sync\"\n\n") + kOpt);
  t.insert(t.find("seed = 42\n") + 10, "checkpoint_dir = \"" + dir + "/ckpt\"\ncheckpoint_every_steps = 40\n");
  std::thread killer([&] { KillWhenTraining(dir, "--shard 1", 10); });
  JobRun first = RunJob(dir, t, 300);
  killer.join();
  ASSERT_NE(first.exit_code, 0) << first.stdout_text;
  EXPECT_NE(first.stderr_text.find("server 1 stopped: killed by signal"), std::string::npos) << first.stderr_text;
  int64_t reached = MaxStep(Events(first, "train"));
  ASSERT_GE(reached, 80) << "killed before two checkpoints";
  ASSERT_LT(reached, 561) << "the job ended before the kill";

  JobRun second = RunJob(dir, t, 300, {"--resume"});
  ASSERT_EQ(second.exit_code, 0) << second.stderr_text;
  auto resumes = Events(second, "resume");
  ASSERT_EQ(resumes.size(), 2u) << "one resume line per worker";
  int64_t at = int64_t(JsonNumber(resumes[0], "step").value_or(-1));
  EXPECT_EQ(JsonNumber(resumes[1], "step").value_or(-2), at);
  EXPECT_EQ(at % 40, 0) << at;
  // (a checkpoint is written at the end of its step, just before that step's log line)
  EXPECT_LE(at, reached + 20) << "a checkpoint from after the kill?";
  EXPECT_GE(at, reached - 80) << "not the newest complete checkpoint";
  // Steps go on from the checkpoint: the resumed run logs no step at or before it.
  std::vector<std::string> after(second.metrics.begin() + int64_t(first.metrics.size()), second.metrics.end());
  int64_t first_after = 1 << 30;
  for (auto& l : after)
    if (JsonField(l, "event").value_or("") == "train")
      first_after = std::min<int64_t>(first_after, int64_t(JsonNumber(l, "step").value_or(0)));
  EXPECT_GT(first_after, at);
  EXPECT_EQ(JsonNumber(second.done_line, "steps").value_or(-1), 561) << second.done_line;
  EXPECT_GE(Accuracy(second), 0.80) << second.done_line;
}

// A checkpoint write never holds up a shard's serving: with a failpoint holding every
// synced write until the test opens a gate, ps_async worker 1 keeps training (its pulls and
// pushes answered, heartbeats flowing) while rank 0 waits for the write's ack; were the
// write on the serving thread, worker 1 would stop at its next pull until the gate opened.
TEST(PsTraining, ACheckpointWriteInProgressHoldsUpNoServing) {
  std::string dir = FreshDir("slow_write");
  // 6400 samples, 2 workers, batch 32: 100 steps each, a train line every 20.
  std::string t = FmnistJob("slow_write", dir + "/out", 2, "mlp", 6400, 1,
                            std::string("[algorithm]\nname = \"ps_async\"\n\n") + kOpt);
  t.insert(t.find("seed = 42\n") + 10, "checkpoint_dir = \"" + dir + "/ckpt\"\ncheckpoint_every_steps = 20\n");
  t.insert(t.find("[cluster]\n") + 10, "heartbeat_ms = 100\nheartbeat_timeout_ms = 1000\n");
  const std::string gate = dir + "/gate";
  setenv("SHOAL_FAILPOINT_CHECKPOINT_WRITE_GATE", gate.c_str(), 1);
  // Worker 1's train lines past step 40 while no checkpoint is logged yet: it trained on
  // while the first write (step 20) was held.
  bool trained_during_write = false;
  std::thread opener([&] {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline && !trained_during_write) {
      std::ifstream m(dir + "/out/metrics.jsonl");
      std::string l;
      bool checkpointed = false, far = false;
      while (std::getline(m, l)) {
        checkpointed |= JsonField(l, "event").value_or("") == "checkpoint";
        far |= JsonField(l, "event").value_or("") == "train" && JsonNumber(l, "rank").value_or(-1) == 1 &&
               JsonNumber(l, "step").value_or(0) >= 60;
      }
      trained_during_write = far && !checkpointed;
      if (checkpointed) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::ofstream(gate) << "open\n";
  });
  JobRun r = RunJob(dir, t, 240);
  opener.join();
  unsetenv("SHOAL_FAILPOINT_CHECKPOINT_WRITE_GATE");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_TRUE(trained_during_write) << "worker 1 did not train on while the checkpoint was being written";
  EXPECT_EQ(Events(r, "restart").size(), 0u) << r.stderr_text;
  EXPECT_EQ(JsonNumber(r.done_line, "workers_failed").value_or(0), 0) << r.done_line;
  EXPECT_GE(Events(r, "checkpoint").size(), 1u);
}

// A whole job from one mpirun: each task's rank picks its role (tasks 0-1 the shards,
// 2-3 the workers), and the servers leave by themselves once the workers have finished,
// so mpirun itself ends, with exit code 0.
TEST(PsTraining, AWholeJobStartedByOneMpirun) {
  if (system("command -v mpirun > /dev/null") != 0) GTEST_SKIP() << "mpirun not installed (openmpi-bin)";
  std::string dir = FreshDir("mpirun");
  std::string job = dir + "/job.toml";
  std::ofstream(job) << FmnistJob("mpirun", dir + "/out", 2, "mlp", 4000, 1,
                                  std::string("[algorithm]\nname = \"ps_sync\"\n\n") + kOpt);
  std::string cmd = "timeout -s KILL 240 mpirun --allow-run-as-root --oversubscribe -np 4 " + BinDir() +
                    "/tools/launcher/shoal-task --config " + job + " > " + dir + "/mpi.log 2>&1";
  int rc = system(cmd.c_str());
  std::ifstream log(dir + "/mpi.log");
  std::string all((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << all;
  EXPECT_NE(all.find("worker 0/2"), std::string::npos) << all;
  EXPECT_NE(all.find("worker 1/2"), std::string::npos) << all;
  EXPECT_NE(all.find("shard 0: every worker has finished"), std::string::npos) << all;
  EXPECT_NE(all.find("shard 1: every worker has finished"), std::string::npos) << all;
}

// The wrong number of tasks is one clear line, and nothing starts.
TEST(PsTraining, MpirunWithTheWrongTaskCountIsRefused) {
  if (system("command -v mpirun > /dev/null") != 0) GTEST_SKIP() << "mpirun not installed (openmpi-bin)";
  std::string dir = FreshDir("mpirun-count");
  std::string job = dir + "/job.toml";
  std::ofstream(job) << FmnistJob("mpirun-count", dir + "/out", 2, "mlp", 4000, 1,
                                  std::string("[algorithm]\nname = \"ps_sync\"\n\n") + kOpt);
  std::string cmd = "timeout -s KILL 60 mpirun --allow-run-as-root --oversubscribe -np 3 " + BinDir() +
                    "/tools/launcher/shoal-task --config " + job + " > " + dir + "/mpi.log 2>&1";
  EXPECT_NE(system(cmd.c_str()), 0);
  std::ifstream log(dir + "/mpi.log");
  std::string all((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(all.find("the job needs 4 tasks (2 server(s) + 2 worker(s)) but openmpi started 3"), std::string::npos)
      << all;
}

// Started by hand, with no task rank in the environment: the error says to use srun or
// mpirun, never to pass --rank (shoal-task has no such flag).
TEST(PsTraining, ShoalTaskWithoutARankAsksForSrunOrMpirun) {
  std::string dir = FreshDir("task-norank");
  std::string job = dir + "/job.toml";
  std::ofstream(job) << FmnistJob("task-norank", dir + "/out", 2, "mlp", 4000, 1,
                                  std::string("[algorithm]\nname = \"ps_sync\"\n\n") + kOpt);
  std::string cmd = "env -u SLURM_PROCID -u OMPI_COMM_WORLD_RANK -u RANK timeout -s KILL 30 " + BinDir() +
                    "/tools/launcher/shoal-task --config " + job + " > " + dir + "/task.log 2>&1";
  EXPECT_NE(system(cmd.c_str()), 0);
  std::ifstream log(dir + "/task.log");
  std::string all((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(all.find("start shoal-task with srun or mpirun"), std::string::npos) << all;
  EXPECT_EQ(all.find("--rank"), std::string::npos) << all;
}

}  // namespace
}  // namespace testing
}  // namespace shoal
