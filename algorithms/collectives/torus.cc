#include "algorithms/collectives/torus.h"

#include "common/error.h"

namespace shoal {

Torus2D::Torus2D(int rank, int size, int cols, Store& store, const RingOptions& base, const std::string& name)
    : rank_(rank), size_(size), cols_(cols) {
  if (cols < 1 || size % cols != 0)
    throw Error("torus2d: " + std::to_string(cols) + " columns do not divide " + std::to_string(size) + " ranks");
  int row = rank / cols, col = rank % cols;
  RingOptions o = base;
  o.prefix = name + "-row" + std::to_string(row);
  row_ = std::make_unique<ZmqRing>(col, cols, store, o);
  o.prefix = name + "-col" + std::to_string(col);
  col_ = std::make_unique<ZmqRing>(row, size / cols, store, o);
  o.prefix = name + "-all";
  all_ = std::make_unique<ZmqRing>(rank, size, store, o);
}

void Torus2D::AllReduce(float* data, int64_t n, ReduceOp op, DType wire) {
  auto [b, e] = row_->ReduceScatter(data, n, ReduceOp::kSum, wire);
  // Ranks of one column own the same chunk index, so they reduce the same range.
  col_->AllReduce(data + b, e - b, ReduceOp::kSum, wire);
  if (op == ReduceOp::kMean)
    for (int64_t i = b; i < e; ++i) data[i] /= float(size_);
  row_->AllGatherChunks(data, n, wire);
}

}  // namespace shoal
