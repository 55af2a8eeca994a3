// Mixed precision on the CPU: with compute bf16, convolutions and fully connected layers read
// bf16 operands and accumulate in fp32 (AMX or AVX512-BF16); their results agree with the
// fp32 backend to bf16's precision (8 bits of mantissa), and a model still learns. On a
// processor without bf16 instructions the same request is one clear error.
#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "tests/engine/grad_check.h"
#include "worker/engine/cpu/cpu_backend.h"
#include "worker/engine/model.h"

namespace shoal {
namespace {

using namespace testing_util;

// max |a - b| over max |b|: bf16 inputs (relative rounding 2^-9) over sums of a few hundred
// terms stay well under 2%; exactly 0 would mean bf16 was never used.
double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, double(std::abs(a[i] - b[i])));
    den = std::max(den, double(std::abs(b[i])));
  }
  return num / std::max(den, 1e-30);
}

TEST(CpuBf16, RefusedClearlyWhereTheProcessorHasNoBf16) {
  if (CpuHasBf16()) {
    auto be = MakeCpuBackend(1, DType::kBF16);
    EXPECT_NE(be->Name().find("bf16 compute"), std::string::npos) << be->Name();
    EXPECT_EQ(be->compute_dtype(), DType::kBF16);
  } else {
    try {
      MakeCpuBackend(1, DType::kBF16);
      ADD_FAILURE() << "bf16 accepted on a processor without bf16 instructions";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("this processor has no bf16 instructions"), std::string::npos) << e.what();
    }
  }
  try {
    MakeCpuBackend(1, DType::kF16);
    ADD_FAILURE() << "fp16 accepted on a CPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("precision = \"fp16\" on a CPU worker"), std::string::npos) << e.what();
  }
}

class CpuBf16Agrees : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CpuHasBf16()) GTEST_SKIP() << "no bf16 on this processor (" << CpuIsaName() << "); the refusal is tested above";
    f32_ = MakeCpuBackend(1);
    b16_ = MakeCpuBackend(1, DType::kBF16);
  }
  std::unique_ptr<Backend> f32_, b16_;
};

TEST_F(CpuBf16Agrees, ConvolutionForwardAndBackward) {
  const Shape xs = {4, 16, 12, 12}, ws = {32, 16, 3, 3}, ys = {4, 32, 12, 12};
  std::mt19937_64 rng(3);
  std::vector<float> x(size_t(NumElements(xs))), w(size_t(NumElements(ws))), b(32), dy(size_t(NumElements(ys)));
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto* v : {&x, &w, &b, &dy})
    for (float& e : *v) e = u(rng);
  std::vector<float> out[2][4];  // [backend][y, dx, dw, db]
  Backend* bes[2] = {f32_.get(), b16_.get()};
  for (int k = 0; k < 2; ++k) {
    Backend& be = *bes[k];
    Tensor tx = be.Empty(xs), tw = be.Empty(ws), tb = be.Empty({32}), ty = be.Empty(ys), tdy = be.Empty(ys);
    be.CopyFromHost(tx, x.data());
    be.CopyFromHost(tw, w.data());
    be.CopyFromHost(tb, b.data());
    be.CopyFromHost(tdy, dy.data());
    ConvParams p{1, 1};
    be.ConvForward(tx, tw, tb, p, ty);
    Tensor dx = be.Empty(xs), dw = be.Zeros(ws), db = be.Zeros({32});
    be.ConvBackward(tx, tw, tdy, p, &dx, dw, &db);
    out[k][0] = Host(be, ty);
    out[k][1] = Host(be, dx);
    out[k][2] = Host(be, dw);
    out[k][3] = Host(be, db);
  }
  const char* names[4] = {"y", "dx", "dw", "db"};
  for (int i = 0; i < 4; ++i) {
    double e = RelErr(out[1][i], out[0][i]);
    EXPECT_LT(e, 0.02) << names[i];
    if (i < 3) {
      EXPECT_GT(e, 0.0) << names[i] << ": identical to fp32, so bf16 did not run";
    }
  }
}

TEST_F(CpuBf16Agrees, FullyConnectedForwardAndAccumulatedBackward) {
  const int64_t N = 32, I = 200, O = 24;
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(size_t(N * I)), w(size_t(O * I)), b(static_cast<size_t>(O)), dy(size_t(N * O)), dw0(size_t(O * I));
  for (auto* v : {&x, &w, &b, &dy, &dw0})
    for (float& e : *v) e = u(rng);
  std::vector<float> out[2][3];
  Backend* bes[2] = {f32_.get(), b16_.get()};
  for (int k = 0; k < 2; ++k) {
    Backend& be = *bes[k];
    Tensor tx = be.Empty({N, I}), tw = be.Empty({O, I}), tb = be.Empty({O}), ty = be.Empty({N, O});
    Tensor tdy = be.Empty({N, O}), dx = be.Empty({N, I}), dw = be.Empty({O, I});
    be.CopyFromHost(tx, x.data());
    be.CopyFromHost(tw, w.data());
    be.CopyFromHost(tb, b.data());
    be.CopyFromHost(tdy, dy.data());
    be.CopyFromHost(dw, dw0.data());  // weight gradients accumulate onto what is there
    be.LinearForward(tx, tw, tb, ty);
    be.LinearBackward(tx, tw, tdy, &dx, dw, nullptr);
    out[k][0] = Host(be, ty);
    out[k][1] = Host(be, dx);
    out[k][2] = Host(be, dw);
  }
  const char* names[3] = {"y", "dx", "dw"};
  for (int i = 0; i < 3; ++i) {
    double e = RelErr(out[1][i], out[0][i]);
    EXPECT_LT(e, 0.02) << names[i];
    EXPECT_GT(e, 0.0) << names[i] << ": identical to fp32, so bf16 did not run";
  }
}

// lenet in bf16 on class prototypes plus noise: the loss falls as in fp32.
TEST_F(CpuBf16Agrees, LenetLearnsInBf16) {
  ModelOptions mo;
  mo.input_shape = {1, 28, 28};
  auto m = MakeModel("lenet", *b16_, mo);
  m->InitParameters(42);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> protos(size_t(10 * 784));
  for (float& v : protos) v = nd(rng);
  std::vector<float> vel(size_t(m->NumParams()), 0.0f);
  Tensor x = b16_->Empty({32, 1, 28, 28});
  std::vector<float> xh(size_t(32 * 784));
  std::vector<int32_t> yh(32);
  double head = 0, tail = 0;
  for (int step = 0; step < 40; ++step) {
    for (int i = 0; i < 32; ++i) {
      yh[size_t(i)] = int32_t(rng() % 10);
      for (int j = 0; j < 784; ++j) xh[size_t(i * 784 + j)] = protos[size_t(yh[size_t(i)] * 784 + j)] + nd(rng);
    }
    b16_->CopyFromHost(x, xh.data());
    m->ZeroGrad();
    StepResult r = m->TrainStep(x, yh.data());
    ASSERT_TRUE(std::isfinite(r.loss)) << "step " << step;
    if (step < 5) head += r.loss / 5;
    if (step >= 35) tail += r.loss / 5;
    size_t k = 0;
    for (Parameter& p : m->parameters()) {
      float* w = p.value.data<float>();
      const float* g = p.grad.data<float>();
      for (int64_t j = 0; j < p.value.numel(); ++j, ++k) {
        vel[k] = 0.9f * vel[k] + g[j];
        w[j] -= 0.02f * vel[k];
      }
    }
  }
  EXPECT_LT(tail, 0.5 * head) << "first " << head << " last " << tail;
}

}  // namespace
}  // namespace shoal
