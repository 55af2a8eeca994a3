#include "algorithms/collectives/hierarchical_nccl.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace shoal {

HierarchicalNccl::HierarchicalNccl(int rank, int size, int cols, int device, Store& store, const RingOptions& base,
                                   const std::string& name)
    : rank_(rank), size_(size), cols_(cols) {
  SHOAL_CHECK(cols >= 1 && size % cols == 0, "hierarchical: " + std::to_string(cols) + " GPUs per host do not divide " +
                                                 std::to_string(size) + " workers");
  const int row = rank / cols, local = rank % cols;
  NcclOptions no;
  no.device = device;
  no.prefix = name + "-host" + std::to_string(row);
  no.timeout_ms = base.timeout_ms;
  host_ = std::make_unique<NcclComm>(local, cols, store, no);
  if (size / cols > 1) {
    RingOptions c = base;
    c.prefix = name + "-col" + std::to_string(local);
    col_ = std::make_unique<ZmqRing>(row, size / cols, store, c);
  }
  RingOptions a = base;
  a.prefix = name + "-all";
  all_ = std::make_unique<ZmqRing>(rank, size, store, a);
}

void HierarchicalNccl::AllReduce(float* data, int64_t n, ReduceOp op, DType wire) {
  if (n <= 0) return;
  host_->AllReduce(data, n, ReduceOp::kSum, wire);
  if (col_) {
    // Equal slices (the last padded) so the host all-gather moves one size from everyone.
    const int64_t per = (n + cols_ - 1) / cols_;
    const int local = rank_ % cols_;
    const int64_t b = std::min(n, per * local), e = std::min(n, b + per);
    slice_.assign(size_t(per), 0.f);
    std::copy(data + b, data + e, slice_.begin());
    col_->AllReduce(slice_.data(), per, ReduceOp::kSum, wire);
    gathered_.resize(size_t(per) * size_t(cols_));
    host_->AllGather(slice_.data(), per * 4, gathered_.data());
    std::copy(gathered_.begin(), gathered_.begin() + n, data);
  }
  if (op == ReduceOp::kMean)
    for (int64_t i = 0; i < n; ++i) data[i] /= float(size_);
}

}  // namespace shoal
