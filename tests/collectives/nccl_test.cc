// NCCL communicator: without a GPU it says so (and a job asking for it with CPU workers
// gets a clear error); with GPUs, exact sums and identical fp16 means across processes,
// one GPU per rank (skipped, saying why, where there are fewer than two).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "algorithms/collectives/factory.h"
#include "algorithms/collectives/nccl_comm.h"
#include "algorithms/collectives/wire_cast_kernel.h"
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

// A peer that dies after init: the survivor's host-buffer collective fails within its
// timeout, naming the call, and never hangs (its download once sat before the bounded wait:
// a device-to-pageable copy returns only when the collective ahead of it ends, i.e. never).
TEST(Nccl, APeerThatDiesMakesTheOtherFailNotHang) {
  if (DevicesSeenByAChild() < 2) GTEST_SKIP() << "needs two CUDA devices (one per rank)";
  std::string dir = Dir("dead");
  auto codes = RunRanks(
      2,
      [&](int rank) {
        FileStore store(dir);
        NcclOptions o;
        o.device = rank;
        o.timeout_ms = 5000;
        NcclComm comm(rank, 2, store, o);
        if (rank == 1) _exit(0);  // gone, without a word to the peer
        std::vector<float> v(4096, 1.f);
        try {
          comm.AllReduce(v.data(), int64_t(v.size()), ReduceOp::kSum);
          return 1;
        } catch (const Error& e) {
          return std::string(e.what()).find("all-reduce") != std::string::npos ? 0 : 2;
        }
      },
      40);
  EXPECT_EQ(codes[0], 0) << "1: the all-reduce returned without its peer, 2: the error does not name the call, "
                            "137: it hung until RunRanks killed it";
}

// Values that take every branch of the fp16/bf16 rounding: ties either way, subnormals of
// both formats, overflow to inf, inf, nan, signed zero, and a spread of ordinary numbers.
std::vector<float> WireProbe() {
  std::vector<float> v = {0.f, -0.f, 1.f, -1.f, 65504.f, 65520.f, 1e6f, -1e6f, 6e-8f, 3e-8f, 2.9e-8f, 1e-40f, -1e-45f,
                          1.0009765625f, 1.00146484375f, 1.00390625f, 1.01171875f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), 3.3895314e38f};
  uint32_t x = 0x12345u;
  for (int i = 0; i < 20000; ++i) {
    x = x * 1664525u + 1013904223u;
    float f;
    std::memcpy(&f, &x, 4);
    v.push_back(f);
  }
  return v;
}

// The device casts give EncodeFloats' bits, and decoding every 16-bit pattern gives
// DecodeFloats' floats (in a child: CUDA must not start in the process that forks ranks).
TEST(Nccl, DeviceWireCastsMatchTheHostBitForBit) {
  if (DevicesSeenByAChild() < 1) GTEST_SKIP() << "no CUDA device on this machine";
  auto codes = RunRanks(1, [](int) {
    std::vector<float> v = WireProbe();
    std::vector<uint16_t> all(65536);
    for (size_t i = 0; i < all.size(); ++i) all[i] = uint16_t(i);
    for (DType t : {DType::kF16, DType::kBF16}) {
      std::vector<uint16_t> want(v.size()), got(v.size());
      EncodeFloats(v.data(), v.size(), t, want.data());
      float* dv = nullptr;
      void* dw = nullptr;
      CheckCuda(cudaMalloc(reinterpret_cast<void**>(&dv), 65536 * 4), "malloc");
      CheckCuda(cudaMalloc(&dw, v.size() * 2), "malloc");
      CheckCuda(cudaMemcpy(dv, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "upload");
      CheckCuda(WireEncodeDevice(dv, int64_t(v.size()), int(t), dw, nullptr), "encode");
      CheckCuda(cudaMemcpy(got.data(), dw, v.size() * 2, cudaMemcpyDeviceToHost), "download");
      if (memcmp(want.data(), got.data(), v.size() * 2) != 0) return 1;
      std::vector<float> fwant(all.size()), fgot(all.size());
      DecodeFloats(all.data(), all.size(), t, fwant.data());
      CheckCuda(cudaFree(dw), "free");
      CheckCuda(cudaMalloc(&dw, all.size() * 2), "malloc");
      CheckCuda(cudaMemcpy(dw, all.data(), all.size() * 2, cudaMemcpyHostToDevice), "upload");
      CheckCuda(WireDecodeDevice(dw, int64_t(all.size()), int(t), dv, nullptr), "decode");
      CheckCuda(cudaMemcpy(fgot.data(), dv, all.size() * 4, cudaMemcpyDeviceToHost), "download");
      if (memcmp(fwant.data(), fgot.data(), all.size() * 4) != 0) return 2;
      cudaFree(dv);
      cudaFree(dw);
    }
    return 0;
  });
  EXPECT_EQ(codes[0], 0) << "1: an encoding differs from EncodeFloats, 2: a decoding from DecodeFloats";
}

// A pageable-host-to-device cudaMemcpy may return before its DMA lands (CUDA's "API
// synchronization behavior"), and NcclComm's stream is non-blocking, so it is not ordered
// after the default stream: the communicator's contract asks the caller to finish the
// writes first.
void Upload(float* d, const float* h, size_t bytes) {
  CheckCuda(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "upload");
  CheckCuda(cudaDeviceSynchronize(), "upload");
}

// One rank, buffers in device memory: all-reduce (fp32, fp16, bf16 wire), broadcast and
// all-gather work on them in place and give the bits the host path gives.
TEST(Nccl, DeviceBuffersAreReducedInPlaceWithTheHostPathsBits) {
  if (DevicesSeenByAChild() < 1) GTEST_SKIP() << "no CUDA device on this machine";
  std::string dir = Dir("dev");
  auto codes = RunRanks(1, [&](int) {
    FileStore store(dir);
    NcclComm comm(0, 1, store);
    if (!comm.HandlesDeviceBuffers()) return 1;
    std::vector<float> v = WireProbe();
    const size_t n = v.size();
    float* d = nullptr;
    CheckCuda(cudaMalloc(reinterpret_cast<void**>(&d), n * 4), "malloc");
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
        std::vector<float> host = v, dev(n);
        comm.AllReduce(host.data(), int64_t(n), op, t);
        Upload(d, v.data(), n * 4);
        comm.AllReduce(d, int64_t(n), op, t);
        CheckCuda(cudaMemcpy(dev.data(), d, n * 4, cudaMemcpyDeviceToHost), "download");
        if (memcmp(host.data(), dev.data(), n * 4) != 0) return 2;
      }
    std::vector<float> back(n);
    Upload(d, v.data(), n * 4);
    comm.Broadcast(d, int64_t(n * 4), 0);
    float* out = nullptr;
    CheckCuda(cudaMalloc(reinterpret_cast<void**>(&out), n * 4), "malloc");
    comm.AllGather(d, int64_t(n * 4), out);
    CheckCuda(cudaMemcpy(back.data(), out, n * 4, cudaMemcpyDeviceToHost), "download");
    if (memcmp(back.data(), v.data(), n * 4) != 0) return 3;
    try {
      comm.AllGather(d, 4, back.data());  // device in, host out: refused, naming both
      return 4;
    } catch (const Error& e) {
      if (std::string(e.what()).find("in is device memory but out is host memory") == std::string::npos) return 5;
    }
    cudaFree(d);
    cudaFree(out);
    return 0;
  });
  EXPECT_EQ(codes[0], 0) << "1: not a device communicator, 2: device and host all-reduce bits differ, "
                            "3: broadcast/all-gather changed the data, 4/5: mixed all-gather not refused clearly";
}

}  // namespace
}  // namespace shoal
