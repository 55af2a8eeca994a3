// Child processes of one job: started with their output in a log file, killed with the
// launcher (PR_SET_PDEATHSIG), so no process outlives the job.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

namespace shoal {

struct Child {
  std::string name;  // "server 0", "worker 3"
  std::string log_path;
  pid_t pid = -1;
  bool running = false;
  int exit_code = 0;    // valid when !running
  int term_signal = 0;  // signal that ended it, 0 if it exited
};

class ProcessGroup {
 public:
  ~ProcessGroup() { KillAll(); }
  // Starts argv[0] with args; stdout and stderr go to log_path (appended to with `append`:
  // a restarted job keeps the log of the attempt before). With `cgroup_procs` (a cgroup's
  // cgroup.procs file) the child joins that group before it execs, so it never runs outside
  // it; a child that cannot join says why in its log and exits 2. Throws shoal::Error.
  Child& Start(const std::string& name, const std::vector<std::string>& argv, const std::string& log_path,
               bool append = false, const std::string& cgroup_procs = "");
  // Reaps exited children; returns those that ended since the last call.
  std::vector<Child*> Reap();
  // SIGTERM, wait up to grace_ms, then SIGKILL whatever is left.
  void StopAll(int grace_ms = 3000);
  void KillAll();
  // Forgets children that have ended (before the job's processes start again).
  void ForgetEnded();
  std::vector<Child>& children() { return children_; }

 private:
  std::vector<Child> children_;
};

// "exit code 1" / "killed by SIGKILL".
std::string DescribeExit(const Child& c);
// The last n lines of a file ("" if unreadable).
std::string TailLines(const std::string& path, int n);

}  // namespace shoal
