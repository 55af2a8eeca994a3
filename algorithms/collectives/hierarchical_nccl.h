// Hierarchical all-reduce for GPU workers (Tencent Jizhi, seed 003): NCCL among the GPUs
// of one host, ZeroMQ rings across hosts. Rows are hosts (rank = row * cols + local):
//   1. NCCL all-reduce inside the host (NVLink / PCIe),
//   2. each local rank j all-reduces its 1/cols slice across hosts on column ring j, so
//      the slow inter-host links carry 1/cols of the data each, in parallel,
//   3. NCCL all-gather of the slices inside the host.
// Every rank ends bit-identical: steps 2 and 3 move the same bytes to everyone.
#pragma once
#include <memory>
#include <vector>

#include "algorithms/collectives/nccl_comm.h"
#include "algorithms/collectives/zmq_ring.h"

namespace shoal {

class HierarchicalNccl : public Communicator {
 public:
  // cols = GPUs per host (must divide size); `device` is this rank's CUDA ordinal.
  HierarchicalNccl(int rank, int size, int cols, int device, Store& store, const RingOptions& base,
                   const std::string& name);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string Name() const override { return "hierarchical(nccl " + std::to_string(cols_) + " per host, ring across)"; }
  void AllReduce(float* data, int64_t n, ReduceOp op, DType wire = DType::kF32) override;
  void AllGather(const void* in, int64_t bytes, void* out) override { all_->AllGather(in, bytes, out); }
  void Broadcast(void* data, int64_t bytes, int root) override { all_->Broadcast(data, bytes, root); }
  void Barrier() override { all_->Barrier(); }
  int64_t bytes_sent() const override {
    return host_->bytes_sent() + (col_ ? col_->bytes_sent() : 0) + all_->bytes_sent();
  }

 private:
  int rank_, size_, cols_;
  std::unique_ptr<NcclComm> host_;
  std::unique_ptr<ZmqRing> col_, all_;
  std::vector<float> slice_, gathered_;
};

}  // namespace shoal
