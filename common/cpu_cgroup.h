// The CPU controller's cgroups as a process sees them: where the controller is mounted, and the
// CFS bandwidth limit (a quota of CPU time per period) of this process's group. `shoal run`
// sets such limits itself ([cluster] workers cpu_quota, tools/launcher/cpu_quota.h); a
// container runtime or Slurm may set them from outside, where only reading them tells.
#pragma once
#include <string>

namespace shoal {

// A kernel file's whole text (/proc, /sys); "" where it cannot be read.
std::string ReadKernelText(const std::string& path);

// Where the cpu controller is mounted, from /proc/mounts' text: {path, 2} for a cgroup2 mount
// whose cgroup.controllers file lists cpu, else {path, 1} for a cgroup v1 mount with the cpu
// option; {"", 0} when neither is there.
struct CpuHierarchy {
  std::string path;
  int version = 0;
};
CpuHierarchy FindCpuHierarchy(const std::string& mounts_text);

// This process's group under a hierarchy of `version`, from /proc/self/cgroup's text: the path
// of the "0::" line (v2) or of the v1 line whose controllers list cpu; "" where there is none.
std::string OwnCgroupPath(const std::string& proc_cgroup_text, int version);

// The limit a group directory's own files set, in cores (quota / period): v2's cpu.max
// ("max 100000": none), v1's cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us. 0 where
// there is none or the files cannot be read.
double CgroupCpuLimit(const std::string& dir, int version);

// The tightest limit of `group` (a path from OwnCgroupPath) and its ancestors under `h`, in cores;
// 0 where none of them sets one.
double TightestCpuLimit(const CpuHierarchy& h, std::string group);

// The tightest limit of this process's group and its ancestors, in cores; 0 where none is set
// or no cpu hierarchy can be read (never an error: a process may run with none).
double OwnCpuQuota();

// The cores this process may run on (its CPU affinity, which a cpuset narrows), at least 1.
int AllowedCores();

}  // namespace shoal
