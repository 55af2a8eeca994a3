// 2D-torus all-reduce (Sony, seed 000) and hierarchical all-reduce (Tencent Jizhi, seed
// 003) are one algorithm on a rows x cols grid of ranks (rank = row * cols + col):
//   1. reduce-scatter along the row ring (each rank keeps 1/cols of the data, summed
//      over its row),
//   2. all-reduce that chunk along the column ring,
//   3. all-gather along the row ring.
// Each rank sends 2(cols-1)/cols + 2(rows-1)/(rows*cols) of the data, and the long
// column hops carry only 1/cols of it. Hierarchical = rows are hosts, columns are
// the ranks with the same local index on each host: most bytes stay inside a host.
#pragma once
#include <memory>

#include "algorithms/collectives/zmq_ring.h"

namespace shoal {

class Torus2D : public Communicator {
 public:
  // cols must divide size. `name` prefixes the rendezvous keys of the three rings.
  Torus2D(int rank, int size, int cols, Store& store, const RingOptions& base, const std::string& name);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string Name() const override {
    return "torus2d(" + std::to_string(size_ / cols_) + "x" + std::to_string(cols_) + ")";
  }
  void AllReduce(float* data, int64_t n, ReduceOp op, DType wire = DType::kF32) override;
  void AllGather(const void* in, int64_t bytes, void* out) override { all_->AllGather(in, bytes, out); }
  void Broadcast(void* data, int64_t bytes, int root) override { all_->Broadcast(data, bytes, root); }
  void Barrier() override { all_->Barrier(); }
  int64_t bytes_sent() const override { return row_->bytes_sent() + col_->bytes_sent() + all_->bytes_sent(); }

 private:
  int rank_, size_, cols_;
  std::unique_ptr<ZmqRing> row_, col_, all_;
};

}  // namespace shoal
