// DGC: exact top-k selection, exact decode, residuals keep what was not sent, momentum
// correction and masking as in Lin et al. 2018, and the sparsity warm-up.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "algorithms/compressors/dgc_compressor.h"
#include "algorithms/compressors/topk.h"

namespace shoal {
namespace {

TEST(TopK, PicksExactlyTheKLargestMagnitudes) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd;
  for (int64_t n : {10, 1000, 100000}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = nd(rng);
    for (int64_t k : {int64_t(1), n / 100 + 1, n / 3}) {
      std::vector<int32_t> idx;
      std::vector<float> val;
      SampledTopK(x.data(), n, k, 5, rng, &idx, &val);
      ASSERT_EQ(int64_t(idx.size()), k);
      std::vector<float> mags;
      for (auto v : x) mags.push_back(std::fabs(v));
      std::sort(mags.rbegin(), mags.rend());
      float kth = mags[size_t(k - 1)];
      for (size_t t = 0; t < idx.size(); ++t) {
        EXPECT_GE(std::fabs(val[t]), kth);
        EXPECT_EQ(val[t], x[size_t(idx[t] - 5)]);
      }
      std::sort(idx.begin(), idx.end());
      EXPECT_EQ(std::unique(idx.begin(), idx.end()), idx.end());
    }
  }
}

TEST(Dgc, SparsityWarmup) {
  DgcOptions o;
  o.sparsity = 0.999;
  o.warmup_epochs = 4;
  DgcCompressor c(o, 1);
  EXPECT_DOUBLE_EQ(c.SparsityAt(0), 0.75);
  EXPECT_DOUBLE_EQ(c.SparsityAt(1.5), 0.9375);
  EXPECT_DOUBLE_EQ(c.SparsityAt(2), 1 - std::pow(0.25, 3));
  EXPECT_DOUBLE_EQ(c.SparsityAt(4), 0.999);
  EXPECT_EQ(DgcCompressor::KFor(1000, 0.999), 1);
  EXPECT_EQ(DgcCompressor::KFor(10000, 0.99), 100);
}

// With momentum 0 the accumulated residual plus everything sent equals the sum of all
// gradients: nothing is lost, only delayed.
TEST(Dgc, ResidualsKeepWhatWasNotSentAndDecodeIsExact) {
  DgcOptions o;
  o.sparsity = 0.9;
  o.warmup_epochs = 0;
  o.momentum = 0;
  DgcCompressor c(o, 7);
  const int64_t n = 2000;
  std::vector<float> w(static_cast<size_t>(n), 0.f), g(static_cast<size_t>(n));
  std::vector<ParamView> params = {{"t", w.data(), g.data(), n, false}};
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd;
  std::vector<double> total(static_cast<size_t>(n), 0.0);
  std::vector<float> decoded(static_cast<size_t>(n), 0.f);
  for (int step = 0; step < 20; ++step) {
    for (int64_t i = 0; i < n; ++i) {
      g[size_t(i)] = nd(rng);
      total[size_t(i)] += g[size_t(i)];
    }
    SparseGrad s = c.Compress(params, {0}, 10.0, 1);
    EXPECT_EQ(int64_t(s.idx.size()), DgcCompressor::KFor(n, 0.9));
    DgcCompressor::Decode(s, decoded.data(), n);
  }
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(decoded[size_t(i)] + c.residual()[0][size_t(i)], total[size_t(i)], 1e-4) << i;
}

// Momentum correction: u = m u + g, v += u; sent entries are cleared from u and v.
TEST(Dgc, MomentumCorrectionAndMasking) {
  DgcOptions o;
  o.sparsity = 0.5;  // 2 of 4 sent
  o.warmup_epochs = 0;
  o.momentum = 0.5;
  DgcCompressor c(o, 1);
  std::vector<float> w(4, 0.f), g = {4, 3, 0.5f, 0.25f};
  std::vector<ParamView> params = {{"t", w.data(), g.data(), 4, false}};
  SparseGrad s1 = c.Compress(params, {0}, 10, 1);
  std::vector<float> d1(4, 0.f);
  DgcCompressor::Decode(s1, d1.data(), 4);
  EXPECT_EQ(d1, (std::vector<float>{4, 3, 0, 0}));
  // step 2: u = [0+g0, 0+g1, 0.5*0.5+0.5, 0.5*0.25+0.25] = [4,3,0.75,0.375]; v = [4,3,1.25,0.625]
  SparseGrad s2 = c.Compress(params, {0}, 10, 1);
  std::vector<float> d2(4, 0.f);
  DgcCompressor::Decode(s2, d2.data(), 4);
  EXPECT_EQ(d2, (std::vector<float>{4, 3, 0, 0}));
  EXPECT_FLOAT_EQ(c.residual()[0][2], 1.25f);
  EXPECT_FLOAT_EQ(c.residual()[0][3], 0.625f);
}

TEST(Dgc, LocalClippingBoundsTheGlobalNorm) {
  DgcOptions o;
  o.sparsity = 0;  // send everything
  o.warmup_epochs = 0;
  o.momentum = 0;
  o.clip_norm = 2.0;
  DgcCompressor c(o, 1);
  std::vector<float> w(2, 0.f), g = {30, 40};  // norm 50
  std::vector<ParamView> params = {{"t", w.data(), g.data(), 2, false}};
  SparseGrad s = c.Compress(params, {0}, 10, 4);  // bound 2/sqrt(4) = 1
  std::vector<float> d(2, 0.f);
  DgcCompressor::Decode(s, d.data(), 2);
  EXPECT_NEAR(d[0], 0.6f, 1e-6);
  EXPECT_NEAR(d[1], 0.8f, 1e-6);
}

}  // namespace
}  // namespace shoal
