// CpuBackend against naive loops and hand-worked values, at the zoo's real shapes (where
// oneDNN picks blocked layouts and reorders at the boundary).
#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "tests/engine/grad_check.h"

namespace shoal {
namespace {

using namespace testing_util;

// y[n,o,i,j] = b[o] + sum_c,kh,kw x[n,c,i*s-p+kh, j*s-p+kw] w[o,c,kh,kw]
std::vector<double> NaiveConv(const std::vector<float>& x, const Shape& xs, const std::vector<float>& w,
                              const Shape& ws, const std::vector<float>& b, int s, int p, Shape* ys) {
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], O = ws[0], K = ws[2];
  const int64_t Ho = (H + 2 * p - K) / s + 1, Wo = (W + 2 * p - K) / s + 1;
  *ys = {N, O, Ho, Wo};
  std::vector<double> y(size_t(N * O * Ho * Wo));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < Ho; ++i)
        for (int64_t j = 0; j < Wo; ++j) {
          double acc = b.empty() ? 0.0 : b[size_t(o)];
          for (int64_t c = 0; c < C; ++c)
            for (int64_t kh = 0; kh < K; ++kh)
              for (int64_t kw = 0; kw < K; ++kw) {
                const int64_t h = i * s - p + kh, ww = j * s - p + kw;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                acc += double(x[size_t(((n * C + c) * H + h) * W + ww)]) *
                       double(w[size_t(((o * C + c) * K + kh) * K + kw)]);
              }
          y[size_t(((n * O + o) * Ho + i) * Wo + j)] = acc;
        }
  return y;
}

struct ConvCase {
  Shape x, w;
  int stride, pad;
};

class CpuConv : public ::testing::TestWithParam<ConvCase> {};

TEST_P(CpuConv, ForwardAndBackwardMatchNaiveLoops) {
  const ConvCase c = GetParam();
  auto be = MakeCpuBackend(2);
  std::mt19937_64 rng(3);
  Tensor x = Random(*be, c.x, rng), w = Random(*be, c.w, rng), b = Random(*be, {c.w[0]}, rng);
  Shape ys;
  std::vector<double> ref = NaiveConv(Host(*be, x), c.x, Host(*be, w), c.w, Host(*be, b), c.stride, c.pad, &ys);
  Tensor y = be->Empty(ys);
  ConvParams p{c.stride, c.pad};
  be->ConvForward(x, w, b, p, y);
  std::vector<float> got = Host(*be, y);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], ref[i], 1e-4 * (1 + std::fabs(ref[i]))) << "y[" << i << "]";

  // Backward through L = sum(y * r): dw = sum r x-patches, dx = transposed conv; checked
  // by linearity: <dx, x> + <db, 1> ... is awkward, so compare with a naive dx/dw.
  std::vector<float> r = Host(*be, Random(*be, ys, rng));
  Tensor dy = be->Empty(ys);
  be->CopyFromHost(dy, r.data());
  Tensor dx = be->Empty(c.x), dw = be->Zeros(c.w), db = be->Zeros({c.w[0]});
  be->Fill(dw, 1.0f);  // gradients accumulate: start from 1 to see it
  be->ConvBackward(x, w, dy, p, &dx, dw, &db);
  // <dy, conv(x, w)> is bilinear: <dx, x> and <dw, w> both equal it (bias-free part).
  std::vector<double> nob = NaiveConv(Host(*be, x), c.x, Host(*be, w), c.w, {}, c.stride, c.pad, &ys);
  double lhs = 0, bsum = 0;
  for (size_t i = 0; i < nob.size(); ++i) lhs += nob[i] * r[i];
  std::vector<float> dxh = Host(*be, dx), xh = Host(*be, x), dwh = Host(*be, dw), wh = Host(*be, w),
                     dbh = Host(*be, db);
  double xdx = 0, wdw = 0;
  for (size_t i = 0; i < xh.size(); ++i) xdx += double(xh[i]) * dxh[i];
  for (size_t i = 0; i < wh.size(); ++i) wdw += double(wh[i]) * (dwh[i] - 1.0);
  for (int64_t o = 0; o < c.w[0]; ++o) {
    double s = 0;
    for (int64_t n = 0; n < ys[0]; ++n)
      for (int64_t k = 0; k < ys[2] * ys[3]; ++k) s += r[size_t((n * ys[1] + o) * ys[2] * ys[3] + k)];
    ASSERT_NEAR(dbh[size_t(o)], s, 1e-3 * (1 + std::fabs(s))) << "db[" << o << "]";
    bsum += s;
  }
  EXPECT_NEAR(xdx, lhs, 1e-4 * (1 + std::fabs(lhs)));
  EXPECT_NEAR(wdw, lhs, 1e-4 * (1 + std::fabs(lhs)));
  // and one dw element by hand
  double dw0 = 0;
  for (int64_t n = 0; n < ys[0]; ++n)
    for (int64_t i = 0; i < ys[2]; ++i)
      for (int64_t j = 0; j < ys[3]; ++j) {
        const int64_t h = i * c.stride - c.pad, ww = j * c.stride - c.pad;
        if (h < 0 || ww < 0) continue;
        dw0 += double(r[size_t(((n * ys[1]) * ys[2] + i) * ys[3] + j)]) *
               xh[size_t((n * c.x[1] * c.x[2] + h) * c.x[3] + ww)];
      }
  EXPECT_NEAR(dwh[0] - 1.0, dw0, 1e-3 * (1 + std::fabs(dw0)));
}

TEST_P(CpuConv, SavedInputPathMatchesPlainBackward) {
  const ConvCase c = GetParam();
  auto be = MakeCpuBackend(1);
  std::mt19937_64 rng(4);
  Tensor x = Random(*be, c.x, rng), w = Random(*be, c.w, rng), b = Random(*be, {c.w[0]}, rng);
  ConvParams p{c.stride, c.pad};
  const int64_t ho = (c.x[2] + 2 * c.pad - c.w[2]) / c.stride + 1, wo = (c.x[3] + 2 * c.pad - c.w[3]) / c.stride + 1;
  Tensor y1 = be->Empty({c.x[0], c.w[0], ho, wo}), y2 = be->Empty(y1.shape()), saved;
  be->ConvForward(x, w, b, p, y1);
  be->ConvForwardTrain(x, w, b, p, y2, saved);
  EXPECT_EQ(Host(*be, y1), Host(*be, y2));
  // another forward of the same shape in between must not disturb this call site's copy
  Tensor x2 = Random(*be, c.x, rng), y3 = be->Empty(y1.shape()), saved2;
  be->ConvForwardTrain(x2, w, b, p, y3, saved2);
  Tensor dy = Random(*be, y1.shape(), rng);
  Tensor dx1 = be->Empty(c.x), dx2 = be->Empty(c.x), dw1 = be->Zeros(c.w), dw2 = be->Zeros(c.w);
  Tensor db1 = be->Zeros({c.w[0]}), db2 = be->Zeros({c.w[0]});
  be->ConvBackward(x, w, dy, p, &dx1, dw1, &db1);
  be->ConvBackwardSaved(x, saved, w, dy, p, &dx2, dw2, &db2);
  EXPECT_EQ(Host(*be, dx1), Host(*be, dx2));
  EXPECT_EQ(Host(*be, dw1), Host(*be, dw2));
  EXPECT_EQ(Host(*be, db1), Host(*be, db2));
}

// dx element by element against the naive transposed convolution, for training (saved
// input) and plain backward alike.
TEST_P(CpuConv, InputGradientMatchesNaiveElementwise) {
  const ConvCase c = GetParam();
  auto be = MakeCpuBackend(1);
  std::mt19937_64 rng(9);
  Tensor x = Random(*be, c.x, rng), w = Random(*be, c.w, rng);
  ConvParams p{c.stride, c.pad};
  const int64_t N = c.x[0], C = c.x[1], H = c.x[2], W = c.x[3], O = c.w[0], K = c.w[2];
  const int64_t Ho = (H + 2 * c.pad - K) / c.stride + 1, Wo = (W + 2 * c.pad - K) / c.stride + 1;
  Tensor y = be->Empty({N, O, Ho, Wo}), saved;
  be->ConvForwardTrain(x, w, Tensor(), p, y, saved);
  Tensor dy = Random(*be, y.shape(), rng);
  const std::vector<float> r = Host(*be, dy), wh = Host(*be, w);
  std::vector<double> ref(size_t(x.numel()), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < Ho; ++i)
        for (int64_t j = 0; j < Wo; ++j)
          for (int64_t ch = 0; ch < C; ++ch)
            for (int64_t kh = 0; kh < K; ++kh)
              for (int64_t kw = 0; kw < K; ++kw) {
                const int64_t h = i * c.stride - c.pad + kh, ww = j * c.stride - c.pad + kw;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                ref[size_t(((n * C + ch) * H + h) * W + ww)] +=
                    double(r[size_t(((n * O + o) * Ho + i) * Wo + j)]) * wh[size_t(((o * C + ch) * K + kh) * K + kw)];
              }
  for (bool use_saved : {true, false}) {
    Tensor dx = be->Empty(c.x), dw = be->Zeros(c.w);
    if (use_saved)
      be->ConvBackwardSaved(x, saved, w, dy, p, &dx, dw, nullptr);
    else
      be->ConvBackward(x, w, dy, p, &dx, dw, nullptr);
    const std::vector<float> got = Host(*be, dx);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], ref[i], 1e-3 * (1 + std::fabs(ref[i]))) << "dx[" << i << "] saved " << use_saved;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuConv,
                         ::testing::Values(ConvCase{{4, 1, 28, 28}, {32, 1, 5, 5}, 1, 0},        // lenet conv1
                                           ConvCase{{4, 32, 12, 12}, {64, 32, 5, 5}, 1, 0},      // lenet conv2
                                           ConvCase{{2, 16, 16, 16}, {32, 16, 3, 3}, 2, 1},      // resnet20 downsample
                                           ConvCase{{2, 3, 11, 11}, {8, 3, 7, 7}, 2, 3},         // resnet50 stem
                                           ConvCase{{16, 512, 2, 2}, {512, 512, 3, 3}, 1, 1}));  // resnet18 layer4

TEST(CpuBackend, LinearAccumulatesWeightGradients) {
  auto be = MakeCpuBackend(1);
  // x = [[1,2]], w = [[1,0],[0,1],[1,1]], b = [0.5,0,-1] -> y = [1.5, 2, 2]
  float xv[] = {1, 2}, wv[] = {1, 0, 0, 1, 1, 1}, bv[] = {0.5f, 0, -1};
  Tensor x = be->Empty({1, 2}), w = be->Empty({3, 2}), b = be->Empty({3}), y = be->Empty({1, 3});
  be->CopyFromHost(x, xv);
  be->CopyFromHost(w, wv);
  be->CopyFromHost(b, bv);
  be->LinearForward(x, w, b, y);
  EXPECT_EQ(Host(*be, y), (std::vector<float>{1.5f, 2, 2}));
  float dyv[] = {1, -1, 2};
  Tensor dy = be->Empty({1, 3}), dx = be->Empty({1, 2}), dw = be->Zeros({3, 2}), db = be->Zeros({3});
  be->CopyFromHost(dy, dyv);
  be->LinearBackward(x, w, dy, &dx, dw, &db);
  be->LinearBackward(x, w, dy, &dx, dw, &db);  // twice: dw, db double, dx does not
  EXPECT_EQ(Host(*be, dx), (std::vector<float>{3, 1}));
  EXPECT_EQ(Host(*be, dw), (std::vector<float>{2, 4, -2, -4, 4, 8}));
  EXPECT_EQ(Host(*be, db), (std::vector<float>{2, -2, 4}));
}

// c = alpha a b + beta c for any alpha and beta (the Backend contract; ONNX's Gemm asks for them),
// against a naive loop, with a transposed b shared by every batch.
TEST(CpuBackend, MatMulWithAnyAlphaAndBeta) {
  auto be = MakeCpuBackend(1);
  const int64_t B = 2, M = 3, N = 4, K = 5;
  std::vector<float> a(B * M * K), b(N * K), c0(B * M * N);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(int(i % 7) - 3) / 4;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(int(i % 5) - 2) / 2;
  for (size_t i = 0; i < c0.size(); ++i) c0[i] = float(int(i % 3) - 1);
  for (auto [alpha, beta] : {std::pair{2.f, -0.5f}, {1.f, 1.f}, {0.5f, 0.f}, {0.f, 3.f}, {-1.f, -1.f}}) {
    Tensor ta = be->Empty({B, M, K}), tb = be->Empty({1, N, K}), tc = be->Empty({B, M, N});
    be->CopyFromHost(ta, a.data());
    be->CopyFromHost(tb, b.data());
    be->CopyFromHost(tc, c0.data());
    be->MatMul(ta, false, tb, true, tc, alpha, beta);
    const std::vector<float> got = Host(*be, tc);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k) s += double(a[(i * M + m) * K + k]) * b[n * K + k];
          const size_t at = size_t((i * M + m) * N + n);
          EXPECT_NEAR(got[at], alpha * s + beta * c0[at], 1e-5) << "alpha " << alpha << " beta " << beta;
        }
  }
}

TEST(CpuBackend, SoftmaxCrossEntropyValues) {
  auto be = MakeCpuBackend(1);
  float zv[] = {0, 0, 0, 0, 2, 0};  // two rows of K=3
  Tensor z = be->Empty({2, 3});
  be->CopyFromHost(z, zv);
  int32_t labels[] = {1, 1};
  int64_t correct = 0;
  Tensor d = be->Empty({2, 3});
  const float loss = be->SoftmaxCrossEntropy(z, labels, 0.0f, &d, &correct);
  const double l2 = std::log(1 + 2 * std::exp(-2.0));
  EXPECT_NEAR(loss, (std::log(3.0) + l2) / 2, 1e-6);
  EXPECT_EQ(correct, 1);  // row 0 ties -> argmax 0; row 1 -> 1
  std::vector<float> dh = Host(*be, d);
  EXPECT_NEAR(dh[0], (1.0 / 3) / 2, 1e-6);
  EXPECT_NEAR(dh[1], (1.0 / 3 - 1) / 2, 1e-6);
  // smoothing 0.3, K=3: targets 0.1/0.8/0.1; row 0 (uniform logits) stays log 3
  const double row1 = std::log(2 + std::exp(2.0)) - 0.8 * 2;
  EXPECT_NEAR(be->SoftmaxCrossEntropy(z, labels, 0.3f, nullptr, nullptr), (std::log(3.0) + row1) / 2, 1e-6);
  int32_t bad[] = {1, 3};
  try {
    be->SoftmaxCrossEntropy(z, bad, 0.0f, nullptr, nullptr);
    FAIL() << "no error for an out-of-range label";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 3 at batch index 1"), std::string::npos) << e.what();
  }
}

TEST(CpuBackend, BatchNormUpdatesRunningStatsWithUnbiasedVariance) {
  auto be = MakeCpuBackend(1);
  float xv[] = {1, 2, 3, 6};  // [4,1]: mean 3, biased var 3.5, unbiased 14/3
  Tensor x = be->Empty({4, 1}), y = be->Empty({4, 1});
  be->CopyFromHost(x, xv);
  Tensor g = be->Empty({1}), b = be->Empty({1}), rm = be->Zeros({1}), rv = be->Empty({1}), sm = be->Empty({1}),
         si = be->Empty({1});
  be->Fill(g, 2.0f);
  be->Fill(b, 1.0f);
  be->Fill(rv, 1.0f);
  be->BatchNormForwardTrain(x, g, b, 0.0f + 1e-5f, 0.1f, rm, rv, sm, si, y);
  EXPECT_NEAR(Host(*be, rm)[0], 0.3, 1e-6);
  EXPECT_NEAR(Host(*be, rv)[0], 0.9 + 0.1 * 14.0 / 3.0, 1e-5);
  EXPECT_NEAR(Host(*be, sm)[0], 3.0, 1e-6);
  EXPECT_NEAR(Host(*be, si)[0], 1 / std::sqrt(3.5 + 1e-5), 1e-6);
  EXPECT_NEAR(Host(*be, y)[3], 2 * 3 / std::sqrt(3.5 + 1e-5) + 1, 1e-5);
}

TEST(CpuBackend, MaxPoolAndGlobalAvgPool) {
  auto be = MakeCpuBackend(1);
  float xv[] = {1, 5, 2, 0, 3, 4, 9, 1, 0, 0, 1, 1, 7, 0, 1, 8};  // [1,1,4,4]
  Tensor x = be->Empty({1, 1, 4, 4}), y = be->Empty({1, 1, 2, 2}), ws;
  be->CopyFromHost(x, xv);
  be->MaxPoolForward(x, PoolParams{2, 2, 0}, y, ws);
  EXPECT_EQ(Host(*be, y), (std::vector<float>{5, 9, 7, 8}));
  float dyv[] = {1, 2, 3, 4};
  Tensor dy = be->Empty({1, 1, 2, 2}), dx = be->Empty({1, 1, 4, 4});
  be->CopyFromHost(dy, dyv);
  be->MaxPoolBackward(x, y, dy, PoolParams{2, 2, 0}, ws, dx);
  std::vector<float> want(16, 0.0f);
  want[1] = 1, want[6] = 2, want[12] = 3, want[15] = 4;
  EXPECT_EQ(Host(*be, dx), want);
  Tensor g = be->Empty({1, 1});
  be->GlobalAvgPoolForward(x, g);
  EXPECT_FLOAT_EQ(Host(*be, g)[0], 43.0f / 16);
}

TEST(CpuBackend, ShapeMismatchIsAClearError) {
  auto be = MakeCpuBackend(1);
  Tensor x = be->Zeros({2, 3, 8, 8}), w = be->Zeros({4, 5, 3, 3}), y = be->Empty({2, 4, 6, 6});
  EXPECT_THROW(be->ConvForward(x, w, Tensor(), ConvParams{}, y), Error);
  Tensor w2 = be->Zeros({4, 3, 3, 3}), bad = be->Empty({2, 4, 5, 5});
  try {
    be->ConvForward(x, w2, Tensor(), ConvParams{}, bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2,4,6,6]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ParseDevice("gpu0"), Error);
  EXPECT_EQ(ParseDevice("cuda:3").index, 3);
  EXPECT_TRUE(ParseDevice("cpu").is_cpu());
}

TEST(CpuBackend, ThreadsSetting) {
  auto one = MakeCpuBackend(1);
  EXPECT_NE(one->Name().find("x1 threads"), std::string::npos) << one->Name();
  EXPECT_THROW(MakeCpuBackend(-1), Error);
  auto all = MakeBackend(ParseDevice("cpu"), 0);
  EXPECT_TRUE(all->device().is_cpu());
}

// [model] precision = "bf16"/"fp16" on cuda:N reaches the CUDA backend's mixed mode (once
// refused as "not built yet"): here, without a device, the only complaint is the device.
TEST(MakeBackend, MixedPrecisionOnCudaIsPassedToTheCudaBackend) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    try {
      auto be = MakeBackend(ParseDevice("cuda:0"), 0, dt);
      EXPECT_EQ(be->compute_dtype(), dt);  // a machine with a GPU
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find("no CUDA device"), 0u) << e.what();
    }
  }
}

TEST(CpuBackend, SumSquaresAndAxpy) {
  auto be = MakeCpuBackend(2);
  Tensor x = be->Empty({100000});
  be->Fill(x, 0.5f);
  EXPECT_NEAR(be->SumSquares(x), 25000.0, 1e-6);
  Tensor y = be->Zeros({100000});
  be->Axpy(-2.0f, x, y);
  be->Scale(3.0f, y);
  EXPECT_EQ(Host(*be, y)[99999], -3.0f);
}

}  // namespace
}  // namespace shoal
