// Each optimizer against its paper's formula on hand-computed values.
#include <gtest/gtest.h>

#include <cmath>

#include "algorithms/optimizers/optimizer.h"
#include "common/config.h"
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
    MakeOptimizer("adagrad", Hyper());
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "unknown optimizer \"adagrad\" (known: adam, adamw, lamb, lars, momentum, rmsprop_sgd, sgd, still)");
  }
}

// Adam and AdamW by hand (PyTorch's hyper-parameters: betas 0.9/0.999, eps 1e-8). At step 1
// bias correction makes m^ = g and v^ = g^2, so every element moves lr * g / (|g| + eps);
// the step-2 values are the textbook formula worked in double:
//   m = b1 m + (1-b1) d, v = b2 v + (1-b2) d^2, w -= lr (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
// with d = g + wd w (adam) or d = g after w *= 1 - lr wd (adamw).
TEST(Optimizer, AdamByHandWithBiasCorrection) {
  auto o = MakeOptimizer("adam", DefaultOptimizerHyper("adam"));
  std::vector<float> w = {1, -2, 0.5f}, g = {0.5f, -0.001f, 0};
  OptimizerState st;
  o->Apply(w.data(), g.data(), 3, true, {0.1f, 0, 0}, &st);
  EXPECT_NEAR(w[0], 0.9, 1e-7);
  EXPECT_NEAR(w[1], -2 + 0.1 * 0.001 / (0.001 + 1e-8), 2e-7);  // eps shows at small |g|
  EXPECT_EQ(w[2], 0.5f);                                       // 0 / (0 + eps): no move
  EXPECT_EQ(st.steps, 1);
  ASSERT_EQ(st.slots.size(), 2u);
  EXPECT_FLOAT_EQ(st.slots[0][0], 0.05f);     // m = (1 - b1) g
  EXPECT_FLOAT_EQ(st.slots[1][0], 0.00025f);  // v = (1 - b2) g^2
  g = {-0.25f, 0, 0};
  o->Apply(w.data(), g.data(), 3, true, {0.1f, 1, 0}, &st);
  EXPECT_NEAR(w[0], 0.8733662987, 1e-6);
  EXPECT_EQ(st.steps, 2);
}

TEST(Optimizer, AdamL2AgainstAdamWDecoupledDecay) {
  OptimizerHyper h = DefaultOptimizerHyper("adam");
  h.weight_decay = 0.1f;
  auto adam = MakeOptimizer("adam", h), adamw = MakeOptimizer("adamw", h);
  // w = 1, g = -0.05: adam's d = g + 0.1 w = +0.05 turns the step around; adamw shrinks w by
  // lr wd = 1% and then steps along -g.
  struct Case {
    const Optimizer* o;
    bool decay;
    double step1, step2;
  } cases[] = {
      {adam.get(), true, 0.90000002, 0.8176733017},
      {adam.get(), false, 1.09999998, 1.0376081163},  // no decay on bias/BN: plain Adam
      {adamw.get(), true, 1.08999998, 1.0167081165},
      {adamw.get(), false, 1.09999998, 1.0376081163},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.o->Name() + (c.decay ? "" : " decay=false"));
    std::vector<float> w = {1}, g = {-0.05f};
    OptimizerState st;
    c.o->Apply(w.data(), g.data(), 1, c.decay, {0.1f, 0, 0}, &st);
    EXPECT_NEAR(w[0], c.step1, 2e-7);
    g = {0.3f};
    c.o->Apply(w.data(), g.data(), 1, c.decay, {0.1f, 1, 0}, &st);
    EXPECT_NEAR(w[0], c.step2, 1e-6);
  }
}

// A constant gradient has m^ = g and v^ = g^2 at every step only if both corrections are
// right at every t; a large eps shows it is added after sqrt(v^) (PyTorch), not before
// the correction: each step moves exactly lr g / (|g| + eps).
TEST(Optimizer, AdamBiasCorrectionHoldsAtEveryStep) {
  OptimizerHyper h = DefaultOptimizerHyper("adam");
  h.eps = 0.1f;
  for (const char* name : {"adam", "adamw"}) {
    SCOPED_TRACE(name);
    auto o = MakeOptimizer(name, h);
    std::vector<float> w = {1}, g = {0.5f};
    OptimizerState st;
    for (int t = 1; t <= 20; ++t) {
      float before = w[0];
      o->Apply(w.data(), g.data(), 1, true, {0.1f, t - 1, 0}, &st);
      EXPECT_NEAR(before - w[0], 0.1 * 0.5 / (0.5 + 0.1), 2e-7) << "step " << t;
    }
    EXPECT_EQ(st.steps, 20);
  }
}

// torch.optim.Adam / AdamW (Debian's python3-torch 1.13, CPU, fp32) on the same w and
// gradients with an lr that changes each step, as a schedule does. Made by:
//   import torch
//   w0 = [0.5, -1.25, 2.0, 0.0, -0.03125]
//   grads = [[0.1, -0.2, 0.3, 0.0, 1.5], [0.05, 0.4, -0.3, 0.2, -1.0], [-0.2, 0.1, 0.0, -0.1, 0.5],
//            [0.3, -0.3, 0.6, 0.05, 2.0], [0.0, 0.25, -0.1, -0.4, 0.01]]
//   lrs = [0.1, 0.05, 0.02, 0.08, 0.01]
//   for name, kw in [("Adam", {}), ("Adam", dict(weight_decay=0.1)), ("AdamW", {}),
//                    ("AdamW", dict(weight_decay=0.1)), ("AdamW", dict(weight_decay=0.2, betas=(0.8, 0.99),
//                    eps=1e-3))]:
//       w = torch.nn.Parameter(torch.tensor(w0)); opt = getattr(torch.optim, name)([w], lr=lrs[0], **kw); out = []
//       for lr, g in zip(lrs, grads):
//           opt.param_groups[0]["lr"] = lr; w.grad = torch.tensor(g); opt.step(); out += w.detach().tolist()
//       print(name, kw, ", ".join("%.9g" % x for x in out))
//       print(opt.state[w]["exp_avg"].tolist(), opt.state[w]["exp_avg_sq"].tolist())
TEST(Optimizer, AdamAndAdamWMatchPyTorch) {
  const std::vector<float> w0 = {0.5f, -1.25f, 2.0f, 0.0f, -0.03125f};
  const std::vector<std::vector<float>> grads = {{0.1f, -0.2f, 0.3f, 0.0f, 1.5f},
                                                 {0.05f, 0.4f, -0.3f, 0.2f, -1.0f},
                                                 {-0.2f, 0.1f, 0.0f, -0.1f, 0.5f},
                                                 {0.3f, -0.3f, 0.6f, 0.05f, 2.0f},
                                                 {0.0f, 0.25f, -0.1f, -0.4f, 0.01f}};
  const float lrs[] = {0.1f, 0.05f, 0.02f, 0.08f, 0.01f};
  struct Case {
    std::string name;
    float wd;  // < 0: the rule's default (adam 0, adamw 1e-2)
    double beta1, beta2;
    float eps;
    std::vector<float> want;  // w after each step
    std::vector<float> m, v;  // PyTorch's exp_avg, exp_avg_sq at the end
  };
  const std::vector<float> m_default = {0.0210060012f, 0.0221379977f, 0.041813001f, -0.0290200002f, 0.247014999f};
  const std::vector<float> v_default = {0.000142282617f, 0.000361750775f, 0.000549010874f, 0.000212357641f,
                                        0.00748361694f};
  const Case cases[] = {
      {"adam",
       -1,
       0.9,
       0.999,
       1e-8f,
       {0.400000006f,  -1.14999998f,   1.89999998f,    0.f,          -0.131249994f,  0.353391021f, -1.16830516f,
        1.90263152f,   -0.0372068398f, -0.138476029f,  0.357518166f, -1.17661822f,   1.90344524f,  -0.0417796448f,
        -0.144046202f, 0.328766048f,   -1.17391706f,   1.86700821f,  -0.0665546954f, -0.19047752f, 0.325728297f,
        -1.1759249f,   1.86392999f,    -0.0631195158f, -0.195403054f},
       m_default,
       v_default},
      {"adam",
       0.1f,
       0.9,
       0.999,
       1e-8f,
       {0.400000036f,  -1.14999998f,   1.89999998f,    0.f,          -0.131249994f,  0.352125525f,  -1.14935422f,
        1.87527847f,   -0.0372068398f, -0.138128936f,  0.35011968f,  -1.14871311f,   1.86370361f,   -0.0415342674f,
        -0.143504038f, 0.308503151f,   -1.11499476f,   1.80389166f,  -0.0647065938f, -0.189426273f, 0.303711146f,
        -1.11275351f,  1.7971375f,     -0.0611611493f, -0.194260195f},
       {0.0362908244f, -0.0252448861f, 0.118788004f, -0.0303422511f, 0.241548508f},
       {0.000170659026f, 0.000377535849f, 0.000920384075f, 0.000217934808f, 0.00742987916f}},
      {"adamw",
       -1,
       0.9,
       0.999,
       1e-8f,
       {0.399500012f,  -1.14874995f,   1.898f,         0.f,          -0.131218746f,  0.352691263f, -1.16648078f,
        1.89968252f,   -0.0372068398f, -0.138379171f,  0.356747866f, -1.17456055f,   1.90011632f,  -0.0417722091f,
        -0.143921673f, 0.32771033f,    -1.17091978f,   1.86215925f,  -0.0665138438f, -0.19023785f, 0.324639797f,
        -1.17281055f,  1.85889482f,    -0.0630720109f, -0.195144355f},
       m_default,
       v_default},
      {"adamw",
       0.1f,
       0.9,
       0.999,
       1e-8f,
       {0.395000011f,  -1.13749993f,   1.88f,          0.f,          -0.130937502f,  0.346416026f,  -1.15011764f,
        1.87323153f,   -0.0372068398f, -0.137508854f,  0.349850357f, -1.15613043f,   1.87029886f,   -0.0417052358f,
        -0.142804012f, 0.318299443f,   -1.14418018f,   1.81889939f,  -0.0661466494f, -0.188092902f, 0.314943403f,
        -1.14504385f,  1.81400228f,    -0.0626453236f, -0.192830339f},
       m_default,
       v_default},
      {"adamw",
       0.2f,
       0.8,
       0.99,
       1e-3f,
       {0.390990108f,  -1.12549758f,   1.86033225f,    0.f,          -0.130558386f,  0.34190613f,   -1.13522661f,
        1.84726608f,   -0.0389109254f, -0.133611739f,  0.346425384f, -1.13970459f,   1.84148073f,   -0.0425317734f,
        -0.138095602f, 0.309158623f,   -1.11492252f,   1.77084529f,  -0.0648577213f, -0.185805827f, 0.305419713f,
        -1.11486053f,  1.7641834f,     -0.0601403303f, -0.190371618f},
       {0.035712f, 0.0393759981f, 0.0698560029f, -0.064319998f, 0.406479985f},
       {0.00140335725f, 0.00355072739f, 0.00540180597f, 0.00211087987f, 0.0733676478f}},
  };
  // fp32 tolerance: the two agree to an ulp or so (seen: within 1 ulp of 1 for the weights,
  // 2 ulps for the moments); 2 and 4 leave room for a compiler that fuses a multiply-add.
  auto close = [](float got, float want) { return std::fabs(got - want) <= 2.4e-7f * std::max(1.0f, std::fabs(want)); };
  auto close_rel = [](float got, float want) { return std::fabs(got - want) <= 4.8e-7f * std::fabs(want); };
  for (const Case& c : cases) {
    OptimizerHyper h = DefaultOptimizerHyper(c.name);
    if (c.wd >= 0) h.weight_decay = c.wd;
    h.beta1 = c.beta1;
    h.beta2 = c.beta2;
    h.eps = c.eps;
    SCOPED_TRACE(c.name + " wd " + std::to_string(h.weight_decay) + " eps " + std::to_string(h.eps));
    auto o = MakeOptimizer(c.name, h);
    std::vector<float> w = w0;
    OptimizerState st;
    for (size_t t = 0; t < grads.size(); ++t) {
      o->Apply(w.data(), grads[t].data(), 5, true, {lrs[t], int64_t(t), 0}, &st);
      for (size_t i = 0; i < 5; ++i)
        EXPECT_PRED2(close, w[i], c.want[5 * t + i]) << "step " << t + 1 << " [" << i << "]";
    }
    ASSERT_EQ(st.slots.size(), 2u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_PRED2(close_rel, st.slots[0][i], c.m[i]) << "exp_avg [" << i << "]";
      EXPECT_PRED2(close_rel, st.slots[1][i], c.v[i]) << "exp_avg_sq [" << i << "]";
    }
  }
}

JobConfig OptimizerJob(const std::string& optimizer_section) {
  return ParseJobConfig(
      "[job]\nname = \"t\"\n[cluster]\nworkers = 1\n[model]\nname = \"mlp\"\n[data]\nformat = \"synthetic\"\n"
      "batch_size = 8\n[algorithm]\nname = \"allreduce\"\n[optimizer]\n" +
          optimizer_section + "\n[train]\nepochs = 1\n",
      "job.toml");
}

// From a job file: PyTorch's defaults where keys are left out (eps 1e-8 for the Adam pair
// while LAMB keeps 1e-6; weight_decay 1e-2 for adamw only), the keys as given otherwise.
TEST(Optimizer, AdamDefaultsAndKeysFromTheJobFile) {
  JobConfig c = OptimizerJob("name = \"adam\"");
  OptimizerHyper h = MakeOptimizer(c.optimizer, c.optimizer_opts)->hyper();
  EXPECT_EQ(h.beta1, 0.9);
  EXPECT_EQ(h.beta2, 0.999);
  EXPECT_EQ(h.eps, 1e-8f);
  EXPECT_EQ(h.weight_decay, 0.f);
  c = OptimizerJob("name = \"adamw\"");
  h = MakeOptimizer(c.optimizer, c.optimizer_opts)->hyper();
  EXPECT_EQ(h.eps, 1e-8f);
  EXPECT_EQ(h.weight_decay, 1e-2f);
  c = OptimizerJob("name = \"lamb\"");
  EXPECT_EQ(MakeOptimizer(c.optimizer, c.optimizer_opts)->hyper().eps, 1e-6f);
  c = OptimizerJob("name = \"adamw\"\nbeta1 = 0.8\nbeta2 = 0.99\neps = 1e-6\nweight_decay = 0.05");
  EXPECT_NO_THROW(CheckOptimizerKeys(c.optimizer, c.optimizer_opts));
  h = MakeOptimizer(c.optimizer, c.optimizer_opts)->hyper();
  EXPECT_EQ(h.beta1, 0.8);
  EXPECT_EQ(h.beta2, 0.99);
  EXPECT_EQ(h.eps, 1e-6f);
  EXPECT_EQ(h.weight_decay, 0.05f);
}

TEST(Optimizer, AdamKeysOutOfRangeNameTheKey) {
  struct Bad {
    std::string line, key;
  } bad[] = {{"beta1 = 1.0", "beta1"},
             {"beta2 = 1.0", "beta2"},
             {"beta1 = -0.1", "beta1"},
             {"eps = 0", "eps"},
             {"eps = -1e-8", "eps"},
             {"weight_decay = -0.01", "weight_decay"},
             {"weight_decay = 2", "weight_decay"}};
  for (const char* name : {"adam", "adamw"}) {
    for (const Bad& b : bad) {
      JobConfig c = OptimizerJob(std::string("name = \"") + name + "\"\n" + b.line);
      try {
        MakeOptimizer(c.optimizer, c.optimizer_opts);
        ADD_FAILURE() << name << " accepted " << b.line;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("[optimizer] " + b.key + ": expected a number in"), std::string::npos)
            << e.what();
      }
    }
    // Keys of other rules are refused for the Adam pair (amsgrad is not implemented).
    for (const char* key : {"momentum = 0.9", "amsgrad = true"}) {
      JobConfig c = OptimizerJob(std::string("name = \"") + name + "\"\n" + key);
      EXPECT_THROW(CheckOptimizerKeys(c.optimizer, c.optimizer_opts), Error) << name << ": " << key;
    }
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
