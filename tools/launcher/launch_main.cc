// shoal-launch (behind `./shoal run JOB.toml`): starts every server and worker of a job on
// this machine, shows one live progress line, stops everything when the job ends, when a
// process fails (saying which, why, and its last log lines) or on Ctrl-C, and prints the
// done JSON line last on stdout.
#include <gflags/gflags.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include <algorithm>

#include "algorithms/facts.h"
#include "algorithms/optimizers/optimizer.h"
#include "common/config.h"
#include "common/error.h"
#include "common/json_fields.h"
#include "common/metrics.h"
#include "tools/launcher/plot.h"
#include "tools/launcher/process_group.h"

DEFINE_string(bin_dir, "bazel-bin", "where shoal-server and shoal-worker were built");
DEFINE_bool(resume, false, "continue from the newest complete checkpoint");

namespace shoal {
namespace {

volatile sig_atomic_t g_stop_signal = 0;
void OnSignal(int sig) { g_stop_signal = sig; }

double UnixNow() {
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  return double(tv.tv_sec) + 1e-6 * double(tv.tv_usec);
}

// Follows metrics.jsonl as the job's processes append to it.
class MetricsFollower {
 public:
  // `from_end`: only lines appended from now on (a resumed job's file holds the earlier run).
  MetricsFollower(std::string path, bool from_end) : path_(std::move(path)) {
    std::ifstream in(path_, std::ios::binary | std::ios::ate);
    if (from_end && in) offset_ = in.tellg();
  }
  std::vector<std::string> NewLines() {
    std::vector<std::string> out;
    std::ifstream in(path_, std::ios::binary);
    if (!in) return out;
    in.seekg(offset_);
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // partial last line: read it next time
      offset_ += std::streamoff(line.size() + 1);
      out.push_back(line);
    }
    return out;
  }

 private:
  std::string path_;
  std::streamoff offset_ = 0;
};

struct Progress {
  double epoch = 0, step = 0, loss = NAN, acc = NAN, sps = 0, staleness = NAN;
  std::map<int, double> worker_sps;
  std::map<int, std::string> end_lines;
  PlotSeries loss_plot{"loss", {}}, acc_plot{"test accuracy", {}};
  double max_acc = NAN;
};

std::string Fmt(const char* f, double v) {
  if (std::isnan(v)) return "-";
  char b[64];
  snprintf(b, sizeof b, f, v);
  return b;
}

int Run(const std::string& job_path) {
  JobConfig cfg;
  try {
    cfg = LoadJobConfig(job_path);
  } catch (const Error& e) {
    fprintf(stderr, "shoal: %s\n", e.what());
    return 2;
  }
  AlgorithmFacts facts;
  try {
    facts = FactsOf(cfg.algorithm);
  } catch (const Error& e) {
    fprintf(stderr, "shoal: %s: [algorithm] name: %s\n", job_path.c_str(), e.what());
    return 2;
  }
  const bool servers = facts.needs_servers;
  try {  // the optimizer and schedule keys too: a typo must stop the job before it starts
    MakeOptimizer(cfg.optimizer, cfg.optimizer_opts);
    LrSchedule::FromConfig(cfg.optimizer_opts, cfg.batch_size * cfg.world_size(), 1, 1);
  } catch (const Error& e) {
    fprintf(stderr, "shoal: %s\n", e.what());
    return 2;
  }
  if (FLAGS_resume && !facts.keeps_checkpoints) {
    fprintf(stderr, "shoal: %s: --resume: algorithm \"%s\" keeps no checkpoints (the parameter-server algorithms do)\n",
            job_path.c_str(), cfg.algorithm.c_str());
    return 2;
  }
  if (FLAGS_resume && cfg.checkpoint_dir.empty()) {
    fprintf(stderr, "shoal: %s: --resume: [job] checkpoint_dir is not set, so there is nothing to resume from\n",
            job_path.c_str());
    return 2;
  }
  if (servers && cfg.servers.empty()) {
    fprintf(stderr, "shoal: %s: [cluster] servers: algorithm \"%s\" needs at least one server\n",
            job_path.c_str(), cfg.algorithm.c_str());
    return 2;
  }
  std::string metrics_path = cfg.output_dir + "/metrics.jsonl";
  std::string log_dir = cfg.output_dir + "/logs";
  MetricsWriter metrics;
  try {
    MakeDirs(log_dir);
    metrics.Open(metrics_path, /*append=*/FLAGS_resume);
  } catch (const Error& e) {
    fprintf(stderr, "shoal: %s\n", e.what());
    return 2;
  }
  MetricsFollower follow(metrics_path, /*from_end=*/FLAGS_resume);
  double start = UnixNow();
  setenv("SHOAL_JOB_START", std::to_string(start).c_str(), 1);
  // oneDNN's OpenMP threads otherwise spin while idle, and several processes of one job
  // share the cores: spinning collapses throughput (measured: resnet20 22-145 vs ~245
  // samples/s under load). A user's own setting wins.
  setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  // Keys this run's rendezvous so files of an earlier run are never read.
  setenv("SHOAL_RUN_ID", (std::to_string((long long)start) + "-" + std::to_string(getpid())).c_str(), 1);

  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGHUP, OnSignal);
  ProcessGroup group;
  std::vector<std::string> common_args = {"--config", job_path};
  if (FLAGS_resume) common_args.push_back("--resume");
  try {
    if (servers)
      for (size_t k = 0; k < cfg.servers.size(); ++k) {
        std::vector<std::string> a = {FLAGS_bin_dir + "/server/shoal-server"};
        a.insert(a.end(), common_args.begin(), common_args.end());
        a.insert(a.end(), {"--shard", std::to_string(k)});
        group.Start("server " + std::to_string(k), a, log_dir + "/server-" + std::to_string(k) + ".log");
      }
    for (int r = 0; r < cfg.world_size(); ++r) {
      std::vector<std::string> a = {FLAGS_bin_dir + "/worker/shoal-worker"};
      a.insert(a.end(), common_args.begin(), common_args.end());
      a.insert(a.end(), {"--rank", std::to_string(r)});
      group.Start("worker " + std::to_string(r), a, log_dir + "/worker-" + std::to_string(r) + ".log");
    }
  } catch (const Error& e) {
    fprintf(stderr, "shoal: %s\n", e.what());
    return 1;
  }
  fprintf(stderr, "shoal: job %s: %s, %d worker(s)%s; logs in %s\n", cfg.name.c_str(), cfg.algorithm.c_str(),
          cfg.world_size(), servers ? (", " + std::to_string(cfg.servers.size()) + " server(s)").c_str() : "",
          log_dir.c_str());

  Progress p;
  bool tty = isatty(2);
  int workers_done = 0, workers_failed = 0;
  double last_print = 0;
  // Workers that may die without ending the job (asynchronous algorithms).
  bool tolerant = cfg.algorithm_opts.GetBool("tolerate_worker_failure",
                                             facts.tolerated_deaths == ToleratedDeaths::kAnyButLast);
  int rc = 0;
  while (true) {
    if (g_stop_signal) {
      fprintf(stderr, "\nshoal: %s received, stopping every process\n", strsignal(g_stop_signal));
      group.StopAll();
      return 130;
    }
    for (auto& line : follow.NewLines()) {
      auto ev = JsonField(line, "event");
      if (!ev) continue;
      int rank = int(JsonNumber(line, "rank").value_or(0));
      if (*ev == "train") {
        p.epoch = JsonNumber(line, "epoch").value_or(p.epoch);
        p.step = std::max(p.step, JsonNumber(line, "step").value_or(0));
        p.loss = JsonNumber(line, "loss").value_or(p.loss);
        if (rank == 0) p.loss_plot.points.emplace_back(JsonNumber(line, "wall_s").value_or(0), p.loss);
        p.worker_sps[rank] = JsonNumber(line, "samples_per_s").value_or(0);
        p.staleness = JsonNumber(line, "staleness").value_or(p.staleness);
      } else if (*ev == "eval") {
        p.acc = JsonNumber(line, "test_accuracy").value_or(p.acc);
        if (rank == 0) p.acc_plot.points.emplace_back(JsonNumber(line, "wall_s").value_or(0), p.acc);
        if (!std::isnan(p.acc) && (std::isnan(p.max_acc) || p.acc > p.max_acc)) p.max_acc = p.acc;
        if (!tty) last_print = 0;  // print every evaluation when not on a terminal
      } else if (*ev == "end") {
        p.end_lines[rank] = line;
      }
    }
    std::vector<Child*> ended = group.Reap();
    std::vector<Child*> failed;
    for (Child* c : ended) {
      bool is_worker = c->name.rfind("worker", 0) == 0;
      if (is_worker && c->exit_code == 0) ++workers_done;
      else failed.push_back(c);
    }
    if (!failed.empty()) {
      bool fatal = false;
      for (Child* c : failed) {
        bool is_worker = c->name.rfind("worker", 0) == 0;
        fatal = fatal || !is_worker || !tolerant || workers_failed + 1 >= cfg.world_size();
        if (is_worker && !fatal) ++workers_failed;
      }
      if (fatal) {
        // One death brings down its peers: wait a moment so the report can name the
        // process that died first (killed by a signal) before those that followed it.
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        for (Child* c : group.Reap()) if (!(c->name.rfind("worker", 0) == 0 && c->exit_code == 0)) failed.push_back(c);
        std::stable_sort(failed.begin(), failed.end(), [](Child* a, Child* b) { return a->term_signal && !b->term_signal; });
      }
      fprintf(stderr, "\n");
      for (Child* c : failed) {
        fprintf(stderr, "shoal: %s stopped: %s; last lines of %s:\n%s", c->name.c_str(), DescribeExit(*c).c_str(),
                c->log_path.c_str(), TailLines(c->log_path, 8).c_str());
        metrics.Write("process_failed", int64_t(p.step), JsonObject().Add("process", c->name).Add("why", DescribeExit(*c)));
      }
      if (fatal) {
        group.StopAll();
        return 1;
      }
      fprintf(stderr, "shoal: the job goes on without them (asynchronous algorithm)\n");
    }
    if (workers_done + workers_failed == cfg.world_size()) break;
    double now = UnixNow();
    if (now - last_print > (tty ? 0.5 : 15.0)) {
      double sps = 0;
      for (auto& [r, s] : p.worker_sps) sps += s;
      std::string line = "epoch " + Fmt("%.0f", p.epoch) + " step " + Fmt("%.0f", p.step) + " loss " + Fmt("%.4f", p.loss) +
                         " test_acc " + Fmt("%.4f", p.acc) + " samples/s " + Fmt("%.0f", sps) +
                         (std::isnan(p.staleness) ? "" : " staleness " + Fmt("%.1f", p.staleness)) +
                         " [" + Fmt("%.0f", now - start) + " s]";
      if (tty) fprintf(stderr, "\r\033[K%s", line.c_str());
      else fprintf(stderr, "%s\n", line.c_str());
      last_print = now;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (tty) fprintf(stderr, "\n");
  group.StopAll();

  // The done line: accuracy from rank 0's end record, totals over workers.
  double acc = NAN, steps = 0, sps = 0, bytes = 0;
  for (auto& [r, line] : p.end_lines) {
    if (r == 0 || std::isnan(acc)) acc = JsonNumber(line, "test_accuracy").value_or(NAN);
    steps = std::max(steps, JsonNumber(line, "steps").value_or(0));
    sps += JsonNumber(line, "samples_per_s").value_or(0);
    bytes += JsonNumber(line, "bytes_sent").value_or(0);
  }
  double wall = UnixNow() - start;
  JsonObject fields;
  fields.Add("job", cfg.name).Add("algorithm", cfg.algorithm).Add("test_accuracy", acc).Add("steps", int64_t(steps));
  fields.Add("wall_s", wall).Add("samples_per_s", sps).Add("bytes_sent", int64_t(bytes)).Add("workers", cfg.world_size());
  if (workers_failed) fields.Add("workers_failed", workers_failed);
  metrics.Write("done", int64_t(steps), fields);
  try {
    WritePlotPng(cfg.output_dir + "/plot.png", {p.loss_plot, p.acc_plot});
  } catch (const Error& e) {
    fprintf(stderr, "shoal: %s\n", e.what());
  }
  JsonObject done;
  done.Add("event", "done");
  std::string body = fields.str();
  std::string out = done.str();
  out = out.substr(0, out.size() - 1) + "," + body.substr(1);
  printf("%s\n", out.c_str());
  fflush(stdout);
  return rc;
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) {
  gflags::SetUsageMessage("shoal-launch JOB.toml [--resume]: run a whole job on this machine");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc != 2) {
    fprintf(stderr, "usage: shoal run JOB.toml [--resume]\n");
    return 2;
  }
  return shoal::Run(argv[1]);
}
