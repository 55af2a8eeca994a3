#include "algorithms/collectives/fusion.h"

#include <algorithm>
#include <cstring>

namespace shoal {

void FusedAllReduce::Pack(const std::vector<ParamView>& params) {
  int64_t total = 0;
  for (auto& p : params) total += p.n;
  buf_.resize(size_t(total));
  int64_t off = 0;
  for (auto& p : params) {
    memcpy(buf_.data() + off, p.g, size_t(p.n) * 4);
    off += p.n;
  }
}

void FusedAllReduce::Run(Communicator& comm, DType wire) {
  int64_t total = int64_t(buf_.size());
  for (int64_t b = 0; b < total || (b == 0 && total == 0); b += bucket_elems_) {
    int64_t n = std::min(bucket_elems_, total - b);
    comm.AllReduce(buf_.data() + b, n, ReduceOp::kMean, wire);
    if (total == 0) break;
  }
}

void FusedAllReduce::UnpackInto(const std::vector<ParamView>& params) const {
  int64_t off = 0;
  for (auto& p : params) {
    memcpy(p.g, buf_.data() + off, size_t(p.n) * 4);
    off += p.n;
  }
}

}  // namespace shoal
