// NCCL among GPU workers: the same Communicator contract as the ZeroMQ ring (host fp32 in,
// every rank identical out), with the reduction done by NCCL on the workers' GPUs over
// NVLink / PCIe / InfiniBand. Buffers in this rank's device memory are reduced in place
// (HandlesDeviceBuffers): no staging and no host copy; an fp16/bf16 wire is cast on the GPU
// with EncodeFloats' rounding, so device and host buffers give the same bits. Rank 0 makes the NCCL unique id and publishes it through the
// job's rendezvous store; the others read it there.
//
// Every wait is bounded: the communicator runs non-blocking, so a rank that dies or never
// joins makes the others abort the communicator and fail with an error naming the call,
// never hang. On a machine without a GPU the constructor throws "no CUDA device: ...".
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "algorithms/collectives/communicator.h"
#include "common/rendezvous/store.h"

namespace shoal {

struct NcclOptions {
  int device = 0;               // CUDA ordinal of this rank's GPU
  std::string prefix = "nccl";  // store key prefix
  int timeout_ms = 120000;      // init and every collective
};

class NcclComm : public Communicator {
 public:
  NcclComm(int rank, int size, Store& store, const NcclOptions& opts = NcclOptions());
  ~NcclComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string Name() const override { return "nccl"; }
  bool HandlesDeviceBuffers() const override { return true; }
  void AllReduce(float* data, int64_t n, ReduceOp op, DType wire = DType::kF32) override;
  void AllGather(const void* in, int64_t bytes, void* out) override;
  void Broadcast(void* data, int64_t bytes, int root) override;
  void Barrier() override;
  int64_t bytes_sent() const override { return bytes_sent_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_, size_;
  int64_t bytes_sent_ = 0;
};

}  // namespace shoal
