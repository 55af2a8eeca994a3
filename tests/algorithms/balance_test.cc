// Batch balancing: the split follows throughput (SplitBatch), the Balancer agrees on it
// across ranks, and a balanced step (uneven per-worker batches, gradients weighted by
// sample count) equals the unbalanced step on the same global batch, for every synchronous
// algorithm that averages gradients or deltas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "algorithms/algorithm.h"
#include "algorithms/balance.h"
#include "common/config.h"
#include "common/error.h"
#include "tests/algorithms/fake_communicator.h"

namespace shoal {
namespace {

// 3 workers of batch 4 (global 12), SGD at lr 0.1.
JobConfig Job(const std::string& algorithm, const std::string& keys = "") {
  return ParseJobConfig(
      "[job]\nname = \"t\"\n[cluster]\nworkers = 3\n[model]\nname = \"mlp\"\n"
      "[data]\nformat = \"synthetic\"\nbatch_size = 4\n"
      "[algorithm]\nname = \"" +
          algorithm + "\"\nbalance = true\n" + keys +
          "[optimizer]\nname = \"sgd\"\nlr = 0.1\nweight_decay = 0\n[train]\nepochs = 1\n",
      "job.toml");
}

TEST(SplitBatch, ProportionalToThroughputSummingToTheGlobalBatch) {
  EXPECT_EQ(SplitBatch(64, {1, 4, 4, 4}), (std::vector<int64_t>{5, 20, 20, 19}));
  EXPECT_EQ(SplitBatch(12, {1, 1, 1}), (std::vector<int64_t>{4, 4, 4}));
  EXPECT_EQ(SplitBatch(10, {1, 1, 1}), (std::vector<int64_t>{4, 3, 3}));  // ties: lower rank
  // Every worker keeps at least one sample, however slow.
  EXPECT_EQ(SplitBatch(4, {1e-9, 1, 1, 1}), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(SplitBatch(10, {1e-9, 1, 1}), (std::vector<int64_t>{1, 5, 4}));
  // Unmeasured or broken rates: the equal split.
  EXPECT_EQ(SplitBatch(8, {0, 3}), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(SplitBatch(8, {NAN, 3}), (std::vector<int64_t>{4, 4}));
  EXPECT_THROW(SplitBatch(2, {1, 1, 1}), Error);
  for (int64_t g : {7, 64, 1000}) {
    auto s = SplitBatch(g, {0.3, 2.5, 1.25, 7});
    EXPECT_EQ(std::accumulate(s.begin(), s.end(), int64_t(0)), g);
  }
}

// Models with batch norm: no share under the floor, however slow the worker.
TEST(SplitBatch, NoShareFallsUnderTheFloor) {
  EXPECT_EQ(SplitBatch(12, {1e-9, 1, 1}, 2), (std::vector<int64_t>{2, 5, 5}));
  EXPECT_EQ(SplitBatch(64, {1e-9, 1e-9, 4, 4}, 16), (std::vector<int64_t>{16, 16, 16, 16}));
  EXPECT_EQ(SplitBatch(64, {1, 100, 100, 100}, 4), (std::vector<int64_t>{4, 20, 20, 20}));
  for (int64_t g : {12, 64, 1000})
    for (int64_t floor : {1, 2, 3}) {
      auto s = SplitBatch(g, {0.001, 2.5, 1.25, 7}, floor);
      EXPECT_EQ(std::accumulate(s.begin(), s.end(), int64_t(0)), g);
      EXPECT_GE(*std::min_element(s.begin(), s.end()), floor) << g << " " << floor;
    }
  try {
    SplitBatch(8, {1, 1, 1}, 3);
    FAIL() << "8 samples cannot give 3 workers 3 each";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot give each of 3 workers 3 sample(s)"), std::string::npos) << e.what();
  }
}

TEST(MinBalancedShare, TwoSamplesAndSixteenValuesPerChannelWithBatchNorm) {
  EXPECT_EQ(MinBalancedShare(0, 32), 1);   // no batch norm
  EXPECT_EQ(MinBalancedShare(64, 32), 2);  // resnet20 on 32x32: its 8x8 last stage
  EXPECT_EQ(MinBalancedShare(49, 32), 2);  // resnet50 on 224x224: 7x7
  EXPECT_EQ(MinBalancedShare(4, 32), 4);   // 2x2 maps
  EXPECT_EQ(MinBalancedShare(1, 32), 16);  // resnet50 on 32x32: 1x1 maps
  EXPECT_EQ(MinBalancedShare(1, 8), 8);    // never more than the equal share
  EXPECT_EQ(MinBalancedShare(1, 1), 1);
}

TEST(Balancer, TheSlowestShareStopsAtTheFloor) {
  JobConfig cfg = Job("allreduce", "balance_every_steps = 1\n");
  FakeCluster cluster(3);
  std::vector<std::vector<int64_t>> sizes(3);
  RunRankThreads(3, [&](int rank) {
    AlgorithmEnv env = cluster.EnvFor(cfg, rank, 10);
    env.min_share = 2;
    Balancer b(env);
    // Rank 0 is 100x slower: its proportional share, 12/201, would be the minimum of one.
    b.Observe(4, rank == 0 ? 100.0 : 1.0);
    EXPECT_TRUE(b.MaybeRebalance(1));
    sizes[size_t(rank)] = b.sizes();
  });
  EXPECT_EQ(sizes[0], (std::vector<int64_t>{2, 5, 5}));
  EXPECT_EQ(sizes[1], sizes[0]);
  EXPECT_EQ(sizes[2], sizes[0]);
}

TEST(Balancer, EveryRankAgreesOnTheSplitFromGatheredThroughput) {
  JobConfig cfg = Job("allreduce", "balance_every_steps = 2\n");
  FakeCluster cluster(3);
  std::vector<std::vector<int64_t>> sizes(3);
  std::vector<int64_t> offsets(3);
  RunRankThreads(3, [&](int rank) {
    Balancer b(cluster.EnvFor(cfg, rank, 10));
    EXPECT_EQ(b.sizes(), (std::vector<int64_t>{4, 4, 4}));
    // Rank 0 computes its 4 samples in 4 s, the others in 1 s: rank 0 is 4x slower.
    b.Observe(4, rank == 0 ? 4.0 : 1.0);
    EXPECT_FALSE(b.MaybeRebalance(1));  // not a rebalancing step
    b.Observe(4, rank == 0 ? 4.0 : 1.0);
    EXPECT_TRUE(b.MaybeRebalance(2));
    sizes[size_t(rank)] = b.sizes();
    offsets[size_t(rank)] = b.offset();
    CheckpointState st;
    b.Save(&st);
    Balancer again(cluster.EnvFor(cfg, rank, 10));
    again.Load(st);
    EXPECT_EQ(again.sizes(), b.sizes());
    st.Put("balance/sizes", "1,2,3");
    EXPECT_THROW(again.Load(st), Error);  // sums to 6, not 12
    // Wraps to 12 in 64 bits: refused before it is summed, not taken as a split.
    st.Put("balance/sizes", "9223372036854775807,9223372036854775807,14");
    EXPECT_THROW(again.Load(st), Error);
    for (const char* bad : {"4,,4", "4,4,x", "4,4,99999999999999999999", "4,4,4,"}) {
      st.Put("balance/sizes", bad);
      try {
        again.Load(st);
        ADD_FAILURE() << bad << " was accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("entry 'balance/sizes'"), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(again.sizes(), b.sizes());  // a refused entry leaves the split as it was
  });
  // rates 1, 4, 4 of 12: 4/3 -> 1 (+1 by remainder), 16/3 -> 5
  EXPECT_EQ(sizes[0], (std::vector<int64_t>{2, 5, 5}));
  EXPECT_EQ(sizes[1], sizes[0]);
  EXPECT_EQ(sizes[2], sizes[0]);
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 2, 7}));
}

// Per-sample gradients of a 3-element tensor: sample i's is (sin i, cos i, i/10).
std::vector<float> SampleGrad(int i) { return {std::sin(float(i)), std::cos(float(i)), float(i) / 10}; }

// Runs `cfg`'s algorithm for `steps` steps on 3 ranks where rank r's gradient at step s is
// the mean of SampleGrad over its slice (by `sizes`) of step s's 12-sample global batch;
// `balanced` passes sample counts in StepInfo (as the trainer does when balancing).
std::vector<float> RunSplit(const JobConfig& cfg, const std::vector<int64_t>& sizes, bool balanced, int steps) {
  FakeCluster cluster(3);
  std::vector<std::vector<float>> out(3);
  RunRankThreads(3, [&](int rank) {
    auto algo = MakeAlgorithm(cfg.algorithm, cluster.EnvFor(cfg, rank, 100));
    EXPECT_TRUE(algo->BalancesBatches());
    std::vector<float> w = {1, -2, 0.5f}, g(3);
    std::vector<ParamView> params = OneTensor(w, g);
    algo->Init(params);
    const int64_t offset = std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t(0));
    for (int s = 0; s < steps; ++s) {
      std::fill(g.begin(), g.end(), 0.f);
      for (int64_t k = 0; k < sizes[size_t(rank)]; ++k) {
        auto gi = SampleGrad(int(12 * s + offset + k));
        for (int j = 0; j < 3; ++j) g[size_t(j)] += gi[size_t(j)] / float(sizes[size_t(rank)]);
      }
      StepInfo info;
      info.step = s;
      info.samples = balanced ? sizes[size_t(rank)] : 0;
      info.global_samples = balanced ? 12 : 0;
      algo->Step(params, info);
    }
    algo->Finish(params);
    out[size_t(rank)] = w;
  });
  EXPECT_EQ(out[0], out[1]) << "weights differ across ranks";
  EXPECT_EQ(out[0], out[2]) << "weights differ across ranks";
  return out[0];
}

// One SGD step per global batch of 12: w -= 0.1 x mean of its 12 sample gradients.
std::vector<float> GlobalBatchSgd(int steps) {
  std::vector<double> w = {1, -2, 0.5};
  for (int s = 0; s < steps; ++s)
    for (int j = 0; j < 3; ++j) {
      double sum = 0;
      for (int i = 0; i < 12; ++i) sum += SampleGrad(12 * s + i)[size_t(j)];
      w[size_t(j)] -= 0.1 * sum / 12;
    }
  return {float(w[0]), float(w[1]), float(w[2])};
}

TEST(BalancedStep, EqualsTheUnbalancedStepOnTheSameSamples) {
  const std::vector<int64_t> uneven = {2, 7, 3};
  struct Case {
    std::string algorithm, keys;
  };
  for (const Case& c : {Case{"allreduce", ""}, Case{"double_buffer", ""}, Case{"dgc", "sparsity = 0\n"},
                        Case{"bmuf", "block_steps = 1\nblock_momentum = 0\nnesterov = false\n"},
                        Case{"bmuf", "sync_warmup_epochs = 1\n"}}) {
    SCOPED_TRACE(c.algorithm + " " + c.keys);
    JobConfig cfg = Job(c.algorithm, c.keys);
    auto even = RunSplit(cfg, {4, 4, 4}, false, 3);
    auto balanced = RunSplit(cfg, uneven, true, 3);
    auto expect = GlobalBatchSgd(3);
    for (int j = 0; j < 3; ++j) {
      EXPECT_NEAR(balanced[size_t(j)], even[size_t(j)], 1e-6) << j;
      EXPECT_NEAR(balanced[size_t(j)], expect[size_t(j)], 1e-5) << j;
    }
    // Without the weights the uneven split is another (wrong) update: the test can tell.
    auto unweighted = RunSplit(cfg, uneven, false, 3);
    double diff = 0;
    for (int j = 0; j < 3; ++j) diff += std::fabs(unweighted[size_t(j)] - expect[size_t(j)]);
    EXPECT_GT(diff, 1e-3);
  }
}

TEST(BalancedStep, BalancingTurnsAllReduceOverlapOff) {
  // Overlapped buckets would leave before the sample-count weight is applied.
  JobConfig cfg = Job("allreduce", "overlap = true\n");
  FakeCluster cluster(3);
  RunRankThreads(3, [&](int rank) {
    auto algo = MakeAlgorithm(cfg.algorithm, cluster.EnvFor(cfg, rank, 100));
    EXPECT_TRUE(algo->BalancesBatches());
    EXPECT_FALSE(algo->WantsGradReady());
  });
}

TEST(BalancedStep, TheBalanceKeyIsAcceptedOnlyWhereItIsRead) {
  for (const char* a : {"allreduce", "double_buffer", "dgc", "bmuf", "auto"}) {
    auto keys = KnownAlgorithmKeys(a);
    EXPECT_NE(std::find(keys.begin(), keys.end(), "balance"), keys.end()) << a;
  }
  for (const char* a : {"adpsgd", "ps_sync", "local"}) {
    auto keys = KnownAlgorithmKeys(a);
    EXPECT_EQ(std::find(keys.begin(), keys.end(), "balance"), keys.end()) << a;
  }
}

}  // namespace
}  // namespace shoal
