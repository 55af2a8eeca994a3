// The synchronous algorithms' arithmetic over the in-process fake communicator: a step with
// known gradients on every rank gives known weights, identical on every rank. Also the
// registry: every registered algorithm has facts, duplicates and unknown names are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "algorithms/algorithm.h"
#include "common/config.h"
#include "common/error.h"
#include "tests/algorithms/fake_communicator.h"

namespace shoal {
namespace {

// SGD at a constant lr 0.1, no decay; 2 workers; extra [algorithm] keys from the test.
JobConfig Job(const std::string& algorithm, const std::string& algorithm_keys = "") {
  return ParseJobConfig(
      "[job]\nname = \"t\"\n[cluster]\nworkers = 2\n[model]\nname = \"mlp\"\n"
      "[data]\nformat = \"synthetic\"\nbatch_size = 4\n"
      "[algorithm]\nname = \"" +
          algorithm + "\"\n" + algorithm_keys +
          "[optimizer]\nname = \"sgd\"\nlr = 0.1\nweight_decay = 0\n[train]\nepochs = 1\n",
      "job.toml");
}

// One rank's model: named tensors it owns, viewed as ParamViews.
struct Model {
  std::map<std::string, std::vector<float>> w, g;
  std::vector<ParamView> views;
  void Add(const std::string& name, std::vector<float> init) {
    g[name].assign(init.size(), 0.f);
    w[name] = std::move(init);
  }
  const std::vector<ParamView>& View() {
    views.clear();
    for (auto& [name, v] : w) {
      ParamView p;
      p.name = name;
      p.w = v.data();
      p.g = g[name].data();
      p.n = int64_t(v.size());
      p.shape = {p.n};
      views.push_back(p);
    }
    return views;
  }
};

// Runs `algorithm` on 2 ranks: Init, then one Step per gradient set (grads(rank, step)),
// then Finish; returns each rank's final weights of tensor "w".
// `world` ranks (default 2); `samples(rank)`: each rank's share of a global batch of their
// sum, as a balanced job's trainer reports it (default: unknown, all equal); `tensors`: the
// sizes of tensors "t0", "t1", ... that init, the gradients and the results are cut into
// (default: one tensor "w").
std::vector<std::vector<float>> RunAlgorithm(const JobConfig& cfg, std::vector<float> init,
                                             const std::function<std::vector<float>(int rank, int step)>& grads,
                                             int steps,
                                             std::vector<std::vector<std::vector<float>>>* after_each = nullptr,
                                             int world = 2, const std::vector<int64_t>& samples = {},
                                             std::vector<size_t> tensors = {}) {
  if (tensors.empty()) tensors = {init.size()};
  auto name = [&](size_t t) { return tensors.size() == 1 ? std::string("w") : "t" + std::to_string(t); };
  FakeCluster cluster(world);
  std::vector<std::vector<float>> out(size_t(world), std::vector<float>{});
  if (after_each) after_each->assign(size_t(world), {});
  int64_t global = 0;
  for (int64_t n : samples) global += n;
  RunRankThreads(world, [&](int rank) {
    AlgorithmEnv env = cluster.EnvFor(cfg, rank, 100);
    auto algo = MakeAlgorithm(cfg.algorithm, env);
    Model m;
    std::vector<float> start = init;
    if (rank != 0)
      for (auto& x : start) x += 7;  // Init must replace it with rank 0's
    auto flat = [&](std::map<std::string, std::vector<float>>& by_name) {
      std::vector<float> v;
      for (size_t t = 0; t < tensors.size(); ++t) v.insert(v.end(), by_name[name(t)].begin(), by_name[name(t)].end());
      return v;
    };
    auto cut = [&](const std::vector<float>& v, std::map<std::string, std::vector<float>>* by_name) {
      for (size_t t = 0, off = 0; t < tensors.size(); off += tensors[t++])
        (*by_name)[name(t)].assign(v.begin() + long(off), v.begin() + long(off + tensors[t]));
    };
    for (size_t t = 0; t < tensors.size(); ++t) m.Add(name(t), std::vector<float>(tensors[t]));
    cut(start, &m.w);
    algo->Init(m.View());
    for (int s = 0; s < steps; ++s) {
      cut(grads(rank, s), &m.g);
      StepInfo info;
      info.step = s;
      if (!samples.empty()) {
        info.samples = samples[size_t(rank)];
        info.global_samples = global;
      }
      algo->Step(m.View(), info);
      if (after_each) (*after_each)[size_t(rank)].push_back(flat(m.w));
    }
    algo->Finish(m.View());
    out[size_t(rank)] = flat(m.w);
  });
  return out;
}

void ExpectAll(const std::vector<std::vector<float>>& got, const std::vector<float>& want) {
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[r][i], want[i], 1e-6) << "rank " << r << " element " << i;
  }
}

TEST(AllReduceAlgorithm, OneStepAppliesTheMeanGradient) {
  // Rank r's gradient (r+1)(1, 2): mean (1.5, 3); w = 1 - 0.1 * mean.
  auto got = RunAlgorithm(
      Job("allreduce"), {1, 1},
      [](int r, int) {
        return std::vector<float>{float(r + 1), 2.f * (r + 1)};
      },
      1);
  ExpectAll(got, {0.85f, 0.7f});
}

TEST(AllReduceAlgorithm, Bf16WireRoundsTheSameOnEveryRank) {
  auto got = RunAlgorithm(
      Job("allreduce", "wire_dtype = \"bf16\"\n"), {1}, [](int r, int) { return std::vector<float>{r ? 1.001f : 2.f}; },
      1);
  EXPECT_EQ(got[0], got[1]);
  EXPECT_NEAR(got[0][0], 1 - 0.1 * 1.5, 1e-3);
}

TEST(DoubleBufferAlgorithm, EachUpdateUsesThePreviousStepsMeanAndFinishAppliesTheLast) {
  // Step 0's mean gradient 1.5, step 1's 15.
  std::vector<std::vector<std::vector<float>>> after;
  auto got = RunAlgorithm(
      Job("double_buffer"), {1}, [](int r, int s) { return std::vector<float>{float((r + 1) * (s == 0 ? 1 : 10))}; }, 2,
      &after);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(after[size_t(r)][0][0], 1.f, 1e-6) << "step 0 has nothing stale to apply";
    EXPECT_NEAR(after[size_t(r)][1][0], 1 - 0.1 * 1.5, 1e-6) << "step 1 applies step 0's mean";
  }
  ExpectAll(got, {float(1 - 0.1 * 1.5 - 0.1 * 15)});
}

TEST(BmufAlgorithm, ABlockAveragesTheDeltasThroughBlockMomentum) {
  // Two local SGD steps with gradient r+1: rank 0 ends at 0.8, rank 1 at 0.6; mean delta
  // 0.3; v = 0.5 * 0 + (1 - 0.5) * 1 * 0.3 = 0.15; global = 0.85; Nesterov start =
  // 0.85 - 0.5 * 0.15 = 0.775, on both ranks.
  std::vector<std::vector<std::vector<float>>> after;
  auto got = RunAlgorithm(
      Job("bmuf", "block_steps = 2\nblock_momentum = 0.5\nblock_lr = 1.0\nnesterov = true\n"), {1},
      [](int r, int) { return std::vector<float>{float(r + 1)}; }, 2, &after);
  EXPECT_NEAR(after[0][0][0], 0.9f, 1e-6);  // the first step is local
  EXPECT_NEAR(after[1][0][0], 0.8f, 1e-6);
  ExpectAll(got, {0.775f});
}

TEST(DilocoAlgorithm, OuterNesterovStepsByHand) {
  // Inner SGD at lr 0.1 with gradient r+1 for 2 steps from 1: rank 0 ends a round 0.2 below
  // its start, rank 1 0.4 below; the mean pseudo-gradient is 0.3 both rounds. PyTorch's
  // SGD(lr=0.5, momentum=0.5, nesterov=True) on it (checked with torch 1.13):
  //   round 1: b = 0.3, step = 0.3 + 0.5 * 0.3 = 0.45, w = 1 - 0.5 * 0.45 = 0.775
  //   round 2: b = 0.5 * 0.3 + 0.3 = 0.45, step = 0.3 + 0.5 * 0.45 = 0.525, w = 0.775 - 0.2625 = 0.5125
  std::vector<std::vector<std::vector<float>>> after;
  auto got = RunAlgorithm(
      Job("diloco", "sync_every = 2\nouter_optimizer = \"nesterov\"\nouter_lr = 0.5\nouter_momentum = 0.5\n"), {1},
      [](int r, int) { return std::vector<float>{float(r + 1)}; }, 4, &after);
  EXPECT_NEAR(after[0][0][0], 0.9f, 1e-6);  // inner steps are local
  EXPECT_NEAR(after[1][0][0], 0.8f, 1e-6);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(after[size_t(r)][1][0], 0.775f, 1e-6) << "rank " << r;
    EXPECT_NEAR(after[size_t(r)][2][0], 0.775f - 0.1f * float(r + 1), 1e-6) << "rank " << r;
  }
  ExpectAll(got, {0.5125f});
}

TEST(DilocoAlgorithm, OuterSgdAtLrOneIsModelAveraging) {
  auto got = RunAlgorithm(
      Job("diloco", "sync_every = 2\nouter_optimizer = \"sgd\"\nouter_lr = 1.0\n"), {1, 2},
      [](int r, int) {
        return std::vector<float>{float(r + 1), -float(r)};
      },
      2);
  // Rank 0 ends at (0.8, 2), rank 1 at (0.6, 2.2): their mean.
  ExpectAll(got, {0.7f, 2.1f});
}

TEST(DilocoAlgorithm, PseudoGradientsCountByTheSamplesEachWorkerProcessed) {
  // One inner step per round; rank 0 processed 3 of 4 samples, rank 1 one: the pseudo-
  // gradients 0.1 and 0.2 count 3 : 1, so plain averaging gives 1 - (3 * 0.1 + 0.2) / 4.
  auto got = RunAlgorithm(Job("diloco", "sync_every = 1\nouter_optimizer = \"sgd\"\nouter_lr = 1.0\n"), {1},
                          [](int r, int) { return std::vector<float>{float(r + 1)}; }, 1, nullptr, 2, {3, 1});
  ExpectAll(got, {0.875f});
}

// Three ranks with irregular gradients (a ring's a + b = b + a would hide an order that
// differs between ranks): after every outer step, and at the end of a partial round, every
// rank holds the same bits.
TEST(DilocoAlgorithm, EveryWorkerHoldsTheSameBitsAfterEveryOuterStep) {
  const int steps = 7;
  std::vector<std::vector<std::vector<float>>> after;
  auto got = RunAlgorithm(
      Job("diloco", "sync_every = 3\nouter_lr = 0.7\nouter_momentum = 0.9\n"), {0.3f, -1.7f, 2.2f, 0.01f},
      [](int r, int s) {
        std::vector<float> g(4);
        for (int i = 0; i < 4; ++i) g[size_t(i)] = std::sin(float(1 + r * 31 + s * 7 + i * 3)) * float(1 + i);
        return g;
      },
      steps, &after, 3);
  for (int s : {2, 5}) {
    EXPECT_EQ(after[1][size_t(s)], after[0][size_t(s)]) << "after step " << s;
    EXPECT_EQ(after[2][size_t(s)], after[0][size_t(s)]) << "after step " << s;
  }
  EXPECT_NE(after[1][6], after[0][6]) << "mid-round the workers' weights are their own";
  EXPECT_EQ(got[1], got[0]);
  EXPECT_EQ(got[2], got[0]);
}

// Quantized pseudo-gradients: every rank applies the same decoded values, so the weights stay
// bit-identical after every outer step; they differ from fp32's by the rounding alone (int8:
// at most absmax / 254 of a block per worker's pseudo-gradient, int4 absmax / 14).
TEST(DilocoAlgorithm, QuantizedWiresKeepEveryWorkerIdentical) {
  const int steps = 6;
  const std::vector<float> init = {0.3f, -1.7f, 2.2f, 0.01f, 5.f};
  auto grads = [](int r, int s) {
    std::vector<float> g(5);
    for (int i = 0; i < 5; ++i) g[size_t(i)] = std::sin(float(2 + r * 17 + s * 5 + i * 11)) * float(1 + i);
    return g;
  };
  const std::string keys = "sync_every = 3\nouter_optimizer = \"sgd\"\nouter_lr = 1.0\n";
  auto exact = RunAlgorithm(Job("diloco", keys), init, grads, steps, nullptr, 3);
  for (const char* wire : {"bf16", "int8", "int4"}) {
    std::vector<std::vector<std::vector<float>>> after;
    auto got = RunAlgorithm(Job("diloco", keys + "outer_wire = \"" + wire + "\"\n"), init, grads, steps, &after, 3);
    for (int s : {2, 5})
      for (int r : {1, 2}) EXPECT_EQ(after[size_t(r)][size_t(s)], after[0][size_t(s)]) << wire << " step " << s;
    // Two outer steps of plain averaging; each worker's pseudo-gradient is at most 0.1 x 3 x 5 = 1.5.
    const float bound = std::string(wire) == "int4" ? 2 * 1.5f / 14 : 2 * 1.5f / 254;
    for (size_t i = 0; i < init.size(); ++i) EXPECT_NEAR(got[0][i], exact[0][i], bound) << wire << " element " << i;
    EXPECT_NE(got[0], exact[0]) << wire << " changed nothing";
  }
}

// Streaming with one fragment, no overlap and merge_alpha 0 is DiLoCo itself, bit for bit
// (the rounds, the partial round at the end).
TEST(DilocoAlgorithm, StreamingOfOneFragmentWithoutOverlapIsPlainDiloco) {
  const std::vector<float> init = {0.3f, -1.7f, 2.2f, 0.01f};
  auto grads = [](int r, int s) {
    std::vector<float> g(4);
    for (int i = 0; i < 4; ++i) g[size_t(i)] = std::sin(float(1 + r * 31 + s * 7 + i * 3)) * float(1 + i);
    return g;
  };
  const std::string keys = "sync_every = 3\nouter_lr = 0.7\nouter_momentum = 0.9\n";
  std::vector<std::vector<std::vector<float>>> plain, streamed;
  auto want = RunAlgorithm(Job("diloco", keys), init, grads, 7, &plain, 3);
  auto got = RunAlgorithm(Job("diloco", keys + "streaming = 1\noverlap_steps = 0\nmerge_alpha = 0.0\n"), init, grads, 7,
                          &streamed, 3);
  EXPECT_EQ(streamed, plain);
  EXPECT_EQ(got, want);
}

// Two fragments of a 5-element model ([0, 2) and [2, 5), cutting tensor t0 = 3 elements),
// sync_every 4: fragment 0 leaves after steps 4, 8, fragment 1 after steps 2, 6; each lands
// one step later and merges half and half. Inner SGD at lr 0.1 on a constant gradient g_r,
// outer plain averaging, start x0: fragment 1 after 3 steps is
//   0.5 (x0 - 0.3 g_r) + 0.5 (x0 - 0.2 mean(g))    (the mean of the locals after 2 steps),
// fragment 0 still purely local (x0 - 0.3 g_r); after 5 steps fragment 0 is
//   0.5 (x0 - 0.5 g_r) + 0.5 (x0 - 0.4 mean(g)).
// After Finish every rank holds the same bits.
TEST(DilocoAlgorithm, StreamingFragmentsLeaveStaggeredAndMergeWhenTheyLand) {
  const std::vector<float> x0 = {1.f, -2.f, 0.5f, 3.f, -1.f};
  auto g = [](int r) { return std::vector<float>{float(r + 1), float(2 * r - 1), 0.5f, -float(r), 3.f}; };
  std::vector<std::vector<std::vector<float>>> after;
  auto got = RunAlgorithm(Job("diloco",
                              "sync_every = 4\nouter_optimizer = \"sgd\"\nouter_lr = 1.0\nstreaming = 2\n"
                              "overlap_steps = 1\nmerge_alpha = 0.5\n"),
                          x0, [&](int r, int) { return g(r); }, 7, &after, 3, {}, {3, 2});
  for (int r = 0; r < 3; ++r) {
    for (size_t i = 0; i < 5; ++i) {
      const float mean = (g(0)[i] + g(1)[i] + g(2)[i]) / 3, gr = g(r)[i];
      const float at3 = i < 2 ? x0[i] - 0.3f * gr : 0.5f * (x0[i] - 0.3f * gr) + 0.5f * (x0[i] - 0.2f * mean);
      EXPECT_NEAR(after[size_t(r)][2][i], at3, 1e-5) << "rank " << r << " element " << i << " after 3 steps";
      if (i < 2) {
        EXPECT_NEAR(after[size_t(r)][4][i], 0.5f * (x0[i] - 0.5f * gr) + 0.5f * (x0[i] - 0.4f * mean), 1e-5)
            << "rank " << r << " element " << i << " after 5 steps";
      }
    }
  }
  EXPECT_EQ(got[1], got[0]);
  EXPECT_EQ(got[2], got[0]);
}

// Streaming on a quantized wire with balanced shares: the fragments' global weights agree on
// every rank, so Finish leaves one model.
TEST(DilocoAlgorithm, StreamingOnAnInt4WireWithUnevenSharesEndsOnOneModel) {
  auto got = RunAlgorithm(Job("diloco", "sync_every = 6\nstreaming = 3\noverlap_steps = 1\nouter_wire = \"int4\"\n"),
                          {0.3f, -1.7f, 2.2f, 0.01f, 5.f, -0.4f, 1.1f},
                          [](int r, int s) {
                            std::vector<float> g(7);
                            for (int i = 0; i < 7; ++i)
                              g[size_t(i)] = std::cos(float(3 + r * 13 + s * 7 + i * 5)) * float(1 + i % 3);
                            return g;
                          },
                          11, nullptr, 3, {5, 2, 9}, {4, 3});
  EXPECT_EQ(got[1], got[0]);
  EXPECT_EQ(got[2], got[0]);
}

TEST(DilocoAlgorithm, BadKeysAreNamed) {
  auto error = [](const std::string& keys) {
    FakeCluster cluster(1);
    JobConfig cfg = Job("diloco", keys);
    try {
      MakeAlgorithm("diloco", cluster.EnvFor(cfg, 0, 100));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error("outer_optimizer = \"adam\"\n").find("job.toml: [algorithm] outer_optimizer: \"adam\""),
            std::string::npos);
  EXPECT_NE(error("outer_lr = -1.0\n").find("[algorithm] outer_lr"), std::string::npos);
  EXPECT_NE(error("outer_momentum = 1.5\n").find("[algorithm] outer_momentum"), std::string::npos);
  EXPECT_NE(error("sync_every = 0\n").find("[algorithm] sync_every"), std::string::npos);
  EXPECT_NE(error("sync_every = 4\nstreaming = 5\n").find("[algorithm] streaming"), std::string::npos);
  EXPECT_NE(error("sync_every = 4\nstreaming = 2\noverlap_steps = 2\n").find("[algorithm] overlap_steps"),
            std::string::npos);
  EXPECT_NE(error("merge_alpha = 0.5\n").find("[algorithm] merge_alpha: only with streaming"), std::string::npos);
  EXPECT_NE(error("streaming = 2\nmerge_alpha = 1.5\n").find("[algorithm] merge_alpha"), std::string::npos);
  EXPECT_NE(error("outer_wire = \"int2\"\n").find("job.toml: [algorithm] outer_wire: \"int2\" is no outer wire format"),
            std::string::npos);
  EXPECT_NE(error("sync_every = \"often\"\n").find("[algorithm] sync_every"), std::string::npos);
}

TEST(DgcAlgorithm, SendsTheTopEntryAndKeepsTheRestAsResidual) {
  // 4 elements at sparsity 0.75: one pair per rank per step. Step 0: rank 0 sends index 1
  // (5) and keeps 1 at index 3; rank 1 sends index 2 (3). w -= 0.1 * sum / 2. Step 1 (zero
  // gradients): rank 0's residual at index 3 goes out.
  const std::string keys = "sparsity = 0.75\nsparsity_warmup_epochs = 0\nmin_compress_elements = 4\nmin_pairs = 1\n";
  std::vector<std::vector<std::vector<float>>> after;
  auto got = RunAlgorithm(
      Job("dgc", keys), {1, 1, 1, 1},
      [](int r, int s) {
        if (s == 1) return std::vector<float>{0, 0, 0, 0};
        return r == 0 ? std::vector<float>{0, 5, 0, 1} : std::vector<float>{0, 0, 3, 0};
      },
      2, &after);
  for (int r = 0; r < 2; ++r) {
    const auto& w = after[size_t(r)][0];
    EXPECT_NEAR(w[0], 1, 1e-6);
    EXPECT_NEAR(w[1], 1 - 0.1 * 2.5, 1e-6);
    EXPECT_NEAR(w[2], 1 - 0.1 * 1.5, 1e-6);
    EXPECT_NEAR(w[3], 1, 1e-6);
  }
  ExpectAll(got, {1.f, 0.75f, 0.85f, 0.95f});
}

TEST(AlgorithmRegistry, EveryAlgorithmsFactsAgree) {
  JobConfig cfg = Job("allreduce");
  for (const AlgorithmFacts& f : AllAlgorithmFacts()) {
    EXPECT_EQ(f.needs_servers, f.server_update != ServerUpdate::kNone) << f.name;
    EXPECT_NO_THROW(FactsOf(f.name));
  }
  EXPECT_EQ(FactsOf("ps_sync").server_update, ServerUpdate::kMeanOfWorkers);
  EXPECT_EQ(FactsOf("ps_async").tolerated_deaths, ToleratedDeaths::kAnyButLast);
  EXPECT_EQ(FactsOf("allreduce").tolerated_deaths, ToleratedDeaths::kNone);
  try {
    FactsOf("allreduse");
    FAIL() << "an unknown name was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("known: "), std::string::npos) << e.what();
  }
}

TEST(AlgorithmRegistry, ADuplicateOrUnknownNameIsRefused) {
  AlgorithmFactory f = [](const AlgorithmEnv&) -> std::unique_ptr<Algorithm> { return nullptr; };
  try {
    RegisterAlgorithm("allreduce", f);
    FAIL() << "a second \"allreduce\" was registered";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("registered twice"), std::string::npos) << e.what();
  }
  EXPECT_THROW(RegisterAlgorithm("no_such_algorithm", f), Error);
}

}  // namespace
}  // namespace shoal
