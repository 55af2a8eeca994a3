#include "common/cpu_cgroup.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace shoal {
namespace {

bool HasWord(const std::string& text, const std::string& word, char sep) {
  std::istringstream in(text);
  std::string w;
  while (std::getline(in, w, sep))
    if (w == word || w == word + "\n") return true;
  return false;
}

// A whole number from a cgroup file's text (its trailing newline allowed); false for anything else.
bool ReadInteger(const std::string& text, long long* v) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  *v = std::strtoll(text.c_str(), &end, 10);
  return errno == 0 && end != text.c_str() && (*end == '\0' || (*end == '\n' && end[1] == '\0'));
}

}  // namespace

std::string ReadKernelText(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

CpuHierarchy FindCpuHierarchy(const std::string& mounts_text) {
  CpuHierarchy v1;
  std::istringstream in(mounts_text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string dev, path, type, opts;
    if (!(f >> dev >> path >> type >> opts)) continue;
    if (type == "cgroup2" && HasWord(ReadKernelText(path + "/cgroup.controllers"), "cpu", ' ')) return {path, 2};
    if (type == "cgroup" && v1.version == 0 && HasWord(opts, "cpu", ',')) v1 = {path, 1};
  }
  return v1;
}

std::string OwnCgroupPath(const std::string& proc_cgroup_text, int version) {
  std::istringstream in(proc_cgroup_text);
  std::string line;
  while (std::getline(in, line)) {  // "ID:CONTROLLERS:PATH"
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    const bool match = version == 2 ? id == "0" && controllers.empty() : HasWord(controllers, "cpu", ',');
    if (match) return line.substr(b + 1);
  }
  return "";
}

double CgroupCpuLimit(const std::string& dir, int version) {
  long long quota = 0, period = 0;
  if (version == 2) {
    std::istringstream f(ReadKernelText(dir + "/cpu.max"));  // "QUOTA PERIOD" or "max PERIOD"
    std::string q, p;
    if (!(f >> q >> p) || !ReadInteger(q, &quota) || !ReadInteger(p, &period)) return 0;
  } else if (version == 1) {
    if (!ReadInteger(ReadKernelText(dir + "/cpu.cfs_quota_us"), &quota) ||
        !ReadInteger(ReadKernelText(dir + "/cpu.cfs_period_us"), &period))
      return 0;
  }
  return quota > 0 && period > 0 ? double(quota) / double(period) : 0;
}

double TightestCpuLimit(const CpuHierarchy& h, std::string group) {
  if (h.version == 0 || group.empty() || group[0] != '/') return 0;
  // A parent's limit binds its children too: the tightest on the way up to the mount's root.
  double tightest = 0;
  while (true) {
    const double limit = CgroupCpuLimit(h.path + group, h.version);
    if (limit > 0 && (tightest == 0 || limit < tightest)) tightest = limit;
    if (group == "/") return tightest;
    const size_t slash = group.rfind('/');
    group = slash == 0 ? "/" : group.substr(0, slash);
  }
}

double OwnCpuQuota() {
  const CpuHierarchy h = FindCpuHierarchy(ReadKernelText("/proc/mounts"));
  return TightestCpuLimit(h, OwnCgroupPath(ReadKernelText("/proc/self/cgroup"), h.version));
}

int AllowedCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace shoal
