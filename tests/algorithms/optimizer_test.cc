// Each optimizer against its paper's formula on hand-computed values.
#include <gtest/gtest.h>

#include <cmath>

#include "algorithms/optimizers/optimizer.h"
#include "common/error.h"

namespace shoal {
namespace {

OptimizerHyper Hyper() { return OptimizerHyper(); }

TEST(Optimizer, SgdWithWeightDecay) {
  OptimizerHyper h;
  h.weight_decay = 0.1f;
  auto o = MakeOptimizer("sgd", h);
  std::vector<float> w = {1, -2}, g = {0.5, 0.5};
  OptimizerState st;
  o->Apply(w.data(), g.data(), 2, true, {0.1f, 0, 0}, &st);
  EXPECT_FLOAT_EQ(w[0], 1 - 0.1f * (0.5f + 0.1f));
  EXPECT_FLOAT_EQ(w[1], -2 - 0.1f * (0.5f - 0.2f));
  o->Apply(w.data(), g.data(), 2, false, {0.1f, 1, 0}, &st);  // no decay on bias/BN
  EXPECT_FLOAT_EQ(w[0], 1 - 0.1f * 0.6f - 0.05f);
}

TEST(Optimizer, MomentumAndNesterov) {
  OptimizerHyper h;
  h.momentum = 0.9f;
  auto o = MakeOptimizer("momentum", h);
  std::vector<float> w = {1}, g = {1};
  OptimizerState st;
  o->Apply(w.data(), g.data(), 1, true, {0.1f, 0, 0}, &st);  // v=1, w=0.9
  o->Apply(w.data(), g.data(), 1, true, {0.1f, 1, 0}, &st);  // v=1.9, w=0.71
  EXPECT_NEAR(w[0], 0.71f, 1e-6);
  h.nesterov = true;
  auto n = MakeOptimizer("momentum", h);
  std::vector<float> w2 = {1};
  OptimizerState s2;
  n->Apply(w2.data(), g.data(), 1, true, {0.1f, 0, 0}, &s2);  // v=1, w -= 0.1*(1+0.9)
  EXPECT_NEAR(w2[0], 0.81f, 1e-6);
}

// Seed 003 Algorithm 1 with w=[3,4], g=[0.6,0.8], wd=0.1, eta=0.001, m=0.9, lr=1, two steps.
TEST(Optimizer, LarsMatchesAlgorithm1) {
  OptimizerHyper h;
  h.momentum = 0.9f;
  h.weight_decay = 0.1f;
  h.trust_coefficient = 0.001f;
  auto o = MakeOptimizer("lars", h);
  std::vector<float> w = {3, 4}, g = {0.6f, 0.8f};
  OptimizerState st;
  o->Apply(w.data(), g.data(), 2, true, {1.0f, 0, 0}, &st);
  EXPECT_NEAR(w[0], 2.997, 1e-6);
  EXPECT_NEAR(w[1], 3.996, 1e-6);
  o->Apply(w.data(), g.data(), 2, true, {1.0f, 1, 0}, &st);
  EXPECT_NEAR(w[0], 2.991303, 1e-6);
  EXPECT_NEAR(w[1], 3.988404, 1e-6);
}

// You et al. 2019 Algorithm 2, one step: w=[1,2], g=[0.5,-1], wd=0.01, lr=0.1.
TEST(Optimizer, LambMatchesPaper) {
  OptimizerHyper h;
  h.weight_decay = 0.01f;
  h.beta1 = 0.9f;
  h.beta2 = 0.999f;
  h.eps = 1e-6f;
  auto o = MakeOptimizer("lamb", h);
  std::vector<float> w = {1, 2}, g = {0.5f, -1};
  OptimizerState st;
  o->Apply(w.data(), g.data(), 2, true, {0.1f, 0, 0}, &st);
  EXPECT_NEAR(w[0], 0.8395208, 2e-6);
  EXPECT_NEAR(w[1], 2.1557126, 2e-6);
  EXPECT_EQ(st.steps, 1);
}

// STiLL: pure LAMB at step 0, pure LARS after warm-up, the linear mix in between.
TEST(Optimizer, StillBlendsLambIntoLars) {
  OptimizerHyper h;
  h.weight_decay = 0.01f;
  h.momentum = 0.9f;
  auto still = MakeOptimizer("still", h), lamb = MakeOptimizer("lamb", h), lars = MakeOptimizer("lars", h);
  std::vector<float> g = {0.5f, -1, 0.25f};
  auto run = [&](const Optimizer& o, int64_t step, int64_t warm) {
    std::vector<float> w = {1, 2, -1};
    OptimizerState st;
    o.Apply(w.data(), g.data(), 3, true, {0.1f, step, warm}, &st);
    return w;
  };
  auto s0 = run(*still, 0, 10), l0 = run(*lamb, 0, 10);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(s0[i], l0[i], 1e-6);
  auto s1 = run(*still, 10, 10), r1 = run(*lars, 10, 10);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(s1[i], r1[i], 1e-6);
  auto sh = run(*still, 5, 10), la = run(*lamb, 5, 10), ra = run(*lars, 5, 10);
  std::vector<float> w0 = {1, 2, -1};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(sh[i] - w0[i], 0.5f * (la[i] - w0[i]) + 0.5f * (ra[i] - w0[i]), 1e-6);
}

TEST(Optimizer, RmspropSgdMovesToSgd) {
  OptimizerHyper h;
  h.momentum = 0.9f;
  auto o = MakeOptimizer("rmsprop_sgd", h), m = MakeOptimizer("momentum", h);
  std::vector<float> g = {0.5f, -1};
  std::vector<float> a = {1, 2}, b = {1, 2};
  OptimizerState sa, sb;
  o->Apply(a.data(), g.data(), 2, true, {0.1f, 100, 100}, &sa);
  m->Apply(b.data(), g.data(), 2, true, {0.1f, 100, 100}, &sb);
  EXPECT_NEAR(a[0], b[0], 1e-7);
  // At step 0: pure RMSprop, w -= rlr * g / (sqrt((1-rho) g^2) + eps).
  std::vector<float> c = {1, 2};
  OptimizerState sc;
  o->Apply(c.data(), g.data(), 2, true, {0.1f, 0, 100}, &sc);
  float rlr = 0.1f * h.rms_lr_ratio;
  EXPECT_NEAR(c[0], 1 - rlr * 0.5f / (std::sqrt(0.01f * 0.25f) + 1e-8f), 1e-6);
}

TEST(Optimizer, UnknownNameListsKnown) {
  try {
    MakeOptimizer("adamw", Hyper());
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unknown optimizer \"adamw\" (known: lamb, lars, momentum, rmsprop_sgd, sgd, still)");
  }
}

TEST(LrSchedule, LinearScalingWarmupAndDecay) {
  LrScheduleOptions o;
  o.base_lr = 0.1;
  o.base_batch_size = 256;
  o.global_batch = 1024;
  o.warmup_steps = 10;
  o.total_steps = 110;
  o.kind = "poly";
  o.poly_power = 2;
  LrSchedule s(o);
  EXPECT_DOUBLE_EQ(s.peak_lr(), 0.4);
  EXPECT_DOUBLE_EQ(s.At(0), 0.04);
  EXPECT_DOUBLE_EQ(s.At(9), 0.4);
  EXPECT_DOUBLE_EQ(s.At(10), 0.4);
  EXPECT_DOUBLE_EQ(s.At(60), 0.4 * 0.25);
  EXPECT_NEAR(s.At(110), 0.0, 1e-12);
  o.kind = "cosine";
  EXPECT_NEAR(LrSchedule(o).At(60), 0.2, 1e-12);
  o.kind = "step";
  o.step_every = 25;
  o.step_gamma = 0.1;
  EXPECT_NEAR(LrSchedule(o).At(35), 0.04, 1e-12);
}

}  // namespace
}  // namespace shoal

#include "algorithms/block_momentum.h"

namespace shoal {
namespace {

// Seed 003 Algorithm 1 by hand: eta_B = 0.5, eps_B = 2, two blocks.
TEST(BlockMomentum, MatchesTheFormula) {
  BlockMomentumParams p;
  p.momentum = 0.5f;
  p.lr = 2.0f;
  p.nesterov = true;
  float global[2] = {1.0f, -1.0f}, v[2] = {0, 0}, start[2];
  float delta1[2] = {0.2f, -0.4f};  // mean over workers of (start - end)
  ApplyBlockMomentum(p, delta1, 2, global, v, start);
  // v = 0.5*0 + 0.5*2*[0.2,-0.4] = [0.2,-0.4]; w = [0.8,-0.6]; start = w - 0.5 v = [0.7,-0.4]
  EXPECT_FLOAT_EQ(v[0], 0.2f);
  EXPECT_FLOAT_EQ(global[0], 0.8f);
  EXPECT_FLOAT_EQ(global[1], -0.6f);
  EXPECT_FLOAT_EQ(start[0], 0.7f);
  EXPECT_FLOAT_EQ(start[1], -0.4f);
  float delta2[2] = {0.1f, 0.0f};
  ApplyBlockMomentum(p, delta2, 2, global, v, start);
  // v = 0.5*[0.2,-0.4] + 0.5*2*[0.1,0] = [0.2,-0.2]; w = [0.6,-0.4]; start = [0.5,-0.3]
  EXPECT_FLOAT_EQ(v[1], -0.2f);
  EXPECT_FLOAT_EQ(global[0], 0.6f);
  EXPECT_FLOAT_EQ(start[1], -0.3f);
}

TEST(BlockMomentum, ZeroMomentumUnitLrIsModelAveraging) {
  BlockMomentumParams p;
  p.momentum = 0;
  p.lr = 1;
  p.nesterov = false;
  // Workers ended at 0.5 and 1.5 from a start of 2: mean delta = 2 - 1 = 1.
  float global[1] = {2}, v[1] = {0}, start[1], delta[1] = {1};
  ApplyBlockMomentum(p, delta, 1, global, v, start);
  EXPECT_FLOAT_EQ(global[0], 1.0f);
  EXPECT_FLOAT_EQ(start[0], 1.0f);
}

}  // namespace
}  // namespace shoal
