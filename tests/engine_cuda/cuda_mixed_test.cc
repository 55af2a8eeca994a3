// CudaBackend's mixed mode (compute bf16/fp16, fp32 at the interface; cuda_backend.h)
// against the same backend in exact fp32, and its cast+transpose kernels (layout_cast.h)
// against host rounding bit for bit. Skips, saying why, where no CUDA device is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/cuda/platform.h"
#include "common/dtype.h"
#include "worker/engine/backend.h"
#include "worker/engine/cuda/kernels.h"
#include "worker/engine/cuda/layout_cast.h"

namespace shoal {
namespace {

bool NoDevice(std::string* why) { return CudaDeviceCount(why) == 0; }

// max |a - b| over max |b|: narrow inputs (relative rounding 2^-9 for bf16, 2^-12 for fp16)
// over sums of a few hundred products stay well inside the tolerances below; a wrong
// layout, a missed accumulation or a dropped bias is off by O(1).
double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

std::vector<float> Sub(std::vector<float> a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] -= b[i];
  return a;
}

class CudaMixedMode : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    std::string why;
    if (NoDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
    exact_ = MakeCudaBackend(0);
    mixed_ = MakeCudaBackend(0, GetParam());
  }
  double Tol() const { return GetParam() == DType::kF16 ? 5e-3 : 3e-2; }

  std::vector<float> Rand(const Shape& s, float lo = -1.f, float hi = 1.f) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(size_t(NumElements(s)));
    for (float& x : v) x = u(rng_);
    return v;
  }
  Tensor On(Backend& b, const Shape& s, const std::vector<float>& v) {
    Tensor t = b.Empty(s);
    b.CopyFromHost(t, v.data());
    return t;
  }
  // NaN-filled outputs: an element the op leaves unwritten fails the comparison.
  Tensor Nans(Backend& b, const Shape& s) { return On(b, s, std::vector<float>(size_t(NumElements(s)), NAN)); }
  std::vector<float> Host(Backend& b, const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    b.CopyToHost(t, v.data());
    return v;
  }

  std::unique_ptr<Backend> exact_, mixed_;
  std::mt19937 rng_{7};
};

struct ConvCase {
  int64_t n, c, h, w, o, k;
  int stride, pad;
};

// NHWC cases (channels multiples of 8), stride 2, pad, 1x1, and the NCHW fallback (3 input
// channels, odd output channels).
const ConvCase kConvCases[] = {
    {2, 16, 8, 8, 32, 3, 1, 1}, {2, 16, 9, 9, 8, 3, 2, 1}, {3, 8, 5, 5, 16, 1, 1, 0},
    {4, 32, 8, 8, 64, 1, 2, 0}, {2, 3, 8, 8, 16, 3, 1, 1}, {2, 5, 7, 7, 7, 3, 2, 0},
};

TEST_P(CudaMixedMode, ReportsItsComputeType) {
  EXPECT_EQ(mixed_->compute_dtype(), GetParam());
  EXPECT_EQ(exact_->compute_dtype(), DType::kF32);
}

TEST_P(CudaMixedMode, ConvolutionAgreesWithFp32) {
  const double tol = Tol();
  for (const ConvCase& cc : kConvCases) {
    const std::string tag = std::string(DTypeName(GetParam())) + " x[" + std::to_string(cc.n) + "," +
                            std::to_string(cc.c) + "," + std::to_string(cc.h) + "," + std::to_string(cc.w) + "] o " +
                            std::to_string(cc.o) + " k " + std::to_string(cc.k) + " s " + std::to_string(cc.stride) +
                            " p " + std::to_string(cc.pad);
    SCOPED_TRACE(tag);
    ConvParams p;
    p.stride = cc.stride;
    p.pad = cc.pad;
    const int64_t ho = (cc.h + 2 * cc.pad - cc.k) / cc.stride + 1, wo = (cc.w + 2 * cc.pad - cc.k) / cc.stride + 1;
    const Shape xs{cc.n, cc.c, cc.h, cc.w}, ws{cc.o, cc.c, cc.k, cc.k}, ys{cc.n, cc.o, ho, wo};
    const auto x = Rand(xs), w = Rand(ws, -0.5f, 0.5f), b = Rand({cc.o}), dy = Rand(ys);
    // Nonzero starting gradients: the contract accumulates into them.
    const auto dw0 = Rand(ws, -4.f, 4.f), db0 = Rand({cc.o}, -4.f, 4.f);

    Backend& e = *exact_;
    Tensor ex = On(e, xs, x), ew = On(e, ws, w), eb = On(e, {cc.o}, b), edy = On(e, ys, dy);
    Tensor ey = Nans(e, ys), edx = Nans(e, xs), edw = On(e, ws, dw0), edb = On(e, {cc.o}, db0);
    e.ConvForward(ex, ew, eb, p, ey);
    e.ConvBackward(ex, ew, edy, p, &edx, edw, &edb);
    const auto ry = Host(e, ey), rdx = Host(e, edx), rdw = Host(e, edw), rdb = Host(e, edb);

    // Both entry points of the mixed backend: plain, and training with the saved NHWC x.
    Backend& m = *mixed_;
    Tensor mx = On(m, xs, x), mw = On(m, ws, w), mb = On(m, {cc.o}, b), mdy = On(m, ys, dy);
    for (bool train : {false, true}) {
      SCOPED_TRACE(train ? "ConvForwardTrain/ConvBackwardSaved" : "ConvForward/ConvBackward");
      Tensor my = Nans(m, ys), mdx = Nans(m, xs), mdw = On(m, ws, dw0), mdb = On(m, {cc.o}, db0), saved;
      if (train) {
        m.ConvForwardTrain(mx, mw, mb, p, my, saved);
        EXPECT_TRUE(saved.defined());
        EXPECT_EQ(saved.dtype(), GetParam());
        // NHWC where both channel counts are multiples of 8, else the NCHW fallback.
        const bool nhwc = cc.c % 8 == 0 && cc.o % 8 == 0;
        const Shape want = nhwc ? Shape{cc.n, cc.h, cc.w, cc.c} : xs;
        EXPECT_EQ(saved.shape(), want);
        m.ConvBackwardSaved(mx, saved, mw, mdy, p, &mdx, mdw, &mdb);
      } else {
        m.ConvForward(mx, mw, mb, p, my);
        m.ConvBackward(mx, mw, mdy, p, &mdx, mdw, &mdb);
      }
      EXPECT_EQ(my.dtype(), DType::kF32);
      EXPECT_LT(RelErr(Host(m, my), ry), tol) << "y";
      EXPECT_LT(RelErr(Host(m, mdx), rdx), tol) << "dx";
      EXPECT_LT(RelErr(Host(m, mdw), rdw), tol) << "dw";
      // The increments alone, so an overwrite instead of += cannot hide behind dw0.
      EXPECT_LT(RelErr(Sub(Host(m, mdw), dw0), Sub(rdw, dw0)), tol) << "dw increment";
      EXPECT_LT(RelErr(Sub(Host(m, mdb), db0), Sub(rdb, db0)), 1e-5) << "db increment (fp32 dy)";
    }
    // Without dx (the first layer): dw still accumulates.
    Tensor mdw = On(m, ws, dw0);
    m.ConvBackward(mx, mw, mdy, p, nullptr, mdw, nullptr);
    EXPECT_LT(RelErr(Sub(Host(m, mdw), dw0), Sub(rdw, dw0)), tol) << "dw increment, no dx";
  }
}

TEST_P(CudaMixedMode, LinearAgreesWithFp32) {
  const double tol = Tol();
  const int64_t cases[][3] = {{8, 64, 10}, {5, 33, 7}, {32, 128, 100}};
  for (const auto& cs : cases) {
    const int64_t n = cs[0], in = cs[1], out = cs[2];
    SCOPED_TRACE(std::string(DTypeName(GetParam())) + " linear " + std::to_string(n) + "x" + std::to_string(in) +
                 " -> " + std::to_string(out));
    const Shape xs{n, in}, ws{out, in}, ys{n, out};
    const auto x = Rand(xs), w = Rand(ws, -0.5f, 0.5f), b = Rand({out}), dy = Rand(ys);
    const auto dw0 = Rand(ws, -4.f, 4.f), db0 = Rand({out}, -4.f, 4.f);
    std::vector<float> r[4];
    for (Backend* be : {exact_.get(), mixed_.get()}) {
      Tensor tx = On(*be, xs, x), tw = On(*be, ws, w), tb = On(*be, {out}, b), tdy = On(*be, ys, dy);
      Tensor ty = Nans(*be, ys), tdx = Nans(*be, xs), tdw = On(*be, ws, dw0), tdb = On(*be, {out}, db0);
      be->LinearForward(tx, tw, tb, ty);
      be->LinearBackward(tx, tw, tdy, &tdx, tdw, &tdb);
      if (be == exact_.get()) {
        r[0] = Host(*be, ty), r[1] = Host(*be, tdx), r[2] = Host(*be, tdw), r[3] = Host(*be, tdb);
        continue;
      }
      EXPECT_LT(RelErr(Host(*be, ty), r[0]), tol) << "y";
      EXPECT_LT(RelErr(Host(*be, tdx), r[1]), tol) << "dx";
      EXPECT_LT(RelErr(Sub(Host(*be, tdw), dw0), Sub(r[2], dw0)), tol) << "dw increment";
      EXPECT_LT(RelErr(Sub(Host(*be, tdb), db0), Sub(r[3], db0)), 1e-5) << "db increment";
    }
  }
}

TEST_P(CudaMixedMode, NarrowTensorsAreRefused) {
  // The mixed mode's interface is fp32; narrow tensors are the fp32 backend's business.
  Tensor x = mixed_->Zeros({2, 8, 4, 4}, GetParam()), w = mixed_->Zeros({8, 8, 3, 3}, GetParam());
  Tensor y = mixed_->Zeros({2, 8, 2, 2}, GetParam());
  try {
    mixed_->ConvForward(x, w, Tensor(), ConvParams(), y);
    FAIL() << "narrow x accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("expected fp32"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Narrow, CudaMixedMode, ::testing::Values(DType::kF16, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(DTypeName(i.param)); });

// ---- the cast+transpose kernels against host rounding (common/dtype.h), bit for bit

class LayoutCast : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    std::string why;
    if (NoDevice(&why)) GTEST_SKIP() << "no CUDA device: " << why;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
  int Type() const { return GetParam() == DType::kF16 ? cudak::kF16 : cudak::kBF16; }
  uint16_t ToNarrow(float f) const { return GetParam() == DType::kF16 ? FloatToHalf(f) : FloatToBf16(f); }
  float FromNarrow(uint16_t h) const { return GetParam() == DType::kF16 ? HalfToFloat(h) : Bf16ToFloat(h); }

  // Values that exercise rounding: ties, subnormals, overflow, infinities, NaN.
  std::vector<float> Values(size_t n) {
    std::vector<float> v(n);
    std::uniform_real_distribution<float> u(-3.f, 3.f);
    std::uniform_int_distribution<uint32_t> bits;
    const float special[] = {
        0.f,      -0.f,      1e-8f, -3e-6f,           65504.f,          65520.f,         1e5f,           3e38f,
        INFINITY, -INFINITY, NAN,   1.f + 1.f / 2048, 1.f + 3.f / 2048, 1.f + 1.f / 256, 1.f + 3.f / 256};
    for (size_t i = 0; i < n; ++i) {
      if (i % 7 == 3) {
        v[i] = special[(i / 7) % (sizeof(special) / sizeof(special[0]))];
      } else if (i % 7 == 5) {
        uint32_t b = bits(rng_);
        std::memcpy(&v[i], &b, 4);  // any bit pattern
      } else {
        v[i] = u(rng_);
      }
    }
    return v;
  }
  template <typename T>
  T* Dev(size_t n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(T) + 1), cudaSuccess);
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  void TearDown() override {
    for (void* p : ptrs_) cudaFree(p);
  }
  std::vector<void*> ptrs_;
  std::mt19937 rng_{11};
};

TEST_P(LayoutCast, ToNhwcAndBackMatchHostBitForBit) {
  // [n, c, hw]: tiles cut in both directions, c = 1 (the plain-cast path), hw = 1.
  const int64_t shapes[][3] = {{2, 3, 5}, {3, 40, 70}, {1, 64, 1}, {2, 1, 1000}, {5, 33, 33}, {1, 1, 1}};
  for (const auto& s : shapes) {
    const int64_t n = s[0], c = s[1], hw = s[2];
    const size_t total = size_t(n * c * hw);
    SCOPED_TRACE("n " + std::to_string(n) + " c " + std::to_string(c) + " hw " + std::to_string(hw));
    const std::vector<float> src = Values(total);
    float* d_src = Dev<float>(total);
    uint16_t* d_mid = Dev<uint16_t>(total);
    ASSERT_EQ(cudaMemcpy(d_src, src.data(), total * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudak::NchwToNhwc(d_src, d_mid, Type(), n, c, hw, nullptr), cudaSuccess);
    std::vector<uint16_t> mid(total);
    ASSERT_EQ(cudaMemcpy(mid.data(), d_mid, total * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < c; ++k)
        for (int64_t p = 0; p < hw; ++p) {
          const uint16_t want = ToNarrow(src[size_t((i * c + k) * hw + p)]);
          const uint16_t got = mid[size_t((i * hw + p) * c + k)];
          if (got != want && ++bad <= 5)
            ADD_FAILURE() << "to NHWC at " << i << "," << k << "," << p << ": " << got << " != " << want;
        }
    EXPECT_EQ(bad, 0);

    // Back, with a bias and accumulating onto a starting value: v = narrow + bias[k] + old.
    std::vector<float> bias(static_cast<size_t>(c)), old(total);
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    for (float& b : bias) b = u(rng_);
    for (float& o : old) o = u(rng_);
    float* d_bias = Dev<float>(size_t(c));
    float* d_out = Dev<float>(total);
    ASSERT_EQ(cudaMemcpy(d_bias, bias.data(), size_t(c) * 4, cudaMemcpyHostToDevice), cudaSuccess);
    for (bool acc : {false, true}) {
      ASSERT_EQ(cudaMemcpy(d_out, old.data(), total * 4, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudak::NhwcToNchw(d_mid, Type(), d_out, c == 1 ? nullptr : d_bias, acc, n, c, hw, nullptr),
                cudaSuccess);
      std::vector<float> out(total);
      ASSERT_EQ(cudaMemcpy(out.data(), d_out, total * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      bad = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < c; ++k)
          for (int64_t p = 0; p < hw; ++p) {
            const size_t at = size_t((i * c + k) * hw + p);
            float want = FromNarrow(mid[size_t((i * hw + p) * c + k)]);
            if (c != 1) want += bias[size_t(k)];
            if (acc) want += old[at];
            uint32_t wb, gb;
            std::memcpy(&wb, &want, 4);
            std::memcpy(&gb, &out[at], 4);
            const bool same = wb == gb || (std::isnan(want) && std::isnan(out[at]));
            if (!same && ++bad <= 5)
              ADD_FAILURE() << "to NCHW (acc " << acc << ") at " << i << "," << k << "," << p << ": " << out[at]
                            << " != " << want;
          }
      EXPECT_EQ(bad, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Narrow, LayoutCast, ::testing::Values(DType::kF16, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(DTypeName(i.param)); });

}  // namespace
}  // namespace shoal
