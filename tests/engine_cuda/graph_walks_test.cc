// The host half of the CUDA graph ops (worker/engine/cuda/graph_walks.h): the walks the
// kernels follow must reach the same elements, in the same order, as a naive multi-index
// walk, for random shapes, broadcasts, reductions and views. Runs anywhere: no device needed.
#include "worker/engine/cuda/graph_walks.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace shoal {
namespace {

// graph_kernels.cu's Offsets, on the host.
void Offsets(const cudak::Walk& w, int64_t i, int ops, int64_t* off) {
  for (int k = 0; k < ops; ++k) off[k] = w.offset[k];
  for (int d = w.ndim - 1; d >= 0; --d) {
    const int64_t q = i / w.shape[d], r = i - q * w.shape[d];
    for (int k = 0; k < ops; ++k) off[k] += r * w.stride[k][d];
    i = q;
  }
}

int64_t Count(const cudak::Walk& w) {
  int64_t n = 1;
  for (int d = 0; d < w.ndim; ++d) n *= w.shape[d];
  return n;
}

// The multi-index of linear position i in `shape`, row-major.
std::vector<int64_t> Unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int d = int(shape.size()) - 1; d >= 0; --d) {
    idx[size_t(d)] = i % shape[size_t(d)];
    i /= shape[size_t(d)];
  }
  return idx;
}

// numpy's rule: the element of `in` that output multi-index `o` reads.
int64_t BroadcastIndex(const std::vector<int64_t>& o, const Shape& in) {
  const size_t lead = o.size() - in.size();
  int64_t off = 0;
  for (size_t d = 0; d < in.size(); ++d) off = off * in[d] + (in[d] == 1 ? 0 : o[lead + d]);
  return off;
}

class GraphWalks : public ::testing::Test {
 protected:
  Shape RandomShape(int rank, int max_dim) {
    std::uniform_int_distribution<int> u(1, max_dim);
    Shape s(static_cast<size_t>(rank));
    for (auto& d : s) d = u(rng_);
    return s;
  }
  std::mt19937 rng_{7};
};

TEST_F(GraphWalks, SimplifyKeepsEveryOffsetInOrder) {
  std::uniform_int_distribution<int> rank(0, 8), stride(-3, 5), coin(0, 3);
  for (int trial = 0; trial < 500; ++trial) {
    const Shape s = RandomShape(rank(rng_), 4);
    cudak::Walk w = cudawalk::OutputWalk(s, "test");
    for (int k = 0; k < 3; ++k) {
      w.offset[k] = 100 * k;
      // Half the operands contiguous (merges happen), the rest random (they mostly do not).
      const std::vector<int64_t> c = ContiguousStrides(s);
      for (int d = 0; d < w.ndim; ++d) w.stride[k][d] = coin(rng_) ? c[size_t(d)] : stride(rng_);
    }
    const cudak::Walk v = cudawalk::Simplify(w, 3);
    ASSERT_EQ(Count(v), Count(w));
    for (int64_t i = 0; i < Count(w); ++i) {
      int64_t a[3], b[3];
      Offsets(w, i, 3, a);
      Offsets(v, i, 3, b);
      for (int k = 0; k < 3; ++k) ASSERT_EQ(a[k], b[k]) << "trial " << trial << " element " << i << " operand " << k;
    }
  }
}

TEST_F(GraphWalks, SameShapeOperandsBecomeOneFlatLoop) {
  const Shape s = {2, 3, 4, 5};
  cudak::Walk w = cudawalk::OutputWalk(s, "test");
  cudawalk::Broadcast(s, s, w, 0, "test", "a");
  cudawalk::Broadcast(s, s, w, 1, "test", "b");
  const cudak::Walk v = cudawalk::Simplify(w, 2);
  ASSERT_EQ(v.ndim, 1);
  EXPECT_EQ(v.shape[0], 120);
  EXPECT_EQ(v.stride[0][0], 1);
  EXPECT_EQ(v.stride[1][0], 1);
}

TEST_F(GraphWalks, BroadcastReadsWhatNumpyReads) {
  std::uniform_int_distribution<int> rank(0, 8), coin(0, 2);
  for (int trial = 0; trial < 300; ++trial) {
    const Shape out = RandomShape(rank(rng_), 3);
    // An input: a suffix of out's dimensions, some set to 1.
    std::uniform_int_distribution<size_t> drop(0, out.size());
    Shape in(out.begin() + long(drop(rng_)), out.end());
    for (auto& d : in)
      if (coin(rng_) == 0) d = 1;
    cudak::Walk w = cudawalk::OutputWalk(out, "test");
    cudawalk::Broadcast(in, out, w, 1, "test", "a");
    const cudak::Walk v = cudawalk::Simplify(w, 2);
    for (int64_t i = 0; i < NumElements(out); ++i) {
      int64_t off[2];
      Offsets(v, i, 2, off);
      ASSERT_EQ(off[1], BroadcastIndex(Unravel(i, out), in))
          << cudawalk::Dims(in) << " to " << cudawalk::Dims(out) << " element " << i;
    }
  }
}

TEST_F(GraphWalks, BroadcastRejectsIncompatibleShapes) {
  cudak::Walk w = cudawalk::OutputWalk({2, 3}, "test");
  EXPECT_THROW(cudawalk::Broadcast({4}, {2, 3}, w, 0, "test", "a"), Error);
  EXPECT_THROW(cudawalk::Broadcast({1, 2, 3}, {2, 3}, w, 0, "test", "a"), Error);
  EXPECT_THROW(cudawalk::OutputWalk(Shape(9, 1), "test"), Error);
}

TEST_F(GraphWalks, ReduceWalksSumWhatANaiveReductionSums) {
  std::uniform_int_distribution<int> rank(1, 8), coin(0, 1);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int trial = 0; trial < 300; ++trial) {
    const Shape xs = RandomShape(rank(rng_), 3);
    std::uniform_int_distribution<size_t> drop(0, xs.size());
    Shape ys(xs.begin() + long(drop(rng_)), xs.end());
    for (auto& d : ys)
      if (coin(rng_)) d = 1;
    std::vector<double> x(size_t(NumElements(xs)));
    for (auto& v : x) v = u(rng_);
    // Naive: every x element into the y element its broadcast index names.
    std::vector<double> want(size_t(NumElements(ys)), 0.0);
    for (int64_t i = 0; i < NumElements(xs); ++i) want[size_t(BroadcastIndex(Unravel(i, xs), ys))] += x[size_t(i)];
    cudak::Walk kept, reduced;
    cudawalk::ReduceWalks(xs, ys, "test", &kept, &reduced);
    ASSERT_EQ(Count(kept), NumElements(ys));
    ASSERT_EQ(Count(kept) * Count(reduced), NumElements(xs));
    for (int64_t o = 0; o < Count(kept); ++o) {
      int64_t base;
      Offsets(kept, o, 1, &base);
      double got = 0;
      for (int64_t j = 0; j < Count(reduced); ++j) {
        int64_t off;
        Offsets(reduced, j, 1, &off);
        got += x[size_t(base + off)];
      }
      ASSERT_NEAR(got, want[size_t(o)], 1e-9) << cudawalk::Dims(xs) << " to " << cudawalk::Dims(ys);
    }
  }
  cudak::Walk k, r;
  EXPECT_THROW(cudawalk::ReduceWalks({2, 3}, {2, 2}, "test", &k, &r), Error);
  EXPECT_THROW(cudawalk::ReduceWalks({3}, {1, 3}, "test", &k, &r), Error);
}

TEST_F(GraphWalks, StridedWalkChecksBoundsAndKeepsTheMapping) {
  // Transpose [2,3] into [3,2]: walk [3,2], read x[j][i] (strides 1, 3), write contiguously.
  cudak::Walk w;
  ASSERT_TRUE(cudawalk::StridedWalk({0, {1, 3}}, 6, {0, {2, 1}}, 6, {3, 2}, "test", &w));
  std::vector<int64_t> src, dst;
  for (int64_t i = 0; i < 6; ++i) {
    int64_t off[2];
    Offsets(w, i, 2, off);
    src.push_back(off[0]);
    dst.push_back(off[1]);
  }
  EXPECT_EQ(src, (std::vector<int64_t>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(dst, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  // A reversed read (negative stride) from the end is inside; one element further is not.
  EXPECT_TRUE(cudawalk::StridedWalk({5, {-1}}, 6, {0, {1}}, 6, {6}, "test", &w));
  EXPECT_THROW(cudawalk::StridedWalk({4, {-1}}, 6, {0, {1}}, 6, {6}, "test", &w), Error);
  EXPECT_THROW(cudawalk::StridedWalk({1, {1}}, 6, {0, {1}}, 6, {6}, "test", &w), Error);
  EXPECT_THROW(cudawalk::StridedWalk({0, {1}}, 6, {0, {1, 1}}, 6, {6}, "test", &w), Error);
  EXPECT_FALSE(cudawalk::StridedWalk({0, {1, 1}}, 6, {0, {1, 1}}, 6, {0, 4}, "test", &w));
}

TEST_F(GraphWalks, IndexTableListsEachIndexsPositionsAscending) {
  const std::vector<int32_t> idx = {3, 0, 3, 1, 3, 0};
  const std::vector<int32_t> t = cudawalk::IndexTable(idx, 5);
  // start[0..5], then positions grouped by index.
  EXPECT_EQ(std::vector<int32_t>(t.begin(), t.begin() + 6), (std::vector<int32_t>{0, 2, 3, 3, 6, 6}));
  EXPECT_EQ(std::vector<int32_t>(t.begin() + 6, t.end()), (std::vector<int32_t>{1, 5, 3, 0, 2, 4}));
}

}  // namespace
}  // namespace shoal
