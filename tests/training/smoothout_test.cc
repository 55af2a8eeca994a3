// SmoothOut (worker/smoothout.h): the noise is uniform in [-a, a] and a function of (seed,
// step, parameter) alone; Restore gives back the saved weights bit for bit; and the gradient a
// SmoothOut step hands to the optimizer is the plain gradient evaluated at the perturbed point
// (w + u), so the update is the noise-free update rule applied at that point's gradient.
#include "worker/smoothout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "worker/engine/backend.h"
#include "worker/engine/models/builder.h"

namespace shoal {
namespace {

TEST(SmoothOut, NoiseIsUniformInTheBoxAndAFunctionOfSeedStepAndParameter) {
  const int64_t n = 200000;
  const double a = 0.01;
  std::vector<float> u(n), same(n), next_step(n), other_param(n), other_seed(n);
  SmoothOut::Noise(7, 3, 2, a, u.data(), n);
  SmoothOut::Noise(7, 3, 2, a, same.data(), n);
  SmoothOut::Noise(7, 4, 2, a, next_step.data(), n);
  SmoothOut::Noise(7, 3, 1, a, other_param.data(), n);
  SmoothOut::Noise(8, 3, 2, a, other_seed.data(), n);
  EXPECT_EQ(u, same);
  EXPECT_NE(u, next_step);
  EXPECT_NE(u, other_param);
  EXPECT_NE(u, other_seed);
  double sum = 0, sq = 0;
  for (float v : u) {
    ASSERT_LE(std::fabs(v), a);
    sum += v;
    sq += double(v) * v;
  }
  // Uniform on [-a, a]: mean 0, variance a^2 / 3 (5 standard errors of slack).
  EXPECT_NEAR(sum / n, 0.0, 5 * a / std::sqrt(3.0 * n));
  EXPECT_NEAR(sq / n, a * a / 3, 5 * a * a * std::sqrt(4.0 / 45 / n));
}

std::vector<float> Params(const Model& m) {
  std::vector<float> w(size_t(m.NumParams()));
  m.CopyParamsToHost(w.data());
  return w;
}

std::vector<float> Grads(const Model& m) {
  std::vector<float> g(size_t(m.NumParams()));
  m.CopyGradsToHost(g.data());
  return g;
}

TEST(SmoothOut, TheGradientIsTheOneAtThePerturbedPointAndTheWeightsComeBackExactly) {
  auto be = MakeCpuBackend(1);
  ModelOptions mo;
  mo.input_shape = {1, 28, 28};
  mo.num_classes = 10;
  auto m = MakeModel("lenet", *be, mo);
  m->InitParameters(3);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(8 * 28 * 28);
  for (float& v : x) v = normal(rng);
  std::vector<int32_t> labels = {0, 1, 2, 3, 4, 5, 6, 7};
  Tensor xt = be->Empty({8, 1, 28, 28});
  be->CopyFromHost(xt, x.data());
  const std::vector<float> w0 = Params(*m);
  const double a = 0.05;
  const int64_t step = 11;

  SmoothOut so(a, 42);
  m->ZeroGrad();
  so.Perturb(*m, step);
  const float loss_smooth = m->TrainStep(xt, labels.data()).loss;
  so.Restore(*m);
  const std::vector<float> g_smooth = Grads(*m);
  const std::vector<float> w_after = Params(*m);
  EXPECT_EQ(0, memcmp(w_after.data(), w0.data(), w0.size() * 4)) << "the weights did not come back bit for bit";

  // The same point built by hand: w0 + u, u from Noise for each parameter in order.
  std::vector<float> w_pert = w0;
  int64_t off = 0;
  for (size_t i = 0; i < m->parameters().size(); ++i) {
    const int64_t n = m->parameters()[i].value.numel();
    std::vector<float> u(static_cast<size_t>(n));
    SmoothOut::Noise(42, step, i, a, u.data(), n);
    for (int64_t k = 0; k < n; ++k) w_pert[size_t(off + k)] += u[size_t(k)];
    off += n;
  }
  m->CopyParamsFromHost(w_pert.data());
  m->ZeroGrad();
  const float loss_at_point = m->TrainStep(xt, labels.data()).loss;
  const std::vector<float> g_at_point = Grads(*m);
  EXPECT_EQ(loss_smooth, loss_at_point);
  EXPECT_EQ(0, memcmp(g_smooth.data(), g_at_point.data(), g_at_point.size() * 4))
      << "the SmoothOut gradient is not the gradient at w + u";

  // And it is not the gradient at w0: the perturbation is really there.
  m->CopyParamsFromHost(w0.data());
  m->ZeroGrad();
  m->TrainStep(xt, labels.data());
  const std::vector<float> g_plain = Grads(*m);
  EXPECT_NE(0, memcmp(g_plain.data(), g_smooth.data(), g_plain.size() * 4));

  // Off: nothing moves.
  SmoothOut off_so(0, 42);
  off_so.Perturb(*m, step);
  EXPECT_EQ(0, memcmp(Params(*m).data(), w0.data(), w0.size() * 4));
  off_so.Restore(*m);
}

}  // namespace
}  // namespace shoal
