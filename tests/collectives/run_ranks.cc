#include "tests/collectives/run_ranks.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

namespace shoal {

std::vector<int> RunRanks(int size, const std::function<int(int)>& body, int timeout_s) {
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    pid_t p = fork();
    if (p == 0) {
      int rc = 99;
      try {
        rc = body(r);
      } catch (const std::exception& e) {
        fprintf(stderr, "rank %d: %s\n", r, e.what());
        rc = 42;
      }
      _exit(rc);
    }
    pids.push_back(p);
  }
  std::vector<int> codes(size, -1);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int left = size;
  while (left > 0) {
    for (int r = 0; r < size; ++r) {
      if (codes[r] != -1) continue;
      int st;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < size; ++r)
        if (codes[r] == -1) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          codes[r] = 255;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return codes;
}

}  // namespace shoal
