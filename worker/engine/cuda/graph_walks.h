// How cuda_graph_ops.cc turns shapes and views into the walks graph_kernels.cu follows, and
// the index table of IndexSelect's backward: plain host C++ without CUDA calls, so
// graph_walks_test checks it on machines without a device.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "worker/engine/backend.h"
#include "worker/engine/cuda/graph_kernels.h"

namespace shoal {
namespace cudawalk {

inline std::string Dims(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

// Drops size-1 dimensions and merges neighbours that every operand walks contiguously, so
// elementwise ops on same-shape tensors become one flat loop; the row-major order of the
// walk, which the kernels' contiguous output follows, is unchanged.
inline cudak::Walk Simplify(const cudak::Walk& w, int ops) {
  cudak::Walk r;
  for (int k = 0; k < ops; ++k) r.offset[k] = w.offset[k];
  for (int d = 0; d < w.ndim; ++d) {
    if (w.shape[d] == 1) continue;
    bool merge = r.ndim > 0;
    for (int k = 0; k < ops && merge; ++k) merge = r.stride[k][r.ndim - 1] == w.stride[k][d] * w.shape[d];
    if (merge) {
      r.shape[r.ndim - 1] *= w.shape[d];
      for (int k = 0; k < ops; ++k) r.stride[k][r.ndim - 1] = w.stride[k][d];
    } else {
      r.shape[r.ndim] = w.shape[d];
      for (int k = 0; k < ops; ++k) r.stride[k][r.ndim] = w.stride[k][d];
      ++r.ndim;
    }
  }
  return r;
}

// A walk over `out` with no operands set yet.
inline cudak::Walk OutputWalk(const Shape& out, const std::string& where) {
  SHOAL_CHECK(out.size() <= kMaxTensorDims,
              where + ": output " + Dims(out) + " has more than " + std::to_string(kMaxTensorDims) + " dimensions");
  cudak::Walk w;
  w.ndim = int(out.size());
  for (size_t d = 0; d < out.size(); ++d) w.shape[d] = out[d];
  return w;
}

// Operand k of w reads `in` broadcast to `out` (aligned right): stride 0 where `in` has size
// 1 or lacks the dimension. Throws when the shapes do not broadcast.
inline void Broadcast(const Shape& in, const Shape& out, cudak::Walk& w, int k, const std::string& where,
                      const char* name) {
  SHOAL_CHECK(in.size() <= out.size(),
              where + ": " + name + " " + Dims(in) + " has more dimensions than the output " + Dims(out));
  const std::vector<int64_t> st = ContiguousStrides(in);
  const size_t lead = out.size() - in.size();
  for (size_t d = 0; d < out.size(); ++d) {
    if (d < lead) {
      w.stride[k][d] = 0;
      continue;
    }
    const int64_t n = in[d - lead];
    SHOAL_CHECK(n == out[d] || n == 1,
                where + ": " + name + " " + Dims(in) + " does not broadcast to the output " + Dims(out));
    w.stride[k][d] = n == 1 ? 0 : st[d - lead];
  }
}

// ReduceSum's two walks, simplified: `kept` over y's shape (y's missing leading dimensions
// as size 1) with x's strides, `reduced` over the dimensions y collapses to 1.
inline void ReduceWalks(const Shape& xs, const Shape& ys, const std::string& where, cudak::Walk* kept,
                        cudak::Walk* reduced) {
  SHOAL_CHECK(xs.size() <= kMaxTensorDims, where + ": more than " + std::to_string(kMaxTensorDims) + " dimensions");
  SHOAL_CHECK(ys.size() <= xs.size(), where + ": y has more dimensions than x");
  const std::vector<int64_t> st = ContiguousStrides(xs);
  const size_t lead = xs.size() - ys.size();
  cudak::Walk k, r;
  k.ndim = r.ndim = int(xs.size());
  for (size_t d = 0; d < xs.size(); ++d) {
    const int64_t yd = d < lead ? 1 : ys[d - lead];
    SHOAL_CHECK(yd == xs[d] || yd == 1,
                where + ": y's dimension " + std::to_string(d - lead) + " is neither x's nor 1");
    const bool collapse = yd == 1 && xs[d] != 1;
    k.shape[d] = collapse ? 1 : xs[d];
    k.stride[0][d] = collapse ? 0 : st[d];
    r.shape[d] = collapse ? xs[d] : 1;
    r.stride[0][d] = collapse ? st[d] : 0;
  }
  *kept = Simplify(k, 1);
  *reduced = Simplify(r, 1);
}

// StridedCopy's walk (operand 0 the source, 1 the destination), simplified, after checking
// that every position it reaches lies inside its tensor. False when there is nothing to copy.
inline bool StridedWalk(const StridedView& sv, int64_t src_numel, const StridedView& dv, int64_t dst_numel,
                        const Shape& shape, const std::string& where, cudak::Walk* out) {
  cudak::Walk w = OutputWalk(shape, where);
  SHOAL_CHECK(sv.strides.size() == shape.size() && dv.strides.size() == shape.size(),
              where + ": the views have " + std::to_string(sv.strides.size()) + " and " +
                  std::to_string(dv.strides.size()) + " strides for " + std::to_string(shape.size()) + " dimensions");
  for (int64_t n : shape) SHOAL_CHECK(n >= 0, where + ": negative size");
  if (NumElements(shape) == 0) return false;
  const StridedView* views[2] = {&sv, &dv};
  const int64_t numel[2] = {src_numel, dst_numel};
  const char* names[2] = {"source", "destination"};
  for (int k = 0; k < 2; ++k) {
    int64_t lo = views[k]->offset, hi = views[k]->offset;
    for (size_t d = 0; d < shape.size(); ++d) {
      const int64_t span = (shape[d] - 1) * views[k]->strides[d];
      (span < 0 ? lo : hi) += span;
      w.stride[k][d] = views[k]->strides[d];
    }
    w.offset[k] = views[k]->offset;
    SHOAL_CHECK(lo >= 0 && hi < numel[k], where + ": the " + names[k] + " view reaches elements " + std::to_string(lo) +
                                              " to " + std::to_string(hi) + " of " + std::to_string(numel[k]));
  }
  *out = Simplify(w, 2);
  return true;
}

// IndexSelect's backward without atomics: a counting sort of the positions j by their index
// (non-negative, < dim). Returns start[dim + 1] followed by pos[m]: the positions holding
// index d are pos[start[d] .. start[d+1]), ascending, so each sum runs in a fixed order.
inline std::vector<int32_t> IndexTable(const std::vector<int32_t>& idx, int64_t dim) {
  std::vector<int32_t> table(size_t(dim) + 1 + idx.size(), 0);
  int32_t* start = table.data();
  int32_t* pos = table.data() + dim + 1;
  for (int32_t v : idx) ++start[v + 1];
  for (int64_t d = 0; d < dim; ++d) start[d + 1] += start[d];
  std::vector<int32_t> fill(start, start + dim);
  for (size_t j = 0; j < idx.size(); ++j) pos[fill[size_t(idx[j])]++] = int32_t(j);
  return table;
}

}  // namespace cudawalk
}  // namespace shoal
