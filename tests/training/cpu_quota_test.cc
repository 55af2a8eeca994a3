// [cluster] workers = [{cpu_quota = ...}]: `shoal run` puts each such worker in its own cgroup
// with a CFS quota. Real jobs, real cgroups (this machine: cgroup v1's cpu controller, as
// root): the worker's CPU time over a wall interval stays near its quota and the kernel
// throttles it; a restarted worker goes back into its group; the groups are gone when the
// job stops, and a launcher killed outright has its groups removed by the next launch.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "tests/ps/ps_test_util.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// A job of `workers` (a TOML array) training with "local" (no exchange, so an unlimited
// worker never waits on a limited one) for far longer than the test watches it.
std::string QuotaJob(const std::string& dir, const std::string& workers, const std::string& job_extra = "") {
  std::string job = FmnistJob("cpu_quota", dir + "/out", 2, "lenet", 4096, 200, "[algorithm]\nname = \"local\"\n");
  job.replace(job.find("workers = 2"), 11, "workers = " + workers);
  job.replace(job.find("seed = 42"), 9, "seed = 42\n" + job_extra);
  return job;
}

// The job's group directory, from the launcher's stderr ("... in cgroup v1 DIR/worker-RANK"),
// waiting (bounded) for the line; "" when it never came.
std::string JobGroup(const std::string& dir) {
  static const std::regex kLine("worker CPU quotas in cgroup v[12] (\\S+)/worker-RANK");
  for (int i = 0; i < 1200; ++i) {
    std::smatch m;
    std::string err = ReadFile(dir + "/stderr.txt");
    if (std::regex_search(err, m, kLine)) return m[1];
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return "";
}

// The single pid running `process` of the job ("--rank 0"), waiting (bounded) for one other
// than `not_pid`; -1 when none came.
int PidOf(const std::string& dir, const std::string& process, int not_pid = -1) {
  for (int i = 0; i < 1200; ++i) {
    std::istringstream ids(PidsOf(dir, process));
    int pid;
    while (ids >> pid)
      if (pid != not_pid) return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return -1;
}

// The cpu controller's path of `pid` ("/shoal-123/worker-0"), from /proc/PID/cgroup.
std::string CpuGroupOf(int pid) {
  std::istringstream in(ReadFile("/proc/" + std::to_string(pid) + "/cgroup"));
  std::string line;
  while (std::getline(in, line)) {
    auto a = line.find(':'), b = line.find(':', a + 1);
    std::string controllers = line.substr(a + 1, b - a - 1);
    if (controllers == "cpu" || controllers.rfind("cpu,", 0) == 0 || controllers.empty()) return line.substr(b + 1);
  }
  return "?";
}

// user + system CPU seconds of every thread of `pid` (/proc/PID/stat fields 14 and 15).
double CpuSeconds(int pid) {
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  std::istringstream f(stat.substr(stat.rfind(')') + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 0; f >> field && i <= 12; ++i) {
    if (i == 11) utime = std::stod(field);
    if (i == 12) stime = std::stod(field);
  }
  return (utime + stime) / double(sysconf(_SC_CLK_TCK));
}

// The launcher that made a job's group ".../shoal-PID".
int LauncherOf(const std::string& group) { return std::stoi(group.substr(group.rfind('-') + 1)); }

int64_t Throttled(const std::string& group) {
  std::istringstream in(ReadFile(group + "/cpu.stat"));
  std::string k;
  int64_t v;
  while (in >> k >> v)
    if (k == "nr_throttled") return v;
  return -1;
}

TEST(CpuQuota, WorkerGetsItsShareRestartsInItsGroupAndGroupsGoWithTheJob) {
  std::string dir = FreshDir("cpu_quota");
  JobRun run;
  std::thread job([&] { run = RunJob(dir, QuotaJob(dir, "[{cpu_quota = 0.2}, {}]", "max_restarts = 1"), 300); });
  const std::string group = JobGroup(dir);
  ASSERT_FALSE(group.empty()) << ReadFile(dir + "/stderr.txt");
  const std::string worker0 = group + "/worker-0";
  EXPECT_EQ(ReadFile(worker0 + "/cpu.cfs_quota_us"), "20000\n");
  EXPECT_EQ(ReadFile(worker0 + "/cpu.cfs_period_us"), "100000\n");
  EXPECT_FALSE(Exists(group + "/worker-1")) << "a worker without a quota gets no group";
  for (int i = 0; i < 1200 && CountEvents(dir, "train") < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(CountEvents(dir, "train"), 2) << "it never trained";

  const int pid = PidOf(dir, "--rank 0");
  ASSERT_GT(pid, 0);
  const std::string rel = group.substr(group.rfind('/'));  // "/shoal-123"
  EXPECT_EQ(CpuGroupOf(pid), rel + "/worker-0");
  EXPECT_EQ(CpuGroupOf(PidOf(dir, "--rank 1")).find("/shoal-"), std::string::npos);

  // Its CPU time over a wall interval: at most its quota (plus a generous margin), and the
  // kernel throttled it on the way, whatever else this machine was doing.
  const int64_t throttled0 = Throttled(worker0);
  const double cpu0 = CpuSeconds(pid);
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(4));
  const double cpu = CpuSeconds(pid) - cpu0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double share = cpu / wall;
  RecordProperty("cpu_share", std::to_string(share));
  printf("worker 0 at cpu_quota 0.2: %.2f s of CPU in %.2f s of wall time = %.3f of a core\n", cpu, wall, share);
  EXPECT_LT(share, 0.4) << cpu << " s of CPU in " << wall << " s";
  EXPECT_GT(cpu, 0.0);
  EXPECT_GT(Throttled(worker0), throttled0) << "the quota never stopped it";

  // Killed, the job restarts (max_restarts = 1): the new worker 0 is in the same group.
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  const int again = PidOf(dir, "--rank 0", pid);
  ASSERT_GT(again, 0);
  EXPECT_EQ(CpuGroupOf(again), rel + "/worker-0");  // joined before it exec'd (pgrep matched its argv)

  // Stopped (SIGTERM to the launcher): no process and no group left.
  ASSERT_EQ(kill(LauncherOf(group), SIGTERM), 0);
  job.join();
  EXPECT_EQ(run.exit_code, 130) << run.stderr_text;
  EXPECT_EQ(ProcessesOf(dir), 0);
  EXPECT_FALSE(Exists(group)) << group << " outlived the job";
}

// A job that fails (a worker dies and no restart is allowed) removes its groups too; a
// launcher killed outright (SIGKILL: no chance to clean up) leaves them, and the next launch
// that sets quotas removes them.
TEST(CpuQuota, FailedAndKilledJobsLeaveNoGroups) {
  std::string failed_dir = FreshDir("cpu_quota_failed");
  JobRun failed;
  std::thread failing(
      [&] { failed = RunJob(failed_dir, QuotaJob(failed_dir, "[{cpu_quota = 0.3}, {cpu_quota = 0.3}]"), 300); });
  const std::string failed_group = JobGroup(failed_dir);
  ASSERT_FALSE(failed_group.empty()) << ReadFile(failed_dir + "/stderr.txt");
  KillWhenTraining(failed_dir, "--rank 1", 1);
  failing.join();
  EXPECT_EQ(failed.exit_code, 1) << failed.stderr_text;
  EXPECT_NE(failed.stderr_text.find("worker 1"), std::string::npos) << failed.stderr_text;
  EXPECT_FALSE(Exists(failed_group));
  EXPECT_EQ(ProcessesOf(failed_dir), 0);

  std::string killed_dir = FreshDir("cpu_quota_killed");
  std::thread job([&] { RunJob(killed_dir, QuotaJob(killed_dir, "[{cpu_quota = 0.3}]"), 300); });
  const std::string killed_group = JobGroup(killed_dir);
  ASSERT_FALSE(killed_group.empty());
  const int worker = PidOf(killed_dir, "--rank 0");
  ASSERT_GT(worker, 0);
  ASSERT_EQ(kill(LauncherOf(killed_group), SIGKILL), 0);
  job.join();
  for (int i = 0; i < 100 && ProcessesOf(killed_dir) > 0; ++i)  // its workers die with it
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(ProcessesOf(killed_dir), 0);
  EXPECT_TRUE(Exists(killed_group)) << "nothing removed it yet";

  std::string next_dir = FreshDir("cpu_quota_next");
  std::string next = QuotaJob(next_dir, "[{cpu_quota = 0.5}]");
  next.replace(next.find("epochs = 200"), 12, "epochs = 1");
  next.replace(next.find("max_train_samples = 4096"), 24, "max_train_samples = 256");
  JobRun r = RunJob(next_dir, next, 300);
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_FALSE(Exists(killed_group)) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("removed " + killed_group + ", left by a launcher that was killed"), std::string::npos)
      << r.stderr_text;
  EXPECT_FALSE(Exists(JobGroup(next_dir)));
}

}  // namespace
}  // namespace testing
}  // namespace shoal
