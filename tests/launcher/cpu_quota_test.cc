// FindCpuHierarchy reads /proc/mounts' format: cgroup v2 where its cgroup.controllers lists
// cpu, else cgroup v1's cpu controller (alone or co-mounted), never cpuacct or cpuset alone.
// A process reads its own limit (OwnCpuQuota) from its group and their ancestors' files, and a
// process in a group `shoal run` made reads the quota the group was given.
// (tests/training/cpu_quota_test runs real jobs in real groups.)
#include "tools/launcher/cpu_quota.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace shoal {
namespace {

const char* kV1 =
    "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n"
    "cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0\n"
    "cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n"
    "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n";

TEST(CpuHierarchy, FindsV1CpuController) {
  CpuHierarchy h = FindCpuHierarchy(kV1);
  EXPECT_EQ(h.version, 1);
  EXPECT_EQ(h.path, "/sys/fs/cgroup/cpu");
  h = FindCpuHierarchy("cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n");
  EXPECT_EQ(h.version, 1);
  EXPECT_EQ(h.path, "/sys/fs/cgroup/cpu,cpuacct");
}

TEST(CpuHierarchy, NoCpuControllerIsVersionZero) {
  EXPECT_EQ(FindCpuHierarchy("").version, 0);
  EXPECT_EQ(FindCpuHierarchy("cgroup /sys/fs/cgroup/cpuacct cgroup rw,cpuacct 0 0\ngarbage\n").version, 0);
}

// A cgroup2 mount counts only when its cgroup.controllers lists cpu (this machine's
// /sys/fs/cgroup/unified lists none: cpu is bound to v1 there).
TEST(CpuHierarchy, PrefersV2WhenItHasCpu) {
  std::string dir = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/unified";
  mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/cgroup.controllers") << "cpuset io memory pids\n";
  const std::string v2 = "cgroup2 " + dir + " cgroup2 rw,relatime 0 0\n";
  EXPECT_EQ(FindCpuHierarchy(v2 + kV1).version, 1);
  std::ofstream(dir + "/cgroup.controllers") << "cpuset cpu io memory pids\n";
  CpuHierarchy h = FindCpuHierarchy(std::string(kV1) + v2);
  EXPECT_EQ(h.version, 2);
  EXPECT_EQ(h.path, dir);
}

TEST(OwnCgroup, ReadsTheCpuLineOfProcSelfCgroup) {
  const std::string v1 = "9:name=systemd:/\n4:memory:/job/7\n2:cpu,cpuacct:/slurm/uid_0/job_12\n0::/\n";
  EXPECT_EQ(OwnCgroupPath(v1, 1), "/slurm/uid_0/job_12");
  EXPECT_EQ(OwnCgroupPath(v1, 2), "/");
  EXPECT_EQ(OwnCgroupPath("0::/kubepods/pod1/c2\n", 2), "/kubepods/pod1/c2");
  EXPECT_EQ(OwnCgroupPath("0::/kubepods/pod1/c2\n", 1), "");
  EXPECT_EQ(OwnCgroupPath("3:cpuacct:/x\n5:cpuset:/y\ngarbage\n", 1), "");
  EXPECT_EQ(OwnCgroupPath("", 2), "");
}

std::string Dir(const std::string& path) {
  std::string dir = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + path;
  for (size_t i = 1; i <= dir.size(); ++i)
    if (i == dir.size() || dir[i] == '/') mkdir(dir.substr(0, i).c_str(), 0755);
  return dir;
}

// The files' own formats: v2 cpu.max "QUOTA PERIOD" or "max PERIOD"; v1 the quota (-1: none) and period in
// microseconds. Anything else reads as no limit, never as a wrong one.
TEST(OwnCgroup, ReadsEachVersionsLimitFiles) {
  const std::string v2 = Dir("/limits/v2"), v1 = Dir("/limits/v1");
  std::ofstream(v2 + "/cpu.max") << "45000 100000\n";
  EXPECT_DOUBLE_EQ(CgroupCpuLimit(v2, 2), 0.45);
  std::ofstream(v2 + "/cpu.max") << "max 100000\n";
  EXPECT_EQ(CgroupCpuLimit(v2, 2), 0);
  std::ofstream(v2 + "/cpu.max") << "45000x 100000\n";
  EXPECT_EQ(CgroupCpuLimit(v2, 2), 0);
  std::ofstream(v1 + "/cpu.cfs_quota_us") << "150000\n";
  std::ofstream(v1 + "/cpu.cfs_period_us") << "100000\n";
  EXPECT_DOUBLE_EQ(CgroupCpuLimit(v1, 1), 1.5);
  std::ofstream(v1 + "/cpu.cfs_quota_us") << "-1\n";
  EXPECT_EQ(CgroupCpuLimit(v1, 1), 0);
  EXPECT_EQ(CgroupCpuLimit(Dir("/limits/empty"), 1), 0);
  EXPECT_EQ(CgroupCpuLimit(v2, 1), 0);  // a v2 group's files are not v1's
}

// A parent's limit binds its children: the tightest on the way up counts, wherever it is set.
TEST(OwnCgroup, TheTightestAncestorCounts) {
  const std::string root = Dir("/tree");
  Dir("/tree/job/step/task");
  std::ofstream(root + "/job/cpu.max") << "30000 100000\n";
  std::ofstream(root + "/job/step/task/cpu.max") << "80000 100000\n";
  EXPECT_DOUBLE_EQ(TightestCpuLimit({root, 2}, "/job/step/task"), 0.3);
  std::ofstream(root + "/job/step/cpu.max") << "20000 100000\n";
  EXPECT_DOUBLE_EQ(TightestCpuLimit({root, 2}, "/job/step/task"), 0.2);
  std::ofstream(root + "/job/step/task/cpu.max") << "10000 100000\n";
  EXPECT_DOUBLE_EQ(TightestCpuLimit({root, 2}, "/job/step/task/"), 0.1);
  EXPECT_EQ(TightestCpuLimit({root, 2}, "/"), 0);
  EXPECT_EQ(TightestCpuLimit({root, 2}, ""), 0);
  EXPECT_EQ(TightestCpuLimit({root, 0}, "/job"), 0);
}

// A real group (this machine's cpu controller, as root): a child that joins a worker's group reads the quota it
// was given (the groups hang from the hierarchy's root, so no limit the test runs under binds them).
TEST(OwnCgroup, AProcessInAQuotaGroupReadsItsQuota) {
  CpuQuotaGroups groups({0.3});
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    FILE* f = fopen(groups.ProcsFile(0).c_str(), "w");
    const bool joined = f && fputs("0", f) >= 0 && fclose(f) == 0;
    const double q = joined ? OwnCpuQuota() : -1;
    ssize_t n = write(fds[1], &q, sizeof q);
    _exit(n == sizeof q ? 0 : 1);
  }
  double q = -2;
  close(fds[1]);
  ASSERT_EQ(read(fds[0], &q, sizeof q), ssize_t(sizeof q));
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_NE(q, -1) << "the child could not join " << groups.ProcsFile(0);
  EXPECT_DOUBLE_EQ(q, 0.3);
}

}  // namespace
}  // namespace shoal
