// auto's probe ends once its choice has settled, and hands over on its own communicator: the algorithm it chose opens
// none (on slow links a new ring's rendezvous and CurveZMQ handshakes cost seconds), runs as that algorithm alone
// would, and the bytes are counted once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "algorithms/algorithm.h"
#include "common/config.h"
#include "common/cpu_cgroup.h"
#include "tools/launcher/cpu_quota.h"
#include "tests/algorithms/fake_communicator.h"

namespace shoal {
namespace {

// 3 workers of batch 4, SGD at lr 0.1.
JobConfig Job(const std::string& algorithm, const std::string& keys = "") {
  return ParseJobConfig(
      "[job]\nname = \"t\"\n[cluster]\nworkers = 3\n[model]\nname = \"mlp\"\n"
      "[data]\nformat = \"synthetic\"\nbatch_size = 4\n[algorithm]\nname = \"" +
          algorithm + "\"\n" + keys + "[optimizer]\nname = \"sgd\"\nlr = 0.1\nweight_decay = 0\n[train]\nepochs = 1\n",
      "job.toml");
}

struct Outcome {
  std::string name;                 // the algorithm's name at the end (auto's says what it chose)
  std::vector<float> weights;       // rank 0's (every rank's must agree)
  int64_t bytes = 0;                // rank 0's bytes_sent
  std::vector<std::string> groups;  // the communicators opened
};

// `steps` steps on 3 ranks; rank r's gradient at step s is fixed by (s, r). Each step sleeps
// 2 ms first, as compute, so auto's probe sees even workers (rank 2 sleeps `slow_ms` once,
// before its second step). `names`: rank 0's algorithm name after each step.
Outcome RunRanks(const JobConfig& cfg, int steps, std::vector<std::string>* names = nullptr, int slow_ms = 0) {
  FakeCluster cluster(3);
  std::vector<std::vector<float>> weights(3);
  Outcome o;
  RunRankThreads(3, [&](int rank) {
    auto algo = MakeAlgorithm(cfg.algorithm, cluster.EnvFor(cfg, rank, 100));
    std::vector<float> w = {1, -2, 0.5f, 3}, g(4);
    std::vector<ParamView> params = OneTensor(w, g);
    algo->Init(params);
    for (int s = 0; s < steps; ++s) {
      std::this_thread::sleep_for(std::chrono::milliseconds(rank == 2 && s == 1 ? slow_ms : 2));
      for (int j = 0; j < 4; ++j) g[size_t(j)] = std::sin(float(7 * s + 3 * rank + j));
      StepInfo info;
      info.step = s;
      algo->Step(params, info);
      if (names && rank == 0) names->push_back(algo->Name());
    }
    algo->Finish(params);
    weights[size_t(rank)] = w;
    if (rank == 0) o.name = algo->Name(), o.bytes = algo->bytes_sent();
  });
  EXPECT_EQ(weights[0], weights[1]) << "weights differ across ranks";
  EXPECT_EQ(weights[0], weights[2]) << "weights differ across ranks";
  o.weights = weights[0];
  o.groups = cluster.GroupNames();
  return o;
}

TEST(AutoHandOver, TheChosenAlgorithmRunsOnAutosCommunicator) {
  // Every ratio out of reach and adpsgd's factor at its most: auto picks allreduce.
  const std::string keys =
      "probe_steps = 4\nuneven_ratio = 1e6\nbmuf_ratio = 1e6\ndgc_ratio = 1e6\ndiloco_ratio = 1e6\n"
      "adpsgd_factor = 100.0\n";
  Outcome chose = RunRanks(Job("auto", keys), 10), plain = RunRanks(Job("allreduce"), 10);
  EXPECT_EQ(chose.name, "auto:allreduce");
  EXPECT_EQ(chose.groups, std::vector<std::string>{"auto"}) << "the chosen algorithm opened a communicator";
  EXPECT_EQ(plain.groups, std::vector<std::string>{"allreduce"});
  EXPECT_EQ(chose.weights, plain.weights);
  // The same all-reduces, those of steps 3 and 4 with every rank's (compute, exchange, seconds
  // measured, CPU quota) at their end (3 x 4 floats: 4 more in each of the ring's chunks, 2 x 2
  // chunks sent), and the chosen algorithm's weights-hash check at its Init (each rank sends 2 of
  // 3 entries): counted once.
  EXPECT_EQ(chose.bytes, plain.bytes + 2 * (2 * 32) + 2 * 8);
}

// From the third probe step every step weighs the figures so far; probe_settle_steps steps in
// a row with the same choice end the probe, long before probe_steps.
TEST(AutoHandOver, TheProbeEndsOnceTheChoiceHasSettled) {
  const std::string forced =
      "uneven_ratio = 1e6\nbmuf_ratio = 1e6\ndgc_ratio = 1e6\ndiloco_ratio = 1e6\nadpsgd_factor = 100.0\n";
  std::vector<std::string> names;
  RunRanks(Job("auto", "probe_steps = 50\nprobe_settle_s = 0\n" + forced), 8, &names);
  // Weighed after steps 3, 4 and 5 (indices 2-4): allreduce each time, so chosen after step 5.
  EXPECT_EQ(names, (std::vector<std::string>{"auto", "auto", "auto", "auto", "auto:allreduce", "auto:allreduce",
                                             "auto:allreduce", "auto:allreduce"}));
  names.clear();
  RunRanks(Job("auto", "probe_steps = 50\nprobe_settle_steps = 6\nprobe_settle_s = 0\n" + forced), 9, &names);
  EXPECT_EQ(names[6], "auto");  // weighed after steps 3-8: chosen after step 8
  EXPECT_EQ(names[7], "auto:allreduce");
  // Where a worker runs under a CPU quota, the same choice every step is not enough: 7 steps
  // of about 2 ms are far from the second of measured steps that settling then waits for
  // (probe_settle_s, ten periods of the quota): the probe runs to probe_steps. Without a quota
  // the default is 0 (settled after step 5, above), and a job may still ask for the wait.
  for (const std::string& wait : {std::string(), std::string("probe_settle_s = 1.0\n")}) {
    JobConfig cfg = Job("auto", "probe_steps = 8\n" + wait + forced);
    if (wait.empty()) cfg.workers[1].cpu_quota = 0.5;
    names.clear();
    RunRanks(cfg, 9, &names);
    EXPECT_EQ(names[6], "auto") << wait;
    EXPECT_EQ(names[7], "auto:allreduce") << wait;
  }
  names.clear();
  RunRanks(Job("auto", "probe_steps = 8\n" + forced), 9, &names);
  EXPECT_EQ(names[4], "auto:allreduce");
}

// Writes this process's pid into a cgroup's procs file (the whole process moves, every thread).
bool JoinGroup(const std::string& procs_file) {
  FILE* f = fopen(procs_file.c_str(), "w");
  const bool ok = f && fputs(std::to_string(getpid()).c_str(), f) >= 0;
  return (f && fclose(f) == 0) && ok;
}

// A quota set outside the job file (a container's, Slurm's: here a real cgroup the test process joins, as root)
// is read by the worker itself and waits as a job file's does; a quota of every core throttles nothing and does
// not.
TEST(AutoHandOver, AQuotaFromOutsideTheJobWaitsToo) {
  const std::string forced =
      "probe_steps = 8\nuneven_ratio = 1e6\nbmuf_ratio = 1e6\ndgc_ratio = 1e6\ndiloco_ratio = 1e6\n"
      "adpsgd_factor = 100.0\n";
  const double cores = double(AllowedCores());
  for (double quota : {cores - 0.5, cores}) {
    const CpuHierarchy h = FindCpuHierarchy(ReadKernelText("/proc/mounts"));
    const std::string home = OwnCgroupPath(ReadKernelText("/proc/self/cgroup"), h.version);
    ASSERT_FALSE(home.empty()) << "no cpu controller to make a group in";
    CpuQuotaGroups groups({quota});
    ASSERT_TRUE(JoinGroup(groups.ProcsFile(0))) << groups.ProcsFile(0);
    ASSERT_DOUBLE_EQ(OwnCpuQuota(), quota);
    std::vector<std::string> names;
    RunRanks(Job("auto", forced), 9, &names);
    ASSERT_TRUE(JoinGroup(h.path + home + "/cgroup.procs")) << "could not go back to " << home;
    if (quota < cores) {
      EXPECT_EQ(names[6], "auto") << quota;  // probe_steps, not settled after step 5
      EXPECT_EQ(names[7], "auto:allreduce") << quota;
    } else {
      EXPECT_EQ(names[4], "auto:allreduce") << quota;
    }
  }
}

// One slow step (a moment of load beside the job) is not the worker's speed: the probe leaves
// each worker's slowest step out. Read as a plain mean over the probe's 4 intervals, rank 2's
// 150 ms step made it 20x slower than the others, and adpsgd (nobody waits for the slowest) won
// even at 3x all-reduce's steps to target.
TEST(AutoHandOver, OneSlowProbeStepDoesNotMakeAWorkerSlow) {
  const std::string keys =
      "probe_steps = 5\nbmuf_ratio = 1e6\ndgc_ratio = 1e6\ndiloco_ratio = 1e6\nadpsgd_factor = 3.0\n";
  EXPECT_EQ(RunRanks(Job("auto", keys), 7, nullptr, 150).name, "auto:allreduce");
}

}  // namespace
}  // namespace shoal
