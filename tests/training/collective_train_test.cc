// Whole jobs through the launcher: each collective/decentralized algorithm trains on real
// Fashion-MNIST with 4 worker processes and reaches its accuracy target; synchronous
// algorithms end with bit-identical weights on every worker; a worker killed mid-job makes
// the job fail fast with a clear report.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <zmq.h>

#include "algorithms/compressors/block_quant.h"
#include "common/json_fields.h"
#include "tests/ps/ps_test_util.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

const char* kMomentum = "[optimizer]\nname = \"momentum\"\nlr = 0.05\nmomentum = 0.9\nweight_decay = 1e-4\n\n";
const char* kAdamW = "[optimizer]\nname = \"adamw\"\nlr = 1e-3\nwarmup_steps = 10\nschedule = \"cosine\"\n\n";

struct Outcome {
  double accuracy = -1;
  std::set<std::string> hashes;
  JobRun run;
};

Outcome Train(const std::string& name, int workers, const std::string& model, int64_t samples, int epochs,
              const std::string& algorithm_section, const std::string& optimizer = kMomentum) {
  std::string dir = FreshDir(name);
  Outcome o;
  o.run =
      RunJob(dir, FmnistJob(name, dir + "/out", workers, model, samples, epochs, algorithm_section + optimizer), 600);
  EXPECT_EQ(o.run.exit_code, 0) << o.run.stderr_text;
  EXPECT_EQ(JsonField(o.run.done_line, "event").value_or(""), "done") << o.run.done_line;
  o.accuracy = JsonNumber(o.run.done_line, "test_accuracy").value_or(-1);
  auto ends = Events(o.run, "end");
  EXPECT_EQ(int(ends.size()), workers);
  for (auto& e : ends) o.hashes.insert(JsonField(e, "weights_hash").value_or("?"));
  return o;
}

TEST(CollectiveTraining, AllReduceReachesTargetWithIdenticalWeights) {
  Outcome o = Train("allreduce", 4, "mlp", 12000, 2, "[algorithm]\nname = \"allreduce\"\n\n");
  EXPECT_GE(o.accuracy, 0.80) << o.run.done_line;
  EXPECT_EQ(o.hashes.size(), 1u) << "weights differ across workers";
  EXPECT_GT(JsonNumber(o.run.done_line, "bytes_sent").value_or(0), 0);
}

// SmoothOut: every worker perturbs with the same noise (seed, step, parameter), so the
// weights stay identical; the job still learns.
TEST(CollectiveTraining, SmoothOutKeepsWeightsIdenticalAndLearns) {
  Outcome o = Train("allreduce_smoothout", 2, "mlp", 6000, 1, "[algorithm]\nname = \"allreduce\"\n\n",
                    "[optimizer]\nname = \"momentum\"\nlr = 0.05\nmomentum = 0.9\nsmoothout = 0.005\n\n");
  EXPECT_GE(o.accuracy, 0.70) << o.run.done_line;
  EXPECT_EQ(o.hashes.size(), 1u) << "weights differ across workers";
}

TEST(CollectiveTraining, AllReduceFp16WireKeepsWeightsIdentical) {
  Outcome o =
      Train("allreduce_fp16", 3, "mlp", 6000, 1, "[algorithm]\nname = \"allreduce\"\nwire_dtype = \"fp16\"\n\n");
  EXPECT_GE(o.accuracy, 0.70) << o.run.done_line;
  EXPECT_EQ(o.hashes.size(), 1u);
}

TEST(CollectiveTraining, TorusAndHierarchicalAllReduce) {
  Outcome t = Train("torus", 4, "mlp", 6000, 1, "[algorithm]\nname = \"allreduce\"\ncollective = \"torus2d\"\n\n");
  EXPECT_GE(t.accuracy, 0.75) << t.run.done_line;
  EXPECT_EQ(t.hashes.size(), 1u);
  // Two "hosts" (127.0.0.1 and 127.0.0.2, both loopback): rows are hosts.
  std::string dir = FreshDir("hier");
  std::string job =
      FmnistJob("hier", dir + "/out", 4, "mlp", 6000, 1,
                std::string("[algorithm]\nname = \"allreduce\"\ncollective = \"hierarchical\"\n\n") + kMomentum);
  job.replace(
      job.find("workers = 4"), 11,
      "workers = [{host = \"127.0.0.1\"}, {host = \"127.0.0.1\"}, {host = \"127.0.0.2\"}, {host = \"127.0.0.2\"}]");
  JobRun r = RunJob(dir, job, 300);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_GE(JsonNumber(r.done_line, "test_accuracy").value_or(0), 0.75) << r.done_line;
  std::set<std::string> hashes;
  for (auto& e : Events(r, "end")) hashes.insert(JsonField(e, "weights_hash").value_or("?"));
  EXPECT_EQ(hashes.size(), 1u);
}

// With [security] keys every link of the job is CurveZMQ: ring and gossip too.
TEST(CollectiveTraining, EncryptedGossipAndRingTrain) {
  char spub[41], ssec[41], cpub[41], csec[41];
  ASSERT_EQ(zmq_curve_keypair(spub, ssec), 0);
  ASSERT_EQ(zmq_curve_keypair(cpub, csec), 0);
  std::string keys = std::string("[security]\nserver_public_key = \"") + spub + "\"\nserver_secret_key = \"" + ssec +
                     "\"\nclient_public_key = \"" + cpub + "\"\nclient_secret_key = \"" + csec + "\"\n\n";
  Outcome o = Train("curve_adpsgd", 4, "mlp", 6000, 1, "[algorithm]\nname = \"adpsgd\"\n\n" + keys);
  EXPECT_GE(o.accuracy, 0.70) << o.run.done_line;
  EXPECT_EQ(o.hashes.size(), 1u);
}

// "auto" measures, then picks the least estimated time to target (seconds per step x its
// factor): an uneven worker -> balanced allreduce, or adpsgd where its factor makes it
// cheaper (and when balancing is off; on equal workers too); slow links -> dgc; an exchange that dwarfs compute ->
// diloco; the auto event carries the figures it weighed.
TEST(CollectiveTraining, AutoPicksFromWhatItMeasures) {
  auto decide = [](const std::string& name, const std::string& workers, const std::string& keys = "",
                   const std::string& train = "") {
    std::string dir = FreshDir(name);
    std::string job =
        FmnistJob(name, dir + "/out", 4, "mlp", 6000, 1, "[algorithm]\nname = \"auto\"\n" + keys + "\n" + kMomentum);
    job.replace(job.find("workers = 4"), 11, "workers = " + workers);
    job.replace(job.find("log_every_steps = 20"), 20, "log_every_steps = 20\n" + train);
    JobRun r = RunJob(dir, job, 300);
    EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
    EXPECT_GE(JsonNumber(r.done_line, "test_accuracy").value_or(0), 0.70) << r.done_line;
    std::set<std::string> picks;
    auto events = Events(r, "auto");
    for (auto& e : events)
      picks.insert(JsonField(e, "choice").value_or("?") + (JsonField(e, "balance") == "true" ? "+balance" : ""));
    EXPECT_EQ(picks.size(), 1u) << "every worker must decide the same";
    // Why it chose: the figures it weighed, as plain fields.
    for (const char* k :
         {"compute_min_s", "compute_max_s", "compute_balanced_s", "exchange_s", "slowest_share", "est_allreduce_s",
          "est_balanced_allreduce_s", "est_bmuf_s", "est_adpsgd_s", "est_diloco_s", "est_dgc_s", "eval_split_s",
          "eval_whole_s", "bmuf_factor", "adpsgd_factor", "dgc_factor", "cpu_quota_workers"})
      EXPECT_TRUE(!events.empty() && JsonNumber(events[0], k).has_value()) << k;
    if (!events.empty()) printf("%s: %s\n", name.c_str(), events[0].c_str());  // what it weighed, in the test log
    return picks.empty() ? std::string("none") : *picks.begin();
  };
  // The mlp's exchange is about its balanced compute, so bmuf_ratio is set out of reach
  // (else balanced bmuf is as right a choice). adpsgd's per-step estimate (harmonic-mean
  // compute + half the exchange) is below balanced allreduce's (+ the whole exchange), so its
  // factor decides between them, named here both ways; without balancing: adpsgd.
  EXPECT_EQ(decide("auto_uneven", "[{slowdown = 4.0}, {}, {}, {}]", "bmuf_ratio = 1000.0\nadpsgd_factor = 2.0\n"),
            "allreduce+balance");
  EXPECT_EQ(
      decide("auto_uneven_adpsgd", "[{slowdown = 4.0}, {}, {}, {}]", "bmuf_ratio = 1000.0\nadpsgd_factor = 0.8\n"),
      "adpsgd");
  EXPECT_EQ(decide("auto_uneven_unbalanced", "[{slowdown = 4.0}, {}, {}, {}]", "balance = false\n"), "adpsgd");
  // The same job evaluating every 2 steps: adpsgd's workers each score the whole test set and
  // wait for the slowest (about 35 ms a step here), allreduce's split it (a quarter of that),
  // and allreduce wins by more than 2x.
  EXPECT_EQ(
      decide("auto_evaluating_often", "[{slowdown = 4.0}, {}, {}, {}]", "balance = false\n", "eval_every_steps = 2\n"),
      "allreduce");
  // Equal workers weigh adpsgd too: at a factor that makes it the cheaper, it is chosen.
  EXPECT_EQ(decide("auto_equal_adpsgd", "4", "bmuf_ratio = 1000.0\nadpsgd_factor = 0.5\n"), "adpsgd");
  // At 80 Mbit/s the mlp's exchange costs about 200x its compute here (0.14 s against 0.7 ms):
  // over diloco_ratio when that is set to 3; set out of reach, dgc's estimate (three times the
  // slowest compute, its bytes 1/250 of the exchange, x dgc_factor) beats allreduce's and
  // adpsgd's. bmuf is set out of reach: its block of 8 steps makes it the cheaper where one
  // worker's compute reads slow, and dgc is not balanced.
  const std::string slow =
      "[{bandwidth_mbps = 80}, {bandwidth_mbps = 80}, {bandwidth_mbps = 80}, {bandwidth_mbps = 80}]";
  // These weigh the link ratios over the whole probe (probe_settle_steps = 20): a probe settled on
  // its first few steps reads their compute, which a loaded machine (tests in parallel) inflates.
  // The ratios are low (diloco 3, dgc 1) for a margin on loaded machines: the probe's compute once counted
  // its own agreement's wait for the last all-reduce to end, and read 10-25 ms against 0.6 ms on CI.
  EXPECT_EQ(decide("auto_slow_links", slow,
                   "diloco_ratio = 1e6\nbmuf_ratio = 1e6\ndgc_ratio = 1.0\nprobe_settle_steps = 20\n"),
            "dgc");
  EXPECT_EQ(decide("auto_slow_links_diloco", slow, "diloco_ratio = 3.0\nsync_every = 10\nprobe_settle_steps = 20\n"),
            "diloco");
}

// auto hands the backward pass's gradients to the algorithm it chose when that one overlaps:
// with the ratios out of reach and adpsgd's factor at its most it picks allreduce, whose
// buckets then leave during the backward pass (train events count them), with the same bits
// as auto without overlap.
TEST(CollectiveTraining, AutoOverlapsTheAllReduceItChose) {
  auto run = [](const std::string& name, bool overlap) {
    const std::string section = std::string("[algorithm]\nname = \"auto\"\nprobe_steps = 5\nbucket_bytes = 65536\n") +
                                "uneven_ratio = 1e6\nbmuf_ratio = 1e6\ndgc_ratio = 1e6\ndiloco_ratio = 1e6\n"
                                "adpsgd_factor = 100.0\n" +
                                (overlap ? "overlap = true\n" : "") + "\n";
    return Train(name, 3, "mlp", 3000, 1, section);
  };
  Outcome plain = run("auto_no_overlap", false), overlapped = run("auto_overlap", true);
  ASSERT_EQ(plain.hashes.size(), 1u);
  EXPECT_EQ(overlapped.hashes, plain.hashes) << "overlap changed the weights";
  for (auto& e : Events(overlapped.run, "auto")) EXPECT_EQ(JsonField(e, "choice").value_or(""), "allreduce") << e;
  int64_t early = 0, late_records = 0;
  for (auto& e : Events(overlapped.run, "train"))
    if (JsonNumber(e, "step").value_or(0) > 5) {
      ++late_records;
      early += int64_t(JsonNumber(e, "overlapped_buckets").value_or(0));
    }
  EXPECT_GT(late_records, 0);
  EXPECT_GT(early, 0) << "no bucket left during the backward pass";
  for (auto& e : Events(plain.run, "train")) EXPECT_EQ(JsonNumber(e, "overlapped_buckets").value_or(0), 0) << e;
}

// [algorithm] balance = true with one slowed worker: its batch shrinks, the others' grow,
// every step still uses the global batch of 4 x 32, and the job reaches its target with
// identical weights everywhere. (Asserts on the batch sizes in metrics, not on timings.)
void ExpectBalancedRunShrinksTheSlowWorkersBatch(const std::string& name, const std::string& sections,
                                                 int64_t samples = 6000, int epochs = 2) {
  std::string dir = FreshDir(name);
  std::string job = FmnistJob(name, dir + "/out", 4, "mlp", samples, epochs, sections);
  job.replace(job.find("workers = 4"), 11, "workers = [{}, {}, {slowdown = 3.0}, {}]");
  JobRun r = RunJob(dir, job, 300);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_GE(JsonNumber(r.done_line, "test_accuracy").value_or(0), 0.78) << r.done_line;
  std::set<std::string> hashes;
  for (auto& e : Events(r, "end")) hashes.insert(JsonField(e, "weights_hash").value_or("?"));
  EXPECT_EQ(hashes.size(), 1u);
  // step -> rank -> batch_size, from every worker's train records.
  std::map<int64_t, std::map<int, int64_t>> batch;
  for (auto& e : Events(r, "train"))
    batch[int64_t(JsonNumber(e, "step").value_or(-1))][int(JsonNumber(e, "rank").value_or(-1))] =
        int64_t(JsonNumber(e, "batch_size").value_or(-1));
  ASSERT_GE(batch.size(), 3u);
  for (auto& [step, by_rank] : batch) {
    ASSERT_EQ(by_rank.size(), 4u) << "step " << step;
    int64_t sum = 0;
    for (auto& [rank, n] : by_rank) sum += n;
    EXPECT_EQ(sum, 128) << "step " << step << ": the global batch changed";
  }
  // From the second record on (the first rebalances come at steps 5, 10, ...), the slowed
  // worker takes less than its equal share and less than every other worker.
  for (auto it = std::next(batch.begin()); it != batch.end(); ++it) {
    const auto& b = it->second;
    EXPECT_LT(b.at(2), 32) << "step " << it->first;
    for (int r : {0, 1, 3}) EXPECT_LT(b.at(2), b.at(r)) << "step " << it->first << " rank " << r;
  }
  EXPECT_GE(Events(r, "balance").size(), 2u);
}

TEST(CollectiveTraining, BalancedAllReduceShrinksTheSlowWorkersBatch) {
  ExpectBalancedRunShrinksTheSlowWorkersBatch(
      "balanced", std::string("[algorithm]\nname = \"allreduce\"\nbalance = true\n\n") + kMomentum);
}

// diloco's inner steps on balanced batches: the slow worker processes fewer samples in a
// round, and its pseudo-gradient counts by them. (Twice the data: 9 outer steps left diloco
// at 0.69.)
TEST(CollectiveTraining, BalancedDilocoShrinksTheSlowWorkersBatch) {
  // Three epochs: the batch split follows measured throughput, so what two epochs reach moves with the
  // machine's load (once 0.7715 beside other tests).
  ExpectBalancedRunShrinksTheSlowWorkersBatch(
      "balanced_diloco", std::string("[algorithm]\nname = \"diloco\"\nsync_every = 10\nbalance = true\n\n") + kAdamW,
      12000, 3);
}

TEST(CollectiveTraining, DoubleBufferReachesTarget) {
  // A 1-step-stale gradient lowers the stable learning rate under momentum 0.9.
  Outcome o = Train("double_buffer", 4, "mlp", 12000, 3, "[algorithm]\nname = \"double_buffer\"\n\n",
                    "[optimizer]\nname = \"momentum\"\nlr = 0.01\nmomentum = 0.9\n\n");
  EXPECT_GE(o.accuracy, 0.80) << o.run.done_line;
  EXPECT_EQ(o.hashes.size(), 1u);
}

TEST(CollectiveTraining, BmufReachesTarget) {
  Outcome o = Train("bmuf", 4, "mlp", 12000, 2,
                    "[algorithm]\nname = \"bmuf\"\nblock_steps = 4\nblock_momentum = 0.5\nblock_lr = 1.0\n\n");
  EXPECT_GE(o.accuracy, 0.78) << o.run.done_line;
  EXPECT_EQ(o.hashes.size(), 1u) << "the final block sync leaves one model";
}

// mlp's parameters, and what one dense fp32 ring all-reduce of them sends per worker on 4.
constexpr int64_t kMlpParams = 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10;
constexpr double kDenseRingBytes = 2.0 * 3 / 4 * 4 * double(kMlpParams);

// DiLoCo with its usual inner optimizer (AdamW local steps) on 4 workers, outer steps every 10
// steps plus `keys`: it reaches 0.78 and ends on one model; returns the bytes one worker sent
// per outer step.
double TrainDiloco(const std::string& name, const std::string& keys) {
  Outcome o =
      Train(name, 4, "mlp", 12000, 2, "[algorithm]\nname = \"diloco\"\nsync_every = 10\n" + keys + "\n", kAdamW);
  EXPECT_GE(o.accuracy, 0.78) << o.run.done_line;
  EXPECT_EQ(o.hashes.size(), 1u) << "the workers ended on different models";
  const double bytes = JsonNumber(o.run.done_line, "bytes_per_outer_step").value_or(0);
  printf("%s: accuracy %.4f, %.0f bytes per outer step per worker (%.2fx fewer than fp32's %.0f)\n", name.c_str(),
         o.accuracy, bytes, kDenseRingBytes / bytes, kDenseRingBytes);
  return bytes;
}

TEST(CollectiveTraining, DilocoReachesTarget) {
  const double bytes = TrainDiloco("diloco", "outer_lr = 0.7\nouter_momentum = 0.9\n");
  EXPECT_GE(bytes, kDenseRingBytes);
  EXPECT_LE(bytes, kDenseRingBytes + 6 * 16);
}

// int8 and int4 pseudo-gradients: every worker applies the same decoded values (one model at
// the end), training still reaches the target, and each worker sends what the ring's quantized
// all-reduce costs: 2 (W - 1) encodings of a quarter of mlp's 269,322 parameters (chunks of
// 67,330 or 67,331) with a 16-byte header each.
TEST(CollectiveTraining, DilocoQuantizedPseudoGradientsKeepOneModel) {
  for (const char* wire : {"int8", "int4"}) {
    SCOPED_TRACE(wire);
    const double bytes = TrainDiloco(std::string("diloco_") + wire, std::string("outer_wire = \"") + wire + "\"\n");
    const BlockQuant q = std::string(wire) == "int8" ? BlockQuant::kInt8 : BlockQuant::kInt4;
    EXPECT_GE(bytes, 6.0 * double(QuantizedBytes(q, kMlpParams / 4)));
    EXPECT_LE(bytes, 6.0 * double(QuantizedBytes(q, kMlpParams / 4 + 1) + 16));
  }
}

// Streaming DiLoCo in 2 fragments: each exchange carries half the model (half a dense fp32
// ring all-reduce's bytes), overlapped with the next inner step; one model at the end.
TEST(CollectiveTraining, StreamingDilocoExchangesHalfTheModelAtATime) {
  const double bytes = TrainDiloco("diloco_streaming", "streaming = 2\noverlap_steps = 1\n");
  EXPECT_GE(bytes, 0.5 * kDenseRingBytes);
  EXPECT_LE(bytes, 0.5 * kDenseRingBytes + 6 * 16);
}

TEST(CollectiveTraining, AdpsgdReachesTargetAndReportsConsensus) {
  Outcome o = Train("adpsgd", 4, "mlp", 12000, 2, "[algorithm]\nname = \"adpsgd\"\n\n");
  EXPECT_GE(o.accuracy, 0.78) << o.run.done_line;
  EXPECT_EQ(o.hashes.size(), 1u) << "the final average leaves one model";
  bool saw_consensus = false;
  for (auto& l : Events(o.run, "train")) saw_consensus |= JsonNumber(l, "consensus_distance").value_or(0) > 0;
  EXPECT_TRUE(saw_consensus);
}

TEST(CollectiveTraining, DgcReachesTargetSendingFarLess) {
  Outcome dense = Train("dgc_dense", 4, "mlp", 12000, 2, "[algorithm]\nname = \"allreduce\"\n\n");
  Outcome o =
      Train("dgc", 4, "mlp", 12000, 2, "[algorithm]\nname = \"dgc\"\nsparsity = 0.99\nsparsity_warmup_epochs = 0\n\n");
  EXPECT_GE(o.accuracy, 0.78) << o.run.done_line;
  EXPECT_EQ(o.hashes.size(), 1u);
  double b = JsonNumber(o.run.done_line, "bytes_sent").value_or(0),
         bd = JsonNumber(dense.run.done_line, "bytes_sent").value_or(0);
  EXPECT_GT(b, 0);
  EXPECT_LT(b * 5, bd) << "dgc " << b << " bytes vs dense " << bd;
}

// An all-reduce job from one mpirun, no shared directory: rank 0 serves the coordinator
// at the job's [cluster] coordinator, the others meet it there, and all end bit-identical.
TEST(CollectiveTraining, AllreduceStartedByOneMpirunMeetsAtTheCoordinator) {
  if (system("command -v mpirun > /dev/null") != 0) GTEST_SKIP() << "mpirun not installed (openmpi-bin)";
  std::string dir = FreshDir("mpirun-ar");
  std::string job = dir + "/job.toml";
  std::string toml =
      FmnistJob("mpirun-ar", dir + "/out", 2, "mlp", 4000, 1, "[algorithm]\nname = \"allreduce\"\n\n") + kMomentum;
  toml.replace(toml.find("[cluster]\n"), 10,
               "[cluster]\ncoordinator = \"127.0.0.1:" + std::to_string(FreePort()) + "\"\n");
  std::ofstream(job) << toml;
  std::string cmd = "timeout -s KILL 240 mpirun --allow-run-as-root --oversubscribe -np 2 " + BinDir() +
                    "/tools/launcher/shoal-task --config " + job + " > " + dir + "/mpi.log 2>&1";
  int rc = system(cmd.c_str());
  std::ifstream log(dir + "/mpi.log");
  std::string all((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << all;
  std::ifstream m(dir + "/out/metrics.jsonl");
  std::set<std::string> hashes;
  std::string l;
  while (std::getline(m, l))
    if (JsonField(l, "event").value_or("") == "end") hashes.insert(JsonField(l, "weights_hash").value_or(""));
  EXPECT_EQ(hashes.size(), 1u) << "the ranks ended with different weights (or none ended)";
  EXPECT_EQ(all.find("rendezvous"), std::string::npos) << all;
}

// A worker that stops answering (SIGSTOP: its sockets stay open, so no ring notices) is
// named by the coordinator within the heartbeat timeout, and the job ends with that name.
TEST(CollectiveTraining, AStoppedWorkerIsNamedWithinTheHeartbeatTimeout) {
  std::string dir = FreshDir("stop");
  std::string toml = FmnistJob("stop", dir + "/out", 3, "mlp", 60000, 5,
                               "[algorithm]\nname = \"allreduce\"\ncollective_timeout_ms = 600000\n\n") +
                     kMomentum;
  toml.replace(toml.find("[cluster]\n"), 10, "[cluster]\nheartbeat_ms = 100\nheartbeat_timeout_ms = 2000\n");
  std::thread stopper([&] { KillWhenTraining(dir, "--rank 2", 3, "STOP"); });
  auto t0 = std::chrono::steady_clock::now();
  JobRun r = RunJob(dir, toml, 300);
  stopper.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.stderr_text.find("worker 2 (127.0.0.1) stopped answering"), std::string::npos) << r.stderr_text;
  EXPECT_LT(secs, 120);
  std::string check = "pgrep -f -- '--confi[g] " + dir + "/job.toml' > /dev/null";
  EXPECT_NE(system(check.c_str()), 0) << "a process of the job outlived it";
}

// Workers started by hand (no launcher, so every run has run id "0") twice in a row with one
// rendezvous_dir: the second run's rank 1 starts first, while the first run's ring
// endpoints are still in the directory, and must meet this run's rank 0, not that one's.
TEST(CollectiveTraining, HandStartedRunsInOneRendezvousDirMeetTheirOwnRun) {
  std::string dir = FreshDir("handruns");
  std::string job = dir + "/job.toml";
  std::ofstream(job) << FmnistJob("handruns", dir + "/out", 2, "mlp", 2000, 1,
                                  "[algorithm]\nname = \"allreduce\"\ncollective_timeout_ms = 10000\n"
                                  "rendezvous_dir = \"" +
                                      dir + "/rdv\"\n\n") +
                            kMomentum;
  std::string w = "env -u SHOAL_RUN_ID timeout -s KILL 60 " + BinDir() + "/worker/shoal-worker --config " + job;
  for (int run = 0; run < 2; ++run) {
    std::string log = dir + "/run" + std::to_string(run);
    std::string cmd = "bash -c '" + w + " --rank 1 > " + log + "-1.log 2>&1 & p=$!; sleep " + (run ? "1" : "0") + "; " +
                      w + " --rank 0 > " + log + "-0.log 2>&1; a=$?; wait $p; b=$?; exit $((a | b))'";
    int rc = system(cmd.c_str());
    EXPECT_EQ(rc, 0) << "run " << run << ":\n" << ReadFile(log + "-0.log") << "\n" << ReadFile(log + "-1.log");
  }
}

// Worker hosts given by name (here "localhost", elsewhere "node3") were bound as given:
// ZeroMQ binds only addresses, so the ring and adpsgd's gossip failed with "cannot listen on
// tcp://localhost:*: No such device". They bind as the shards do and publish the name.
TEST(CollectiveTraining, WorkerHostsGivenByNameWire) {
  for (const char* algorithm : {"allreduce", "adpsgd"}) {
    SCOPED_TRACE(algorithm);
    std::string dir = FreshDir(std::string("named_") + algorithm);
    std::string job = FmnistJob("named", dir + "/out", 2, "mlp", 256, 1,
                                std::string("[algorithm]\nname = \"") + algorithm + "\"\n\n" + kMomentum);
    const std::string count = "workers = 2\n";
    job.replace(job.find(count), count.size(), "workers = [{host = \"localhost\"}, {host = \"localhost\"}]\n");
    JobRun r = RunJob(dir, job, 120);
    EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
    EXPECT_EQ(JsonField(r.done_line, "event").value_or(""), "done") << r.done_line;
  }
}

TEST(CollectiveTraining, BadJobFileStartsNothing) {
  std::string dir = FreshDir("bad");
  JobRun r = RunJob(dir,
                    FmnistJob("bad", dir + "/out", 2, "mlp", 1000, 1, "[algorithm]\nname = \"allreduce\"\n") +
                        "[optimizer]\nname = \"adamax\"\n",
                    60);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.stderr_text.find("unknown optimizer \"adamax\""), std::string::npos) << r.stderr_text;
  std::string dir2 = FreshDir("bad2");
  JobRun r2 = RunJob(dir2, "[job]\nname = \"x\"\n[data]\ntrain = \"a\"\ntest = \"b\"\nbatch_size = -3\n", 60);
  EXPECT_EQ(r2.exit_code, 2);
  EXPECT_NE(r2.stderr_text.find("[data] batch_size: expected an integer"), std::string::npos) << r2.stderr_text;
}

TEST(CollectiveTraining, KilledWorkerFailsTheJobFastWithAReport) {
  std::string dir = FreshDir("kill");
  std::string toml =
      FmnistJob("kill", dir + "/out", 3, "mlp", 60000, 5, "[algorithm]\nname = \"allreduce\"\n\n") + kMomentum;
  std::thread killer([&] { KillWhenTraining(dir, "--rank 1", 3); });
  auto t0 = std::chrono::steady_clock::now();
  JobRun r = RunJob(dir, toml, 300);
  killer.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.stderr_text.find("worker 1 stopped: killed by signal"), std::string::npos) << r.stderr_text;
  EXPECT_LT(secs, 150);
  // No process of this job outlives it.
  std::string check = "pgrep -f -- '--confi[g] " + dir + "/job.toml' > /dev/null";
  EXPECT_NE(system(check.c_str()), 0);
}

}  // namespace
}  // namespace testing
}  // namespace shoal
