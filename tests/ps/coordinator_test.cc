// The coordinator: barriers across worker processes, a clear line when a member stops
// answering, failed barriers after that, consistent tensor placement, and the recovery
// generation a shard restarted alone starts (shard 0 too, from the one it kept on disk).
#include <csignal>
#include <gtest/gtest.h>
#include <map>
#include <thread>
#include <unistd.h>

#include "common/config.h"
#include "common/error.h"
#include "tests/ps/ps_test_util.h"
#include "common/ps/client.h"
#include "common/transport/heartbeat.h"

namespace shoal {
namespace {

using testing::ForkChild;
using testing::ServerProcess;
using testing::WaitChild;

// A job file of `servers` shards and `workers` workers that keeps checkpoints.
std::string JobWithCheckpoints(const std::string& name, int servers, int workers) {
  std::string job = testing::WriteJob(name, servers, workers, "", 100, 1000);
  std::string text = testing::ReadFile(job);
  text.replace(text.find("[job]\n") + 6, 0, "checkpoint_dir = \"" + testing::TempPath(name + "-ckpt") + "\"\n");
  testing::WriteFile(job, text);
  return job;
}

// Tensors "a" and "b" (4 floats each) set to v on their shards.
void AssignAB(Client& w, float v) {
  std::vector<float> x(4, v);
  w.Wait(w.Push({{"a", DType::kF32, {4}, x.data(), 16, nullptr}, {"b", DType::kF32, {4}, x.data(), 16, nullptr}},
                msg::PushOp::ASSIGN));
}

// Checkpoint `id` (at step id) written by every one of `shards` and committed; its record.
CheckpointRecord CheckpointAt(Client& w, uint64_t id, uint32_t shards) {
  CheckpointRecord rec;
  rec.id = id;
  rec.step = int64_t(id);
  rec.shards = shards;
  w.Checkpoint(rec);
  return rec;
}

TEST(Coordinator, DeadWorkerIsReportedAndBarrierFails) {
  // heartbeat every 100 ms, declared dead after 1 s of silence (slack for loaded CI machines)
  std::string job = testing::WriteJob("coord-dead", 1, 2, "", 100, 1000);
  ServerProcess s0(job, 0);
  ASSERT_TRUE(s0.WaitForLog("listening on")) << s0.log();
  JobConfig cfg = LoadJobConfig(job);

  // Worker 1 registers, heartbeats, then hangs forever (stands for a crashed machine).
  pid_t victim = ForkChild([&] {
    ClientOptions o;
    o.rank = 1;
    Client c(cfg, o);
    c.Register();
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return true;
  });
  ASSERT_TRUE(s0.WaitForLog("worker 1 joined")) << s0.log();
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  EXPECT_EQ(s0.log().find("stopped answering"), std::string::npos) << "alive worker reported dead:\n" << s0.log();
  kill(victim, SIGKILL);
  WaitChild(victim, 5000);
  EXPECT_TRUE(s0.WaitForLog("coordinator: worker 1 stopped answering: no heartbeat for", 5000)) << s0.log();

  ClientOptions o;
  o.rank = 0;
  o.timeout_ms = 5000;
  Client c0(cfg, o);
  auto info = c0.Register();
  bool found = false;
  for (auto& m : info.members)
    if (m.role == msg::Role::WORKER && m.rank == 1) {
      found = true;
      EXPECT_FALSE(m.alive);
    }
  EXPECT_TRUE(found);
  // Asked again later (ps_ssp does, to leave dead clocks out), without registering again.
  found = false;
  for (auto& m : c0.Members()) {
    if (m.role == msg::Role::WORKER && m.rank == 1) {
      found = !m.alive;
    } else if (m.role == msg::Role::WORKER && m.rank == 0) {
      EXPECT_TRUE(m.alive);
    }
  }
  EXPECT_TRUE(found) << "MEMBERS did not report worker 1 dead";
  try {
    c0.Barrier("after-crash");
    FAIL() << "barrier completed with a dead worker";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("worker 1 stopped answering"), std::string::npos) << e.what();
  }
}

TEST(Coordinator, BarrierWaitsForEveryWorker) {
  std::string job = testing::WriteJob("coord-barrier", 1, 3);
  ServerProcess s0(job, 0);
  ASSERT_TRUE(s0.WaitForLog("listening on")) << s0.log();
  JobConfig cfg = LoadJobConfig(job);
  std::string stamp = testing::TempPath("barrier-stamp");
  std::vector<pid_t> kids;
  for (int r = 0; r < 3; ++r)
    kids.push_back(ForkChild([&, r] {
      ClientOptions o;
      o.rank = r;
      o.timeout_ms = 10000;
      Client c(cfg, o);
      c.Register();
      // The last worker arrives late; nobody may leave the barrier before it arrives.
      if (r == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        testing::WriteFile(stamp, "arrived");
      }
      c.Barrier("b1");
      return testing::ReadFile(stamp) == "arrived";
    }));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(WaitChild(kids[r], 20000), 0) << "worker " << r;
}

TEST(Coordinator, PlacementIsFixedByTheFirstListAndChecked) {
  std::string job = testing::WriteJob("coord-place", 2, 2);
  ServerProcess s0(job, 0), s1(job, 1);
  ASSERT_TRUE(s0.WaitForLog("listening on")) << s0.log();
  JobConfig cfg = LoadJobConfig(job);
  ClientOptions o;
  o.heartbeat = false;
  o.timeout_ms = 5000;
  Client a(cfg, o);
  std::vector<TensorSpec> specs = {{"x", DType::kF32, {1000}}, {"y", DType::kF32, {600}}, {"z", DType::kF32, {500}}};
  auto ia = a.Register(specs);
  EXPECT_NE(ia.shard_of.at("x"), ia.shard_of.at("y"));
  EXPECT_EQ(ia.shard_of.at("y"), ia.shard_of.at("z"));  // 1000 vs 600+500
  o.rank = 1;
  Client b(cfg, o);
  auto ib = b.Register();  // no list: gets the placement already made
  EXPECT_EQ(ib.shard_of, ia.shard_of);
  specs[2].shape = {7};
  try {
    b.Register(specs);
    FAIL() << "a different tensor list was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("differs"), std::string::npos) << e.what();
  }
  o.rank = 9;  // outside the job's 2 workers
  Client c(cfg, o);
  EXPECT_THROW(c.Register(), Error);
  EXPECT_TRUE(s0.WaitForLog("worker rank 9 is outside the job", 2000)) << s0.log();
}

// A shard restarted alone (--resume --rejoin) restores the committed checkpoint and starts a
// new recovery generation: requests and barriers of the old one are refused, the client
// learns why (ShardRestarted, with the checkpoint), and after Reload every shard serves
// that checkpoint's values to the new generation.
TEST(Coordinator, ShardRestartedAloneStartsANewRecoveryGeneration) {
  std::string job = JobWithCheckpoints("coord-gen", 2, 1);
  ServerProcess s0(job, 0);
  auto s1 = std::make_unique<ServerProcess>(job, 1);
  ASSERT_TRUE(s0.WaitForLog("listening on")) << s0.log();
  ASSERT_TRUE(s1->WaitForLog("listening on")) << s1->log();
  JobConfig cfg = LoadJobConfig(job);
  ClientOptions o;
  o.timeout_ms = 5000;
  Client w(cfg, o);
  auto info = w.Register({{"a", DType::kF32, {4}}, {"b", DType::kF32, {4}}});
  ASSERT_NE(info.shard_of.at("a"), info.shard_of.at("b"));
  AssignAB(w, 1.f);
  const CheckpointRecord rec = CheckpointAt(w, 7, 2);
  AssignAB(w, 2.f);  // after the checkpoint: the restarted shard will not have it

  s1.reset();  // SIGTERM; then started again alone
  ServerProcess again(job, 1, {"--resume", "--rejoin"});
  ASSERT_TRUE(again.WaitForLog("rejoining the running job as recovery generation 1")) << again.log();
  ASSERT_TRUE(s0.WaitForLog("restarted from checkpoint 7")) << s0.log();

  std::vector<PulledTensor> out;
  try {
    w.Wait(w.Pull({"a", "b"}, &out));
    FAIL() << "a pull of the old generation was served";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refused: this shard serves generation 1"), std::string::npos) << e.what();
  }
  try {
    w.Barrier("x");
    FAIL() << "a barrier of the old generation completed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("server shard 1 restarted from checkpoint 7"), std::string::npos) << e.what();
  }
  try {
    w.CheckRestarts();
    FAIL() << "no restart reported";
  } catch (const ShardRestarted& r) {
    EXPECT_EQ(r.generation, 1u);
    EXPECT_EQ(r.from.id, 7u);
  }
  w.SetGeneration(1);
  w.Reload(rec);
  w.Wait(w.Pull({"a", "b"}, &out));
  for (auto& t : out) EXPECT_EQ(t.ToFloats(), std::vector<float>(4, 1.f)) << t.name << " is not the checkpoint's";
  w.Barrier("y");  // the new generation's barriers complete
}

// A ps_sync worker restarted alone (--resume --rejoin): its first resume query starts a new
// recovery generation naming it, and fails the barrier the others wait at; its later
// queries (CheckRestarts) only ask.
TEST(Coordinator, WorkerRestartedAloneStartsANewRecoveryGenerationOnce) {
  std::string job = JobWithCheckpoints("coord-wgen", 1, 2);
  ServerProcess s0(job, 0);
  ASSERT_TRUE(s0.WaitForLog("listening on")) << s0.log();
  JobConfig cfg = LoadJobConfig(job);
  ClientOptions o;
  o.timeout_ms = 5000;
  Client w0(cfg, o);
  w0.Register({{"a", DType::kF32, {4}}});
  CheckpointAt(w0, 3, 1);
  std::string barrier_error;
  std::thread waiting([&] {
    try {
      w0.Barrier("step-5");
    } catch (const Error& e) {
      barrier_error = e.what();
    }
  });
  // Whether w0's barrier is pending when the generation starts (failed) or arrives after
  // (refused), the answer names the restart.
  o.rank = 1;
  o.rejoin = true;
  Client w1(cfg, o);
  w1.Register({{"a", DType::kF32, {4}}});
  EXPECT_EQ(w1.NewestCheckpoint().id, 3u);
  EXPECT_EQ(w1.latest_generation(), 1u);
  waiting.join();
  EXPECT_NE(barrier_error.find("worker 1 restarted from checkpoint 3"), std::string::npos) << barrier_error;
  w1.CheckRestarts();  // no new generation: it is in the one it started
  EXPECT_EQ(w1.latest_generation(), 1u);
  try {
    w0.CheckRestarts();
    FAIL() << "no restart reported";
  } catch (const ShardRestarted& r) {
    EXPECT_EQ(r.generation, 1u);
    EXPECT_EQ(r.from.id, 3u);
  }
}

// Shard 0, the coordinator's host, SIGKILLed and started again alone (--resume --rejoin)
// goes on from the generation it kept on disk (1, started by shard 1's restart) to the
// next (2), so every request of the generations before is refused; it learns placement
// again from a registration, and the job goes on from the committed checkpoint.
// A job resumed on one worker more: every tensor of the checkpoint stays on the shard that
// restored it (placing the longer list afresh would move the stop flag to shard 1, which
// does not hold it), the coordinator says 2 workers wrote it, and once the plan arrives each
// shard sets every clock, the new one too, to the mapped step and clears the stop flag.
TEST(Coordinator, AResumeOnMoreWorkersKeepsEveryTensorOnItsShardAndSeedsTheClocks) {
  const std::string job = JobWithCheckpoints("coord-reshape", 2, 2);
  std::vector<TensorSpec> specs = {{"a", DType::kF32, {4}},
                                   {"b", DType::kF32, {4}},
                                   {WorkerClockName(0), DType::kF32, {1}},
                                   {WorkerClockName(1), DType::kF32, {1}},
                                   {kStopTensor, DType::kF32, {1}}};
  JobConfig cfg = LoadJobConfig(job);
  ClientOptions o;
  o.heartbeat = false;
  o.timeout_ms = 10000;
  std::map<std::string, int> before;
  {
    ServerProcess s0(job, 0), s1(job, 1);
    ASSERT_TRUE(s0.WaitForLog("listening on")) << s0.log();
    ASSERT_TRUE(s1.WaitForLog("listening on")) << s1.log();
    Client w(cfg, o);
    before = w.Register(specs).shard_of;
    ASSERT_EQ(before.at(kStopTensor), 0);
    std::vector<float> v(4, 7.f);
    std::vector<TensorRef> refs;
    for (auto& t : specs) refs.push_back({t.name, DType::kF32, t.shape, v.data(), t.bytes(), nullptr});
    w.Wait(w.Push(refs, msg::PushOp::ASSIGN));
    CheckpointRecord rec;
    rec.id = 6;
    rec.step = 6;
    rec.batch = 6;  // 6 batches of 2 x 10 samples
    rec.shards = 2;
    w.Checkpoint(rec);
  }
  std::string text = testing::ReadFile(job);
  text.replace(text.find("workers = 2"), 11, "workers = 3");
  testing::WriteFile(job, text);
  cfg = LoadJobConfig(job);
  ServerProcess s0(job, 0, {"--resume"}), s1(job, 1, {"--resume"});
  ASSERT_TRUE(s0.WaitForLog("listening on")) << s0.log();
  ASSERT_TRUE(s1.WaitForLog("listening on")) << s1.log();
  Client w(cfg, o);
  specs.push_back({WorkerClockName(2), DType::kF32, {1}});
  TrainingPlan plan;
  plan.steps_per_epoch = 10;
  plan.total_steps = 20;
  plan.rule = msg::ServerRule::APPLY_EACH;
  plan.workers = 3;
  plan.global_batch = 30;
  auto after = w.Register(specs, &plan).shard_of;
  for (auto& [name, shard] : before) EXPECT_EQ(after.at(name), shard) << name;
  EXPECT_EQ(after.at(WorkerClockName(2)), 1);  // the lighter shard
  const CheckpointRecord rec = w.NewestCheckpoint();
  EXPECT_EQ(rec.id, 6u);
  EXPECT_EQ(rec.workers, 2u);
  std::vector<PulledTensor> out;
  w.Wait(w.Pull({WorkerClockName(0), WorkerClockName(1), WorkerClockName(2), kStopTensor, "a"}, &out));
  // 6 x 20 samples are batch 4 of 30.
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out[size_t(r)].ToFloats(), std::vector<float>{4.f}) << r;
  EXPECT_EQ(out[3].ToFloats(), std::vector<float>{0.f});
  EXPECT_EQ(out[4].ToFloats(), std::vector<float>(4, 7.f));  // the model is the checkpoint's
  EXPECT_TRUE(s0.WaitForLog("was written by 2 workers, this job has 3")) << s0.log();
}

TEST(Coordinator, CoordinatorShardRestartedAloneGoesOnFromItsGenerationOnDisk) {
  std::string job = JobWithCheckpoints("coord-gen0", 2, 1);
  auto s0 = std::make_unique<ServerProcess>(job, 0);
  auto s1 = std::make_unique<ServerProcess>(job, 1);
  ASSERT_TRUE(s0->WaitForLog("listening on")) << s0->log();
  ASSERT_TRUE(s1->WaitForLog("listening on")) << s1->log();
  JobConfig cfg = LoadJobConfig(job);
  ClientOptions o;
  o.timeout_ms = 10000;
  Client w(cfg, o);
  const std::vector<TensorSpec> specs = {{"a", DType::kF32, {4}}, {"b", DType::kF32, {4}}};
  auto info = w.Register(specs);
  const std::string on0 = info.shard_of.at("a") == 0 ? "a" : "b";
  AssignAB(w, 1.f);
  const CheckpointRecord rec = CheckpointAt(w, 7, 2);
  s1.reset();  // shard 1 restarted alone: generation 1
  s1 = std::make_unique<ServerProcess>(job, 1, std::vector<std::string>{"--resume", "--rejoin"});
  ASSERT_TRUE(s1->WaitForLog("rejoining the running job as recovery generation 1")) << s1->log();
  EXPECT_THROW(w.CheckRestarts(), ShardRestarted);
  w.SetGeneration(1);
  w.Reload(rec);
  AssignAB(w, 2.f);  // after the checkpoint: lost when shard 0 comes back

  kill(s0->pid(), SIGKILL);
  s0->WaitExit(5000);
  s0 = std::make_unique<ServerProcess>(job, 0, std::vector<std::string>{"--resume", "--rejoin"});
  ASSERT_TRUE(s0->WaitForLog("recovery generation 2 (was 1)")) << s0->log();

  std::vector<PulledTensor> out;
  try {
    w.Wait(w.Pull({on0}, &out));
    FAIL() << "a pull of the old generation was served";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refused: this shard serves generation 2"), std::string::npos) << e.what();
  }
  try {
    w.Barrier("x");
    FAIL() << "a barrier of the old generation completed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("server shard 0 (the coordinator) restarted from checkpoint 7"),
              std::string::npos)
        << e.what();
  }
  try {
    w.CheckRestarts();
    FAIL() << "no restart reported";
  } catch (const ShardRestarted& r) {
    EXPECT_EQ(r.generation, 2u);
    EXPECT_EQ(r.from.id, 7u);
  }
  w.SetGeneration(2);
  EXPECT_EQ(w.Register(specs).shard_of, info.shard_of) << "placement changed across the restart";
  w.Reload(rec);
  w.Wait(w.Pull({"a", "b"}, &out));
  for (auto& t : out) EXPECT_EQ(t.ToFloats(), std::vector<float>(4, 1.f)) << t.name << " is not the checkpoint's";
  w.Barrier("y");  // the new generation's barriers complete
}

// Shard 0 handles a RELOAD on its serving thread; here the reload waits for a checkpoint
// write held by its failpoint (2.5 s, standing for a long load). Meanwhile 100 workers'
// heartbeats queue up unread. After it, the coordinator serves a bounded number of
// messages before its next membership check: time it spent not reading must not count as
// the members' silence, so no live member is declared dead (every barrier would be refused).
TEST(Coordinator, ALongHandlingStepIsNoMembersSilence) {
  const int workers = 100;
  std::string job = JobWithCheckpoints("coord-stall", 1, workers);
  const std::string gate = testing::TempPath("coord-stall-gate");
  testing::WriteFile(gate, "open");
  setenv("SHOAL_FAILPOINT_CHECKPOINT_WRITE_GATE", gate.c_str(), 1);
  ServerProcess s0(job, 0);
  unsetenv("SHOAL_FAILPOINT_CHECKPOINT_WRITE_GATE");
  ASSERT_TRUE(s0.WaitForLog("listening on")) << s0.log();
  JobConfig cfg = LoadJobConfig(job);
  ClientOptions o;
  o.timeout_ms = 30000;
  Client w(cfg, o);
  w.Register({{"a", DType::kF32, {4}}, {"b", DType::kF32, {4}}});
  AssignAB(w, 1.f);
  const CheckpointRecord rec = CheckpointAt(w, 1, 1);
  // Every other worker heartbeats (every 100 ms; dead after 1 s of silence).
  TransportContext ctx("test-members");
  std::vector<std::unique_ptr<HeartbeatSender>> members;
  for (int r = 1; r < workers; ++r)
    members.push_back(
        std::make_unique<HeartbeatSender>(ctx, "tcp://" + cfg.servers[0], CurveKeys{}, msg::Role::WORKER, r, 100));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_EQ(s0.log().find("stopped answering"), std::string::npos) << s0.log();

  // Checkpoint 2's write is held until the gate opens; the RELOAD waits for it on shard
  // 0's serving thread.
  ASSERT_EQ(unlink(gate.c_str()), 0);
  std::thread writer([&] {
    ClientOptions wo;
    wo.rank = 1;
    wo.timeout_ms = 30000;
    Client c(cfg, wo);
    c.Register();
    CheckpointAt(c, 2, 1);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    testing::WriteFile(gate, "open");
  });
  w.Reload(rec);
  opener.join();
  writer.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // many membership checks
  EXPECT_EQ(s0.log().find("stopped answering"), std::string::npos) << s0.log();
  members.clear();
}

}  // namespace
}  // namespace shoal
