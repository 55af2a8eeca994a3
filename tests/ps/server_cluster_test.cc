// Two shoal-server processes and three client processes pushing and pulling at once;
// every value must come out exactly (integer-valued floats, so summation order is moot).
#include <csignal>
#include <unistd.h>
#include <thread>
#include <gtest/gtest.h>

#include "common/config.h"
#include "common/error.h"
#include "tests/ps/ps_test_util.h"
#include "common/ps/client.h"

namespace shoal {
namespace {

using testing::ForkChild;
using testing::ServerProcess;
using testing::WaitChild;

constexpr int kWorkers = 3;
constexpr int kRounds = 6;

std::vector<TensorSpec> Specs() {
  return {{"conv.w", DType::kF32, {64, 3, 5, 5}},
          {"fc.w", DType::kF32, {300, 100}},
          {"fc.b", DType::kF32, {100}},
          {"emb", DType::kF16, {128, 8}},
          {"big", DType::kF32, {1 << 18}}};
}

// What worker r pushes for element i in round k: small integers, exact in fp16 too.
float Value(int r, int k, size_t i) { return float((r + 1) * (k + 1) + int(i % 3)); }

float Expected(size_t i) {
  float sum = 0;
  for (int r = 0; r < kWorkers; ++r)
    for (int k = 0; k < kRounds; ++k) sum += Value(r, k, i);
  return sum;
}

bool RunWorker(const std::string& job, int rank) {
  JobConfig cfg = LoadJobConfig(job);
  ClientOptions o;
  o.rank = rank;
  o.timeout_ms = 20000;
  Client c(cfg, o);
  auto specs = Specs();
  const ClusterInfo& info = c.Register(specs);
  if (info.shard_of.size() != specs.size()) return false;
  c.Barrier("start");
  for (int k = 0; k < kRounds; ++k) {
    std::vector<std::vector<float>> f32(specs.size());
    std::vector<std::vector<uint16_t>> f16(specs.size());
    std::vector<TensorRef> refs;
    for (size_t t = 0; t < specs.size(); ++t) {
      size_t n = specs[t].bytes() / DTypeSize(specs[t].dtype);
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = Value(rank, k, i);
      TensorRef ref{specs[t].name, specs[t].dtype, specs[t].shape, nullptr, specs[t].bytes()};
      if (specs[t].dtype == DType::kF16) {
        f16[t].resize(n);
        EncodeFloats(v.data(), n, DType::kF16, f16[t].data());
        ref.data = f16[t].data();
      } else {
        f32[t] = std::move(v);
        ref.data = f32[t].data();
      }
      refs.push_back(ref);
    }
    c.Wait(c.Push(refs, msg::PushOp::ADD));
    // Pulls while others still push: each value is a partial sum, never torn or missing.
    std::vector<PulledTensor> mid;
    c.Wait(c.Pull({"fc.b"}, &mid));
    if (mid[0].ToFloats()[0] < (k + 1) * (rank + 1)) return false;
  }
  c.Barrier("pushed");
  std::vector<std::string> names;
  for (auto& s : specs) names.push_back(s.name);
  std::vector<PulledTensor> out;
  c.Wait(c.Pull(names, &out));
  for (size_t t = 0; t < specs.size(); ++t) {
    if (out[t].name != specs[t].name || out[t].shape != specs[t].shape || out[t].dtype != specs[t].dtype) return false;
    if (out[t].version != uint64_t(kWorkers * kRounds)) {
      fprintf(stderr, "rank %d: '%s' version %lu\n", rank, out[t].name.c_str(), (unsigned long)out[t].version);
      return false;
    }
    auto v = out[t].ToFloats();
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] != Expected(i)) {
        fprintf(stderr, "rank %d: '%s'[%zu] = %g, want %g\n", rank, out[t].name.c_str(), i, v[i], Expected(i));
        return false;
      }
  }
  c.Barrier("checked");
  return true;
}

TEST(ServerCluster, TwoShardsThreeConcurrentClientsExactResults) {
  std::string job = testing::WriteJob("cluster", 2, kWorkers);
  ServerProcess s0(job, 0), s1(job, 1);
  ASSERT_TRUE(s0.WaitForLog("listening on")) << s0.log();
  ASSERT_TRUE(s1.WaitForLog("listening on")) << s1.log();
  std::vector<pid_t> kids;
  for (int r = 0; r < kWorkers; ++r) kids.push_back(ForkChild([&, r] { return RunWorker(job, r); }));
  for (int r = 0; r < kWorkers; ++r) EXPECT_EQ(WaitChild(kids[r], 40000), 0) << "worker " << r;
  EXPECT_TRUE(s0.WaitForLog("server shard 1 joined", 2000)) << s0.log();
  EXPECT_TRUE(s0.alive());
  EXPECT_TRUE(s1.alive());

  // Placement balanced bytes: each shard got tensors, none spans shards.
  JobConfig cfg = LoadJobConfig(job);
  ClientOptions o;
  o.rank = 0;
  o.timeout_ms = 5000;
  o.heartbeat = false;
  Client c(cfg, o);
  auto info = c.Register();
  std::set<int> used;
  for (auto& kv : info.shard_of) used.insert(kv.second);
  EXPECT_EQ(used.size(), 2u);
  EXPECT_EQ(info.world_size, kWorkers);

  // Server-side errors come back to the caller with the shard's words.
  std::vector<float> wrong(7, 1.0f);
  try {
    c.Wait(c.Push({{"fc.b", DType::kF32, {7}, wrong.data(), 28}}));
    FAIL() << "push with the wrong shape was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fc.b'"), std::string::npos) << e.what();
  }
  std::vector<PulledTensor> out;
  EXPECT_THROW(c.Pull({"not.registered"}, &out), Error);
  c.Wait(c.Pull({"fc.b"}, &out));
  EXPECT_EQ(out[0].ToFloats()[1], Expected(1));  // the rejected push changed nothing

  // PushPull: one round trip per shard returns the values after the push, across shards.
  std::vector<float> ones_b(100, 1.0f), ones_big(1 << 18, 1.0f);
  std::vector<PulledTensor> after;
  c.Wait(c.PushPull({{"big", DType::kF32, {1 << 18}, ones_big.data(), ones_big.size() * 4},
                     {"fc.b", DType::kF32, {100}, ones_b.data(), 400}},
                    msg::PushOp::ADD, &after));
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0].name, "big");
  EXPECT_EQ(after[1].name, "fc.b");
  EXPECT_EQ(after[1].version, uint64_t(kWorkers * kRounds + 1));
  for (int t = 0; t < 2; ++t) {
    auto v = after[t].ToFloats();
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], Expected(i) + 1) << after[t].name << "[" << i << "]";
  }
  EXPECT_NE(info.shard_of.at("fc.b"), info.shard_of.at("big"));  // "big" alone outweighs the rest

  // SIGTERM stops a shard cleanly.
  kill(s1.pid(), SIGTERM);
  EXPECT_EQ(s1.WaitExit(5000), 0);
  EXPECT_TRUE(s1.WaitForLog("shard 1: stopped", 1000)) << s1.log();
}

// Servers never read the data set: a ps_sync job whose data files do not exist on the
// server hosts still runs the job's optimizer, with the schedule from the workers' plan.
TEST(ServerCluster, ServersLearnThePlanAtRegistrationNotFromTheData) {
  std::string job = testing::WriteJob("plan", 2, 1,
                                      "[algorithm]\nname = \"ps_sync\"\n"
                                      "[optimizer]\nname = \"sgd\"\nlr = 0.4\nweight_decay = 0\nwarmup_epochs = 1\n");
  // The synthetic default becomes data files that are nowhere.
  std::string text = testing::ReadFile(job);
  text.replace(text.find("format = \"synthetic\""), 20,
               "format = \"idx\"\ntrain = \"/nonexistent/train\"\ntest = \"/nonexistent/t10k\"");
  testing::WriteFile(job, text);
  ServerProcess s0(job, 0), s1(job, 1);
  ASSERT_TRUE(s0.WaitForLog("listening on")) << s0.log();
  ASSERT_TRUE(s1.WaitForLog("listening on")) << s1.log();
  JobConfig cfg = LoadJobConfig(job);
  ClientOptions o;
  o.timeout_ms = 20000;
  o.heartbeat = false;
  Client c(cfg, o);
  TrainingPlan plan;
  plan.steps_per_epoch = 4;  // warm-up: lr(0) = 0.4 / 4
  plan.total_steps = 8;
  plan.rule = msg::ServerRule::MEAN_OF_WORKERS;
  plan.workers = 1;
  plan.global_batch = 32;
  std::vector<TensorSpec> specs = {{"a", DType::kF32, {2, 1}}, {"b", DType::kF32, {2, 1}}};
  const ClusterInfo& info = c.Register(specs, &plan);
  ASSERT_NE(info.shard_of.at("a"), info.shard_of.at("b")) << "both shards must get the plan";
  std::vector<float> ones = {1, 1}, g = {2, 3};
  c.Wait(c.Push({{"a", DType::kF32, {2, 1}, ones.data(), 8}, {"b", DType::kF32, {2, 1}, ones.data(), 8}},
                msg::PushOp::ASSIGN));
  c.Wait(
      c.Push({{"a", DType::kF32, {2, 1}, g.data(), 8}, {"b", DType::kF32, {2, 1}, g.data(), 8}}, msg::PushOp::APPLY));
  std::vector<PulledTensor> out;
  c.Wait(c.Pull({"a", "b"}, &out));
  for (auto& t : out) {
    std::vector<float> w = t.ToFloats();
    EXPECT_NEAR(w[0], 1 - 0.1 * 2, 1e-6) << t.name;
    EXPECT_NEAR(w[1], 1 - 0.1 * 3, 1e-6) << t.name;
  }
  // A worker whose plan disagrees (another job file) is refused by name.
  Client other(cfg, o);
  TrainingPlan wrong = plan;
  wrong.steps_per_epoch = 5;
  try {
    other.Register(specs, &wrong);
    FAIL() << "a disagreeing plan was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("disagrees"), std::string::npos) << e.what();
  }
}

// One worker of the job: registers, pushes once, and leaves (or, `die`, just stops).
bool BriefWorker(const std::string& job, int rank, bool die) {
  JobConfig cfg = LoadJobConfig(job);
  ClientOptions o;
  o.rank = rank;
  o.timeout_ms = 20000;
  Client c(cfg, o);
  c.Register({{"w", DType::kF32, {4}}});
  std::vector<float> v(4, 1.f);
  c.Wait(c.Push({{"w", DType::kF32, {4}, v.data(), 16}}, msg::PushOp::ADD));
  if (die) _exit(0);  // no leave: its heartbeats just stop
  c.Leave();
  return true;
}

TEST(ServerCluster, ServersLeaveByThemselvesOnceEveryWorkerHasFinished) {
  std::string job = testing::WriteJob("leave", 2, 2);
  ServerProcess s0(job, 0), s1(job, 1);
  ASSERT_TRUE(s0.WaitForLog("listening on")) << s0.log();
  ASSERT_TRUE(s1.WaitForLog("listening on")) << s1.log();
  pid_t a = ForkChild([&] { return BriefWorker(job, 0, false); });
  ASSERT_EQ(WaitChild(a, 30000), 0);
  // One worker still to go: the servers stay.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(s0.alive() && s1.alive());
  pid_t b = ForkChild([&] { return BriefWorker(job, 1, false); });
  ASSERT_EQ(WaitChild(b, 30000), 0);
  EXPECT_EQ(s1.WaitExit(10000), 0) << s1.log();
  EXPECT_EQ(s0.WaitExit(10000), 0) << s0.log();
  EXPECT_NE(s0.log().find("every worker has finished"), std::string::npos) << s0.log();
}

TEST(ServerCluster, AWorkerThatDiedCountsAsGoneAfterTheHeartbeatTimeout) {
  std::string job = testing::WriteJob("leave-dead", 2, 2);
  ServerProcess s0(job, 0), s1(job, 1);
  ASSERT_TRUE(s0.WaitForLog("listening on")) << s0.log();
  ASSERT_TRUE(s1.WaitForLog("listening on")) << s1.log();
  pid_t dead = ForkChild([&] { return BriefWorker(job, 1, true); });
  ASSERT_EQ(WaitChild(dead, 30000), 0);
  pid_t a = ForkChild([&] { return BriefWorker(job, 0, false); });
  ASSERT_EQ(WaitChild(a, 30000), 0);
  EXPECT_EQ(s1.WaitExit(15000), 0) << s1.log();
  EXPECT_EQ(s0.WaitExit(15000), 0) << s0.log();
  EXPECT_NE(s0.log().find("worker 1 stopped answering"), std::string::npos) << s0.log();
}

// Shard 0 gone for good with nobody to restart it (SIGKILL here; a host whose link went
// down looks the same from shard 1): shard 1 stops by itself once the coordinator has been
// silent for three heartbeat timeouts, naming it, instead of serving nobody for ever.
TEST(ServerCluster, AShardCutOffFromTheCoordinatorLeavesNamingIt) {
  std::string job = testing::WriteJob("coordinator-gone", 2, 1);
  ServerProcess s0(job, 0), s1(job, 1);
  ASSERT_TRUE(s0.WaitForLog("listening on")) << s0.log();
  ASSERT_TRUE(s1.WaitForLog("listening on")) << s1.log();
  // A few heartbeats answered first: silence counts only once the coordinator has spoken.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(kill(s0.pid(), SIGKILL), 0);
  EXPECT_EQ(s1.WaitExit(15000), 1) << s1.log();
  std::string log = s1.log();
  EXPECT_NE(log.find("shard 1: the job cannot go on: the coordinator at tcp://" + LoadJobConfig(job).servers[0] +
                     " stopped answering"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("shard 0 on"), std::string::npos) << log;
}

TEST(ServerCli, BadJobFileExitsNonZeroWithOneLine) {
  std::string bad = testing::TempPath("bad.toml");
  testing::WriteFile(bad,
                     "[job]\nname = \"bad\"\n[data]\nformat = \"synthetic\"\n[cluster]\nservers = "
                     "[\"127.0.0.1:1\"]\nworkers = \"three\"\n");
  ServerProcess s(bad, 0);
  EXPECT_EQ(s.WaitExit(10000), 2);
  std::string log = s.log();
  EXPECT_NE(log.find("bad.toml"), std::string::npos) << log;
  EXPECT_NE(log.find("workers"), std::string::npos) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
  EXPECT_EQ(log.find("listening"), std::string::npos) << log;

  std::string job = testing::WriteJob("shard-range", 1, 1);
  ServerProcess s2(job, 5);
  EXPECT_EQ(s2.WaitExit(10000), 2);
  EXPECT_NE(s2.log().find("--shard 5: " + job + " lists 1 server(s) in [cluster] servers"), std::string::npos)
      << s2.log();
}

// A model of 50,000 small tensors: its register, cluster map, push, pull and pull reply
// headers (a few MiB each) are legitimate and must be read whole, not refused as malformed.
TEST(ServerCluster, HeadersNamingFiftyThousandTensorsAreAccepted) {
  constexpr int kTensors = 50000;
  std::string job = testing::WriteJob("many-tensors", 1, 1);
  ServerProcess server(job, 0);
  ASSERT_TRUE(server.WaitForLog("listening on")) << server.log();
  JobConfig cfg = LoadJobConfig(job);
  ClientOptions o;
  o.timeout_ms = 30000;
  Client c(cfg, o);
  std::vector<TensorSpec> specs;
  for (int i = 0; i < kTensors; ++i) specs.push_back({"layer" + std::to_string(i) + ".bias", DType::kF32, {1}});
  ASSERT_EQ(c.Register(specs).shard_of.size(), size_t(kTensors));
  std::vector<float> values(kTensors);
  std::vector<TensorRef> refs;
  std::vector<std::string> names;
  for (int i = 0; i < kTensors; ++i) {
    values[i] = float(i);
    refs.push_back({specs[i].name, DType::kF32, {1}, &values[i], 4});
    names.push_back(specs[i].name);
  }
  c.Wait(c.Push(refs, msg::PushOp::ASSIGN));
  std::vector<PulledTensor> out;
  c.Wait(c.Pull(names, &out));
  ASSERT_EQ(out.size(), size_t(kTensors));
  for (int i = 0; i < kTensors; i += 997) EXPECT_EQ(out[i].ToFloats()[0], float(i)) << names[i];
  EXPECT_EQ(out.back().ToFloats()[0], float(kTensors - 1));
  EXPECT_EQ(server.log().find("malformed"), std::string::npos) << server.log();
}

}  // namespace
}  // namespace shoal
