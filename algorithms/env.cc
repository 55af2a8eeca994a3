#include "algorithms/env.h"

#include <algorithm>

#include "algorithms/collectives/factory.h"
#include "common/rendezvous/store.h"
#include "common/error.h"
#include "common/ps/client.h"
#include "common/rendezvous/rendezvous.h"

namespace shoal {

std::shared_ptr<Store> MakeRendezvous(const JobConfig& cfg, int rank, std::shared_ptr<void>* coordinator) {
  // A shared directory when the job asks for one (keyed by the run id, so files of an
  // earlier run are never read).
  std::string dir = cfg.algorithm_opts.GetString("rendezvous_dir", "");
  if (!dir.empty()) return std::make_shared<FileStore>(dir + "/" + RunId());
  // Else the job's coordinator, over the network: shard 0 when the algorithm has servers,
  // else worker rank 0, which starts it here.
  const bool has_servers = FactsOf(cfg.algorithm).needs_servers;
  const std::string address = cfg.CoordinatorAddress(has_servers);
  const CurveKeys keys{cfg.curve_server_public, cfg.curve_server_secret, cfg.curve_client_public,
                       cfg.curve_client_secret};
  if (!has_servers && rank == 0) {
    try {
      *coordinator = std::make_shared<RendezvousServer>(ListenEndpoint(address), keys);
    } catch (const Error& e) {
      throw Error(cfg.path + ": [cluster] coordinator " + address + ": worker rank 0 cannot serve it: " + e.what() +
                  " (set [cluster] coordinator to a free host:port)");
    }
  }
  return std::make_shared<CoordinatorStore>("tcp://" + address, keys);
}

AlgorithmEnv MakeAlgorithmEnv(const JobConfig& cfg, int rank, int64_t steps_per_epoch, MetricsWriter* metrics,
                              bool resume) {
  AlgorithmEnv env;
  env.config = &cfg;
  env.rank = rank;
  env.world = cfg.world_size();
  env.steps_per_epoch = std::max<int64_t>(1, steps_per_epoch);
  env.total_steps = cfg.epochs * env.steps_per_epoch;
  if (cfg.max_steps > 0) env.total_steps = std::min(env.total_steps, cfg.max_steps);
  env.optimizer = MakeOptimizer(cfg.optimizer, cfg.optimizer_opts);
  env.schedule = std::make_shared<LrSchedule>(
      LrSchedule::FromConfig(cfg.optimizer_opts, cfg.batch_size * env.world, env.steps_per_epoch, env.total_steps));
  env.metrics = metrics;
  env.resume = resume;
  env.store = MakeRendezvous(cfg, rank, &env.coordinator);
  std::shared_ptr<Store> store = env.store;
  const JobConfig* c = &cfg;
  env.make_communicator = [c, rank, store](const std::string& name) {
    return MakeWorkerCommunicator(*c, rank, *store, name);
  };
  env.make_ps_client = [c](const ClientOptions& o) { return std::make_unique<Client>(*c, o); };
  return env;
}

}  // namespace shoal
