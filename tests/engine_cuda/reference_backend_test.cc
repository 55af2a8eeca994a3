// The host reference that cuda_backend_test trusts is itself checked here: every backward
// against central finite differences of its forward, and the batch-norm statistics and loss
// against values worked out by hand.
#include "tests/engine_cuda/reference_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace shoal {
namespace {

class ReferenceBackend : public ::testing::Test {
 protected:
  Tensor Random(const Shape& s) {
    Tensor t = b_->Empty(s);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng_);
    return t;
  }
  Tensor Filled(const Shape& s, float v) {
    Tensor t = b_->Empty(s);
    b_->Fill(t, v);
    return t;
  }
  static double Dot(const Tensor& a, const Tensor& r) {
    double acc = 0;
    for (int64_t i = 0; i < a.numel(); ++i) acc += double(a.data<float>()[i]) * r.data<float>()[i];
    return acc;
  }
  // Compares grad with d loss / d t by central differences, element by element.
  void ExpectGradient(Tensor& t, const Tensor& grad, const std::function<double()>& loss, const std::string& what) {
    const float h = 1e-2f;
    for (int64_t i = 0; i < t.numel(); ++i) {
      float& v = t.data<float>()[i];
      const float keep = v;
      v = keep + h;
      const double up = loss();
      v = keep - h;
      const double down = loss();
      v = keep;
      const double fd = (up - down) / (2 * h);
      ASSERT_NEAR(grad.data<float>()[i], fd, 2e-3 * (1 + std::fabs(fd))) << what << " [" << i << "]";
    }
  }

  std::unique_ptr<Backend> b_ = MakeHostReferenceBackend();
  std::mt19937 rng_{7};
};

TEST_F(ReferenceBackend, ConvGradients) {
  ConvParams p;
  p.stride = 2;
  p.pad = 1;
  Tensor x = Random({2, 2, 5, 5}), w = Random({3, 2, 3, 3}), b = Random({3});
  Tensor y = b_->Empty({2, 3, 3, 3}), r = Random({2, 3, 3, 3});
  auto loss = [&] {
    b_->ConvForward(x, w, b, p, y);
    return Dot(y, r);
  };
  Tensor dx = b_->Empty(x.shape()), dw = Filled(w.shape(), 0.f), db = Filled({3}, 0.f);
  b_->ConvBackward(x, w, r, p, &dx, dw, &db);
  ExpectGradient(x, dx, loss, "conv dx");
  ExpectGradient(w, dw, loss, "conv dw");
  ExpectGradient(b, db, loss, "conv db");
}

TEST_F(ReferenceBackend, BatchNormGradients) {
  Tensor x = Random({3, 2, 2, 2}), gamma = Random({2}), beta = Random({2});
  Tensor rm = Filled({2}, 0.f), rv = Filled({2}, 1.f), sm = b_->Empty({2}), si = b_->Empty({2});
  Tensor y = b_->Empty(x.shape()), r = Random(x.shape());
  auto loss = [&] {
    b_->BatchNormForwardTrain(x, gamma, beta, 1e-5f, 0.1f, rm, rv, sm, si, y);
    return Dot(y, r);
  };
  loss();
  Tensor dx = b_->Empty(x.shape()), dg = Filled({2}, 0.f), dbeta = Filled({2}, 0.f);
  b_->BatchNormBackward(x, r, gamma, sm, si, 1e-5f, dx, dg, dbeta);
  ExpectGradient(x, dx, loss, "bn dx");
  ExpectGradient(gamma, dg, loss, "bn dgamma");
  ExpectGradient(beta, dbeta, loss, "bn dbeta");
}

TEST_F(ReferenceBackend, BatchNormStatisticsByHand) {
  Tensor x = b_->Empty({2, 1});
  x.data<float>()[0] = 1.f;
  x.data<float>()[1] = 3.f;  // mean 2, biased variance 1, unbiased variance 2
  Tensor g = Filled({1}, 1.f), be = Filled({1}, 0.f), rm = Filled({1}, 10.f), rv = Filled({1}, 10.f);
  Tensor sm = b_->Empty({1}), si = b_->Empty({1}), y = b_->Empty({2, 1});
  b_->BatchNormForwardTrain(x, g, be, 0.f + 1e-5f, 0.25f, rm, rv, sm, si, y);
  EXPECT_FLOAT_EQ(rm.data<float>()[0], 0.75f * 10 + 0.25f * 2);
  EXPECT_FLOAT_EQ(rv.data<float>()[0], 0.75f * 10 + 0.25f * 2);
  EXPECT_FLOAT_EQ(sm.data<float>()[0], 2.f);
  EXPECT_NEAR(si.data<float>()[0], 1 / std::sqrt(1 + 1e-5), 1e-6);
  EXPECT_NEAR(y.data<float>()[0], -1.f, 1e-4);
}

TEST_F(ReferenceBackend, PoolingAndLinearGradients) {
  PoolParams p;
  p.kernel = 3;
  p.stride = 2;
  p.pad = 1;
  // Distinct values 0.1 apart: a finite-difference step cannot change which one is the max.
  Tensor x = b_->Empty({1, 2, 5, 5}), y = b_->Empty({1, 2, 3, 3}), r = Random({1, 2, 3, 3}), ws;
  std::vector<int> order(50);
  for (int i = 0; i < 50; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng_);
  for (int i = 0; i < 50; ++i) x.data<float>()[i] = 0.1f * float(order[i]) - 2.5f;
  auto pool = [&] {
    b_->MaxPoolForward(x, p, y, ws);
    return Dot(y, r);
  };
  pool();
  Tensor dx = b_->Empty(x.shape());
  b_->MaxPoolBackward(x, y, r, p, ws, dx);
  ExpectGradient(x, dx, pool, "maxpool dx");

  Tensor ga = b_->Empty({1, 2}), ra = Random({1, 2});
  auto avg = [&] {
    b_->GlobalAvgPoolForward(x, ga);
    return Dot(ga, ra);
  };
  b_->GlobalAvgPoolBackward(ra, dx);
  ExpectGradient(x, dx, avg, "avgpool dx");

  Tensor a = Random({4, 5}), w = Random({3, 5}), bias = Random({3}), out = b_->Empty({4, 3});
  Tensor rl = Random({4, 3});
  auto lin = [&] {
    b_->LinearForward(a, w, bias, out);
    return Dot(out, rl);
  };
  Tensor da = b_->Empty(a.shape()), dw = Filled(w.shape(), 0.f), db = Filled({3}, 0.f);
  b_->LinearBackward(a, w, rl, &da, dw, &db);
  ExpectGradient(a, da, lin, "linear dx");
  ExpectGradient(w, dw, lin, "linear dw");
  ExpectGradient(bias, db, lin, "linear db");
}

TEST_F(ReferenceBackend, SoftmaxCrossEntropy) {
  const int32_t labels[] = {2, 0, 3};
  Tensor z = Filled({3, 4}, 0.f), d = b_->Empty({3, 4});
  int64_t hits = -1;
  // Uniform logits: loss log K for any smoothing; argmax is index 0, so one hit.
  EXPECT_NEAR(b_->SoftmaxCrossEntropy(z, labels, 0.2f, &d, &hits), std::log(4.0), 1e-6);
  EXPECT_EQ(hits, 1);
  EXPECT_NEAR(d.data<float>()[2], (0.25 - (0.8 + 0.05)) / 3, 1e-7);
  EXPECT_NEAR(d.data<float>()[1], (0.25 - 0.05) / 3, 1e-7);

  Tensor logits = Random({3, 4});
  auto loss = [&] { return double(b_->SoftmaxCrossEntropy(logits, labels, 0.1f, nullptr, nullptr)); };
  b_->SoftmaxCrossEntropy(logits, labels, 0.1f, &d, nullptr);
  ExpectGradient(logits, d, loss, "dlogits");
}

}  // namespace
}  // namespace shoal
