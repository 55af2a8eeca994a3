// Ring all-reduce bandwidth among real processes on loopback: bytes / time of one
// all-reduce (sum, fp32), median of repeats, for each size and process count.
// Prints "procs size_bytes gbps" lines for run.sh to collect.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "algorithms/collectives/zmq_ring.h"

int main(int argc, char** argv) {
  std::vector<int> procs = {2, 4};
  std::vector<int64_t> sizes = {1 << 20, 16 << 20, 64 << 20};
  int reps = argc > 1 ? atoi(argv[1]) : 10;
  for (int np : procs) {
    for (int64_t bytes : sizes) {
      std::string dir =
          "/tmp/shoal_ring_bench_" + std::to_string(getpid()) + "_" + std::to_string(np) + "_" + std::to_string(bytes);
      int fds[2];
      if (pipe(fds) != 0) return 1;
      std::vector<pid_t> pids;
      for (int r = 0; r < np; ++r) {
        pid_t p = fork();
        if (p == 0) {
          close(fds[0]);
          {  // the ring must be destroyed (sends flushed) before _exit
            shoal::FileStore store(dir);
            shoal::ZmqRing ring(r, np, store);
            int64_t n = bytes / 4;
            std::vector<float> v(static_cast<size_t>(n), 1.0f);
            for (int w = 0; w < 2; ++w) ring.AllReduce(v.data(), n, shoal::ReduceOp::kSum);
            std::vector<double> t;
            for (int i = 0; i < reps; ++i) {
              ring.Barrier();
              auto t0 = std::chrono::steady_clock::now();
              ring.AllReduce(v.data(), n, shoal::ReduceOp::kSum);
              t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            }
            // The slowest rank's median defines the collective's time: take max over ranks.
            std::sort(t.begin(), t.end());
            double med = t[t.size() / 2];
            double all[64] = {0};
            ring.AllGather(&med, sizeof med, all);
            if (r == 0) {
              double worst = *std::max_element(all, all + np);
              dprintf(fds[1], "%d %lld %.4f\n", np, (long long)bytes, double(bytes) / worst / 1e9);
            }
          }
          _exit(0);
        }
        pids.push_back(p);
      }
      close(fds[1]);
      char buf[256];
      ssize_t k = read(fds[0], buf, sizeof buf - 1);
      if (k > 0) {
        buf[k] = 0;
        fputs(buf, stdout);
        fflush(stdout);
      }
      close(fds[0]);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      std::string rm = "rm -rf " + dir;
      if (system(rm.c_str()) != 0) {
      }
    }
  }
  return 0;
}
