// NCCL communicator: without a GPU it says so (and a job asking for it with CPU workers
// gets a clear error); with GPUs, exact sums and identical fp16 means across processes,
// one GPU per rank (skipped, saying why, where there are fewer than two).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "algorithms/collectives/factory.h"
#include "algorithms/collectives/nccl_comm.h"
#include "common/config.h"
#include "common/error.h"
#include "tests/collectives/run_ranks.h"
#include "common/cuda/platform.h"

namespace shoal {
namespace {

// CUDA must not be initialised in a process that forks ranks: count devices in a child.
int DevicesSeenByAChild() {
  pid_t p = fork();
  if (p == 0) _exit(std::min(CudaDeviceCount(nullptr), 100));
  int st = 0;
  waitpid(p, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 0;
}

std::string Dir(const std::string& name) {
  return ::testing::TempDir() + "/nccl_" + name + "_" + std::to_string(getpid());
}

TEST(Nccl, WithoutADeviceTheErrorSaysSo) {
  if (DevicesSeenByAChild() > 0) GTEST_SKIP() << "a CUDA device is present: the no-device path cannot be shown here";
  FileStore store(Dir("nodev"));
  try {
    NcclComm c(0, 1, store);
    FAIL() << "constructed an NCCL communicator without a GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}

TEST(Nccl, AJobOfCpuWorkersCannotAskForIt) {
  JobConfig cfg = ParseJobConfig("[job]\nname = \"n\"\noutput_dir = \"" + Dir("job") +
                                     "\"\n[cluster]\nworkers = [{device = \"cpu\"}, {device = \"cpu\"}]\n"
                                     "[data]\nformat = \"synthetic\"\ntrain = \"\"\ntest = \"\"\n"
                                     "[algorithm]\nname = \"allreduce\"\ncollective = \"nccl\"\n",
                                 "job.toml");
  FileStore store(Dir("job-store"));
  try {
    MakeWorkerCommunicator(cfg, 0, store, "allreduce");
    FAIL() << "nccl accepted CPU workers";
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("collective"), std::string::npos) << w;
    EXPECT_NE(w.find("worker 0 is on the CPU"), std::string::npos) << w;
  }
}

// NCCL cannot encrypt: a job with keys must choose the ring or accept plaintext, and the
// error says so before any device is touched.
TEST(Nccl, AJobWithKeysIsToldNcclTrafficIsNotCovered) {
  std::string keys = "[security]\nserver_public_key = \"" + std::string(40, 'a') + "\"\nserver_secret_key = \"" +
                     std::string(40, 'b') + "\"\nclient_public_key = \"" + std::string(40, 'c') +
                     "\"\nclient_secret_key = \"" + std::string(40, 'd') + "\"\n";
  for (const char* collective : {"nccl", "hierarchical"}) {
    JobConfig cfg = ParseJobConfig("[job]\nname = \"k\"\noutput_dir = \"" + Dir("keys") +
                                       "\"\n[cluster]\nworkers = [{device = \"cuda:0\"}, {device = \"cuda:1\"}]\n"
                                       "[data]\nformat = \"synthetic\"\n[algorithm]\nname = \"allreduce\"\n"
                                       "collective = \"" +
                                       std::string(collective) + "\"\n" + keys,
                                   "job.toml");
    FileStore store(Dir(std::string("keys-store-") + collective));
    try {
      MakeWorkerCommunicator(cfg, 0, store, "allreduce");
      FAIL() << collective << " was built for a job with keys";
    } catch (const Error& e) {
      std::string w = e.what();
      EXPECT_NE(w.find("NCCL's traffic is not encrypted"), std::string::npos) << w;
      EXPECT_NE(w.find("allow_plaintext = true"), std::string::npos) << w;
    }
  }
}

// An all-GPU hierarchical job takes NCCL inside the host: without a GPU that says so.
TEST(Nccl, HierarchicalOnGpuWorkersUsesNcclInsideTheHost) {
  if (DevicesSeenByAChild() > 0) GTEST_SKIP() << "a CUDA device is present: the no-device path cannot be shown here";
  JobConfig cfg = ParseJobConfig("[job]\nname = \"h\"\noutput_dir = \"" + Dir("hier") +
                                     "\"\n[cluster]\n"
                                     "workers = [{device = \"cuda:0\"}]\n"
                                     "[data]\nformat = \"synthetic\"\ntrain = \"\"\ntest = \"\"\n"
                                     "[algorithm]\nname = \"allreduce\"\ncollective = \"hierarchical\"\n",
                                 "job.toml");
  FileStore store(Dir("hier-store"));
  try {
    MakeWorkerCommunicator(cfg, 0, store, "allreduce");
    FAIL() << "built a GPU communicator without a GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nccl: no CUDA device"), std::string::npos) << e.what();
  }
}

TEST(Nccl, OneRankPerGpuSumsExactlyAndHalfMeansAgree) {
  int devices = DevicesSeenByAChild();
  if (devices < 1) GTEST_SKIP() << "no CUDA device on this machine";
  const int size = std::min(devices, 4);
  std::string dir = Dir("sum");
  auto codes = RunRanks(size, [&](int rank) {
    FileStore store(dir);
    NcclOptions o;
    o.device = rank;
    o.timeout_ms = 60000;
    NcclComm comm(rank, size, store, o);
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(4099), int64_t(1) << 20}) {
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float((rank * 7 + i * 3) % 23) - 11.0f;
      comm.AllReduce(v.data(), n, ReduceOp::kSum);
      for (int64_t i = 0; i < n; ++i) {
        float want = 0;
        for (int r = 0; r < size; ++r) want += float((r * 7 + i * 3) % 23) - 11.0f;
        if (v[size_t(i)] != want) return 1;
      }
    }
    std::vector<float> h(5001);
    for (size_t i = 0; i < h.size(); ++i) h[i] = 0.37f * float(i % 13) + 0.01f * float(rank);
    comm.AllReduce(h.data(), int64_t(h.size()), ReduceOp::kMean, DType::kF16);
    std::vector<float> all(h.size() * size_t(size));
    comm.AllGather(h.data(), int64_t(h.size() * 4), all.data());
    for (int r = 1; r < size; ++r)
      if (memcmp(all.data(), all.data() + h.size() * size_t(r), h.size() * 4) != 0) return 2;
    for (size_t i = 0; i < h.size(); ++i) {
      double want = 0.37 * double(i % 13) + 0.01 * (size - 1) / 2.0;
      if (std::abs(h[i] - want) > 0.01 + 2e-3 * std::abs(want)) return 3;
    }
    std::vector<int32_t> b(333, rank == 0 ? 77 : -1);
    comm.Broadcast(b.data(), int64_t(b.size() * 4), 0);
    for (int32_t x : b)
      if (x != 77) return 4;
    return 0;
  });
  for (int r = 0; r < size; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace shoal
