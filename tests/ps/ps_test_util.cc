#include "tests/ps/ps_test_util.h"

#include <arpa/inet.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <fstream>
#include <mutex>
#include <netinet/in.h>
#include <set>
#include <sstream>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace shoal::testing {

// The kernel may hand the same ephemeral port to two binds in a row once the first socket is
// closed, so a job asking for two ports could list one address twice: ports this process
// already handed out are skipped.
int FreePort() {
  static std::mutex mu;
  static std::set<int> given;
  std::lock_guard<std::mutex> lock(mu);
  for (int attempt = 0;; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    close(fd);
    const int port = ntohs(a.sin_port);
    if (given.insert(port).second || attempt >= 100) return port;
  }
}

std::string TempPath(const std::string& name) {
  const char* d = getenv("TEST_TMPDIR");
  return std::string(d ? d : "/tmp") + "/" + name;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string WriteJob(const std::string& name, int servers, int workers, const std::string& extra, int hb,
                     int hb_timeout) {
  std::string list;
  for (int i = 0; i < servers; ++i)
    list += std::string(i ? ", " : "") + "\"127.0.0.1:" + std::to_string(FreePort()) + "\"";
  std::string text =
      "[job]\nname = \"" + name + "\"\noutput_dir = \"" + TempPath(name) + "\"\n\n[cluster]\nservers = [" + list +
      "]\nworkers = " + std::to_string(workers) + "\nheartbeat_ms = " + std::to_string(hb) +
      "\nheartbeat_timeout_ms = " + std::to_string(hb_timeout) + "\n\n[data]\nformat = \"synthetic\"\n\n" + extra;
  std::string path = TempPath(name + ".toml");
  WriteFile(path, text);
  return path;
}

std::string ServerBinary() {
  const char* src = getenv("TEST_SRCDIR");
  if (src) return std::string(src) + "/shoal/server/shoal-server";
  return "server/shoal-server";
}

ServerProcess::ServerProcess(const std::string& job, int shard, const std::vector<std::string>& extra) {
  static int counter = 0;
  log_path_ = TempPath("server-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ".log");
  std::string bin = ServerBinary();
  std::vector<std::string> args = {bin, "--config", job, "--shard", std::to_string(shard)};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(bin.c_str(), argv.data());
    perror("exec shoal-server");
    _exit(127);
  }
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && WaitExit(0) == -1) {
    kill(pid_, SIGTERM);
    WaitChild(pid_, 3000);  // kills it if SIGTERM was not enough
  }
}

bool ServerProcess::alive() const { return pid_ > 0 && kill(pid_, 0) == 0; }

int ServerProcess::WaitExit(int timeout_ms) {
  if (pid_ <= 0) return -1;
  int code = WaitChild(pid_, timeout_ms);
  if (code != -1 || timeout_ms > 0) pid_ = -1;
  return code;
}

bool ServerProcess::WaitForLog(const std::string& text, int timeout_ms) const {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  do {
    if (log().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < deadline);
  return false;
}

pid_t ForkChild(const std::function<bool()>& fn) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    bool ok = false;
    try {
      ok = fn();
    } catch (const std::exception& e) {
      fprintf(stderr, "child %d: %s\n", getpid(), e.what());
    }
    fflush(stdout);
    fflush(stderr);
    _exit(ok ? 0 : 1);
  }
  return pid;
}

int WaitChild(pid_t pid, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r < 0) return -2;
    if (std::chrono::steady_clock::now() >= deadline) {
      if (timeout_ms > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace shoal::testing
