#include "algorithms/collectives/communicator.h"

#include <algorithm>
#include <vector>

namespace shoal {

void Communicator::AllReduceQuantized(float* data, int64_t n, ReduceOp op, BlockQuant q) {
  const int64_t bytes = QuantizedBytes(q, n);
  const int W = size();
  std::vector<uint8_t> mine(static_cast<size_t>(bytes)), all(static_cast<size_t>(bytes) * size_t(W));
  QuantizeBlocks(q, data, n, mine.data());
  AllGather(mine.data(), bytes, all.data());
  std::fill(data, data + n, 0.f);
  for (int r = 0; r < W; ++r)
    AddDequantized(q, all.data() + size_t(r) * size_t(bytes), bytes, n, data,
                   Name() + " all-reduce: rank " + std::to_string(r) + "'s encoding");
  if (op == ReduceOp::kMean)
    for (int64_t i = 0; i < n; ++i) data[i] /= float(W);
}

}  // namespace shoal
