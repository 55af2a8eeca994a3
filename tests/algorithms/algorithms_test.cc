// The synchronous algorithms' arithmetic over the in-process fake communicator: a step with
// known gradients on every rank gives known weights, identical on every rank. Also the
// registry: every registered algorithm has facts, duplicates and unknown names are refused.
#include <gtest/gtest.h>

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
std::vector<std::vector<float>> RunAlgorithm(const JobConfig& cfg, std::vector<float> init,
                                             const std::function<std::vector<float>(int rank, int step)>& grads,
                                             int steps,
                                             std::vector<std::vector<std::vector<float>>>* after_each = nullptr) {
  FakeCluster cluster(2);
  std::vector<std::vector<float>> out(2);
  if (after_each) after_each->assign(2, {});
  RunRankThreads(2, [&](int rank) {
    AlgorithmEnv env = cluster.EnvFor(cfg, rank, 100);
    auto algo = MakeAlgorithm(cfg.algorithm, env);
    Model m;
    std::vector<float> start = init;
    if (rank != 0)
      for (auto& x : start) x += 7;  // Init must replace it with rank 0's
    m.Add("w", start);
    algo->Init(m.View());
    for (int s = 0; s < steps; ++s) {
      m.g["w"] = grads(rank, s);
      StepInfo info;
      info.step = s;
      algo->Step(m.View(), info);
      if (after_each) (*after_each)[size_t(rank)].push_back(m.w["w"]);
    }
    algo->Finish(m.View());
    out[size_t(rank)] = m.w["w"];
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
