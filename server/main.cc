// shoal-server --config JOB.toml --shard K: one parameter-server shard (shard 0 also
// coordinates). A bad job file or flag is one line on stderr and exit 2, nothing started.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <gflags/gflags.h>
#include <glog/logging.h>

#include "algorithms/optimizers/optimizer.h"
#include "common/config.h"
#include "common/error.h"
#include "common/flags.h"
#include "server/aggregation.h"
#include "server/server.h"

DEFINE_string(config, "", "job file (TOML)");
DEFINE_int32(shard, 0, "which [cluster] servers entry this process serves");
DEFINE_string(bind, "", "endpoint to bind instead of servers[shard], e.g. tcp://0.0.0.0:7701");
DEFINE_bool(resume, false, "load the job's newest complete checkpoint before serving");
DEFINE_bool(rejoin, false,
            "with --resume: this shard (shard 0, the coordinator's host, too) was restarted alone while the job "
            "runs (shoal run does this); the workers re-pull from the checkpoint it restores");
DEFINE_bool(fresh, false, "start over: delete the checkpoints an earlier run left in [job] checkpoint_dir");

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

// --bind as typed: "tcp://HOST:PORT", PORT 1-65535 or "*". ZeroMQ itself would take port
// 99999 as 34463 and "-5" as 65531, listening where no worker looks.
void CheckBind(const std::string& bind) {
  const std::string usage = ": expected tcp://HOST:PORT with PORT 1-65535 or *, e.g. tcp://0.0.0.0:7701";
  if (bind.empty()) {
    if (!gflags::GetCommandLineFlagInfoOrDie("bind").is_default)
      throw shoal::Error("--bind is empty" + usage + " (or leave --bind out to listen at [cluster] servers[shard])");
    return;
  }
  const auto colon = bind.rfind(':');
  if (bind.rfind("tcp://", 0) != 0 || colon == std::string::npos || colon <= 6)
    throw shoal::Error("--bind " + bind + usage);
  const std::string port = bind.substr(colon + 1);
  if (port != "*" && !shoal::IsPort(port)) throw shoal::Error("--bind " + bind + usage);
}
}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("shoal-server --config JOB.toml --shard K");
  const std::string bad_flag = shoal::ParseFlags(&argc, &argv);
  if (!bad_flag.empty()) {
    fprintf(stderr, "shoal-server: %s\n", bad_flag.c_str());
    return 2;
  }
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_config.empty()) {
    fprintf(stderr, "shoal-server: --config JOB.toml is required\n");
    return 2;
  }
  // Exit 2 tells a launcher not to restart: only for what is certainly the job file's or the
  // flags' fault. Binding, reaching shard 0 and reading the checkpoints can fail for reasons
  // a restart gets past (a port still held, shard 0 restarting, a network timeout): exit 1,
  // unless the error says it is the input's (InputError).
  shoal::JobConfig cfg;
  std::unique_ptr<shoal::UpdateRule> rule;
  try {
    CheckBind(FLAGS_bind);
    // Before the port is bound: a refused flag must not have listened (and taken the port).
    if (FLAGS_rejoin && !FLAGS_resume)
      throw shoal::Error(std::string("--rejoin needs --resume") + (FLAGS_fresh ? ", not --fresh" : "") +
                         ": a shard restarted alone rejoins from the job's newest checkpoint");
    cfg = shoal::LoadJobConfig(FLAGS_config);
    // Only [optimizer]: the server reads nothing of [algorithm] and must not link the
    // algorithms' facts; the workers and the launcher check that section.
    shoal::CheckOptimizerKeys(cfg.optimizer, cfg.optimizer_opts);
    if (cfg.servers.empty())
      throw shoal::Error(FLAGS_config + ": [cluster] servers: expected at least one \"host:port\"");
    if (FLAGS_shard < 0 || FLAGS_shard >= int(cfg.servers.size()))
      throw shoal::Error("--shard " + std::to_string(FLAGS_shard) + ": " + FLAGS_config + " lists " +
                         std::to_string(cfg.servers.size()) + " server(s) in [cluster] servers (shards 0 to " +
                         std::to_string(cfg.servers.size() - 1) + ")");
    shoal::CheckpointStartFrom(FLAGS_resume, FLAGS_fresh);  // both given: refused here
    // The parameter-server algorithms run the job's optimizer here, on whole tensors; the
    // workers' plan (at registration) says how.
    rule = shoal::MakeServerUpdateRule(cfg);
  } catch (const std::exception& e) {
    fprintf(stderr, "shoal-server: %s\n", e.what());
    return 2;
  }
  std::unique_ptr<shoal::Server> server;
  try {
    server = std::make_unique<shoal::Server>(cfg, FLAGS_shard, FLAGS_bind);
    server->kv().SetUpdateRule(std::move(rule));
    server->OpenCheckpoints(shoal::CheckpointStartFrom(FLAGS_resume, FLAGS_fresh), FLAGS_rejoin);
  } catch (const shoal::InputError& e) {
    fprintf(stderr, "shoal-server: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fprintf(stderr, "shoal-server: shard %d could not start: %s\n", FLAGS_shard, e.what());
    return 1;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGPIPE, SIG_IGN);
  server->Run(g_stop);
  if (!server->failure().empty()) {
    fprintf(stderr, "shoal-server: shard %d: the job cannot go on: %s\n", FLAGS_shard, server->failure().c_str());
    return 1;
  }
  LOG(INFO) << "shard " << FLAGS_shard << ": stopped";
  return 0;
}
