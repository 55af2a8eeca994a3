#include "tools/launcher/cpu_quota.h"

#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "common/error.h"

namespace shoal {
namespace {

// Throws naming the file and the system's reason: a quota that was not set must not pass
// for one that was.
void WriteCgroupFile(const std::string& path, const std::string& text) {
  FILE* f = fopen(path.c_str(), "w");
  bool ok = f && fputs(text.c_str(), f) >= 0;
  ok = (f && fclose(f) == 0) && ok;  // cgroup files report a refused value on the flush
  if (!ok)
    throw Error("[cluster] workers cpu_quota: cannot write \"" + text + "\" to " + path + ": " + strerror(errno) +
                " (CPU quotas need write access to the cgroup hierarchy: run as root)");
}

// rmdir, waiting a little while the kernel lets go of processes that just ended.
bool RemoveGroup(const std::string& dir) {
  for (int i = 0; i < 50; ++i) {
    if (rmdir(dir.c_str()) == 0 || errno == ENOENT) return true;
    if (errno != EBUSY) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Removes shoal-<pid> groups whose launcher is gone (it was killed before it could remove
// them; its workers died with it). A live launcher's groups, and any group that still holds a
// process, stay.
void SweepStaleGroups(const std::string& hierarchy) {
  DIR* d = opendir(hierarchy.c_str());
  if (!d) return;
  std::vector<std::string> stale;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind("shoal-", 0) != 0 || name.size() == 6 || name.find_first_not_of("0123456789", 6) != name.npos)
      continue;
    std::string comm = ReadKernelText("/proc/" + name.substr(6) + "/comm");
    if (comm != "shoal-launch\n") stale.push_back(hierarchy + "/" + name);
  }
  closedir(d);
  for (auto& job : stale) {
    if (DIR* j = opendir(job.c_str())) {
      while (dirent* e = readdir(j))
        if (std::string(e->d_name).rfind("worker-", 0) == 0) rmdir((job + "/" + e->d_name).c_str());
      closedir(j);
    }
    if (rmdir(job.c_str()) == 0)
      fprintf(stderr, "shoal: removed %s, left by a launcher that was killed\n", job.c_str());
  }
}

}  // namespace

CpuQuotaGroups::CpuQuotaGroups(const std::vector<double>& quotas) : workers_(quotas.size()) {
  bool any = false;
  for (double q : quotas) any = any || q > 0;
  if (!any) return;
  hierarchy_ = FindCpuHierarchy(ReadKernelText("/proc/mounts"));
  if (hierarchy_.version == 0)
    throw Error(
        "[cluster] workers cpu_quota: this machine mounts no cgroup cpu controller (neither a cgroup2 hierarchy whose "
        "cgroup.controllers lists cpu nor a cgroup v1 cpu hierarchy in /proc/mounts), so quotas cannot be set");
  SweepStaleGroups(hierarchy_.path);
  job_dir_ = hierarchy_.path + "/shoal-" + std::to_string(getpid());
  try {
    if (mkdir(job_dir_.c_str(), 0755) != 0 && errno != EEXIST)
      throw Error("[cluster] workers cpu_quota: cannot make the cgroup " + job_dir_ + ": " + strerror(errno) +
                  " (CPU quotas need write access to the cgroup hierarchy: run as root)");
    if (hierarchy_.version == 2) {
      WriteCgroupFile(hierarchy_.path + "/cgroup.subtree_control", "+cpu");
      WriteCgroupFile(job_dir_ + "/cgroup.subtree_control", "+cpu");
    }
    for (size_t r = 0; r < quotas.size(); ++r) {
      if (!(quotas[r] > 0)) continue;
      std::string dir = job_dir_ + "/worker-" + std::to_string(r);
      if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
        throw Error("[cluster] workers cpu_quota: cannot make the cgroup " + dir + ": " + strerror(errno));
      workers_[r] = dir;
      const long quota_us = long(quotas[r] * kPeriodUs + 0.5);
      if (hierarchy_.version == 2) {
        WriteCgroupFile(dir + "/cpu.max", std::to_string(quota_us) + " " + std::to_string(kPeriodUs));
      } else {
        WriteCgroupFile(dir + "/cpu.cfs_period_us", std::to_string(kPeriodUs));
        WriteCgroupFile(dir + "/cpu.cfs_quota_us", std::to_string(quota_us));
      }
    }
  } catch (...) {
    Remove();
    throw;
  }
}

std::string CpuQuotaGroups::ProcsFile(int rank) const {
  if (rank < 0 || size_t(rank) >= workers_.size() || workers_[size_t(rank)].empty()) return "";
  return workers_[size_t(rank)] + "/cgroup.procs";
}

std::string CpuQuotaGroups::Describe() const {
  if (job_dir_.empty()) return "";
  return "cgroup v" + std::to_string(hierarchy_.version) + " " + job_dir_;
}

void CpuQuotaGroups::Remove() {
  if (job_dir_.empty()) return;
  for (auto& dir : workers_)
    if (!dir.empty() && !RemoveGroup(dir))
      fprintf(stderr, "shoal: could not remove the cgroup %s: %s\n", dir.c_str(), strerror(errno));
  if (!RemoveGroup(job_dir_))
    fprintf(stderr, "shoal: could not remove the cgroup %s: %s\n", job_dir_.c_str(), strerror(errno));
  workers_.assign(workers_.size(), "");
  job_dir_.clear();
}

}  // namespace shoal
