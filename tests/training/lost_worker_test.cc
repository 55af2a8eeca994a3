// diloco with [algorithm] elastic = true: a worker killed (SIGKILL) mid-run drops out of the
// outer steps and the others go on without a whole-job restart; `shoal run` starts it again
// alone and it takes the global weights at the next outer step, or, without restarts left, the
// others finish alone; worker 0 too (the coordinator is a process of its own, and the next
// lowest worker decides the rounds). With [job] checkpoint_dir, the checkpoints commit among each round's
// members: one taken while a worker was dead is complete without it, and --resume hands that
// worker the global state. Real launcher and workers on loopback, real RocksDB stores,
// CurveZMQ keys on every link, bounded waits, no process left behind.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "algorithms/algorithm.h"
#include "common/checkpoint/checkpoint_store.h"
#include "common/json_fields.h"
#include "tests/ps/ps_test_util.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

const char* kAdamW = "[optimizer]\nname = \"adamw\"\nlr = 1e-3\nweight_decay = 1e-2\n\n";

// 4 workers of the mlp, batch 32, 12000 samples: 93 steps an epoch, an outer step every 10.
std::string Job(const std::string& name, const std::string& dir, int epochs, int max_restarts, bool keys) {
  std::string security;
  if (keys) {
    char spub[41], ssec[41], cpub[41], csec[41];
    EXPECT_EQ(zmq_curve_keypair(spub, ssec), 0);
    EXPECT_EQ(zmq_curve_keypair(cpub, csec), 0);
    security = std::string("[security]\nserver_public_key = \"") + spub + "\"\nserver_secret_key = \"" + ssec +
               "\"\nclient_public_key = \"" + cpub + "\"\nclient_secret_key = \"" + csec + "\"\n\n";
  }
  std::string t = FmnistJob(name, dir + "/out", 4, "mlp", 12000, epochs,
                            "[algorithm]\nname = \"diloco\"\nsync_every = 10\nelastic = true\n\n" + security + kAdamW);
  t.insert(t.find("seed = 42\n") + 10, "max_restarts = " + std::to_string(max_restarts) + "\n");
  t.replace(t.find("[cluster]\n"), 10, "[cluster]\nheartbeat_ms = 200\nheartbeat_timeout_ms = 2000\n");
  return t;
}

double Wall(const std::string& event) { return JsonNumber(event, "wall_s").value_or(-1); }

// Seconds from the launcher's record of the death to the first round decided after it.
double KillToNextRound(const JobRun& r) {
  auto failed = Events(r, "process_failed");
  if (failed.empty()) return -1;
  for (auto& q : Events(r, "quorum"))
    if (Wall(q) > Wall(failed[0])) return Wall(q) - Wall(failed[0]);
  return -1;
}

// The end records' ranks and weights.
std::map<int, std::string> EndHashes(const JobRun& r) {
  std::map<int, std::string> out;
  for (auto& e : Events(r, "end"))
    out[int(JsonNumber(e, "rank").value_or(-1))] = JsonField(e, "weights_hash").value_or("?");
  return out;
}

// All four workers of `r` end on one model, each after `steps` steps.
void ExpectAllFourEndOnOneModel(const JobRun& r, int64_t steps) {
  std::map<int, std::string> ends = EndHashes(r);
  ASSERT_EQ(ends.size(), 4u) << r.stderr_text;
  for (auto& [rank, hash] : ends) EXPECT_EQ(hash, ends[0]) << "worker " << rank;
  for (auto& e : Events(r, "end")) EXPECT_EQ(int64_t(JsonNumber(e, "steps").value_or(0)), steps) << e;
}

// The coordinator processes (shoal-launch --serve_coordinator) of the job in `dir`.
int CoordinatorsOf(const std::string& dir) {
  // "[r]": the pattern must not match the shell that runs pgrep.
  FILE* p = popen(("pgrep -c -f -- '--serve_coordinato[r] .*" + dir + "/job.toml' 2>/dev/null").c_str(), "r");
  if (!p) return -1;
  int n = 0;
  if (fscanf(p, "%d", &n) != 1) n = 0;
  pclose(p);
  return n;
}

// A job of 6 epochs whose worker `rank` is killed once the job logged 40 train events (about
// step 200, between or inside outer steps as it happens); it must end well all the same. It
// exports its final weights to <dir>/out/final.weights.
JobRun KilledRun(const std::string& name, const std::string& rank, int max_restarts, bool keys) {
  const std::string dir = FreshDir(name);
  std::thread killer([&] { KillWhenTraining(dir, "--rank " + rank, 40); });
  std::string job = Job(name, dir, 6, max_restarts, keys);
  job.insert(job.find("seed = 42\n") + 10, "export_weights = \"" + dir + "/out/final.weights\"\n");
  JobRun r = RunJob(dir, job, 600);
  killer.join();
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_GE(JsonNumber(r.done_line, "test_accuracy").value_or(0), 0.80) << r.done_line;
  EXPECT_EQ(ProcessesOf(dir), 0);
  EXPECT_EQ(CoordinatorsOf(dir), 0);
  return r;
}

// At the round that took the rejoined worker in (its `rejoin` event), the others (`others`)
// logged `join_round`, and all of them hold the same weights after it.
void ExpectRejoinedOnTheOthersWeights(const JobRun& r, const std::string& rejoin, const std::set<int>& others) {
  const double round = JsonNumber(rejoin, "round").value_or(-1);
  std::set<int> members;
  std::set<std::string> hashes = {JsonField(rejoin, "weights_hash").value_or("?")};
  for (auto& e : Events(r, "join_round"))
    if (JsonNumber(e, "round").value_or(-2) == round) {
      members.insert(int(JsonNumber(e, "rank").value_or(-1)));
      hashes.insert(JsonField(e, "weights_hash").value_or("?"));
    }
  EXPECT_EQ(members, others) << r.stderr_text;
  EXPECT_EQ(hashes.size(), 1u) << "the rejoined worker's weights differ from the others' after its first outer step";
}

// Worker `rank` of `r` alone was started again, once, and nothing else was (a whole-job
// restart names no process alone, and every worker would say it resumed); it rejoined with the
// others' weights, and all four ended on one model after every step. Its `rejoin` event.
std::string ExpectRestartedAloneAndRejoined(const JobRun& r, int rank, const std::set<int>& others) {
  EXPECT_EQ(JsonNumber(r.done_line, "restarts").value_or(0), 1) << r.done_line;
  EXPECT_FALSE(JsonNumber(r.done_line, "workers_failed").has_value()) << r.done_line;
  auto restarts = Events(r, "restart");
  EXPECT_EQ(restarts.size(), 1u) << r.stderr_text;
  if (!restarts.empty()) {
    EXPECT_EQ(JsonField(restarts[0], "alone").value_or(""), "worker " + std::to_string(rank)) << restarts[0];
  }
  EXPECT_TRUE(Events(r, "resume").empty()) << r.stderr_text;
  auto rejoin = Events(r, "rejoin");
  EXPECT_EQ(rejoin.size(), 1u) << r.stderr_text;
  if (rejoin.empty()) return "";
  EXPECT_EQ(JsonNumber(rejoin[0], "rank").value_or(-1), rank);
  EXPECT_GT(JsonNumber(rejoin[0], "step").value_or(0), 0);
  ExpectRejoinedOnTheOthersWeights(r, rejoin[0], others);
  ExpectAllFourEndOnOneModel(r, 93 * 6);
  return rejoin[0];
}

// The three workers left after `lost` died and was not restarted: some round was decided
// among them, and they end on one model.
void ExpectTheOthersFinishedWithout(const JobRun& r, int lost) {
  std::vector<int> rest;
  for (int k = 0; k < 4; ++k)
    if (k != lost) rest.push_back(k);
  const std::string members = std::to_string(rest[0]) + "," + std::to_string(rest[1]) + "," + std::to_string(rest[2]);
  bool without = false;
  for (auto& q : Events(r, "quorum")) without = without || JsonField(q, "members").value_or("") == members;
  EXPECT_TRUE(without) << r.stderr_text;
  std::map<int, std::string> ends = EndHashes(r);
  EXPECT_EQ(ends.size(), 3u) << r.stderr_text;
  EXPECT_EQ(ends.count(lost), 0u);
  for (auto& [rank, hash] : ends) EXPECT_EQ(hash, ends[rest[0]]) << "worker " << rank;
}

TEST(LostWorker, RestartedAloneItRejoinsWithTheGlobalWeights) {
  const std::string base_dir = FreshDir("elastic_no_kill");
  JobRun base = RunJob(base_dir, Job("elastic_no_kill", base_dir, 6, 1, true), 600);
  ASSERT_EQ(base.exit_code, 0) << base.stderr_text;
  const double base_acc = JsonNumber(base.done_line, "test_accuracy").value_or(0);

  JobRun r = KilledRun("elastic_kill", "2", 1, true);
  ASSERT_EQ(r.exit_code, 0);
  const double acc = JsonNumber(r.done_line, "test_accuracy").value_or(0);
  const std::string rejoin = ExpectRestartedAloneAndRejoined(r, 2, {0, 1, 3});
  printf(
      "elastic diloco, 4 workers, 6 epochs: accuracy %.4f without a kill, %.4f with worker 2 killed and rejoined "
      "(at step %.0f); %.2f s from the kill to the next outer round\n",
      base_acc, acc, JsonNumber(rejoin, "step").value_or(0), KillToNextRound(r));
}

TEST(LostWorker, NotRestartedTheOthersFinishAlone) {
  JobRun r = KilledRun("elastic_lost", "3", 0, false);
  ASSERT_EQ(r.exit_code, 0);
  const double acc = JsonNumber(r.done_line, "test_accuracy").value_or(0);
  EXPECT_EQ(JsonNumber(r.done_line, "workers_failed").value_or(0), 1) << r.done_line;
  EXPECT_TRUE(Events(r, "restart").empty()) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("the outer steps go on among the live workers"), std::string::npos) << r.stderr_text;
  ExpectTheOthersFinishedWithout(r, 3);
  printf(
      "elastic diloco, worker 3 killed and not restarted: accuracy %.4f; %.2f s from the kill to the next outer "
      "round\n",
      acc, KillToNextRound(r));
}

// Worker 0, the lowest rank (it decides the rounds while it lives), killed mid-run and
// started again alone: the next lowest decides meanwhile, worker 0 rejoins with the others'
// weights (no whole-job restart), and all four end on one model. The coordinator is a process
// of its own, so it goes on serving throughout.
TEST(LostWorker, WorkerZeroRestartedAloneRejoins) {
  JobRun r = KilledRun("elastic_kill0", "0", 1, true);
  ASSERT_EQ(r.exit_code, 0);
  const std::string rejoin = ExpectRestartedAloneAndRejoined(r, 0, {1, 2, 3});
  // Worker 1 decided while worker 0 was gone.
  bool by_one = false;
  for (auto& q : Events(r, "quorum")) by_one = by_one || JsonNumber(q, "decider").value_or(-1) == 1;
  EXPECT_TRUE(by_one) << r.stderr_text;
  printf(
      "elastic diloco, worker 0 killed and rejoined at step %.0f: accuracy %.4f; %.2f s from the kill to the next "
      "outer round\n",
      JsonNumber(rejoin, "step").value_or(0), JsonNumber(r.done_line, "test_accuracy").value_or(0), KillToNextRound(r));
}

// Worker 0 killed with no restart left: the other three finish, and the done line counts it
// failed and carries a live worker's final accuracy.
TEST(LostWorker, WorkerZeroNotRestartedTheOthersFinish) {
  JobRun r = KilledRun("elastic_lost0", "0", 0, true);
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(JsonNumber(r.done_line, "workers_failed").value_or(0), 1) << r.done_line;
  EXPECT_TRUE(Events(r, "restart").empty()) << r.stderr_text;
  ExpectTheOthersFinishedWithout(r, 0);
  // The done line's accuracy is one of theirs.
  std::set<double> accs;
  for (auto& e : Events(r, "end")) accs.insert(JsonNumber(e, "test_accuracy").value_or(-1));
  EXPECT_EQ(accs.count(JsonNumber(r.done_line, "test_accuracy").value_or(-2)), 1u) << r.done_line;
  // Worker 0 wrote no export: the lowest survivor did, and it holds their final model.
  std::vector<float> exported = ReadFloats(r.output_dir + "/final.weights");
  ParamView all;
  all.w = exported.data();
  all.n = int64_t(exported.size());
  EXPECT_EQ(WeightsHash({all}), EndHashes(r)[1]) << exported.size() << " floats exported";
  printf(
      "elastic diloco, worker 0 killed and not restarted: accuracy %.4f; %.2f s from the kill to the next outer "
      "round\n",
      JsonNumber(r.done_line, "test_accuracy").value_or(0), KillToNextRound(r));
}

// The job of `Job` with a checkpoint every outer step (every 10 steps) in <dir>/ckpt.
std::string CheckpointedJob(const std::string& name, const std::string& dir, int epochs, int max_restarts) {
  std::string t = Job(name, dir, epochs, max_restarts, true);
  t.insert(t.find("seed = 42\n") + 10, "checkpoint_dir = \"" + dir + "/ckpt\"\ncheckpoint_every_steps = 10\n");
  return t;
}

// Waits (bounded) until the job in `dir` logged `count` events named `event`.
bool WaitForEvents(const std::string& dir, const std::string& event, int count, int timeout_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (CountEvents(dir, event) < count) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
}

// The records of worker `rank`'s checkpoint store in the job in `dir`.
std::vector<CheckpointRecord> StoreOf(const std::string& dir, int rank) {
  std::optional<HeldCheckpoints> h = CheckpointStore::Peek(dir + "/ckpt/worker-" + std::to_string(rank));
  return h ? h->written : std::vector<CheckpointRecord>();
}

// What `shoal checkpoints` (shoal-launch --checkpoint_state) says of the job in `dir`.
std::string CheckpointState(const std::string& dir) {
  std::string cmd =
      "timeout -s KILL 60 " + BinDir() + "/tools/launcher/shoal-launch --checkpoint_state " + dir + "/job.toml 2>&1";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  return out;
}

// Checkpoints and elasticity together: worker 2 killed and restarted alone mid-run, then the
// whole job stopped (its coordinator killed, with no restart left) after a later checkpoint, and resumed with --resume:
// it finishes, every worker on the same weights, as accurate as an uninterrupted run must be. The checkpoint at the
// step worker 2 rejoined at lists it absent and its store lacks it (it trains from the step after, and wrote nothing
// before it held the global state).
TEST(LostWorker, CheckpointedRejoinedThenWholeJobKilledAndResumed) {
  const std::string dir = FreshDir("elastic_ckpt");
  const std::string job = CheckpointedJob("elastic_ckpt", dir, 6, 1);
  bool second_kill = false;
  std::thread killer([&] {
    KillWhenTraining(dir, "--rank 2", 40);
    if (!WaitForEvents(dir, "rejoin", 1, 300)) return;
    if (!WaitForEvents(dir, "checkpoint", CountEvents(dir, "checkpoint") + 2, 300)) return;
    // "[r]": the pattern must not match the shell that runs pkill.
    second_kill = system(("pkill -KILL -f -- '--serve_coordinato[r] .*" + dir + "/job.toml'").c_str()) == 0;
  });
  JobRun killed = RunJob(dir, job, 600);
  killer.join();
  ASSERT_TRUE(second_kill) << killed.stderr_text;
  EXPECT_NE(killed.exit_code, 0) << "the coordinator's death with no restart left ends the attempt";
  EXPECT_EQ(ProcessesOf(dir), 0);
  auto restarts = Events(killed, "restart");
  ASSERT_EQ(restarts.size(), 1u) << killed.stderr_text;
  EXPECT_EQ(JsonField(restarts[0], "alone").value_or(""), "worker 2");
  auto rejoin = Events(killed, "rejoin");
  ASSERT_EQ(rejoin.size(), 1u) << killed.stderr_text;
  const int64_t joined_at = int64_t(JsonNumber(rejoin[0], "step").value_or(-1));
  ASSERT_EQ(joined_at % 10, 0) << rejoin[0];
  bool listed_absent = false;
  for (auto& c : Events(killed, "checkpoint"))
    if (int64_t(JsonNumber(c, "step").value_or(-1)) == joined_at)
      listed_absent = JsonField(c, "absent").value_or("") == "2";
  EXPECT_TRUE(listed_absent) << "the checkpoint at step " << joined_at << " must list worker 2 absent";
  bool later = false;
  for (const CheckpointRecord& rec : StoreOf(dir, 2)) {
    EXPECT_NE(rec.step, joined_at) << "worker 2 wrote the checkpoint of the step it joined at";
    later = later || rec.step > joined_at;
  }
  EXPECT_TRUE(later) << "worker 2 wrote no checkpoint after it rejoined";

  JobRun resumed = RunJob(dir, job, 600, {"--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.stderr_text;
  EXPECT_EQ(ProcessesOf(dir), 0);
  auto resumes = Events(resumed, "resume");
  EXPECT_EQ(resumes.size(), 4u) << resumed.stderr_text;
  // From a checkpoint after the rejoin, which worker 2 wrote too: each worker from its own.
  for (auto& e : resumes) {
    const int64_t at = int64_t(JsonNumber(e, "step").value_or(-1));
    EXPECT_GT(at, joined_at) << e;
    EXPECT_EQ(JsonField(e, "from").value_or(""), "its own checkpoint " + std::to_string(at)) << e;
  }
  const double acc = JsonNumber(resumed.done_line, "test_accuracy").value_or(0);
  EXPECT_GE(acc, 0.80) << resumed.done_line;
  ExpectAllFourEndOnOneModel(resumed, 93 * 6);
  printf(
      "elastic diloco with checkpoints: worker 2 rejoined at step %lld, the job killed at step %.0f and resumed "
      "at step %.0f: accuracy %.4f\n",
      (long long)joined_at, JsonNumber(Events(killed, "process_failed").back(), "step").value_or(-1),
      resumes.empty() ? -1.0 : JsonNumber(resumes[0], "step").value_or(-1), acc);
}

// Worker 3 killed and not restarted: the checkpoints after the round that left it out list
// it absent and are complete without it (`shoal checkpoints` says so), and --resume starts it
// from a holder's copy of the global state with fresh inner state, at the same data position.
TEST(LostWorker, ACheckpointTakenWhileAWorkerWasDeadIsCompleteAndResumes) {
  const std::string dir = FreshDir("elastic_ckpt_gap");
  const std::string job = CheckpointedJob("elastic_ckpt_gap", dir, 3, 0);
  std::thread killer([&] { KillWhenTraining(dir, "--rank 3", 40); });
  JobRun first = RunJob(dir, job, 600);
  killer.join();
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text;
  EXPECT_EQ(JsonNumber(first.done_line, "workers_failed").value_or(0), 1) << first.done_line;
  auto checkpoints = Events(first, "checkpoint");
  ASSERT_FALSE(checkpoints.empty());
  const std::string& last = checkpoints.back();
  EXPECT_EQ(JsonField(last, "absent").value_or(""), "3") << last;
  const int64_t last_id = int64_t(JsonNumber(last, "id").value_or(-1));
  for (const CheckpointRecord& rec : StoreOf(dir, 3)) EXPECT_LT(rec.id, uint64_t(last_id));
  EXPECT_EQ(CheckpointState(dir), "complete " + std::to_string(last_id) + " " + std::to_string(last_id) + "\n");

  JobRun resumed = RunJob(dir, job, 600, {"--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.stderr_text;
  EXPECT_EQ(ProcessesOf(dir), 0);
  std::map<int, std::string> from;
  for (auto& e : Events(resumed, "resume")) {
    from[int(JsonNumber(e, "rank").value_or(-1))] = JsonField(e, "from").value_or("");
    EXPECT_EQ(int64_t(JsonNumber(e, "step").value_or(-1)), last_id) << e;
  }
  ASSERT_EQ(from.size(), 4u) << resumed.stderr_text;
  for (int r = 0; r < 3; ++r) EXPECT_EQ(from[r], "its own checkpoint " + std::to_string(last_id)) << r;
  EXPECT_NE(from[3].find("worker 0's copy of checkpoint " + std::to_string(last_id)), std::string::npos) << from[3];
  ExpectAllFourEndOnOneModel(resumed, 93 * 3);
  printf("elastic diloco, worker 3 lost: checkpoint %lld complete without it; resumed, accuracy %.4f\n",
         (long long)last_id, JsonNumber(resumed.done_line, "test_accuracy").value_or(0));
}

// Started as a cluster starts it (one shoal-task per rank, the rank from RANK / WORLD_SIZE, as
// srun or mpirun set theirs): task 0 starts the job's coordinator beside its worker, every
// worker meets it at [cluster] coordinator, the job ends on one model, and the coordinator
// leaves by itself once every worker has.
TEST(LostWorker, ShoalTaskZeroStartsTheCoordinator) {
  const std::string dir = FreshDir("elastic_task");
  std::string toml = Job("elastic_task", dir, 2, 0, true);
  toml.replace(toml.find("[cluster]\n"), 10,
               "[cluster]\ncoordinator = \"127.0.0.1:" + std::to_string(FreePort()) + "\"\n");
  std::ofstream(dir + "/job.toml") << toml;
  std::string cmd = "cd " + dir + " && for r in 0 1 2 3; do (RANK=$r WORLD_SIZE=4 timeout -s KILL 240 " + BinDir() +
                    "/tools/launcher/shoal-task --config " + dir +
                    "/job.toml > task-$r.log 2>&1; echo $? > rc-$r) & "
                    "done; wait";
  ASSERT_EQ(system(cmd.c_str()), 0);
  auto read = [&](const std::string& name) {
    std::ifstream in(dir + "/" + name);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(read("rc-" + std::to_string(r)), "0\n") << read("task-" + std::to_string(r) + ".log");
  EXPECT_NE(read("task-0.log").find("shoal: coordinator of job elastic_task serving at 127.0.0.1:"), std::string::npos)
      << read("task-0.log");
  std::set<std::string> hashes;
  std::ifstream m(dir + "/out/metrics.jsonl");
  for (std::string l; std::getline(m, l);)
    if (JsonField(l, "event").value_or("") == "end") hashes.insert(JsonField(l, "weights_hash").value_or(""));
  EXPECT_EQ(hashes.size(), 1u) << "the workers ended with different weights (or none ended)";
  // It leaves within a heartbeat timeout of the last worker's leave (bounded wait).
  for (int i = 0; i < 100 && CoordinatorsOf(dir) > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(CoordinatorsOf(dir), 0);
  EXPECT_NE(read("task-0.log").find("every worker has left or died"), std::string::npos) << read("task-0.log");
}

// shoal-launch --serve_coordinator refuses what it cannot serve with exit code 2 and a line
// naming it: a bad --coordinator (with the job file's checks), a job with servers, no job file.
TEST(LostWorker, TheCoordinatorProcessRefusesBadInputByName) {
  const std::string dir = FreshDir("coordinator_refusals");
  std::ofstream(dir + "/job.toml") << Job("coordinator_refusals", dir, 1, 0, false);
  std::ofstream(dir + "/ps.toml") << FmnistJob("ps", dir + "/out", 2, "mlp", 1000, 1,
                                               std::string("[algorithm]\nname = \"ps_sync\"\n\n") + kAdamW);
  auto serve = [&](const std::string& args) {
    const std::string cmd = "timeout -s KILL 30 " + BinDir() + "/tools/launcher/shoal-launch --serve_coordinator " +
                            args + " > " + dir + "/out.txt 2>&1";
    const int st = system(cmd.c_str());
    std::ifstream in(dir + "/out.txt");
    return std::make_pair(WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                          std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
  };
  auto refused = [&](const std::string& args, const std::string& names) {
    auto [rc, out] = serve(args);
    EXPECT_EQ(rc, 2) << args << ": " << out;
    EXPECT_NE(out.find(names), std::string::npos) << args << ": " << out;
  };
  refused("--coordinator 127.0.0.1:99999 " + dir + "/job.toml",
          "--coordinator (overriding [cluster] coordinator of the job file): expected \"host:port\" with port 1-65535");
  refused("--coordinator garbage " + dir + "/job.toml", "got \"garbage\"");
  refused(dir + "/ps.toml", "[algorithm] name = \"ps_sync\" has servers, and server shard 0 is its coordinator");
  refused(dir + "/missing.toml", dir + "/missing.toml");
}

// What elastic cannot be combined with is refused before anything starts, naming the key.
TEST(LostWorker, RefusedWhereItCannotWork) {
  auto refused = [](const std::string& name, const std::string& algorithm, const std::string& job_keys = "") {
    const std::string dir = FreshDir(name);
    std::string t = FmnistJob(name, dir + "/out", 2, "mlp", 1000, 1, algorithm + "\n" + kAdamW);
    t.insert(t.find("seed = 42\n") + 10, job_keys);
    JobRun r = RunJob(dir, t, 120);
    EXPECT_EQ(r.exit_code, 2) << name << ": " << r.stderr_text;
    return r.stderr_text;
  };
  EXPECT_NE(refused("elastic_streaming", "[algorithm]\nname = \"diloco\"\nelastic = true\nstreaming = 2\n")
                .find("[algorithm] streaming: not with elastic = true (lost-worker tolerance works with streaming = "
                      "0 only)"),
            std::string::npos);
  EXPECT_NE(refused("elastic_balance", "[algorithm]\nname = \"diloco\"\nelastic = true\nbalance = true\n")
                .find("[algorithm] balance: not with elastic = true"),
            std::string::npos);
  EXPECT_NE(refused("elastic_torus", "[algorithm]\nname = \"diloco\"\nelastic = true\ncollective = \"torus2d\"\n")
                .find("[algorithm] collective: not with elastic = true"),
            std::string::npos);
  EXPECT_NE(refused("elastic_bmuf", "[algorithm]\nname = \"auto\"\nelastic = true\n")
                .find("[algorithm] elastic: only with name = \"diloco\""),
            std::string::npos);
  EXPECT_NE(refused("elastic_type", "[algorithm]\nname = \"diloco\"\nelastic = 3\n").find("elastic"),
            std::string::npos);
}

}  // namespace
}  // namespace testing
}  // namespace shoal
