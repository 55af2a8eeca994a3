// Helpers for multi-process tests on loopback: free ports, job files, server processes
// with their stderr captured, forked client processes; every wait is bounded.
#pragma once
#include <chrono>
#include <functional>
#include <string>
#include <sys/types.h>
#include <vector>

namespace shoal::testing {

// A loopback TCP port free at the time of the call, never one this process was given before.
int FreePort();
std::string TempPath(const std::string& name);
void WriteFile(const std::string& path, const std::string& text);
std::string ReadFile(const std::string& path);

// A job file with `servers` fresh loopback ports and `workers` workers; `extra` is
// appended verbatim (e.g. a [security] section).
std::string WriteJob(const std::string& name, int servers, int workers, const std::string& extra = "",
                     int heartbeat_ms = 100, int heartbeat_timeout_ms = 1000);

// shoal-server as a child process; killed when this object goes.
class ServerProcess {
 public:
  // `extra`: more flags after --shard ("--resume", "--rejoin").
  ServerProcess(const std::string& job, int shard, const std::vector<std::string>& extra = {});
  ~ServerProcess();
  // Waits until the log holds `text`; false after timeout.
  bool WaitForLog(const std::string& text, int timeout_ms = 10000) const;
  std::string log() const { return ReadFile(log_path_); }
  bool alive() const;
  pid_t pid() const { return pid_; }
  // Waits for the process to exit; returns its exit code, or -1 on timeout.
  int WaitExit(int timeout_ms);

 private:
  pid_t pid_ = -1;
  std::string log_path_;
};

// Runs fn in a forked child; the child's exit code is 0 if fn returns true.
pid_t ForkChild(const std::function<bool()>& fn);
// Exit code of the child, or -1 if it did not exit in time (it is then killed).
int WaitChild(pid_t pid, int timeout_ms);

std::string ServerBinary();

}  // namespace shoal::testing
