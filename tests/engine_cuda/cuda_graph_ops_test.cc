// The CUDA backend's ops for imported graphs (backend.h: Unary ... DropoutMask) and its
// convolution and pooling geometry (rectangular stride/pad, dilation, groups) against the CPU
// engine, on random inputs with broadcasting cases and negative axes; reductions checked bit
// for bit run to run. Skips with the driver's reason where no CUDA device is present
// (cuda_device_test covers the no-device behaviour).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/cuda/platform.h"
#include "common/dtype.h"
#include "common/error.h"
#include "worker/engine/backend.h"

namespace shoal {
namespace {

struct Pair {
  Tensor ref, gpu;
};

std::string S(const Shape& s) { return ShapeString(s); }

class CudaGraphOps : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
    ref_ = MakeCpuBackend(2);
    gpu_ = MakeCudaBackend(0);
  }

  Pair FromHost(const Shape& s, const std::vector<float>& v) {
    Pair p{ref_->Empty(s), gpu_->Empty(s)};
    ref_->CopyFromHost(p.ref, v.data());
    gpu_->CopyFromHost(p.gpu, v.data());
    return p;
  }
  std::vector<float> RandomHost(const Shape& s, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(size_t(NumElements(s)));
    for (float& x : v) x = u(rng_);
    return v;
  }
  Pair Random(const Shape& s, float lo = -1.f, float hi = 1.f) { return FromHost(s, RandomHost(s, lo, hi)); }
  // Multiples of 0.5 in [lo, hi]: ties for the comparisons and max/min.
  Pair Steps(const Shape& s, int lo, int hi) {
    std::uniform_int_distribution<int> u(2 * lo, 2 * hi);
    std::vector<float> v(size_t(NumElements(s)));
    for (float& x : v) x = 0.5f * float(u(rng_));
    return FromHost(s, v);
  }
  // NaN-filled: an op that leaves elements unwritten shows.
  Pair Empty(const Shape& s) { return FromHost(s, std::vector<float>(size_t(NumElements(s)), std::nanf(""))); }
  Pair Zeros(const Shape& s) { return FromHost(s, std::vector<float>(size_t(NumElements(s)), 0.f)); }
  std::vector<float> Host(Backend& b, const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    b.CopyToHost(t, v.data());
    return v;
  }

  // |gpu - ref| <= rtol (|ref| + max|ref|) elementwise, as cuda_backend_test.
  void ExpectClose(const Pair& p, const std::string& what, double rtol = 1e-4) {
    ASSERT_EQ(p.ref.shape(), p.gpu.shape()) << what;
    std::vector<float> c = Host(*ref_, p.ref), g = Host(*gpu_, p.gpu);
    double scale = 0;
    for (float x : c) scale = std::max(scale, double(std::fabs(x)));
    int64_t bad = 0, first = -1;
    double worst = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      const double err = std::fabs(double(g[i]) - double(c[i]));
      const bool ok = err <= rtol * (std::fabs(double(c[i])) + scale) && !std::isnan(g[i]) && !std::isnan(c[i]);
      if (!ok && bad++ == 0) first = int64_t(i);
      worst = std::max(worst, err);
    }
    EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << c.size() << " elements differ; first at " << first
                      << " ref=" << (first >= 0 ? c[size_t(first)] : 0.f)
                      << " cuda=" << (first >= 0 ? g[size_t(first)] : 0.f) << "; max |diff| " << worst << ", max |ref| "
                      << scale;
  }
  // Bit patterns of a device tensor, for run-to-run identity.
  std::vector<uint32_t> Bits(const Tensor& t) {
    std::vector<float> v = Host(*gpu_, t);
    std::vector<uint32_t> b(v.size());
    std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
    return b;
  }

  std::mt19937 rng_{20261125};
  std::unique_ptr<Backend> ref_, gpu_;
};

// ---- elementwise

struct UnaryCase {
  UnaryOp op;
  const char* name;
  float lo, hi, a, b;
};

TEST_F(CudaGraphOps, UnaryForwardAndBackward) {
  const UnaryCase cases[] = {
      {UnaryOp::kIdentity, "identity", -2, 2, 0, 0},
      {UnaryOp::kNeg, "neg", -2, 2, 0, 0},
      {UnaryOp::kRelu, "relu", -2, 2, 0, 0},
      {UnaryOp::kLeakyRelu, "leaky_relu", -2, 2, 0.1f, 0},
      {UnaryOp::kClip, "clip", -2, 2, -0.5f, 0.75f},
      {UnaryOp::kSigmoid, "sigmoid", -6, 6, 0, 0},
      {UnaryOp::kTanh, "tanh", -3, 3, 0, 0},
      {UnaryOp::kErf, "erf", -2, 2, 0, 0},
      {UnaryOp::kSqrt, "sqrt", 0.1f, 4, 0, 0},
      {UnaryOp::kExp, "exp", -3, 3, 0, 0},
      {UnaryOp::kLog, "log", 0.1f, 4, 0, 0},
      {UnaryOp::kAbs, "abs", -2, 2, 0, 0},
      {UnaryOp::kReciprocal, "reciprocal", 0.5f, 3, 0, 0},
      {UnaryOp::kPowScalar, "pow", 0.1f, 3, 2.5f, 0},
      {UnaryOp::kAffine, "affine", -2, 2, 1.5f, -0.25f},
  };
  const Shape s = {3, 5, 7};
  for (const UnaryCase& uc : cases) {
    Pair x = Random(s, uc.lo, uc.hi);
    Pair y = Empty(s);
    ref_->Unary(uc.op, x.ref, y.ref, uc.a, uc.b);
    gpu_->Unary(uc.op, x.gpu, y.gpu, uc.a, uc.b);
    ExpectClose(y, std::string(uc.name) + " y");
    Pair dy = Random(s);
    Pair dx = Empty(s);
    ref_->UnaryBackward(uc.op, x.ref, y.ref, dy.ref, dx.ref, uc.a, uc.b);
    gpu_->UnaryBackward(uc.op, x.gpu, y.gpu, dy.gpu, dx.gpu, uc.a, uc.b);
    ExpectClose(dx, std::string(uc.name) + " dx");
  }
}

struct Broadcast3 {
  Shape a, b, y;
};

TEST_F(CudaGraphOps, BinaryBroadcastsNumpyStyle) {
  const Broadcast3 shapes[] = {
      {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}},       {{2, 3, 4}, {4}, {2, 3, 4}},
      {{2, 1, 4}, {3, 1}, {2, 3, 4}},          {{1}, {2, 3}, {2, 3}},
      {{3, 1, 5}, {2, 1, 4, 1}, {2, 3, 4, 5}}, {{2, 1, 3, 1, 2, 1, 2, 1}, {1, 4, 1, 1, 2, 3}, {2, 1, 3, 4, 2, 1, 2, 3}},
  };
  const std::pair<BinaryOp, const char*> ops[] = {
      {BinaryOp::kAdd, "add"},   {BinaryOp::kSub, "sub"},         {BinaryOp::kMul, "mul"}, {BinaryOp::kDiv, "div"},
      {BinaryOp::kPow, "pow"},   {BinaryOp::kMax, "max"},         {BinaryOp::kMin, "min"}, {BinaryOp::kEqual, "equal"},
      {BinaryOp::kLess, "less"}, {BinaryOp::kGreater, "greater"},
  };
  for (const Broadcast3& bc : shapes) {
    for (const auto& op : ops) {
      const std::string tag = std::string(op.second) + " " + S(bc.a) + " " + S(bc.b) + " -> " + S(bc.y);
      Pair a, b;
      if (op.first == BinaryOp::kPow) {
        a = Random(bc.a, 0.2f, 2.f);
        b = Random(bc.b, -2.f, 2.f);
      } else if (op.first == BinaryOp::kDiv) {
        a = Random(bc.a);
        b = Random(bc.b, 0.5f, 2.f);
      } else {
        a = Steps(bc.a, -2, 2);
        b = Steps(bc.b, -2, 2);
      }
      Pair y = Empty(bc.y);
      ref_->Binary(op.first, a.ref, b.ref, y.ref);
      gpu_->Binary(op.first, a.gpu, b.gpu, y.gpu);
      ExpectClose(y, tag);
    }
  }
}

TEST_F(CudaGraphOps, BinaryRejectsShapesThatDoNotBroadcast) {
  Pair a = Random({2, 3}), b = Random({4}), y = Empty({2, 3});
  EXPECT_THROW(gpu_->Binary(BinaryOp::kAdd, a.gpu, b.gpu, y.gpu), Error);
  EXPECT_THROW(ref_->Binary(BinaryOp::kAdd, a.ref, b.ref, y.ref), Error);
}

TEST_F(CudaGraphOps, WhereBroadcastsAllThree) {
  const Shape ys = {2, 3, 4};
  const Shape conds[] = {{2, 3, 4}, {3, 1}, {4}};
  for (const Shape& cs : conds) {
    Pair c = Steps(cs, 0, 1);  // 0, 0.5, 1: nonzero counts as true
    Pair a = Random({2, 1, 4}), b = Random({1});
    Pair y = Empty(ys);
    ref_->Where(c.ref, a.ref, b.ref, y.ref);
    gpu_->Where(c.gpu, a.gpu, b.gpu, y.gpu);
    ExpectClose(y, "where cond " + S(cs));
  }
}

// ---- reductions and copies

TEST_F(CudaGraphOps, ReduceSumOverAnyDimensionsDeterministically) {
  struct Case {
    Shape x, y;
    float alpha;
    bool accumulate;
  };
  const Case cases[] = {
      {{4, 5, 6}, {1, 5, 1}, 1.f, false}, {{4, 5, 6}, {6}, 0.5f, false},   {{4, 5, 6}, {1}, 1.f, true},
      {{4, 5, 6}, {4, 1, 6}, -2.f, true}, {{3, 5000}, {3, 1}, 1.f, false}, {{70000}, {1}, 1.f, false},
      {{2, 3}, {2, 3}, 3.f, false},       {{300, 7}, {7}, 1.f, true},
  };
  for (const Case& rc : cases) {
    const std::string tag = "reduce " + S(rc.x) + " -> " + S(rc.y);
    Pair x = Random(rc.x);
    Pair y = rc.accumulate ? Random(rc.y) : Empty(rc.y);
    const std::vector<float> start = Host(*gpu_, y.gpu);
    ref_->ReduceSum(x.ref, y.ref, rc.alpha, rc.accumulate);
    gpu_->ReduceSum(x.gpu, y.gpu, rc.alpha, rc.accumulate);
    ExpectClose(y, tag);
    // Again from the same start: the same bits.
    Tensor again = gpu_->Empty(rc.y);
    gpu_->CopyFromHost(again, start.data());
    gpu_->ReduceSum(x.gpu, again, rc.alpha, rc.accumulate);
    EXPECT_EQ(Bits(again), Bits(y.gpu)) << tag << ": not bit-identical run to run";
  }
}

TEST_F(CudaGraphOps, StridedCopyTransposesSlicesExpandsAndAccumulates) {
  // Transpose [3,4,5] -> [5,3,4]: walk the destination's shape, read x with permuted strides.
  {
    Pair x = Random({3, 4, 5});
    Pair y = Empty({5, 3, 4});
    StridedView sv{0, {1, 20, 5}}, dv{0, ContiguousStrides({5, 3, 4})};
    ref_->StridedCopy(x.ref, sv, y.ref, dv, {5, 3, 4});
    gpu_->StridedCopy(x.gpu, sv, y.gpu, dv, {5, 3, 4});
    ExpectClose(y, "transpose");
  }
  // Slice rows 1..2, columns 2..4 of [4,6] into [2,3], offset into the source.
  {
    Pair x = Random({4, 6});
    Pair y = Empty({2, 3});
    StridedView sv{1 * 6 + 2, {6, 1}}, dv{0, {3, 1}};
    ref_->StridedCopy(x.ref, sv, y.ref, dv, {2, 3});
    gpu_->StridedCopy(x.gpu, sv, y.gpu, dv, {2, 3});
    ExpectClose(y, "slice");
  }
  // Expand [3,1] to [3,4] (source stride 0), then accumulate it into the right half of [3,8]
  // (concat's backward runs the other way; pad writes into an offset).
  {
    Pair x = Random({3, 1});
    Pair y = Random({3, 8});
    StridedView sv{0, {1, 0}}, dv{4, {8, 1}};
    ref_->StridedCopy(x.ref, sv, y.ref, dv, {3, 4}, true);
    gpu_->StridedCopy(x.gpu, sv, y.gpu, dv, {3, 4}, true);
    ExpectClose(y, "expand + accumulate");
  }
  // Eight dimensions.
  {
    const Shape s = {2, 1, 2, 3, 1, 2, 2, 3};
    Pair x = Random(s);
    Pair y = Empty(s);
    std::vector<int64_t> st = ContiguousStrides(s);
    std::reverse(st.begin(), st.end());
    Shape rs(s.rbegin(), s.rend());
    // y viewed backwards: walks `rs` reading x in reversed dimension order.
    StridedView sv{0, st}, dv{0, ContiguousStrides(rs)};
    Pair yr = Empty(rs);
    ref_->StridedCopy(x.ref, sv, yr.ref, dv, rs);
    gpu_->StridedCopy(x.gpu, sv, yr.gpu, dv, rs);
    ExpectClose(yr, "8-d reversal of dimensions");
  }
}

TEST_F(CudaGraphOps, StridedCopyRejectsAViewOutsideItsTensor) {
  Pair x = Random({4}), y = Empty({4});
  StridedView sv{2, {1}}, dv{0, {1}};
  EXPECT_THROW(gpu_->StridedCopy(x.gpu, sv, y.gpu, dv, {4}), Error);
}

// ---- matrix products

struct MatMulCase {
  int64_t batch, m, n, k;
  bool ta, tb, a_once, b_once;
  float alpha, beta;
};

TEST_F(CudaGraphOps, BatchedMatMulWithTransposesAndBroadcastBatch) {
  const MatMulCase cases[] = {
      {1, 5, 7, 3, false, false, false, false, 1.f, 0.f}, {4, 6, 5, 8, false, false, false, false, 1.f, 0.f},
      {4, 6, 5, 8, true, false, false, false, 1.f, 0.f},  {4, 6, 5, 8, false, true, false, false, 1.f, 0.f},
      {3, 9, 4, 7, true, true, false, false, 0.5f, 0.f},  {3, 9, 4, 7, false, false, true, false, 1.f, 1.f},
      {3, 9, 4, 7, false, true, false, true, 2.f, -0.5f}, {2, 64, 48, 96, false, true, false, false, 0.125f, 0.f},
  };
  for (const MatMulCase& mc : cases) {
    const std::string tag = "matmul B" + std::to_string(mc.batch) + " M" + std::to_string(mc.m) + " N" +
                            std::to_string(mc.n) + " K" + std::to_string(mc.k) + (mc.ta ? " ta" : "") +
                            (mc.tb ? " tb" : "") + (mc.a_once ? " a-once" : "") + (mc.b_once ? " b-once" : "");
    const Shape as = {mc.a_once ? 1 : mc.batch, mc.ta ? mc.k : mc.m, mc.ta ? mc.m : mc.k};
    const Shape bs = {mc.b_once ? 1 : mc.batch, mc.tb ? mc.n : mc.k, mc.tb ? mc.k : mc.n};
    Pair a = Random(as), b = Random(bs);
    Pair c = mc.beta != 0.f ? Random({mc.batch, mc.m, mc.n}) : Empty({mc.batch, mc.m, mc.n});
    ref_->MatMul(a.ref, mc.ta, b.ref, mc.tb, c.ref, mc.alpha, mc.beta);
    gpu_->MatMul(a.gpu, mc.ta, b.gpu, mc.tb, c.gpu, mc.alpha, mc.beta);
    ExpectClose(c, tag);
  }
}

TEST_F(CudaGraphOps, MatMulRejectsMismatchedInnerDimensions) {
  Pair a = Random({2, 3, 4}), b = Random({2, 5, 6}), c = Empty({2, 3, 6});
  EXPECT_THROW(gpu_->MatMul(a.gpu, false, b.gpu, false, c.gpu), Error);
}

// Mixed mode: the product in bf16/fp16 with fp32 accumulation, against exact fp32 on the same
// device (the CPU's bf16 needs processor support this test should not depend on).
TEST_F(CudaGraphOps, MatMulHonoursTheComputeType) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    std::unique_ptr<Backend> mixed = MakeCudaBackend(0, dt);
    const Shape as = {3, 32, 64}, bs = {1, 64, 48}, cs = {3, 32, 48};
    const std::vector<float> ha = RandomHost(as, -1, 1), hb = RandomHost(bs, -1, 1);
    Tensor a = mixed->Empty(as), b = mixed->Empty(bs), c = mixed->Empty(cs);
    mixed->CopyFromHost(a, ha.data());
    mixed->CopyFromHost(b, hb.data());
    mixed->MatMul(a, false, b, false, c);
    Pair exact{gpu_->Empty(as), gpu_->Empty(bs)};
    gpu_->CopyFromHost(exact.ref, ha.data());
    gpu_->CopyFromHost(exact.gpu, hb.data());
    Tensor ce = gpu_->Empty(cs);
    gpu_->MatMul(exact.ref, false, exact.gpu, false, ce);
    std::vector<float> got(size_t(NumElements(cs))), want(got.size());
    mixed->CopyToHost(c, got.data());
    gpu_->CopyToHost(ce, want.data());
    double diff = 0, scale = 0, moved = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      diff = std::max(diff, double(std::fabs(got[i] - want[i])));
      scale = std::max(scale, double(std::fabs(want[i])));
      moved += got[i] != want[i];
    }
    const double tol = dt == DType::kF16 ? 5e-3 : 3e-2;
    EXPECT_LE(diff / scale, tol) << DTypeName(dt);
    EXPECT_GT(moved, 0) << DTypeName(dt) << ": identical to fp32, so the narrow type was not used";
  }
}

// ---- softmax and layer norm

TEST_F(CudaGraphOps, SoftmaxAndLogSoftmaxAlongAnyAxis) {
  const Shape s = {3, 4, 5, 6};
  for (int axis : {0, 1, 2, 3, -1, -3}) {
    for (bool log : {false, true}) {
      const std::string tag = std::string(log ? "log-softmax" : "softmax") + " axis " + std::to_string(axis);
      Pair x = Random(s, -4.f, 4.f);
      Pair y = Empty(s);
      ref_->Softmax(x.ref, axis, log, y.ref);
      gpu_->Softmax(x.gpu, axis, log, y.gpu);
      ExpectClose(y, tag + " y");
      Pair dy = Random(s), dx = Empty(s);
      ref_->SoftmaxBackward(y.ref, dy.ref, axis, log, dx.ref);
      gpu_->SoftmaxBackward(y.gpu, dy.gpu, axis, log, dx.gpu);
      ExpectClose(dx, tag + " dx", 3e-4);
    }
  }
}

TEST_F(CudaGraphOps, LayerNormForwardAndBackward) {
  struct Case {
    Shape x;
    int64_t cols;
    bool beta;
  };
  const Case cases[] = {{{4, 6, 32}, 32, true}, {{3, 50}, 50, false}, {{2, 3, 4, 5}, 20, true}, {{700, 96}, 96, true}};
  for (const Case& lc : cases) {
    const std::string tag = "layernorm " + S(lc.x) + " cols " + std::to_string(lc.cols);
    const int64_t rows = NumElements(lc.x) / lc.cols;
    Pair x = Random(lc.x, -2.f, 3.f);
    Pair gamma = Random({lc.cols}, 0.5f, 1.5f);
    Pair beta = lc.beta ? Random({lc.cols}) : Pair{};
    Pair y = Empty(lc.x), mean = Empty({rows}), invstd = Empty({rows});
    ref_->LayerNormForward(x.ref, gamma.ref, beta.ref, lc.cols, 1e-5f, y.ref, mean.ref, invstd.ref);
    gpu_->LayerNormForward(x.gpu, gamma.gpu, beta.gpu, lc.cols, 1e-5f, y.gpu, mean.gpu, invstd.gpu);
    ExpectClose(y, tag + " y");
    ExpectClose(mean, tag + " mean");
    ExpectClose(invstd, tag + " invstd");

    Pair dy = Random(lc.x), dx = Empty(lc.x);
    Pair dgamma = Random({lc.cols}), dbeta = Random({lc.cols});  // non-zero: both must accumulate
    const std::vector<float> g0 = Host(*gpu_, dgamma.gpu), b0 = Host(*gpu_, dbeta.gpu);
    ref_->LayerNormBackward(x.ref, dy.ref, gamma.ref, mean.ref, invstd.ref, lc.cols, dx.ref, &dgamma.ref,
                            lc.beta ? &dbeta.ref : nullptr);
    gpu_->LayerNormBackward(x.gpu, dy.gpu, gamma.gpu, mean.gpu, invstd.gpu, lc.cols, dx.gpu, &dgamma.gpu,
                            lc.beta ? &dbeta.gpu : nullptr);
    ExpectClose(dx, tag + " dx", 3e-4);
    ExpectClose(dgamma, tag + " dgamma");
    ExpectClose(dbeta, tag + " dbeta");

    Tensor g2 = gpu_->Empty({lc.cols}), b2 = gpu_->Empty({lc.cols}), dx2 = gpu_->Empty(lc.x);
    gpu_->CopyFromHost(g2, g0.data());
    gpu_->CopyFromHost(b2, b0.data());
    gpu_->LayerNormBackward(x.gpu, dy.gpu, gamma.gpu, mean.gpu, invstd.gpu, lc.cols, dx2, &g2, lc.beta ? &b2 : nullptr);
    EXPECT_EQ(Bits(g2), Bits(dgamma.gpu)) << tag << ": dgamma not bit-identical run to run";
    EXPECT_EQ(Bits(b2), Bits(dbeta.gpu)) << tag << ": dbeta not bit-identical run to run";
  }
}

// ---- index select

TEST_F(CudaGraphOps, IndexSelectWithNegativeAndRepeatedIndices) {
  const Shape xs = {5, 7, 3};
  struct Case {
    int axis;
    Shape idx_shape;
    std::vector<float> idx;
  };
  const Case cases[] = {
      {1, {2, 4}, {0, 6, -1, 3, 3, -7, 2, 6}},  // -1 = 6, -7 = 0; 3 and 6 repeat
      {0, {3}, {4, -5, 4}},
      {-1, {5}, {2, 0, -1, 1, 2}},
      {-3, {}, {3}},  // a scalar index drops the dimension
  };
  for (const Case& ic : cases) {
    const std::string tag = "index_select axis " + std::to_string(ic.axis) + " indices " + S(ic.idx_shape);
    const int ax = ic.axis < 0 ? ic.axis + 3 : ic.axis;
    Shape ys(xs.begin(), xs.begin() + ax);
    ys.insert(ys.end(), ic.idx_shape.begin(), ic.idx_shape.end());
    ys.insert(ys.end(), xs.begin() + ax + 1, xs.end());
    Pair x = Random(xs);
    Pair idx = FromHost(ic.idx_shape, ic.idx);
    Pair y = Empty(ys);
    ref_->IndexSelect(x.ref, idx.ref, ic.axis, y.ref);
    gpu_->IndexSelect(x.gpu, idx.gpu, ic.axis, y.gpu);
    ExpectClose(y, tag + " y", 0);

    Pair dy = Random(ys);
    Pair dx = Zeros(xs);
    ref_->IndexSelectBackward(dy.ref, idx.ref, ic.axis, dx.ref);
    gpu_->IndexSelectBackward(dy.gpu, idx.gpu, ic.axis, dx.gpu);
    ExpectClose(dx, tag + " dx");
    Tensor dx2 = gpu_->Zeros(xs);
    gpu_->IndexSelectBackward(dy.gpu, idx.gpu, ic.axis, dx2);
    EXPECT_EQ(Bits(dx2), Bits(dx.gpu)) << tag << ": dx not bit-identical run to run";
  }
}

TEST_F(CudaGraphOps, IndexSelectRejectsIndicesOutOfRange) {
  Pair x = Random({4, 3});
  for (float bad : {4.f, -5.f, 1.5f}) {
    Pair idx = FromHost({2}, {0.f, bad});
    Pair y = Empty({2, 3});
    EXPECT_THROW(gpu_->IndexSelect(x.gpu, idx.gpu, 0, y.gpu), Error) << bad;
  }
}

// An embedding table's gradient: many repeats of few rows, summed in a fixed order.
TEST_F(CudaGraphOps, IndexSelectBackwardIsDeterministicWithManyRepeats) {
  const int64_t vocab = 50, hidden = 64, tokens = 4096;
  std::uniform_int_distribution<int> u(0, int(vocab) - 1);
  std::vector<float> idx(tokens);
  for (float& v : idx) v = float(u(rng_));
  Pair ids = FromHost({8, tokens / 8}, idx);
  Pair dy = Random({8, tokens / 8, hidden});
  Pair dx = Zeros({vocab, hidden});
  ref_->IndexSelectBackward(dy.ref, ids.ref, 0, dx.ref);
  gpu_->IndexSelectBackward(dy.gpu, ids.gpu, 0, dx.gpu);
  ExpectClose(dx, "embedding dx");
  Tensor again = gpu_->Zeros({vocab, hidden});
  gpu_->IndexSelectBackward(dy.gpu, ids.gpu, 0, again);
  EXPECT_EQ(Bits(again), Bits(dx.gpu));
}

// ---- pooling and convolution geometry

struct PoolCase {
  Shape x;
  PoolParams p;
};

PoolParams Pool(int kh, int kw, int sh, int sw, int ph, int pw, bool include_pad = false) {
  PoolParams p;
  p.kernel = kh;
  p.kernel_w = kw;
  p.stride = sh;
  p.stride_w = sw;
  p.pad = ph;
  p.pad_w = pw;
  p.count_include_pad = include_pad;
  return p;
}

Shape PoolOut(const Shape& x, const PoolParams& p) {
  return {x[0], x[1], (x[2] + 2 * p.ph() - p.kh()) / p.sh() + 1, (x[3] + 2 * p.pw() - p.kw()) / p.sw() + 1};
}

TEST_F(CudaGraphOps, AveragePoolingWithAndWithoutPaddingInTheCount) {
  const PoolCase cases[] = {
      {{2, 3, 8, 8}, Pool(2, 2, 2, 2, 0, 0)},       {{2, 3, 7, 9}, Pool(3, 3, 2, 2, 1, 1, false)},
      {{2, 3, 7, 9}, Pool(3, 3, 2, 2, 1, 1, true)}, {{1, 4, 9, 6}, Pool(3, 2, 2, 1, 1, 0, false)},
      {{1, 4, 9, 6}, Pool(3, 2, 1, 2, 1, 1, true)},
  };
  for (const PoolCase& pc : cases) {
    const PoolParams& p = pc.p;
    const std::string tag = "avgpool " + S(pc.x) + " k" + std::to_string(p.kh()) + "x" + std::to_string(p.kw()) + " s" +
                            std::to_string(p.sh()) + "x" + std::to_string(p.sw()) + " p" + std::to_string(p.ph()) +
                            "x" + std::to_string(p.pw()) + (p.count_include_pad ? " include-pad" : " exclude-pad");
    const Shape ys = PoolOut(pc.x, p);
    Pair x = Random(pc.x), y = Empty(ys);
    ref_->AvgPoolForward(x.ref, p, y.ref);
    gpu_->AvgPoolForward(x.gpu, p, y.gpu);
    ExpectClose(y, tag + " y");
    Pair dy = Random(ys), dx = Empty(pc.x);
    ref_->AvgPoolBackward(dy.ref, p, dx.ref);
    gpu_->AvgPoolBackward(dy.gpu, p, dx.gpu);
    ExpectClose(dx, tag + " dx");
  }
}

TEST_F(CudaGraphOps, MaxPoolingWithRectangularWindows) {
  const PoolCase cases[] = {{{2, 3, 9, 6}, Pool(3, 2, 2, 1, 1, 0)}, {{1, 2, 7, 10}, Pool(2, 3, 1, 3, 0, 1)}};
  for (const PoolCase& pc : cases) {
    const Shape ys = PoolOut(pc.x, pc.p);
    Pair x = Random(pc.x), y = Empty(ys);
    Tensor wr, wg;
    ref_->MaxPoolForward(x.ref, pc.p, y.ref, wr);
    gpu_->MaxPoolForward(x.gpu, pc.p, y.gpu, wg);
    ExpectClose(y, "maxpool " + S(pc.x) + " y", 0);
    Pair dy = Random(ys), dx = Empty(pc.x);
    ref_->MaxPoolBackward(x.ref, y.ref, dy.ref, pc.p, wr, dx.ref);
    gpu_->MaxPoolBackward(x.gpu, y.gpu, dy.gpu, pc.p, wg, dx.gpu);
    ExpectClose(dx, "maxpool " + S(pc.x) + " dx");
  }
}

struct GeomConv {
  Shape x;
  int64_t o, kh, kw;
  ConvParams p;
  bool bias;
};

ConvParams Conv(int sh, int sw, int ph, int pw, int dh, int dw, int groups) {
  ConvParams p;
  p.stride = sh;
  p.stride_w = sw;
  p.pad = ph;
  p.pad_w = pw;
  p.dilation = dh;
  p.dilation_w = dw;
  p.groups = groups;
  return p;
}

TEST_F(CudaGraphOps, ConvolutionWithGroupsDilationAndRectangularGeometry) {
  const GeomConv cases[] = {
      {{2, 4, 9, 9}, 6, 3, 3, Conv(1, 1, 1, 1, 1, 1, 2), true},     // two groups
      {{2, 6, 8, 8}, 6, 3, 3, Conv(1, 1, 1, 1, 1, 1, 6), true},     // depthwise
      {{2, 3, 11, 11}, 4, 3, 3, Conv(1, 1, 2, 2, 2, 2, 1), false},  // dilation 2
      {{2, 3, 10, 12}, 5, 3, 5, Conv(2, 1, 1, 2, 1, 1, 1), true},   // rectangular kernel, stride, pad
      {{1, 8, 12, 9}, 4, 2, 3, Conv(2, 3, 0, 1, 2, 1, 4), true},    // all of it at once
  };
  for (const GeomConv& gc : cases) {
    const ConvParams& p = gc.p;
    const std::string tag = "conv x " + S(gc.x) + " groups " + std::to_string(p.groups) + " dilation " +
                            std::to_string(p.dh()) + "x" + std::to_string(p.dw()) + " stride " +
                            std::to_string(p.sh()) + "x" + std::to_string(p.sw());
    const int64_t ho = ConvParams::OutSize(gc.x[2], gc.kh, p.sh(), p.ph(), p.dh());
    const int64_t wo = ConvParams::OutSize(gc.x[3], gc.kw, p.sw(), p.pw(), p.dw());
    ASSERT_GT(ho, 0);
    ASSERT_GT(wo, 0);
    Pair x = Random(gc.x);
    Pair w = Random({gc.o, gc.x[1] / p.groups, gc.kh, gc.kw}, -0.5f, 0.5f);
    Pair b = gc.bias ? Random({gc.o}) : Pair{};
    Pair y = Empty({gc.x[0], gc.o, ho, wo});
    ref_->ConvForward(x.ref, w.ref, b.ref, p, y.ref);
    gpu_->ConvForward(x.gpu, w.gpu, b.gpu, p, y.gpu);
    ExpectClose(y, tag + " y");
    Pair dy = Random(y.ref.shape()), dx = Empty(gc.x);
    Pair dw = Random(w.ref.shape()), db = Random({gc.o});
    ref_->ConvBackward(x.ref, w.ref, dy.ref, p, &dx.ref, dw.ref, gc.bias ? &db.ref : nullptr);
    gpu_->ConvBackward(x.gpu, w.gpu, dy.gpu, p, &dx.gpu, dw.gpu, gc.bias ? &db.gpu : nullptr);
    ExpectClose(dx, tag + " dx");
    ExpectClose(dw, tag + " dw");
    ExpectClose(db, tag + " db");
  }
}

// Plans are cached per geometry: the same shapes with another dilation or group count must
// not reuse a plan made for the first.
TEST_F(CudaGraphOps, ConvolutionPlanCacheKeysEveryGeometryField) {
  Pair x = Random({1, 4, 10, 10});
  for (const ConvParams& p : {Conv(1, 1, 1, 1, 1, 1, 1), Conv(1, 1, 1, 1, 2, 2, 1), Conv(1, 2, 1, 1, 1, 1, 1),
                              Conv(1, 1, 1, 0, 1, 1, 1), Conv(1, 1, 1, 1, 1, 1, 2)}) {
    const int64_t ho = ConvParams::OutSize(10, 3, p.sh(), p.ph(), p.dh());
    const int64_t wo = ConvParams::OutSize(10, 3, p.sw(), p.pw(), p.dw());
    Pair w = Random({4, 4 / p.groups, 3, 3});
    Pair y = Empty({1, 4, ho, wo});
    ref_->ConvForward(x.ref, w.ref, Tensor(), p, y.ref);
    gpu_->ConvForward(x.gpu, w.gpu, Tensor(), p, y.gpu);
    ExpectClose(y, "conv dilation " + std::to_string(p.dh()) + " stride_w " + std::to_string(p.sw()) + " pad_w " +
                       std::to_string(p.pw()) + " groups " + std::to_string(p.groups));
  }
}

// ---- dropout

TEST_F(CudaGraphOps, DropoutMaskEqualsTheCpusForTheSameSeed) {
  const Shape s = {7, 1433};
  for (uint64_t seed : {uint64_t(0), uint64_t(42), uint64_t(0xDEADBEEFCAFEull)}) {
    for (float ratio : {0.f, 0.1f, 0.5f, 0.9f}) {
      const std::string tag = "seed " + std::to_string(seed) + " ratio " + std::to_string(ratio);
      Pair m = Empty(s);
      ref_->DropoutMask(seed, ratio, m.ref);
      gpu_->DropoutMask(seed, ratio, m.gpu);
      const std::vector<float> c = Host(*ref_, m.ref), g = Host(*gpu_, m.gpu);
      const float keep = 1.0f / (1.0f - ratio);
      int64_t differ = 0, off_hash = 0, dropped = 0;
      for (size_t i = 0; i < g.size(); ++i) {
        differ += (c[i] == 0.f) != (g[i] == 0.f) || std::fabs(c[i] - g[i]) > 1e-6f * keep;
        // backend.h's hash, independently of either backend.
        const float want = HashUniform(seed, i) < ratio ? 0.f : keep;
        off_hash += g[i] != want;
        dropped += g[i] == 0.f;
      }
      EXPECT_EQ(differ, 0) << tag << ": CUDA and CPU masks differ";
      EXPECT_EQ(off_hash, 0) << tag << ": CUDA mask differs from HashUniform";
      const double frac = double(dropped) / double(g.size());
      EXPECT_NEAR(frac, ratio, 0.02) << tag;
    }
  }
}

}  // namespace
}  // namespace shoal
