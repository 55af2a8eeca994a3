// What diloco puts on the wire over a whole run, counted by the ZeroMQ ring's own byte counter (its 16-byte
// message headers included), against the formula: the start (the ring's wiring token, an all-gather of each rank's
// 8-byte weights hash, plus a broadcast of the model only where the ranks' weights differ), one ring all-reduce of the
// model per outer step (every full block of sync_every steps and the last partial one) and one of a single float per
// stop vote. 4 ranks on threads, small segments so a chunk takes several messages.
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

constexpr int kWorld = 4;
constexpr int64_t kSegmentBytes = 8192;
constexpr int64_t kHeader = 16;                            // ZmqRing::Header
const std::vector<int64_t> kModel = {23520, 30, 300, 10};  // an mlp 784-30-10: 23,860 parameters

int64_t Elements() {
  int64_t n = 0;
  for (int64_t t : kModel) n += t;
  return n;
}

// What `bytes` of payload cost in messages of at most kSegmentBytes (an empty payload is one
// header-only message).
int64_t Messages(int64_t bytes) { return std::max<int64_t>(1, (bytes + kSegmentBytes - 1) / kSegmentBytes); }

// Ring rank r's bytes for one fp32 all-reduce of n floats in kWorld chunks ([n c / N, n (c+1) / N)):
// reduce-scatter sends every chunk but the one r ends up owning ((r + 1) mod N), the all-gather
// every chunk but (r + 2) mod N, each chunk as its segments, each segment one header.
int64_t AllReduceBytes(int64_t n, int r) {
  int64_t total = 0;
  for (int c = 0; c < kWorld; ++c) {
    const int64_t bytes = 4 * (n * (c + 1) / kWorld - n * c / kWorld);
    const int64_t chunk = bytes + kHeader * Messages(bytes);
    total += (c != (r + 1) % kWorld ? chunk : 0) + (c != (r + 2) % kWorld ? chunk : 0);
  }
  return total;
}

// The start: the ring's wiring (a token, one float, all-reduced round it), the hash all-gather
// (N - 1 messages of 8 bytes), and where the weights differed the broadcast from rank 0 along
// the ring, forwarded by all but the last rank.
int64_t StartBytes(int r, bool broadcast) {
  int64_t total = AllReduceBytes(1, r) + (kWorld - 1) * (kHeader + 8);
  if (broadcast && r != kWorld - 1)
    for (int64_t t : kModel) total += 4 * t + kHeader * Messages(4 * t);
  return total;
}

struct Trained {
  std::vector<int64_t> bytes;                  // per rank, the whole run
  std::vector<std::vector<float>> after_init;  // per rank, the weights Init left
  std::set<std::vector<float>> final_weights;  // distinct final weights over the ranks
};

// `steps` steps of diloco (sync_every `h`, fp32 outer wire) on kWorld ranks over a real ring,
// a stop vote after every `steps_per_vote` steps (the trainer's evaluations), then Finish.
// `same_start`: every rank draws its weights from one seed, else each from its own.
Trained Train(int64_t steps, int64_t h, int64_t steps_per_vote, bool same_start) {
  static int run = 0;
  const std::string dir =
      ::testing::TempDir() + "/diloco_bytes_" + std::to_string(getpid()) + "_" + std::to_string(run++);
  JobConfig cfg = ParseJobConfig(
      "[job]\nname = \"t\"\n[cluster]\nworkers = 4\n[model]\nname = \"mlp\"\n"
      "[data]\nformat = \"synthetic\"\nbatch_size = 4\n[algorithm]\nname = \"diloco\"\nsync_every = " +
          std::to_string(h) + "\n[optimizer]\nname = \"adamw\"\nlr = 1e-3\n[train]\nepochs = 4\n",
      "job.toml");
  Trained out;
  out.bytes.resize(kWorld);
  out.after_init.resize(kWorld);
  std::vector<std::vector<float>> finals(kWorld);
  RunRankThreads(kWorld, [&](int rank) {
    FileStore store(dir);
    FakeCluster unused(kWorld);
    AlgorithmEnv env = unused.EnvFor(cfg, rank, steps_per_vote);
    env.make_communicator = [&, rank](const std::string& name) -> std::unique_ptr<Communicator> {
      RingOptions o;
      o.prefix = name;
      o.segment_bytes = kSegmentBytes;
      return std::make_unique<ZmqRing>(rank, kWorld, store, o);
    };
    auto algo = MakeAlgorithm(cfg.algorithm, env);
    std::mt19937_64 weights_rng(same_start ? 7 : uint64_t(rank) + 100);
    std::mt19937_64 grads_rng(uint64_t(rank) + 1);
    std::normal_distribution<float> nd(0.f, 0.05f);
    std::vector<std::vector<float>> w, g;
    std::vector<ParamView> views;
    for (int64_t n : kModel) {
      w.emplace_back(size_t(n));
      g.emplace_back(size_t(n));
      for (auto& x : w.back()) x = nd(weights_rng);
    }
    for (size_t t = 0; t < kModel.size(); ++t) {
      ParamView p;
      p.name = "t" + std::to_string(t);
      p.w = w[t].data();
      p.g = g[t].data();
      p.n = kModel[t];
      p.shape = {p.n};
      views.push_back(p);
    }
    algo->Init(views);
    for (auto& t : w) out.after_init[size_t(rank)].insert(out.after_init[size_t(rank)].end(), t.begin(), t.end());
    for (int64_t s = 0; s < steps; ++s) {
      for (auto& t : g)
        for (auto& x : t) x = nd(grads_rng);
      StepInfo info;
      info.step = s;
      algo->Step(views, info);
      if ((s + 1) % steps_per_vote == 0) {
        EXPECT_FALSE(algo->AgreeToStop(false));
      }
    }
    algo->Finish(views);
    out.bytes[size_t(rank)] = algo->bytes_sent();
    for (auto& t : w) finals[size_t(rank)].insert(finals[size_t(rank)].end(), t.begin(), t.end());
  });
  for (auto& f : finals) out.final_weights.insert(f);
  return out;
}

// Each rank's bytes for a run of `steps` steps at sync_every `h` with `votes` stop votes.
int64_t Expected(int r, int64_t steps, int64_t h, int64_t votes, bool broadcast) {
  const int64_t outer_steps = (steps + h - 1) / h;  // the last, partial block is exchanged at Finish
  return StartBytes(r, broadcast) + outer_steps * AllReduceBytes(Elements(), r) + votes * AllReduceBytes(1, r);
}

TEST(DilocoBytes, ARunSendsTheFormulasBytesAndNoBroadcastWhenTheRanksStartAlike) {
  // 250 steps at sync_every 100: outer steps after 100 and 200, and the last 50 at Finish.
  const Trained run = Train(250, 100, 50, /*same_start=*/true);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(run.bytes[size_t(r)], Expected(r, 250, 100, 5, false)) << "rank " << r;
  // Against an all-reduce every step: 250 model all-reduces to 3.
  const double dense = double(StartBytes(0, false) + 250 * AllReduceBytes(Elements(), 0));
  printf("rank 0: %lld bytes; an all-reduce every step: %.0f (%.1fx)\n", (long long)run.bytes[0], dense,
         dense / double(run.bytes[0]));
  EXPECT_EQ(run.final_weights.size(), 1u) << "diloco left the ranks with different weights";
}

TEST(DilocoBytes, RunEndingOnASyncHasNoPartialExchange) {
  const Trained run = Train(200, 100, 40, /*same_start=*/true);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(run.bytes[size_t(r)], Expected(r, 200, 100, 5, false)) << "rank " << r;
  EXPECT_EQ(run.final_weights.size(), 1u);
}

TEST(DilocoBytes, RanksThatStartApartTakeRankZerosWeightsByBroadcast) {
  const Trained run = Train(30, 20, 30, /*same_start=*/false);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(run.bytes[size_t(r)], Expected(r, 30, 20, 1, true)) << "rank " << r;
    EXPECT_EQ(run.after_init[size_t(r)], run.after_init[0]) << "rank " << r << " did not take rank 0's weights";
  }
  EXPECT_EQ(run.final_weights.size(), 1u);
}

// A rank whose weights are on the device (here flagged so, in host memory) cannot hash them: it
// still joins the all-gather, the ranks disagree, and every rank takes part in the broadcast.
TEST(DilocoBytes, ARankWithOnDeviceWeightsMakesEveryRankBroadcast) {
  static int run = 0;
  const std::string dir = ::testing::TempDir() + "/start_" + std::to_string(getpid()) + "_" + std::to_string(run++);
  std::vector<int64_t> bytes(kWorld);
  RunRankThreads(kWorld, [&](int rank) {
    FileStore store(dir);
    RingOptions o;
    o.prefix = "start";
    o.segment_bytes = kSegmentBytes;
    ZmqRing ring(rank, kWorld, store, o);
    std::vector<std::vector<float>> w;
    std::vector<ParamView> views;
    for (size_t t = 0; t < kModel.size(); ++t) {
      w.emplace_back(size_t(kModel[t]), 0.25f * float(t + 1));
      ParamView p;
      p.w = w.back().data();
      p.n = kModel[t];
      p.on_device = rank == 2;
      views.push_back(p);
    }
    StartFromRankZero(ring, views);
    bytes[size_t(rank)] = ring.bytes_sent();
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(bytes[size_t(r)], StartBytes(r, true)) << "rank " << r;
}

}  // namespace
}  // namespace shoal
