// Loss scaling and the non-finite step guard: the scaler's rule (halve on a skipped step,
// never below 1, double after growth_interval good steps, capped at 2^126; a fixed scale
// never moves), its checkpoint entries and exact unscaling; the guard of LocalUpdater
// (a NaN or inf gradient leaves weights and optimizer state bit-identical and is counted);
// and the agreement of the collective algorithms: when one rank's gradient is not finite,
// every rank skips the same step and the weights stay identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "algorithms/algorithm.h"
#include "common/config.h"
#include "tests/algorithms/fake_communicator.h"
#include "worker/loss_scaler.h"

namespace shoal {
namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(LossScaler, DynamicHalvesOnSkipsWithAFloorAndDoublesAfterGoodSteps) {
  LossScaler s(LossScaler::Mode::kDynamic, 8, 3);
  EXPECT_EQ(s.scale(), 8.f);
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.good_steps(), 2);
  s.Update(true);  // a skip also restarts the count of good steps
  EXPECT_EQ(s.scale(), 4.f);
  EXPECT_EQ(s.good_steps(), 0);
  for (int i = 0; i < 4; ++i) s.Update(true);
  EXPECT_EQ(s.scale(), 1.f);  // 4 -> 2 -> 1, then the floor
  EXPECT_EQ(s.skipped_steps(), 5);
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 1.f);
  s.Update(false);
  EXPECT_EQ(s.scale(), 2.f);
  EXPECT_EQ(s.good_steps(), 0);
  for (int i = 0; i < 3; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 4.f);

  LossScaler top(LossScaler::Mode::kDynamic, kMaxLossScale, 1);
  top.Update(false);
  EXPECT_EQ(double(top.scale()), kMaxLossScale);  // 1/S must stay a normal float
}

// A dynamic start beyond fp32's range: the factor is inf (every gradient overflows), S halves
// step by step until it fits; 2^127 is used, and then it grows no more.
TEST(LossScaler, AStartBeyondFp32HalvesUntilItFits) {
  LossScaler s(LossScaler::Mode::kDynamic, std::ldexp(1.0, 130), 1);
  EXPECT_TRUE(std::isinf(s.scale()));
  s.Update(true);
  s.Update(true);
  EXPECT_TRUE(std::isinf(s.scale()));  // 2^128 is beyond FLT_MAX
  s.Update(true);
  EXPECT_EQ(s.scale(), std::ldexp(1.f, 127));
  std::vector<float> g = {std::ldexp(0.75f, 127), std::ldexp(-1.f, 100)};
  ParamView p;
  p.name = "w";
  p.g = g.data();
  p.n = 2;
  s.Unscale(p, nullptr);
  EXPECT_EQ(g, (std::vector<float>{0.75f, std::ldexp(-1.f, -27)}));
  s.Update(false);
  EXPECT_EQ(s.scale(), std::ldexp(1.f, 127));
}

TEST(LossScaler, FixedAndNoneNeverMoveButCountSkips) {
  LossScaler fixed(LossScaler::Mode::kFixed, 1024, 1);
  fixed.Update(true);
  fixed.Update(false);
  fixed.Update(false);
  EXPECT_EQ(fixed.scale(), 1024.f);
  EXPECT_EQ(fixed.skipped_steps(), 1);
  LossScaler none(LossScaler::Mode::kNone, 65536, 2000);
  EXPECT_EQ(none.scale(), 1.f);
  none.Update(true);
  EXPECT_EQ(none.scale(), 1.f);
  EXPECT_EQ(none.skipped_steps(), 1);
}

TEST(LossScaler, FromConfigFollowsTheJobFile) {
  auto job = [](const std::string& model_keys) {
    return ParseJobConfig("[job]\nname = \"t\"\n[model]\nname = \"mlp\"\n" + model_keys + "[data]\nformat = \"synthetic\"\n",
                          "job.toml");
  };
  EXPECT_EQ(LossScaler::FromConfig(job("")).mode(), LossScaler::Mode::kNone);
  LossScaler fp16 = LossScaler::FromConfig(job("precision = \"fp16\"\n"));
  EXPECT_EQ(fp16.mode(), LossScaler::Mode::kDynamic);
  EXPECT_EQ(fp16.scale(), 65536.f);
  LossScaler fixed = LossScaler::FromConfig(job("loss_scale = 512\n"));
  EXPECT_EQ(fixed.mode(), LossScaler::Mode::kFixed);
  EXPECT_EQ(fixed.scale(), 512.f);
}

TEST(LossScaler, CheckpointKeepsTheScaleAndTheGoodSteps) {
  LossScaler s(LossScaler::Mode::kDynamic, 1 << 20, 4);
  s.Update(true);
  s.Update(false);
  s.Update(false);
  CheckpointState st;
  s.Save(&st);
  LossScaler back(LossScaler::Mode::kDynamic, 65536, 4);
  back.Load(st);
  EXPECT_EQ(back.scale(), float(1 << 19));
  EXPECT_EQ(back.good_steps(), 2);
  EXPECT_EQ(back.skipped_steps(), 1);
  back.Update(false);
  back.Update(false);
  EXPECT_EQ(back.scale(), float(1 << 20));  // the count went on where it was
  // A checkpoint from before loss scaling leaves the start.
  LossScaler old(LossScaler::Mode::kDynamic, 65536, 4);
  old.Load(CheckpointState());
  EXPECT_EQ(old.scale(), 65536.f);
}

TEST(LossScaler, UnscalingByAPowerOfTwoIsExact) {
  std::vector<float> g = {3.f * 1024, -0.125f * 1024, 1e-30f * 1024, 0.f};
  ParamView p;
  p.name = "w";
  p.g = g.data();
  p.n = int64_t(g.size());
  LossScaler(LossScaler::Mode::kFixed, 1024, 1).Unscale(p, nullptr);
  EXPECT_EQ(g, (std::vector<float>{3.f, -0.125f, 1e-30f, 0.f}));
  std::vector<float> big = {float(kMaxLossScale) * 0.5f};
  p.g = big.data();
  p.n = 1;
  LossScaler(LossScaler::Mode::kDynamic, kMaxLossScale, 1).Unscale(p, nullptr);
  EXPECT_EQ(big[0], 0.5f);
}

// Two tensors with momentum SGD: a host model for LocalUpdater.
struct Tensors {
  std::vector<std::vector<float>> w = {{1, 2, 3, 4, 5}, {0.5f, -0.5f}}, g = {{1, 1, 1, 1, 1}, {2, 2}};
  std::vector<ParamView> views;
  const std::vector<ParamView>& View() {
    views.clear();
    for (size_t i = 0; i < w.size(); ++i) {
      ParamView p;
      p.name = i == 0 ? "fc.w" : "fc.b";
      p.w = w[i].data();
      p.g = g[i].data();
      p.n = int64_t(w[i].size());
      p.no_weight_decay = i == 1;
      views.push_back(p);
    }
    return views;
  }
};

AlgorithmEnv MomentumEnv() {
  AlgorithmEnv env;
  OptimizerHyper h;
  h.weight_decay = 0.01f;
  env.optimizer = MakeOptimizer("momentum", h);
  LrScheduleOptions o;
  o.base_lr = 0.1;
  o.total_steps = 10;
  env.schedule = std::make_shared<LrSchedule>(o);
  return env;
}

std::string Bytes(const std::vector<std::vector<float>>& v) {
  std::string s;
  for (auto& t : v) s.append(reinterpret_cast<const char*>(t.data()), t.size() * 4);
  return s;
}

TEST(StepGuard, NonFiniteGradientLeavesWeightsAndOptimizerStateBitIdentical) {
  AlgorithmEnv env = MomentumEnv();
  LocalUpdater u(env);
  Tensors m;
  ASSERT_TRUE(u.Apply(m.View(), 0));  // the momentum slots exist now
  CheckpointState before;
  u.Save(m.View(), "opt/", &before);
  const std::string w_before = Bytes(m.w);
  for (float bad : {kInf, -kInf, kNaN}) {
    m.g = {{1, 1, 1, 1, 1}, {2, bad}};  // one element of the last tensor
    EXPECT_FALSE(u.Apply(m.View(), 1));
    EXPECT_EQ(Bytes(m.w), w_before);
    CheckpointState after;
    u.Save(m.View(), "opt/", &after);
    EXPECT_EQ(after.entries, before.entries) << "optimizer state changed by a skipped step (" << bad << ")";
  }
  EXPECT_EQ(u.skipped(), 3);
  m.g = {{1, 1, 1, 1, 1}, {2, 2}};
  EXPECT_TRUE(u.Apply(m.View(), 1));
  EXPECT_NE(Bytes(m.w), w_before);
  EXPECT_EQ(u.skipped(), 3);
}

TEST(StepGuard, FiniteCheckSeesEveryElement) {
  Tensors m;
  EXPECT_TRUE(GradientsFinite(m.View()));
  for (size_t t = 0; t < m.g.size(); ++t)
    for (size_t i = 0; i < m.g[t].size(); ++i) {
      Tensors bad;
      bad.g[t][i] = kNaN;
      EXPECT_FALSE(GradientsFinite(bad.View())) << t << "," << i;
      bad.g[t][i] = std::numeric_limits<float>::max();
      EXPECT_TRUE(GradientsFinite(bad.View()));
    }
}

JobConfig Job(const std::string& algorithm) {
  return ParseJobConfig(
      "[job]\nname = \"t\"\n[cluster]\nworkers = 2\n[model]\nname = \"mlp\"\n"
      "[data]\nformat = \"synthetic\"\nbatch_size = 4\n"
      "[algorithm]\nname = \"" +
          algorithm + "\"\n[optimizer]\nname = \"momentum\"\nlr = 0.1\nweight_decay = 0\n[train]\nepochs = 1\n",
      "job.toml");
}

// Three steps on 2 ranks; at step 1 only rank 1's gradient holds an inf. Every rank must
// skip that step alone and end with the same weights as a run of steps 0 and 2.
void ExpectAgreedSkip(const std::string& algorithm) {
  auto run = [&](bool poison) {
    FakeCluster cluster(2);
    JobConfig cfg = Job(algorithm);
    std::vector<std::vector<float>> out(2);
    std::vector<int64_t> skipped(2);
    RunRankThreads(2, [&](int rank) {
      AlgorithmEnv env = cluster.EnvFor(cfg, rank, 100);
      auto algo = MakeAlgorithm(cfg.algorithm, env);
      std::vector<float> w = {1, 2, 3}, g(3);
      ParamView p;
      p.name = "w";
      p.w = w.data();
      p.g = g.data();
      p.n = 3;
      p.shape = {3};
      algo->Init({p});
      for (int s = 0; s < 3; ++s) {
        if (s == 1 && !poison) continue;
        g = {0.5f * (rank + 1), -1.f, 0.25f};
        if (s == 1) g[2] = rank == 1 ? kInf : 0.25f;
        StepInfo info;
        info.step = s;
        algo->Step({p}, info);
      }
      algo->Finish({p});
      out[size_t(rank)] = w;
      skipped[size_t(rank)] = algo->skipped_steps();
    });
    EXPECT_EQ(out[0], out[1]) << algorithm;
    for (int r = 0; r < 2; ++r) EXPECT_EQ(skipped[size_t(r)], poison ? 1 : 0) << algorithm << " rank " << r;
    for (float x : out[0]) EXPECT_TRUE(std::isfinite(x)) << algorithm;
    return out[0];
  };
  EXPECT_EQ(run(true), run(false)) << algorithm << ": the skipped step changed something";
}

TEST(StepGuard, AllReduceSkipsTheSameStepOnEveryRank) { ExpectAgreedSkip("allreduce"); }
TEST(StepGuard, DgcSkipsTheSameStepOnEveryRank) { ExpectAgreedSkip("dgc"); }

}  // namespace
}  // namespace shoal
