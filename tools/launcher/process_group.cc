#include "tools/launcher/process_group.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <fstream>
#include <thread>

#include "common/error.h"

namespace shoal {

Child& ProcessGroup::Start(const std::string& name, const std::vector<std::string>& argv, const std::string& log_path,
                           bool append, const std::string& cgroup_procs) {
  int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd < 0) throw Error(log_path + ": cannot create log file: " + strerror(errno));
  if (access(argv[0].c_str(), X_OK) != 0) {
    close(fd);
    throw Error(argv[0] + ": cannot execute: " + strerror(errno));
  }
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    throw Error(std::string("fork failed: ") + strerror(errno));
  }
  if (pid == 0) {
    // Own process group: a terminal's Ctrl-C reaches only the launcher, which stops all.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGPIPE, SIG_DFL);             // the launcher ignores it; an ignored signal stays so across exec
    if (getppid() != parent) _exit(127);  // the launcher died before prctl took effect
    dup2(fd, 1);
    dup2(fd, 2);
    if (!cgroup_procs.empty()) {
      // "0": the writing process itself (async-signal-safe: no formatting after fork).
      int g = open(cgroup_procs.c_str(), O_WRONLY | O_CLOEXEC);
      if (g < 0 || write(g, "0", 1) != 1) {
        dprintf(2, "shoal: cannot join the cgroup of %s: %s\n", cgroup_procs.c_str(), strerror(errno));
        _exit(2);
      }
      close(g);
    }
    execv(args[0], args.data());
    dprintf(2, "exec %s failed: %s\n", args[0], strerror(errno));
    _exit(127);
  }
  close(fd);
  children_.push_back(Child{name, log_path, pid, true, 0, 0});
  return children_.back();
}

std::vector<Child*> ProcessGroup::Reap() {
  std::vector<Child*> ended;
  for (auto& c : children_) {
    if (!c.running) continue;
    int status = 0;
    pid_t r = waitpid(c.pid, &status, WNOHANG);
    if (r == c.pid) {
      c.running = false;
      if (WIFEXITED(status)) c.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) {
        c.term_signal = WTERMSIG(status);
        c.exit_code = 128 + c.term_signal;
      }
      ended.push_back(&c);
    }
  }
  return ended;
}

void ProcessGroup::ForgetEnded() {
  std::vector<Child> running;
  for (auto& c : children_)
    if (c.running) running.push_back(c);
  children_ = std::move(running);
}

void ProcessGroup::StopAll(int grace_ms) {
  for (auto& c : children_)
    if (c.running) kill(c.pid, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    Reap();
    bool any = false;
    for (auto& c : children_) any = any || c.running;
    if (!any) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  KillAll();
}

void ProcessGroup::KillAll() {
  for (auto& c : children_) {
    if (!c.running) continue;
    kill(c.pid, SIGKILL);
    int status;
    waitpid(c.pid, &status, 0);
    c.running = false;
    c.term_signal = SIGKILL;
    c.exit_code = 128 + SIGKILL;
  }
}

std::string DescribeExit(const Child& c) {
  if (c.term_signal) return std::string("killed by signal ") + strsignal(c.term_signal);
  return "exit code " + std::to_string(c.exit_code);
}

std::string TailLines(const std::string& path, int n) {
  std::ifstream in(path);
  std::deque<std::string> lines;
  std::string l;
  while (std::getline(in, l)) {
    lines.push_back(l);
    if (int(lines.size()) > n) lines.pop_front();
  }
  std::string out;
  for (auto& x : lines) out += "    " + x + "\n";
  return out;
}

}  // namespace shoal
