// Tensor fusion: many small gradients packed into buckets of at most bucket_bytes, each
// exchanged with one collective call (per-call latency paid per bucket, not per tensor).
#pragma once
#include <cstdint>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/collectives/communicator.h"

namespace shoal {

class FusedAllReduce {
 public:
  explicit FusedAllReduce(int64_t bucket_bytes) : bucket_elems_(std::max<int64_t>(1, bucket_bytes / 4)) {}
  // Copies every view's gradient into the fusion buffer (which the caller may then hand
  // to another thread), all-reduces it bucket by bucket, and writes the mean back into
  // `out` (the same layout: concatenated tensors).
  void Pack(const std::vector<ParamView>& params);
  void Run(Communicator& comm, DType wire);
  void UnpackInto(const std::vector<ParamView>& params) const;  // into ParamView::g
  std::vector<float>& buffer() { return buf_; }

 private:
  int64_t bucket_elems_;
  std::vector<float> buf_;
};

}  // namespace shoal
