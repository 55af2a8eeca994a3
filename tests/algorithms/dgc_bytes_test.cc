// What dgc puts on the wire per step, counted by the ZeroMQ ring's own byte counter (ring
// headers included), against dense all-reduce of the same model: 4 ranks on threads, a
// model with lenet's tensor sizes (317,066 parameters), sparsity 0.999 after warm-up.
#include <gtest/gtest.h>
#include <unistd.h>

#include <random>
#include <set>

#include "algorithms/algorithm.h"
#include "algorithms/collectives/zmq_ring.h"
#include "common/config.h"
#include "common/rendezvous/store.h"
#include "tests/algorithms/fake_communicator.h"

namespace shoal {
namespace {

const std::vector<int64_t> kLenet = {800, 32, 51200, 64, 262144, 256, 2560, 10};  // conv1 w, b, conv2, fc1, fc2

JobConfig Job(const std::string& algorithm_section) {
  return ParseJobConfig(
      "[job]\nname = \"t\"\n[cluster]\nworkers = 4\n[model]\nname = \"lenet\"\n"
      "[data]\nformat = \"synthetic\"\nbatch_size = 4\n" +
          algorithm_section +
          "[optimizer]\nname = \"momentum\"\nlr = 0.05\nmomentum = 0.9\nweight_decay = 1e-4\n[train]\nepochs = 4\n",
      "job.toml");
}

struct Measured {
  double bytes_per_step = 0;             // rank 0's counter over the measured steps
  std::set<std::vector<float>> weights;  // every rank's final weights, all tensors
};

// Runs `steps` steps on 4 ranks over a real ring; counts rank 0's bytes_sent from step
// `from` on.
Measured RunSteps(const std::string& algorithm_section, int steps, int from) {
  const int world = 4;
  static int run = 0;
  std::string dir = ::testing::TempDir() + "/dgc_bytes_" + std::to_string(getpid()) + "_" + std::to_string(run++);
  JobConfig cfg = Job(algorithm_section);
  Measured m;
  std::vector<std::vector<float>> finals(world);
  RunRankThreads(world, [&](int rank) {
    FileStore store(dir);
    FakeCluster unused(world);
    AlgorithmEnv env = unused.EnvFor(cfg, rank, 4);  // 4 steps an epoch
    env.make_communicator = [&, rank](const std::string& name) -> std::unique_ptr<Communicator> {
      RingOptions o;
      o.prefix = name;
      return std::make_unique<ZmqRing>(rank, world, store, o);
    };
    auto algo = MakeAlgorithm(cfg.algorithm, env);
    std::vector<std::vector<float>> w, g;
    std::vector<ParamView> views;
    std::mt19937_64 rng(uint64_t(rank) + 1);
    std::normal_distribution<float> nd(0.f, 0.01f);
    for (int64_t n : kLenet) {
      w.emplace_back(size_t(n));
      g.emplace_back(size_t(n));
      for (auto& x : w.back()) x = nd(rng);
    }
    for (size_t t = 0; t < kLenet.size(); ++t) {
      ParamView p;
      p.name = "t" + std::to_string(t);
      p.w = w[t].data();
      p.g = g[t].data();
      p.n = kLenet[t];
      p.shape = {p.n};
      views.push_back(p);
    }
    algo->Init(views);
    int64_t at = 0;
    for (int s = 0; s < steps; ++s) {
      if (s == from) at = algo->bytes_sent();
      for (auto& t : g)
        for (auto& x : t) x = nd(rng);
      StepInfo info;
      info.step = s;
      algo->Step(views, info);
    }
    if (rank == 0) m.bytes_per_step = double(algo->bytes_sent() - at) / double(steps - from);
    algo->Finish(views);
    for (auto& t : w) finals[size_t(rank)].insert(finals[size_t(rank)].end(), t.begin(), t.end());
  });
  for (auto& f : finals) m.weights.insert(f);
  return m;
}

TEST(DgcBytes, AfterWarmupAtSparsity0999SendsOver250xFewerBytesThanDenseAllReduce) {
  // Warm-up over epoch 0 (steps 0-3); steps 4-11 are at 0.999.
  Measured dgc = RunSteps("[algorithm]\nname = \"dgc\"\nsparsity = 0.999\nsparsity_warmup_epochs = 1\n", 12, 4);
  Measured dense = RunSteps("[algorithm]\nname = \"allreduce\"\n", 6, 2);
  int64_t params = 0;
  for (int64_t n : kLenet) params += n;
  // Dense ring all-reduce sends 2(N-1)/N of the model per worker per step, plus headers.
  EXPECT_GE(dense.bytes_per_step, 1.5 * 4 * double(params));
  EXPECT_LT(dense.bytes_per_step, 1.5 * 4 * double(params) + 4096);
  ASSERT_GT(dgc.bytes_per_step, 0);
  printf("bytes per step per worker: dgc %.1f, dense all-reduce %.1f: %.1fx fewer\n", dgc.bytes_per_step,
         dense.bytes_per_step, dense.bytes_per_step / dgc.bytes_per_step);
  EXPECT_GE(dense.bytes_per_step / dgc.bytes_per_step, 250.0)
      << "dgc " << dgc.bytes_per_step << " bytes/step vs dense " << dense.bytes_per_step;
  EXPECT_EQ(dgc.weights.size(), 1u) << "dgc left the ranks with different weights";
  EXPECT_EQ(dense.weights.size(), 1u);
}

}  // namespace
}  // namespace shoal
