// Per-worker CPU quotas for `shoal run` ([cluster] workers = [{cpu_quota = 0.15}, ...]): each
// worker with a quota runs in its own cgroup with a CFS bandwidth limit, so a worker at 0.15
// of a core behaves like a slower device even while cores sit idle, and the others cannot
// take the time it leaves (a sleeping worker would hand its core to them).
//
// Layout: <hierarchy>/shoal-<launcher pid>/worker-<rank>. The hierarchy is cgroup v2's (cpu.max)
// where a cgroup2 mount offers the cpu controller, else cgroup v1's cpu controller
// (cpu.cfs_quota_us / cpu.cfs_period_us). Both need write access to the hierarchy (root).
#pragma once
#include <string>
#include <vector>

#include "common/cpu_cgroup.h"

namespace shoal {

class CpuQuotaGroups {
 public:
  // The CFS period every group uses; a quota of q cores is q x this per period.
  static constexpr long kPeriodUs = 100000;

  // Makes one group per worker whose quota (in cores) is above 0, after removing the empty
  // groups of launchers that are gone (killed before they could clean up). Throws
  // shoal::Error naming the hierarchy and the reason when no cpu controller is mounted or
  // its files cannot be written. `quotas` all 0: nothing is made or read.
  explicit CpuQuotaGroups(const std::vector<double>& quotas);
  ~CpuQuotaGroups() { Remove(); }
  CpuQuotaGroups(const CpuQuotaGroups&) = delete;
  CpuQuotaGroups& operator=(const CpuQuotaGroups&) = delete;

  // The file a child writes "0" into to join worker `rank`'s group; "" when it has no quota.
  std::string ProcsFile(int rank) const;
  // "cgroup v1 /sys/fs/cgroup/cpu/shoal-123" ("" when no worker has a quota).
  std::string Describe() const;
  // Removes every group. Their processes must have ended; a group still busy after a short
  // bounded wait is left for the next launch's sweep (and reported on stderr).
  void Remove();

 private:
  CpuHierarchy hierarchy_;
  std::string job_dir_;               // <hierarchy>/shoal-<pid>
  std::vector<std::string> workers_;  // per rank: its group's directory, "" without a quota
};

}  // namespace shoal
