// FindCpuHierarchy reads /proc/mounts' format: cgroup v2 where its cgroup.controllers lists
// cpu, else cgroup v1's cpu controller (alone or co-mounted), never cpuacct or cpuset alone.
// (tests/training/cpu_quota_test runs real jobs in real groups.)
#include "tools/launcher/cpu_quota.h"

#include <sys/stat.h>

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

}  // namespace
}  // namespace shoal
