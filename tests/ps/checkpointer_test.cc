// RocksDB checkpoints of a shard: exact round trip of tensors and optimizer state, the
// committed one never pruned, a new job refuses an earlier run's directory (--fresh clears
// it), a full disk fails the write and keeps what was there, corrupted records named, and a
// writer SIGKILLed at random moments never leaves a checkpoint half there.
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "algorithms/optimizers/optimizer.h"
#include "common/byte_codec.h"
#include "common/config.h"
#include "common/error.h"
#include "server/aggregation.h"
#include "server/checkpointer.h"
#include "server/coordinator.h"
#include "server/kv_shard.h"

namespace shoal {
namespace {

Frame Floats(const std::vector<float>& v) { return Frame(v.data(), v.size() * 4); }
std::vector<float> Values(const KvShard& kv, const std::string& name) {
  const StoredTensor* t = kv.Find(name);
  if (!t) return {};
  const float* p = reinterpret_cast<const float*>(t->buf->data());
  return std::vector<float>(p, p + t->elements());
}

std::string Dir(const std::string& name) {
  static int n = 0;
  return ::testing::TempDir() + "/ckpt_" + name + "_" + std::to_string(getpid()) + "_" + std::to_string(n++);
}

// Runs CheckpointerChild.<role> in a new process of this binary (fork + exec), with `env`
// set: a child only forked would inherit RocksDB's background thread pool without its
// threads (fork copies one thread), and a write's flush would wait for them forever.
pid_t SpawnChild(const std::string& role, const std::vector<std::pair<std::string, std::string>>& env) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  setenv("SHOAL_CHECKPOINTER_CHILD", role.c_str(), 1);
  for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  const std::string filter = "--gtest_filter=CheckpointerChild." + role;
  execl("/proc/self/exe", "checkpointer_test", filter.c_str(), static_cast<char*>(nullptr));
  _exit(99);
}

// The value of `key` in a child's environment, or "" (a test run normally: it skips).
std::string ChildEnv(const char* key) {
  const char* v = getenv(key);
  return v ? v : "";
}

CheckpointRecord Rec(uint64_t id) {
  CheckpointRecord r;
  r.id = id;
  r.step = int64_t(id);
  r.epoch = int64_t(id) / 10;
  r.batch = int64_t(id) % 10;
  r.shards = 1;
  return r;
}

// The job's server rule with the plan two ps_async workers would send.
std::unique_ptr<UpdateRule> PlannedRule(const JobConfig& cfg) {
  auto rule = MakeServerUpdateRule(cfg);
  TrainingPlan plan;
  plan.steps_per_epoch = 10;
  plan.total_steps = 20;
  plan.rule = msg::ServerRule::APPLY_EACH;
  plan.workers = 2;
  plan.global_batch = 64;
  rule->SetPlan(plan);
  return rule;
}

JobConfig PsJob(const std::string& algorithm) {
  return ParseJobConfig(
      "[job]\nname = \"t\"\n[cluster]\nservers = [\"127.0.0.1:1\"]\nworkers = 2\n[model]\nname = \"mlp\"\n"
      "[data]\nformat = \"idx\"\ntrain = \"/usr/share/datasets/fashion-mnist/train\"\n"
      "test = \"/usr/share/datasets/fashion-mnist/t10k\"\nbatch_size = 32\nmax_train_samples = 640\n"
      "[algorithm]\nname = \"" +
          algorithm +
          "\"\n[optimizer]\nname = \"lamb\"\nlr = 0.01\nweight_decay = 0.01\n"
          "[train]\nepochs = 2\n",
      "job.toml");
}

TEST(Checkpointer, TensorsAndOptimizerStateRoundTripExactly) {
  JobConfig cfg = PsJob("ps_async");
  KvShard a, b;
  a.SetUpdateRule(PlannedRule(cfg));
  b.SetUpdateRule(PlannedRule(cfg));
  a.Push("fc.weight", DType::kF32, {2, 3}, Floats({1, 2, 3, 4, 5, 6}), msg::PushOp::ASSIGN);
  a.Push("fc.bias", DType::kF32, {3}, Floats({0.5f, -0.5f, 0}), msg::PushOp::ASSIGN);
  a.Push("half", DType::kF16, {2}, Frame("\x01\x3c\x00\x40", 4), msg::PushOp::ASSIGN);
  for (int i = 0; i < 5; ++i) {  // LAMB's moments and step counts now differ from zero
    a.Push("fc.weight", DType::kF32, {2, 3}, Floats({0.1f, -0.2f, 0.3f, 0.1f * i, 0, 1}), msg::PushOp::APPLY);
    a.Push("fc.bias", DType::kF32, {3}, Floats({1, 1, -1}), msg::PushOp::APPLY);
  }
  std::string dir = Dir("roundtrip");
  {
    Checkpointer c(dir, 0, CheckpointStart::kNew);
    EXPECT_GT(c.Write(Rec(7), 0, a), 36u);
    c.Commit(Rec(7));
  }
  Checkpointer c(dir, 0, CheckpointStart::kResume);
  EXPECT_EQ(c.Committed().id, 7u);
  EXPECT_EQ(c.Committed().batch, 7);
  c.Load(7, &b);
  ASSERT_EQ(b.size(), 3u);
  for (auto& [name, t] : a.tensors()) {
    const StoredTensor* u = b.Find(name);
    ASSERT_TRUE(u) << name;
    EXPECT_EQ(u->dtype, t.dtype);
    EXPECT_EQ(u->shape, t.shape);
    EXPECT_EQ(u->version, t.version);
    ASSERT_EQ(u->buf->size(), t.buf->size());
    EXPECT_EQ(memcmp(u->buf->data(), t.buf->data(), t.buf->size()), 0) << name;
  }
  // The same next update on both: identical only if moments and step counts came back.
  for (KvShard* kv : {&a, &b}) {
    kv->Push("fc.weight", DType::kF32, {2, 3}, Floats({0.3f, 0.3f, -0.3f, 0.2f, 0.1f, 0}), msg::PushOp::APPLY);
    kv->Push("fc.bias", DType::kF32, {3}, Floats({-1, 2, 0.5f}), msg::PushOp::APPLY);
  }
  EXPECT_EQ(Values(a, "fc.weight"), Values(b, "fc.weight"));
  EXPECT_EQ(Values(a, "fc.bias"), Values(b, "fc.bias"));
  // Against a shard that lost its state: the update differs, so the check above has teeth.
  KvShard cold;
  cold.SetUpdateRule(PlannedRule(cfg));
  cold.Push("fc.weight", DType::kF32, {2, 3}, Frame(a.Find("fc.weight")->buf->data(), 24), msg::PushOp::ASSIGN);
  KvShard warm;
  warm.SetUpdateRule(PlannedRule(cfg));
  c.Load(7, &warm);
  cold.Push("fc.weight", DType::kF32, {2, 3}, Floats({1, 1, 1, 1, 1, 1}), msg::PushOp::APPLY);
  warm.Push("fc.weight", DType::kF32, {2, 3}, Floats({1, 1, 1, 1, 1, 1}), msg::PushOp::APPLY);
  EXPECT_NE(Values(cold, "fc.weight"), Values(warm, "fc.weight"));
}

// A shard running adamw (ps_async, one worker: every push is one step at the schedule's lr)
// applies exactly the worker-side rule (decoupled decay on the matrix, none on the bias),
// and its checkpoint holds both moments and the step count: restored, they are the same
// bits, and the next update matches the rule continued without a checkpoint.
TEST(Checkpointer, AdamWStateOnAServerRoundTripsExactly) {
  JobConfig cfg = ParseJobConfig(
      "[job]\nname = \"t\"\n[cluster]\nservers = [\"127.0.0.1:1\"]\nworkers = 1\n[model]\nname = \"mlp\"\n"
      "[data]\nformat = \"synthetic\"\nbatch_size = 32\n[algorithm]\nname = \"ps_async\"\n"
      "[optimizer]\nname = \"adamw\"\nlr = 0.01\nweight_decay = 0.1\n[train]\nepochs = 2\n",
      "job.toml");
  auto planned = [&] {
    auto rule = MakeServerUpdateRule(cfg);
    TrainingPlan plan;
    plan.steps_per_epoch = 10;
    plan.total_steps = 20;
    plan.rule = msg::ServerRule::APPLY_EACH;
    plan.workers = 1;
    plan.global_batch = 32;
    rule->SetPlan(plan);
    return rule;
  };
  // The worker-side rule from the same [optimizer]: what the shard must reproduce.
  auto reference = MakeOptimizer(cfg.optimizer, cfg.optimizer_opts);
  ASSERT_EQ(reference->Name(), "adamw");
  std::vector<float> rw = {1, -2, 3, 0.5f, 0, -1}, rb = {0.5f, -0.5f, 0};
  OptimizerState rws, rbs;

  KvShard a, b;
  a.SetUpdateRule(planned());
  b.SetUpdateRule(planned());
  a.Push("fc.weight", DType::kF32, {2, 3}, Floats(rw), msg::PushOp::ASSIGN);
  a.Push("fc.bias", DType::kF32, {3}, Floats(rb), msg::PushOp::ASSIGN);
  for (int i = 0; i < 4; ++i) {
    std::vector<float> gw = {0.1f, -0.2f, 0.3f, 0.1f * i, 0, 1}, gb = {1, 1 - 0.5f * i, -1};
    a.Push("fc.weight", DType::kF32, {2, 3}, Floats(gw), msg::PushOp::APPLY);
    a.Push("fc.bias", DType::kF32, {3}, Floats(gb), msg::PushOp::APPLY);
    reference->Apply(rw.data(), gw.data(), 6, true, {0.01f, i, 0}, &rws);
    reference->Apply(rb.data(), gb.data(), 3, false, {0.01f, i, 0}, &rbs);
  }
  EXPECT_EQ(Values(a, "fc.weight"), rw);
  EXPECT_EQ(Values(a, "fc.bias"), rb);

  std::string dir = Dir("adamw");
  {
    Checkpointer c(dir, 0, CheckpointStart::kNew);
    c.Write(Rec(4), 0, a);
    c.Commit(Rec(4));
  }
  Checkpointer c(dir, 0, CheckpointStart::kResume);
  c.Load(4, &b);
  for (const char* name : {"fc.weight", "fc.bias"}) {
    SCOPED_TRACE(name);
    const StoredTensor *t = a.Find(name), *u = b.Find(name);
    ASSERT_TRUE(t && u);
    EXPECT_EQ(Values(b, name), Values(a, name));
    // The rule's bytes: pushes, pending count, the OptimizerState, the (empty) sum.
    std::string saved = a.rule().SaveState(*t), loaded = b.rule().SaveState(*u);
    EXPECT_EQ(saved, loaded);
    ByteReader r(loaded, name);
    EXPECT_EQ(r.Get<int64_t>(), 4);  // pushes
    r.Get<int32_t>();
    OptimizerState st = DecodeOptimizerState(r.Blob(), t->elements(), name);
    const OptimizerState& want = std::string(name) == "fc.weight" ? rws : rbs;
    EXPECT_EQ(st.steps, 4);
    ASSERT_EQ(st.slots.size(), 2u);  // exp_avg, exp_avg_sq
    EXPECT_EQ(st.slots[0], want.slots[0]);
    EXPECT_EQ(st.slots[1], want.slots[1]);
  }
  // One more step on the original, the restored shard and the reference: the same bits.
  std::vector<float> gw = {-0.3f, 0.2f, 0.1f, 0, 0.5f, -1}, gb = {0.25f, -2, 0.5f};
  for (KvShard* kv : {&a, &b}) {
    kv->Push("fc.weight", DType::kF32, {2, 3}, Floats(gw), msg::PushOp::APPLY);
    kv->Push("fc.bias", DType::kF32, {3}, Floats(gb), msg::PushOp::APPLY);
  }
  reference->Apply(rw.data(), gw.data(), 6, true, {0.01f, 4, 0}, &rws);
  reference->Apply(rb.data(), gb.data(), 3, false, {0.01f, 4, 0}, &rbs);
  EXPECT_EQ(Values(a, "fc.weight"), rw);
  EXPECT_EQ(Values(b, "fc.weight"), rw);
  EXPECT_EQ(Values(b, "fc.bias"), rb);
  // A shard that restarted without the moments steps elsewhere (step 1's bias correction).
  KvShard cold;
  cold.SetUpdateRule(planned());
  cold.Push("fc.bias", DType::kF32, {3}, Frame(b.Find("fc.bias")->buf->data(), 12), msg::PushOp::ASSIGN);
  b.Push("fc.bias", DType::kF32, {3}, Floats({1, 1, 1}), msg::PushOp::APPLY);
  cold.Push("fc.bias", DType::kF32, {3}, Floats({1, 1, 1}), msg::PushOp::APPLY);
  EXPECT_NE(Values(cold, "fc.bias"), Values(b, "fc.bias"));
}

// The bug this guards against: with committed C, an uncommitted write between, and a new
// write Y, pruning "all but the newest before Y" deleted C, so a failed Y left nothing.
TEST(Checkpointer, NeverPrunesTheCommittedCheckpoint) {
  std::string dir = Dir("keep");
  KvShard kv;
  kv.Push("w", DType::kF32, {2}, Floats({1, 2}), msg::PushOp::ASSIGN);
  Checkpointer c(dir, 3, CheckpointStart::kNew);
  EXPECT_EQ(c.Committed().id, 0u);
  c.Write(Rec(10), 0, kv);   // committed job-wide (shard 0 records it; this shard hears `keep`)
  c.Write(Rec(20), 10, kv);  // written, never committed
  c.Write(Rec(30), 10, kv);
  EXPECT_EQ(c.Written(), (std::vector<uint64_t>{30, 20, 10}));
  c.Write(Rec(30), 10, kv);  // a repeated id replaces itself
  EXPECT_EQ(c.Written(), (std::vector<uint64_t>{30, 20, 10}));
  KvShard out;
  c.Load(10, &out);  // still whole
  EXPECT_EQ(Values(out, "w"), (std::vector<float>{1, 2}));
  c.Write(Rec(40), 30, kv);  // 30 committed: what came before it goes
  EXPECT_EQ(c.Written(), (std::vector<uint64_t>{40, 30}));
  // After a resume from 30 the timeline moves on from there: 40 of the old one goes.
  c.Write(Rec(35), 30, kv);
  EXPECT_EQ(c.Written(), (std::vector<uint64_t>{35, 30}));
  EXPECT_THROW(c.Load(10, &out), Error);
  // This store's own committed record is kept whatever a writer says.
  c.Commit(Rec(35));
  c.Write(Rec(50), 0, kv);
  c.Write(Rec(60), 60, kv);
  EXPECT_EQ(c.Written(), (std::vector<uint64_t>{60, 35}));
}

TEST(Checkpointer, ANewJobRefusesAnEarlierRunsCheckpointsAndFreshClearsThem) {
  std::string dir = Dir("safe");
  KvShard kv;
  kv.Push("w", DType::kF32, {2}, Floats({1, 2}), msg::PushOp::ASSIGN);
  { Checkpointer c(dir, 0, CheckpointStart::kNew); }  // an empty store is no earlier run
  {
    Checkpointer c(dir, 0, CheckpointStart::kNew);
    c.Write(Rec(10), 0, kv);
    c.Commit(Rec(10));
  }
  try {
    Checkpointer c(dir, 0, CheckpointStart::kNew);
    FAIL() << "a new job opened a directory holding checkpoint 10";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("--resume"), std::string::npos) << m;
    EXPECT_NE(m.find("--fresh"), std::string::npos) << m;
    EXPECT_NE(m.find("shard-0"), std::string::npos) << m;
  }
  {
    Checkpointer c(dir, 0, CheckpointStart::kResume);  // the run goes on: all still there
    EXPECT_EQ(c.Committed().id, 10u);
  }
  Checkpointer again(dir, 0, CheckpointStart::kFresh);
  EXPECT_TRUE(again.Written().empty());
  EXPECT_EQ(again.Committed().id, 0u);
  EXPECT_THROW(CheckpointStartFrom(true, true), Error);
}

// Shard 0 restarted alone takes back the workers that finished from its notes; a damaged
// note is an error naming the store, the note and the item, never a crash or a wrong set.
TEST(Checkpointer, TheCoordinatorsFinishedWorkersNoteIsReadStrictly) {
  const JobConfig cfg = PsJob("ps_async");  // 2 workers
  const std::string dir = Dir("notes");
  {
    Checkpointer c(dir, 0, CheckpointStart::kNew);
    Coordinator first(cfg, [](const PeerId&, OutMessage&) {});
    first.SetCheckpointer(&c);  // generation 0, nobody finished
    EXPECT_EQ(c.Note("coordinator/left"), std::optional<std::string>(""));
    c.PutNote("coordinator/left", "0,1");
  }
  {
    Checkpointer c(dir, 0, CheckpointStart::kResume);
    Coordinator again(cfg, [](const PeerId&, OutMessage&) {});
    again.SetCheckpointer(&c, /*rejoin=*/true);
    EXPECT_TRUE(again.JobOver());  // both workers had finished
    EXPECT_EQ(again.generation(), 1u);
    EXPECT_EQ(c.Note("coordinator/left"), std::optional<std::string>("0,1"));
  }
  for (const char* bad : {"0,,1", "0,x", "0,+1", "0,4294967296", "0,2", "-1"}) {
    Checkpointer c(dir, 0, CheckpointStart::kResume);
    c.PutNote("coordinator/left", bad);
    Coordinator again(cfg, [](const PeerId&, OutMessage&) {});
    try {
      again.SetCheckpointer(&c, true);
      ADD_FAILURE() << "finished workers \"" << bad << "\" were accepted";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("shard-0: the coordinator's note 'coordinator/left'"), std::string::npos) << m;
      EXPECT_NE(m.find(std::string(bad) == "0,2" || std::string(bad) == "-1" ? "but the job has 2 workers" : "item 2"),
                std::string::npos)
          << m;
    }
  }
}

// AFullDiskFailsTheWrite's writer; its exit code says what went wrong.
TEST(CheckpointerChild, FullDisk) {
  if (ChildEnv("SHOAL_CHECKPOINTER_CHILD") != "FullDisk") GTEST_SKIP() << "runs in a child of FullDisk";
  const std::string dir = ChildEnv("SHOAL_CHECKPOINTER_DIR");
  {
    signal(SIGXFSZ, SIG_IGN);
    int code = 0;
    try {
      Checkpointer c(dir, 0, CheckpointStart::kNew);
      KvShard kv;
      kv.Push("w", DType::kF32, {4}, Floats({1, 2, 3, 4}), msg::PushOp::ASSIGN);
      c.Write(Rec(1), 0, kv);
      c.Commit(Rec(1));
      rlimit large{RLIM_INFINITY, RLIM_INFINITY};
      getrlimit(RLIMIT_FSIZE, &large);
      rlimit small{1 << 20, large.rlim_max};  // the soft limit only: it can be raised again
      setrlimit(RLIMIT_FSIZE, &small);
      kv.Push("big", DType::kF32, {4 << 20}, Floats(std::vector<float>(4 << 20, 5.f)), msg::PushOp::ASSIGN);
      try {
        c.Write(Rec(2), 1, kv);
        code = 10;  // written past the limit?
      } catch (const Error& e) {
        std::string m = e.what();
        if (m.find("checkpoint 2") == std::string::npos || m.find("shard-0") == std::string::npos) code = 11;
      }
      setrlimit(RLIMIT_FSIZE, &large);
      KvShard back;
      c.Load(1, &back);
      if (Values(back, "w") != std::vector<float>{1, 2, 3, 4} || back.size() != 1) code = 12;
      if (c.Written() != std::vector<uint64_t>{1}) code = 13;
      c.Write(Rec(3), 1, kv);  // room again
      if (c.Written() != std::vector<uint64_t>{3, 1}) code = 14;
    } catch (const std::exception& e) {
      fprintf(stderr, "%s\n", e.what());
      code = 20;
    }
    _exit(code);
  }
}

// A disk that fills up mid-write (a file-size limit: EFBIG, as ENOSPC would): the write
// fails with an error naming the store, the committed checkpoint stays whole, and once
// there is room again the next write succeeds.
TEST(Checkpointer, AFullDiskFailsTheWriteAndKeepsThePreviousCheckpoint) {
  std::string dir = Dir("full");
  pid_t pid = SpawnChild("FullDisk", {{"SHOAL_CHECKPOINTER_DIR", dir}});
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "10: written past the limit, 11: error names neither, 12: previous lost, "
                                   "13: pruned, 14: no recovery, 20: exception";
  Checkpointer c(dir, 0, CheckpointStart::kResume);
  KvShard back;
  c.Load(3, &back);
  EXPECT_EQ(back.size(), 2u);
}

TEST(Checkpointer, CorruptedRecordsAreNamedNotTrusted) {
  std::string dir = Dir("corrupt");
  KvShard kv;
  kv.Push("layer.w", DType::kF32, {4}, Floats({1, 2, 3, 4}), msg::PushOp::ASSIGN);
  {
    Checkpointer c(dir, 0, CheckpointStart::kNew);
    c.Write(Rec(5), 0, kv);
  }
  {  // flip the stored tensor into garbage, as a bad disk or another program would
    rocksdb::DB* db = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir + "/shard-0", &db).ok());
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "t/0000000000000005/layer.w", "SHCK\x00garbage").ok());
    delete db;
  }
  Checkpointer c(dir, 0, CheckpointStart::kResume);
  KvShard out;
  try {
    c.Load(5, &out);
    FAIL() << "loaded a corrupted checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer.w"), std::string::npos) << e.what();
  }
  EXPECT_EQ(out.size(), 0u) << "nothing half-loaded";
}

// AWriterKilledMidWrite's writer: checkpoints from SHOAL_CHECKPOINTER_NEXT on until killed.
TEST(CheckpointerChild, Writer) {
  if (ChildEnv("SHOAL_CHECKPOINTER_CHILD") != "Writer") GTEST_SKIP() << "runs in a child of AWriterKilledMidWrite";
  const size_t kFloats = 1 << 20;
  const uint64_t next = std::stoull(ChildEnv("SHOAL_CHECKPOINTER_NEXT"));
  const int ready = std::stoi(ChildEnv("SHOAL_CHECKPOINTER_READY_FD"));
  try {
    Checkpointer c(ChildEnv("SHOAL_CHECKPOINTER_DIR"), 0,
                   ChildEnv("SHOAL_CHECKPOINTER_NEW") == "1" ? CheckpointStart::kNew : CheckpointStart::kResume);
    KvShard kv;
    for (uint64_t id = next;; ++id) {
      for (int t = 0; t < 3; ++t)
        kv.Push("t" + std::to_string(t), DType::kF32, {int64_t(kFloats)},
                Floats(std::vector<float>(kFloats, float(id * 10 + t))), msg::PushOp::ASSIGN);
      c.Write(Rec(id), id - 1, kv);  // the one before counts as committed
      if (id == next && write(ready, "w", 1) != 1) _exit(4);
    }
  } catch (...) {
    _exit(3);
  }
}

// A writer killed at random moments: every checkpoint with a manifest loads whole, with
// the values it was written with; the newest written is never older than two before.
TEST(Checkpointer, AWriterKilledMidWriteLeavesEveryCheckpointWhole) {
  std::string dir = Dir("crash");
  std::mt19937 rng(7);
  const size_t kFloats = 1 << 20;  // 4 MiB a tensor, 3 tensors: writes take a while
  uint64_t next = 1;
  for (int round = 0; round < 6; ++round) {
    // The writer says when its first checkpoint of the round is down, so the kill always
    // lands mid-stream however slow the machine is, never before anything was written.
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    pid_t pid = SpawnChild("Writer", {{"SHOAL_CHECKPOINTER_DIR", dir},
                                      {"SHOAL_CHECKPOINTER_NEXT", std::to_string(next)},
                                      {"SHOAL_CHECKPOINTER_READY_FD", std::to_string(ready[1])},
                                      {"SHOAL_CHECKPOINTER_NEW", round == 0 ? "1" : "0"}});
    close(ready[1]);
    pollfd pfd{ready[0], POLLIN, 0};
    bool wrote = poll(&pfd, 1, 60000) == 1;
    close(ready[0]);
    if (wrote) std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 200));
    kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    ASSERT_TRUE(wrote) << "the writer wrote no checkpoint within 60 s";
    ASSERT_TRUE(WIFSIGNALED(st)) << "the writer failed on its own";
    Checkpointer c(dir, 0, CheckpointStart::kResume);
    std::vector<uint64_t> ids = c.Written();
    ASSERT_FALSE(ids.empty()) << "round " << round;
    ASSERT_LE(ids.size(), 2u);
    for (uint64_t id : ids) {
      KvShard kv;
      c.Load(id, &kv);
      ASSERT_EQ(kv.size(), 3u);
      for (int t = 0; t < 3; ++t) {
        std::vector<float> v = Values(kv, "t" + std::to_string(t));
        ASSERT_EQ(v.size(), kFloats);
        EXPECT_EQ(v.front(), float(id * 10 + t));
        EXPECT_EQ(v.back(), float(id * 10 + t));
      }
    }
    next = ids.front() + 1;
  }
}

}  // namespace
}  // namespace shoal
