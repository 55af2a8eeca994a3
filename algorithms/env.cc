#include "algorithms/env.h"

#include <algorithm>

#include "algorithms/collectives/factory.h"
#include "algorithms/cuda_device_ops.h"
#include "algorithms/job_keys.h"
#include "common/device.h"
#include "common/rendezvous/store.h"
#include "common/error.h"
#include "common/ps/client.h"
#include "common/rendezvous/rendezvous.h"

namespace shoal {

namespace {

// Rank 0's coordinator and this worker's membership; the membership goes first, so rank 0
// has left before its coordinator waits for the others.
struct CoordinatorSession {
  std::unique_ptr<RendezvousServer> server;
  std::unique_ptr<Membership> membership;
  ~CoordinatorSession() {
    membership.reset();
    server.reset();
  }
};

}  // namespace

std::shared_ptr<Store> MakeRendezvous(const JobConfig& cfg, int rank, std::shared_ptr<void>* coordinator,
                                      std::function<void(const std::string&)> on_member_failure) {
  // A shared directory when the job asks for one. The run id keeps two launcher runs apart,
  // but every hand-started worker has run id "0": the ranks' join handshake (FileStoreRun)
  // is what keeps an earlier run's files from being read.
  std::string dir = cfg.algorithm_opts.GetString("rendezvous_dir", "");
  if (!dir.empty()) {
    FileStoreRun run;
    run.rank = rank;
    run.world = cfg.world_size();
    return std::make_shared<FileStore>(dir + "/" + RunId(), run);
  }
  // Else the job's coordinator, over the network: shard 0 when the algorithm has servers;
  // else worker rank 0, which starts it here, unless the job survives lost workers: rank 0 may
  // be lost too, so its coordinator is a process of its own (`shoal-launch
  // --serve_coordinator`, which `shoal run` and `shoal-task` start).
  const bool has_servers = FactsOf(cfg.algorithm).needs_servers;
  const std::string address = cfg.CoordinatorAddress(has_servers);
  const CurveKeys keys{cfg.curve_server_public, cfg.curve_server_secret, cfg.curve_client_public,
                       cfg.curve_client_secret};
  if (!has_servers) {
    auto session = std::make_shared<CoordinatorSession>();
    if (rank == 0 && !SurvivesLostWorkers(cfg)) {
      try {
        session->server = std::make_unique<RendezvousServer>(ListenEndpoint(address), keys,
                                                             JobMembership(cfg, /*deaths_end_job=*/true));
      } catch (const Error& e) {
        throw Error(cfg.path + ": [cluster] coordinator " + address + ": worker rank 0 cannot serve it: " + e.what() +
                    " (set [cluster] coordinator to a free host:port)");
      }
    }
    session->membership = std::make_unique<Membership>("tcp://" + address, keys, rank, int(cfg.heartbeat_ms),
                                                       int(cfg.heartbeat_timeout_ms), std::move(on_member_failure));
    *coordinator = session;
  }
  return std::make_shared<CoordinatorStore>("tcp://" + address, keys);
}

AlgorithmEnv MakeAlgorithmEnv(const JobConfig& cfg, int rank, const BatchSchedule& batches, MetricsWriter* metrics,
                              bool resume, std::function<void(const std::string&)> on_member_failure) {
  AlgorithmEnv env;
  env.config = &cfg;
  env.rank = rank;
  env.world = cfg.world_size();
  env.steps_per_epoch = batches.StepsInEpoch(0);
  env.total_steps = batches.FirstStepOfEpoch(cfg.epochs);
  if (cfg.max_steps > 0) env.total_steps = std::min(env.total_steps, cfg.max_steps);
  env.optimizer = MakeOptimizer(cfg.optimizer, cfg.optimizer_opts);
  env.schedule = std::make_shared<LrSchedule>(LrSchedule::FromConfig(cfg.optimizer_opts, batches, env.total_steps));
  env.metrics = metrics;
  env.resume = resume;
  env.store = MakeRendezvous(cfg, rank, &env.coordinator, std::move(on_member_failure));
  std::shared_ptr<Store> store = env.store;
  const JobConfig* c = &cfg;
  env.make_communicator = [c, rank, store](const std::string& name) {
    return MakeWorkerCommunicator(*c, rank, *store, name);
  };
  env.make_member_ring = [c, rank, store](const std::string& name, const std::vector<int>& members) {
    return MakeMemberRing(*c, rank, members, *store, name);
  };
  env.make_ps_client = [c](const ClientOptions& o) { return std::make_unique<Client>(*c, o); };
  // Only a CUDA worker ever has on-device views; its device is the one its backend uses.
  const Device dev =
      rank >= 0 && size_t(rank) < cfg.workers.size() ? ParseDevice(cfg.workers[size_t(rank)].device) : Device();
  if (!dev.is_cpu()) env.device = MakeCudaDeviceOps(dev.index);
  return env;
}

}  // namespace shoal
