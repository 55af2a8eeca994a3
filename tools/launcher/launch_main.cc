// shoal-launch (behind `./shoal run JOB.toml`): starts every server and worker of a job on
// this machine, shows one live progress line (and one line per evaluation), names the
// stragglers, serves the live status page, stops everything when the job ends, when a
// process fails (saying which, why, and its last log lines) or on Ctrl-C, and prints the
// done JSON line last on stdout. With [job] max_restarts, a failed job starts again from
// its newest complete checkpoint (or from the start when it has none yet).
#include <gflags/gflags.h>
#include <signal.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <thread>

#include <algorithm>

#include "algorithms/facts.h"
#include "algorithms/optimizers/optimizer.h"
#include "algorithms/job_keys.h"
#include "common/checkpoint/checkpoint_store.h"
#include "common/config.h"
#include "common/error.h"
#include "common/json_fields.h"
#include "common/metrics.h"
#include "common/rendezvous/rendezvous.h"
#include "common/transport/transport.h"
#include "tools/launcher/cpu_quota.h"
#include "tools/launcher/plot.h"
#include "tools/launcher/process_group.h"
#include "tools/launcher/status_page.h"
#include "tools/launcher/status_server.h"
#include "tools/launcher/status_tracker.h"

DEFINE_string(bin_dir, "bazel-bin", "where shoal-server and shoal-worker were built");
DEFINE_bool(resume, false, "continue from the newest complete checkpoint");
DEFINE_bool(fresh, false, "start over: delete the checkpoints an earlier run left in [job] checkpoint_dir");
DEFINE_bool(serve_coordinator, false,
            "start nothing: serve the job's coordinator (rendezvous store and worker membership) until every worker "
            "has left or died; for a job without servers whose worker 0 may be lost (diloco with elastic = true), "
            "which `shoal run` and `shoal task` start this way");
DEFINE_string(coordinator, "", "with --serve_coordinator: host:port to serve at (default: the job's coordinator)");
DEFINE_bool(checkpoint_state, false,
            "start nothing: print what the job's checkpoint folders hold, as seen from this machine, in one line: "
            "'complete ID STEP', 'none' (every folder is here and none holds a complete checkpoint), 'unknown: WHY' "
            "(a folder is not here) or 'off' (no [job] checkpoint_dir); for scripts such as a requeued sbatch job");

namespace shoal {
namespace {

volatile sig_atomic_t g_stop_signal = 0;
void OnSignal(int sig) { g_stop_signal = sig; }

// A TCP port free on `host` right now (the kernel's pick), for a coordinator this launcher
// places; 0 when none can be had.
int FreePort(const std::string& host) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  if (inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &a.sin_addr) != 1 ||
      bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return 0;
  }
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// This binary (it serves an elastic job's coordinator as a child of its own).
std::string SelfPath() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("cannot read /proc/self/exe to start the coordinator");
  return std::string(buf, size_t(n));
}

// `name` in bin_dir: bazel-bin keeps it under `sub`/, an unpacked bundle flat in bin/.
std::string BinaryPath(const std::string& sub, const std::string& name) {
  std::string nested = FLAGS_bin_dir + "/" + sub + "/" + name;
  return access(nested.c_str(), X_OK) == 0 ? nested : FLAGS_bin_dir + "/" + name;
}

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

// "worker 3" -> 3; -1 for anything else.
int WorkerRank(const std::string& name) {
  if (name.rfind("worker ", 0) != 0) return -1;
  return atoi(name.c_str() + 7);
}

// One `shoal run`, in the order Run() calls the phases. A phase that fails prints its one
// line and returns the exit code; 0 means go on.
class Launch {
 public:
  explicit Launch(std::string job_path) : job_path_(std::move(job_path)) {}

  // The job file, the algorithm's facts, the optimizer keys and the --resume preconditions:
  // every mistake stops the job before anything starts.
  int Check() {
    try {
      cfg_ = LoadJobConfig(job_path_);
    } catch (const Error& e) {
      fprintf(stderr, "shoal: %s\n", e.what());
      return 2;
    }
    try {
      facts_ = FactsOf(cfg_.algorithm);
    } catch (const Error& e) {
      fprintf(stderr, "shoal: %s: [algorithm] name: %s\n", job_path_.c_str(), e.what());
      return 2;
    }
    try {
      CheckJobKeys(cfg_);
      elastic_ = SurvivesLostWorkers(cfg_);
      MakeOptimizer(cfg_.optimizer, cfg_.optimizer_opts);
      LrSchedule::FromConfig(cfg_.optimizer_opts, cfg_.batch_size * cfg_.world_size(), 1, 1);
    } catch (const Error& e) {
      fprintf(stderr, "shoal: %s\n", e.what());
      return 2;
    }
    if (FLAGS_resume && FLAGS_fresh) {
      fprintf(stderr, "shoal: --resume and --fresh contradict each other: continue the run, or start over\n");
      return 2;
    }
    if (FLAGS_resume && cfg_.checkpoint_dir.empty()) {
      fprintf(stderr, "shoal: %s: --resume: [job] checkpoint_dir is not set, so there is nothing to resume from\n",
              job_path_.c_str());
      return 2;
    }
    if (facts_.needs_servers && cfg_.servers.empty()) {
      fprintf(stderr, "shoal: %s: [cluster] servers: algorithm \"%s\" needs at least one server\n", job_path_.c_str(),
              cfg_.algorithm.c_str());
      return 2;
    }
    if (int rc = CheckDataPaths()) return rc;
    if (int rc = CheckResumable()) return rc;
    return CheckEarlierRun();
  }

  // --resume with nothing to resume from is refused here, once, before any process starts
  // (each would refuse alone). Resumable: a checkpoint some store holds and committed (a job
  // without servers resumes it on any number of workers; a PS job's coordinator commits on
  // shard 0), or, without servers, one every worker holds. Every store `shoal run` opens is
  // on this machine, so a missing folder is a store with nothing in it.
  int CheckResumable() {
    if (!FLAGS_resume) return 0;
    std::string held;
    bool resumable = false;
    std::vector<std::vector<CheckpointRecord>> records;  // what each store holds
    try {
      auto stores = CheckpointStores();
      for (size_t i = 0; i < stores.size(); ++i) {
        std::optional<HeldCheckpoints> h = CheckpointStore::Peek(stores[i].second);
        // Each shard restores its own store only: tensors never move between shards. (On
        // any number of workers it resumes: the servers map their step to the new batch.)
        if (facts_.needs_servers && i == 0 && h && h->committed.id > 0 && h->committed.shards != cfg_.servers.size()) {
          fprintf(stderr,
                  "shoal: %s: --resume: checkpoint %llu in %s was written by %u servers and this job has %zu "
                  "([cluster] servers): a parameter-server job resumes on as many servers as wrote its checkpoints; "
                  "list that many, or start over with --fresh; nothing was started\n",
                  job_path_.c_str(), (unsigned long long)h->committed.id, cfg_.checkpoint_dir.c_str(),
                  h->committed.shards, cfg_.servers.size());
          return 2;
        }
        std::vector<uint64_t> ids;
        records.push_back(h ? h->written : std::vector<CheckpointRecord>());
        for (auto& rec : records.back()) {
          ids.push_back(rec.id);
          if (rec.id <= h->committed.id && (!facts_.needs_servers || i == 0)) resumable = true;
        }
        held += (held.empty() ? "" : "; ") + stores[i].first + ": " + IdList(ids);
      }
      resumable = resumable || (!facts_.needs_servers && NewestCompleteOfWorkers(records).id > 0);
    } catch (const Error& e) {
      fprintf(stderr, "shoal: %s: [job] checkpoint_dir: %s\n", job_path_.c_str(), e.what());
      return 2;
    }
    if (resumable) return 0;
    fprintf(stderr,
            "shoal: %s: --resume: [job] checkpoint_dir %s holds no complete checkpoint (%s): start over with --fresh "
            "or without --resume; nothing was started\n",
            job_path_.c_str(), cfg_.checkpoint_dir.c_str(), held.c_str());
    return 2;
  }

  // The data files, before the checkpoints: a job that cannot read its data fails the same
  // way whatever its checkpoints hold, and a missing file is what the user must fix first.
  // Every process of `shoal run` runs on this machine, so the launcher sees what they would.
  int CheckDataPaths() {
    // A webdataset path is a shard pattern; its workers name a missing shard.
    if (cfg_.data_format == "synthetic" || cfg_.data_format == "webdataset") return 0;
    for (auto [key, path] : {std::pair<const char*, std::string>{"train", cfg_.train_path}, {"test", cfg_.test_path}}) {
      if (path.empty() || PathOrPrefixExists(path)) continue;
      fprintf(stderr, "shoal: %s: [data] %s = \"%s\": no such file or directory, nor files whose names start with it\n",
              job_path_.c_str(), key, path.c_str());
      return 2;
    }
    return 0;
  }
  // `path` itself, or (the formats take a prefix: "t10k" for t10k-images-idx3-ubyte) a
  // file in its folder whose name starts with its last part.
  static bool PathOrPrefixExists(const std::string& path) {
    if (access(path.c_str(), F_OK) == 0) return true;
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().filename().string().rfind(base, 0) == 0) return true;
    return false;
  }

  // The checkpoint stores this job's processes open: "shard K" or "worker R", and its folder.
  std::vector<std::pair<std::string, std::string>> CheckpointStores() const {
    std::vector<std::pair<std::string, std::string>> out;
    if (cfg_.checkpoint_dir.empty()) return out;
    if (facts_.needs_servers)
      for (size_t k = 0; k < cfg_.servers.size(); ++k)
        out.emplace_back("shard " + std::to_string(k), cfg_.checkpoint_dir + "/shard-" + std::to_string(k));
    else
      for (int r = 0; r < cfg_.world_size(); ++r)
        out.emplace_back("worker " + std::to_string(r), cfg_.checkpoint_dir + "/worker-" + std::to_string(r));
    return out;
  }

  // A new run (neither --resume nor --fresh) over an earlier run's checkpoints is refused
  // here, once, before any process starts: each process would refuse alone (exit 2, its log
  // lines among the launcher's), and a restart must never get past the refusal with --fresh,
  // which deletes what the refusal protects.
  int CheckEarlierRun() {
    if (FLAGS_resume || FLAGS_fresh) return 0;
    std::string held;
    CheckpointRecord newest;
    try {
      for (auto& [who, path] : CheckpointStores()) {
        std::optional<HeldCheckpoints> h = CheckpointStore::Peek(path);
        if (!h || h->empty()) continue;
        std::vector<uint64_t> ids;
        for (auto& rec : h->written) ids.push_back(rec.id);
        held += (held.empty() ? "" : "; ") + who + ": " + IdList(ids);
        if (h->committed.id > newest.id) newest = h->committed;
      }
    } catch (const Error& e) {
      fprintf(stderr, "shoal: %s: [job] checkpoint_dir: %s\n", job_path_.c_str(), e.what());
      return 2;
    }
    if (held.empty()) return 0;
    const std::string complete = DescribeCommitted(newest);
    fprintf(stderr,
            "shoal: %s: [job] checkpoint_dir %s holds checkpoints of an earlier run (%s%s): continue that run with "
            "--resume, or start over with --fresh (deletes them); nothing was started\n",
            job_path_.c_str(), cfg_.checkpoint_dir.c_str(), held.c_str(),
            complete.empty() ? "" : ("; " + complete).c_str());
    return 2;
  }

  // --checkpoint_state: what a requeued batch job needs to start again without deleting a
  // complete checkpoint. "none" only when every store is here (a shared checkpoint_dir) and
  // none is complete; a store that is not here may be on another node's disk.
  int PrintCheckpointState() {
    try {
      cfg_ = LoadJobConfig(job_path_);
      facts_ = FactsOf(cfg_.algorithm);
    } catch (const Error& e) {
      fprintf(stderr, "shoal: %s\n", e.what());
      return 2;
    }
    auto stores = CheckpointStores();
    if (stores.empty()) {
      printf("off\n");
      return 0;
    }
    for (auto& [who, path] : stores) {
      std::error_code ec;
      if (!std::filesystem::is_directory(path, ec)) {
        printf("unknown: %s's folder %s is not on this machine\n", who.c_str(), path.c_str());
        return 0;
      }
    }
    std::optional<CheckpointRecord> rec = CompleteCheckpointInStores();
    if (!rec)
      printf("unknown: a folder could not be read\n");
    else if (rec->id == 0)
      printf("none\n");
    else
      printf("complete %llu %lld\n", (unsigned long long)rec->id, (long long)rec->step);
    return 0;
  }

  // CheckpointStore::Peek, but with --fresh a store no process of this launch has opened yet
  // (and so deleted) holds the earlier run the user chose to discard: it counts as none. Every
  // open writes the store's CURRENT, a read-only Peek never does.
  std::optional<HeldCheckpoints> PeekThisLaunch(const std::string& path) const {
    struct stat st {};
    if (FLAGS_fresh && stat((path + "/CURRENT").c_str(), &st) == 0 &&
        double(st.st_mtim.tv_sec) + 1e-9 * double(st.st_mtim.tv_nsec) < start_)
      return std::nullopt;
    return CheckpointStore::Peek(path);
  }

  // The newest checkpoint every process holds whole, asked of the stores themselves (every
  // process stopped): one whose commit no process logged yet (killed between writing it and
  // the log line) counts too. Shard 0's coordinator commits a PS job's; a job without servers
  // has a complete checkpoint wherever every worker wrote one (or, elastic diloco, is recorded
  // absent from it: not a member of the outer round it was taken at). id 0 when there is none;
  // nullopt when a store cannot be read (then nothing may be deleted either).
  std::optional<CheckpointRecord> CompleteCheckpointInStores() const {
    try {
      auto stores = CheckpointStores();
      if (stores.empty()) return CheckpointRecord{};
      if (facts_.needs_servers) {
        std::optional<HeldCheckpoints> h = PeekThisLaunch(stores[0].second);
        return h ? h->committed : CheckpointRecord{};
      }
      std::vector<std::vector<CheckpointRecord>> records;  // what each worker's store holds
      for (auto& [who, path] : stores) {
        std::optional<HeldCheckpoints> h = PeekThisLaunch(path);
        if (!h) return CheckpointRecord{};
        records.push_back(h->written);
      }
      return NewestCompleteOfWorkers(records);
    } catch (const Error& e) {
      fprintf(stderr, "shoal: %s\n", e.what());
      return std::nullopt;
    }
  }

  // The output and log directories, metrics.jsonl, and the environment every child inherits.
  int PrepareOutput() {
    metrics_path_ = cfg_.output_dir + "/metrics.jsonl";
    log_dir_ = cfg_.output_dir + "/logs";
    try {
      MakeDirs(log_dir_);
      metrics_.Open(metrics_path_, /*append=*/FLAGS_resume);
    } catch (const Error& e) {
      fprintf(stderr, "shoal: %s\n", e.what());
      return 2;
    }
    follow_ = std::make_unique<MetricsFollower>(metrics_path_, /*from_end=*/FLAGS_resume);
    tracker_ = std::make_unique<StatusTracker>(cfg_);
    try {
      status_ = std::make_unique<StatusServer>(cfg_.status_bind, int(cfg_.status_port), StatusPageHtml(),
                                               cfg_.curve_enabled() ? StatusServer::NewToken() : std::string());
    } catch (const Error& e) {
      fprintf(stderr, "shoal: %s: [job] status_port / status_bind: %s\n", job_path_.c_str(), e.what());
      return 2;
    }
    try {
      std::vector<double> quotas;
      for (auto& w : cfg_.workers) quotas.push_back(w.cpu_quota);
      quotas_ = std::make_unique<CpuQuotaGroups>(quotas);
    } catch (const Error& e) {
      fprintf(stderr, "shoal: %s: %s\n", job_path_.c_str(), e.what());
      return 2;
    }
    start_ = UnixNow();
    last_print_ = start_;  // the first line once there is progress to show
    setenv("SHOAL_JOB_START", std::to_string(start_).c_str(), 1);
    // oneDNN's OpenMP threads otherwise spin while idle, and several processes of one job
    // share the cores: spinning collapses throughput (measured: resnet20 22-145 vs ~245
    // samples/s under load). A user's own setting wins.
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    SetRunId();
    return 0;
  }

  // Keys this attempt's rendezvous so values of an earlier run, or of the attempt before a
  // restart, are never read.
  void SetRunId() {
    setenv(
        "SHOAL_RUN_ID",
        (std::to_string((long long)start_) + "-" + std::to_string(getpid()) + "-" + std::to_string(restarts_)).c_str(),
        1);
  }

  // Every server (if the algorithm needs them) and every worker, each logging to its file.
  int StartProcesses() {
    signal(SIGINT, OnSignal);
    signal(SIGTERM, OnSignal);
    signal(SIGHUP, OnSignal);
    const std::vector<std::string> common_args = {"--config", job_path_};
    std::vector<std::string> mode_args;
    if (restarts_ == 0) {
      if (FLAGS_resume) mode_args.push_back("--resume");
      if (FLAGS_fresh) mode_args.push_back("--fresh");
    } else {
      // A complete checkpoint (Restart asked the stores) or the one resumed from is the place
      // to go on from; without one, what the failed attempt left is incomplete and this
      // launch's own (CheckEarlierRun let no earlier run's checkpoints through), so it goes.
      mode_args.push_back(restart_resumes_ ? "--resume" : "--fresh");
    }
    const bool append_logs = restarts_ > 0;
    std::vector<std::string> worker_args;
    std::string coordinator = cfg_.CoordinatorAddress(facts_.needs_servers);
    if (!facts_.needs_servers && cfg_.coordinator.empty()) {
      // On one machine a port the kernel picked keeps concurrent jobs apart (a cluster uses the
      // job file's or the documented default).
      int port = FreePort(cfg_.workers[0].host);
      if (port > 0) {
        coordinator = cfg_.workers[0].host + ":" + std::to_string(port);
        worker_args = {"--coordinator", coordinator};
      }
    }
    try {
      // Worker rank 0 serves the coordinator, unless it may be lost: then a process of its own.
      if (elastic_)
        Start("coordinator", {SelfPath(), "--serve_coordinator", "--coordinator", coordinator, job_path_},
              log_dir_ + "/coordinator.log", append_logs);
      if (facts_.needs_servers)
        for (size_t k = 0; k < cfg_.servers.size(); ++k) {
          std::vector<std::string> a = {BinaryPath("server", "shoal-server")};
          a.insert(a.end(), common_args.begin(), common_args.end());
          a.insert(a.end(), {"--shard", std::to_string(k)});
          a.insert(a.end(), mode_args.begin(), mode_args.end());
          Start("server " + std::to_string(k), a, log_dir_ + "/server-" + std::to_string(k) + ".log", append_logs);
        }
      for (int r = 0; r < cfg_.world_size(); ++r) {
        std::vector<std::string> a = {BinaryPath("worker", "shoal-worker")};
        a.insert(a.end(), common_args.begin(), common_args.end());
        a.insert(a.end(), {"--rank", std::to_string(r)});
        a.insert(a.end(), mode_args.begin(), mode_args.end());
        a.insert(a.end(), worker_args.begin(), worker_args.end());
        Start("worker " + std::to_string(r), a, log_dir_ + "/worker-" + std::to_string(r) + ".log", append_logs);
      }
    } catch (const Error& e) {
      fprintf(stderr, "shoal: %s\n", e.what());
      return 1;
    }
    if (restarts_ > 0) return 0;
    fprintf(stderr, "shoal: job %s: %s, %d worker(s)%s; logs in %s\n", cfg_.name.c_str(), cfg_.algorithm.c_str(),
            cfg_.world_size(),
            facts_.needs_servers ? (", " + std::to_string(cfg_.servers.size()) + " server(s)").c_str() : "",
            log_dir_.c_str());
    fprintf(stderr, "shoal: status page: %s (JSON: %s)\n", status_->url().c_str(), status_->url("status.json").c_str());
    if (!quotas_->Describe().empty())
      fprintf(stderr, "shoal: worker CPU quotas in %s/worker-RANK\n", quotas_->Describe().c_str());
    return 0;
  }

  // Follows the job until every worker has ended: progress, failures (fatal unless the
  // algorithm's facts tolerate that death), Ctrl-C.
  int Supervise() {
    tty_ = isatty(2);
    // Workers that may die without ending the job (asynchronous algorithms, elastic diloco).
    const bool tolerant =
        elastic_ ||
        cfg_.algorithm_opts.GetBool("tolerate_worker_failure", facts_.tolerated_deaths == ToleratedDeaths::kAnyButLast);
    while (true) {
      if (g_stop_signal) {
        fprintf(stderr, "\nshoal: %s received, stopping every process\n", strsignal(g_stop_signal));
        group_.StopAll();
        Publish("stopped", true);
        return 130;
      }
      ReadMetrics();
      if (int rc = CheckProcesses(tolerant)) {
        Publish("failed", true);
        return rc;
      }
      if (workers_done_ + workers_failed_ == cfg_.world_size()) break;
      PrintProgress();
      Publish("running", false);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ReadMetrics();
    PrintEvalLines(/*force=*/true);
    if (tty_) fprintf(stderr, "\n");
    group_.StopAll();
    return 0;
  }

  // After a failure: stops what is left and says whether to start again (max_restarts).
  bool failed_on_input() const { return last_failure_is_input_; }

  bool Restart() {
    if (last_failure_is_input_) {
      if (cfg_.max_restarts > 0) fprintf(stderr, "shoal: not restarting: the job's input is wrong, not a process\n");
      return false;
    }
    if (restarts_ >= cfg_.max_restarts) {
      if (cfg_.max_restarts > 0)
        fprintf(stderr, "shoal: no restarts left ([job] max_restarts = %lld)\n", (long long)cfg_.max_restarts);
      return false;
    }
    ++restarts_;
    group_.StopAll();
    ReadMetrics();  // the stopped processes' last lines: a checkpoint committed as they went
    group_.ForgetEnded();
    workers_done_ = workers_failed_ = 0;
    end_lines_.clear();
    tracker_->Restarted();
    Publish("restarting", true);
    // The stores, not the log: every rank may have written a checkpoint that rank 0 was
    // killed before logging, and --fresh would delete that complete checkpoint.
    std::optional<CheckpointRecord> stored = CompleteCheckpointInStores();
    if (stored && stored->id > last_checkpoint_) {
      last_checkpoint_ = stored->id;
      last_checkpoint_step_ = stored->step;
    }
    const bool resume = last_checkpoint_ > 0 || FLAGS_resume || !stored;
    restart_resumes_ = resume;
    // A checkpoint every worker had written as the failure came may not be announced yet:
    // the workers agree on the newest one they all hold, never an older one than this.
    std::string from = last_checkpoint_ > 0
                           ? "checkpoint " + std::to_string(last_checkpoint_) + " (step " +
                                 std::to_string(last_checkpoint_step_) + ") or a newer one every process holds"
                       : FLAGS_resume ? "the checkpoint it resumed from"
                       : resume ? "the newest complete checkpoint (the stores could not be read, so none is deleted)"
                                : "the start (no complete checkpoint yet)";
    fprintf(stderr, "shoal: restart %d of %lld after %s: every process starts again from %s\n", restarts_,
            (long long)cfg_.max_restarts, last_failure_.c_str(), from.c_str());
    metrics_.Write("restart", last_checkpoint_step_,
                   JsonObject()
                       .Add("attempt", restarts_)
                       .Add("max_restarts", cfg_.max_restarts)
                       .Add("after", last_failure_)
                       .Add("from_checkpoint", int64_t(last_checkpoint_)));
    resume_reported_ = false;
    SetRunId();
    return true;
  }

  // The done record in metrics.jsonl, the plot, and the done JSON line last on stdout.
  int Report() {
    // Accuracy from rank 0's end record, totals over workers.
    double acc = NAN, steps = 0, sps = 0, bytes = 0, skipped = 0, outer_bytes = 0;
    int outer_reports = 0;
    for (auto& [r, line] : end_lines_) {
      skipped += JsonNumber(line, "data_skipped").value_or(0);
      if (auto b = JsonNumber(line, "bytes_per_outer_step")) {
        outer_bytes += *b;
        ++outer_reports;
      }
      if (r == 0 || std::isnan(acc)) acc = JsonNumber(line, "test_accuracy").value_or(NAN);
      steps = std::max(steps, JsonNumber(line, "steps").value_or(0));
      sps += JsonNumber(line, "samples_per_s").value_or(0);
      bytes += JsonNumber(line, "bytes_sent").value_or(0);
    }
    double wall = UnixNow() - start_;
    JsonObject fields;
    fields.Add("job", cfg_.name)
        .Add("algorithm", cfg_.algorithm)
        .Add("test_accuracy", acc)
        .Add("steps", int64_t(steps));
    fields.Add("wall_s", wall)
        .Add("samples_per_s", sps)
        .Add("bytes_sent", int64_t(bytes))
        .Add("workers", cfg_.world_size());
    // diloco: what one worker sends per outer step, the mean over workers.
    if (outer_reports) fields.Add("bytes_per_outer_step", int64_t(outer_bytes / outer_reports));
    if (workers_failed_) fields.Add("workers_failed", workers_failed_);
    if (restarts_) fields.Add("restarts", restarts_);
    if (cfg_.skip_bad) fields.Add("data_skipped", int64_t(skipped));
    metrics_.Write("done", int64_t(steps), fields);
    Publish("done", true);
    try {
      WritePlotPng(cfg_.output_dir + "/plot.png",
                   {{"loss", tracker_->loss_curve()}, {"test accuracy", tracker_->accuracy_curve()}});
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
    return 0;
  }

 private:
  // A worker with a cpu_quota starts (and restarts) inside its cgroup.
  void Start(const std::string& name, const std::vector<std::string>& argv, const std::string& log, bool append) {
    group_.Start(name, argv, log, append, quotas_->ProcsFile(WorkerRank(name)));
    started_[name] = {argv, log};
  }

  // Whether `c`'s death can be ridden out by starting it alone again: any shard (shard 0's
  // coordinator keeps its recovery generation beside its checkpoints and learns membership
  // and placement again from the members), or a worker of a PS job (ps_sync: the others
  // roll back with it); only from a committed checkpoint, and within max_restarts.
  // diloco with elastic = true: any worker, rank 0 included (the coordinator is a process of
  // its own), while none has finished; it needs no checkpoint (the others hand it the global
  // state), and keeps its checkpoint folder as it is.
  bool CanRestartAlone(const Child& c) const {
    if (g_stop_signal || restarts_ >= cfg_.max_restarts) return false;
    if (c.term_signal == 0 && (c.exit_code == 2 || c.exit_code == 0)) return false;  // bad input, or done
    if (elastic_) return WorkerRank(c.name) >= 0 && workers_done_ == 0;
    if (!facts_.needs_servers) return false;
    if (last_checkpoint_ == 0 && !FLAGS_resume) return false;
    if (c.name.rfind("server ", 0) == 0) return true;
    return c.name.rfind("worker ", 0) == 0 && (facts_.tolerated_deaths == ToleratedDeaths::kAnyButLast || SyncPs()) &&
           workers_done_ == 0;  // once one finished, the shards may be leaving
  }
  // ps_sync: every step needs every worker's gradient, so a worker restarted alone rejoins
  // (--rejoin): every shard and the other workers go back to its checkpoint with it.
  bool SyncPs() const { return facts_.needs_servers && facts_.server_update == ServerUpdate::kMeanOfWorkers; }

  // Starts the process of that name again, alone, from the newest committed checkpoint (an
  // elastic diloco worker: from the global state the others hand it at the next outer step).
  void RestartAlone(const std::string& name, const std::string& why) {
    ++restarts_;
    auto& [argv, log] = started_.at(name);
    std::vector<std::string> a;
    for (auto& x : argv)
      if (x != "--resume" && x != "--fresh" && x != "--rejoin") a.push_back(x);
    if (!elastic_) a.push_back("--resume");
    const bool server = name.rfind("server ", 0) == 0;
    if (server || SyncPs() || elastic_) a.push_back("--rejoin");
    std::string from = last_checkpoint_ > 0 ? "checkpoint " + std::to_string(last_checkpoint_) + " (step " +
                                                  std::to_string(last_checkpoint_step_) + ")"
                                            : "the checkpoint the run resumed from";
    std::string what = elastic_ ? name +
                                      " restarted alone; it takes the global weights at the next outer step, the "
                                      "others go on"
                       : server   ? "shard " + name.substr(7) + " restarted alone; workers re-pull from " + from
                       : SyncPs() ? name + " restarted alone from " + from + "; the others roll back to it"
                                  : name + " restarted alone from " + from + "; the others go on";
    fprintf(stderr, "shoal: restart %d of %lld after %s: %s\n", restarts_, (long long)cfg_.max_restarts, why.c_str(),
            what.c_str());
    metrics_.Write("restart", last_checkpoint_step_,
                   JsonObject()
                       .Add("attempt", restarts_)
                       .Add("max_restarts", cfg_.max_restarts)
                       .Add("after", why)
                       .Add("from_checkpoint", int64_t(last_checkpoint_))
                       .Add("alone", name)
                       .Add("what", what));
    if (!server) tracker_->WorkerRestarted(WorkerRank(name));
    try {
      Start(name, a, log, /*append=*/true);
    } catch (const Error& e) {
      fprintf(stderr, "shoal: %s\n", e.what());
    }
  }

  void ReadMetrics() {
    for (auto& line : follow_->NewLines()) {
      tracker_->Consume(line);
      auto ev = JsonField(line, "event");
      if (!ev) continue;
      int rank = int(JsonNumber(line, "rank").value_or(0));
      if (*ev == "end") {
        end_lines_[rank] = line;
      } else if (*ev == "checkpoint") {
        last_checkpoint_ = uint64_t(JsonNumber(line, "id").value_or(double(last_checkpoint_)));
        last_checkpoint_step_ = int64_t(JsonNumber(line, "step").value_or(0));
      } else if (*ev == "warning") {
        if (tty_) fprintf(stderr, "\n");
        fprintf(stderr, "shoal: warning from worker %d: %s\n", rank, JsonField(line, "message").value_or("?").c_str());
      } else if (*ev == "resume" && !resume_reported_) {
        resume_reported_ = true;
        if (tty_) fprintf(stderr, "\n");
        fprintf(stderr, "shoal: resumed from the checkpoint at step %.0f (epoch %.0f, batch %.0f)\n",
                JsonNumber(line, "step").value_or(0), JsonNumber(line, "epoch").value_or(0),
                JsonNumber(line, "batch").value_or(0));
      }
    }
    // Stragglers: named on the console and as events in metrics.jsonl.
    for (const StragglerChange& c : tracker_->TakeStragglerChanges()) {
      fprintf(stderr, "%sshoal: %s\n", tty_ ? "\r\033[K" : "", c.Describe().c_str());
      metrics_.Write(c.straggler ? "straggler" : "straggler_end", c.step,
                     JsonObject()
                         .Add("rank", c.rank)
                         .Add("host", c.host)
                         .Add("device", c.device)
                         .Add("slower", c.slower)
                         .Add("since_step", c.since_step)
                         .Add("since_wall_s", c.since_wall_s));
    }
    PrintEvalLines(false);
  }

  // One line per evaluated step, once every live worker has reported it.
  void PrintEvalLines(bool force) {
    while (auto line = tracker_->TakeEvalLine(UnixNow() - start_, force)) {
      fprintf(stderr, "%s%s\n", tty_ ? "\r\033[K" : "", line->c_str());
      printed_step_ = tracker_->step();
      last_print_ = UnixNow();
    }
  }

  // The status page's data, at most four times a second unless `now`.
  void Publish(const char* state, bool now) {
    const double t = UnixNow();
    if (!now && t - last_publish_ < 0.25) return;
    status_->Publish(tracker_->Json(t - start_, state, restarts_));
    last_publish_ = t;
  }

  // Reaps ended children; returns 1 once a death ends the job (everything stopped).
  int CheckProcesses(bool tolerant) {
    std::vector<Child*> failed;
    auto take = [&](const std::vector<Child*>& ended) {
      for (Child* c : ended) {
        bool is_worker = c->name.rfind("worker", 0) == 0;
        if (is_worker) tracker_->WorkerGone(WorkerRank(c->name), c->exit_code != 0);
        if (is_worker && c->exit_code == 0)
          ++workers_done_;
        else if (!is_worker && c->exit_code == 0 && c->term_signal == 0)
          continue;  // a server leaves by itself once every worker has finished
        else
          failed.push_back(c);
      }
    };
    take(group_.Reap());
    // Deaths close together are one failure: a host going down takes several processes, and
    // their ends can straddle two reaps (one waitpid round). A moment's wait gathers them
    // before restarting any alone decides the budget.
    if (!failed.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      take(group_.Reap());
    }
    // Those that can be started alone again are, before anything else is decided. Deaths in
    // one reap go alone only together: each restart counts against max_restarts, and a shard
    // or a ps_sync worker rejoins as a new recovery generation that expects every other
    // process to be running. So several go alone only when the budget holds them all and
    // none of them rejoins; otherwise they are failures like the rest (the whole job
    // restarts, one restart, from its checkpoint; or an asynchronous job goes on).
    bool all_alone = !failed.empty(), rejoins = false;
    for (Child* c : failed) {
      all_alone = all_alone && CanRestartAlone(*c);
      rejoins = rejoins || c->name.rfind("server ", 0) == 0 || SyncPs();
    }
    if (all_alone && (failed.size() == 1 || (!rejoins && restarts_ + int(failed.size()) <= cfg_.max_restarts))) {
      std::vector<std::pair<std::string, std::string>> alone;  // name, why (Child* die with Start)
      for (Child* c : failed) {
        fprintf(stderr, "\nshoal: %s stopped: %s; last lines of %s:\n%s", c->name.c_str(), DescribeExit(*c).c_str(),
                c->log_path.c_str(), TailLines(c->log_path, 8).c_str());
        metrics_.Write("process_failed", int64_t(tracker_->step()),
                       JsonObject().Add("process", c->name).Add("why", DescribeExit(*c)));
        alone.emplace_back(c->name, c->name + " " + DescribeExit(*c));
      }
      for (auto& [name, why] : alone) RestartAlone(name, why);
      return 0;
    }
    if (failed.empty()) return 0;
    bool fatal = false;
    for (Child* c : failed) {
      bool is_worker = c->name.rfind("worker", 0) == 0;
      fatal = fatal || !is_worker || !tolerant || workers_failed_ + 1 >= cfg_.world_size();
      if (is_worker && !fatal) ++workers_failed_;
    }
    if (fatal) {
      // One death brings down its peers: wait a moment so the report can name the
      // process that died first (killed by a signal) before those that followed it.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      for (Child* c : group_.Reap())
        if (!(c->name.rfind("worker", 0) == 0 && c->exit_code == 0)) failed.push_back(c);
      std::stable_sort(failed.begin(), failed.end(),
                       [](Child* a, Child* b) { return a->term_signal && !b->term_signal; });
    }
    fprintf(stderr, "\n");
    last_failure_ = failed[0]->name + " " + DescribeExit(*failed[0]);
    // Exit code 2 is a process refusing its job file or flags: starting again cannot help.
    last_failure_is_input_ = failed[0]->term_signal == 0 && failed[0]->exit_code == 2;
    for (Child* c : failed) {
      fprintf(stderr, "shoal: %s stopped: %s; last lines of %s:\n%s", c->name.c_str(), DescribeExit(*c).c_str(),
              c->log_path.c_str(), TailLines(c->log_path, 8).c_str());
      metrics_.Write("process_failed", int64_t(tracker_->step()),
                     JsonObject().Add("process", c->name).Add("why", DescribeExit(*c)));
    }
    if (fatal) {
      group_.StopAll();
      return 1;
    }
    fprintf(stderr, "shoal: the job goes on without them (%s)\n",
            elastic_ ? "diloco elastic: the outer steps go on among the live workers" : "asynchronous algorithm");
    return 0;
  }

  // On a terminal, one line rewritten twice a second; in a log, a line 15 s after the last
  // one (an evaluation's line included), and only when the job got further than it.
  // (An evaluation's line follows the train event of its step, so a log line that showed
  // the newest step could name the same step as the evaluation's line right after it.)
  void PrintProgress() {
    double now = UnixNow();
    if (now - last_print_ <= (tty_ ? 0.5 : 15.0)) return;
    if (tty_) {
      fprintf(stderr, "\r\033[K%s", tracker_->ProgressLine(now - start_).c_str());
      last_print_ = now;
      return;
    }
    // A log keeps its lines: never a step that an evaluation's line will show again.
    const double step = double(tracker_->SettledStep());
    if (step <= printed_step_) return;
    fprintf(stderr, "%s\n", tracker_->ProgressLine(now - start_, step).c_str());
    printed_step_ = step;
    last_print_ = now;
  }

  const std::string job_path_;
  JobConfig cfg_;
  AlgorithmFacts facts_;
  std::string metrics_path_, log_dir_;
  MetricsWriter metrics_;
  std::unique_ptr<MetricsFollower> follow_;
  double start_ = 0, last_print_ = 0, last_publish_ = 0, printed_step_ = 0;
  // Before group_: destroyed after it, once group_ has killed and reaped every process.
  std::unique_ptr<CpuQuotaGroups> quotas_;
  ProcessGroup group_;
  std::unique_ptr<StatusTracker> tracker_;
  std::unique_ptr<StatusServer> status_;
  std::map<int, std::string> end_lines_;
  bool tty_ = false;
  int workers_done_ = 0, workers_failed_ = 0;
  int restarts_ = 0;
  bool elastic_ = false;          // SurvivesLostWorkers: a lost worker is restarted alone, or the others go on
  uint64_t last_checkpoint_ = 0;  // the newest complete checkpoint this run has seen committed
  int64_t last_checkpoint_step_ = 0;
  std::string last_failure_;  // "worker 1 killed by SIGKILL"
  bool resume_reported_ = false;
  bool last_failure_is_input_ = false;
  bool restart_resumes_ = false;  // the next restart passes --resume (else --fresh)
  // How each process was started (argv, log), to start one again alone.
  std::map<std::string, std::pair<std::vector<std::string>, std::string>> started_;
};

// --serve_coordinator: the job's coordinator as a process of its own, so that every worker,
// rank 0 included, can be lost while it keeps the store and the membership.
int ServeCoordinator(const std::string& job_path) {
  JobConfig cfg;
  try {
    cfg = LoadJobConfig(job_path);
    CheckJobKeys(cfg);
    if (!FLAGS_coordinator.empty()) {  // the job file's checks, naming the flag
      cfg.coordinator = FLAGS_coordinator;
      CheckJobLimits(cfg, {{"[cluster] coordinator", "--coordinator"}});
    }
    if (FactsOf(cfg.algorithm).needs_servers)
      throw Error(job_path + ": [algorithm] name = \"" + cfg.algorithm +
                  "\" has servers, and server shard 0 is its coordinator: --serve_coordinator is for jobs without");
  } catch (const Error& e) {
    fprintf(stderr, "shoal: %s\n", e.what());
    return 2;
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  const std::string address = cfg.CoordinatorAddress(false);
  const CurveKeys keys{cfg.curve_server_public, cfg.curve_server_secret, cfg.curve_client_public,
                       cfg.curve_client_secret};
  std::unique_ptr<RendezvousServer> server;
  try {
    server = std::make_unique<RendezvousServer>(ListenEndpoint(address), keys,
                                                JobMembership(cfg, /*deaths_end_job=*/!SurvivesLostWorkers(cfg)));
  } catch (const Error& e) {
    fprintf(stderr, "shoal: %s: coordinator %s: cannot serve it: %s\n", job_path.c_str(), address.c_str(), e.what());
    return 1;
  }
  fprintf(stderr, "shoal: coordinator of job %s serving at %s\n", cfg.name.c_str(), address.c_str());
  while (!server->finished() && !g_stop_signal) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  fprintf(stderr, "shoal: coordinator of job %s: %s\n", cfg.name.c_str(),
          g_stop_signal ? strsignal(g_stop_signal) : "every worker has left or died");
  return 0;
}

int Run(const std::string& job_path) {
  Launch job(job_path);
  for (auto phase : {&Launch::Check, &Launch::PrepareOutput})
    if (int rc = (job.*phase)()) return rc;
  while (true) {
    if (int rc = job.StartProcesses()) return rc;
    int rc = job.Supervise();
    if (rc == 0) break;
    if (rc != 1) return rc;
    // A process that refused its input (exit 2) makes the whole job's answer 2 as well.
    if (!job.Restart()) return job.failed_on_input() ? 2 : 1;
  }
  return job.Report();
}

}  // namespace
}  // namespace shoal

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "shoal-launch JOB.toml [--resume | --fresh]: run a whole job on this machine (--checkpoint_state, "
      "--serve_coordinator: one of its other modes)");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc != 2) {
    fprintf(stderr,
            "usage: shoal run JOB.toml [--resume | --fresh] | shoal coordinator JOB.toml [--coordinator HOST:PORT]\n");
    return 2;
  }
  // A reader of its output that goes away (a benchmark killed, `| head`) must not kill it
  // with SIGPIPE midway: it still stops the job's processes and removes their cgroups.
  signal(SIGPIPE, SIG_IGN);
  try {
    if (FLAGS_checkpoint_state) return shoal::Launch(argv[1]).PrintCheckpointState();
    if (FLAGS_serve_coordinator) return shoal::ServeCoordinator(argv[1]);
    return shoal::Run(argv[1]);
  } catch (const std::exception& e) {  // Run reports shoal::Error itself; anything else is a bug
    fprintf(stderr, "shoal: %s: unexpected error: %s\n", argv[1], e.what());
    return 1;
  }
}
