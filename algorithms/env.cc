#include "algorithms/env.h"

#include <algorithm>

#include "algorithms/collectives/factory.h"
#include "algorithms/collectives/store.h"
#include "common/error.h"
#include "common/ps/client.h"

namespace shoal {

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
  // Keyed by the run id, so files of an earlier run are never read.
  std::string dir = cfg.algorithm_opts.GetString("rendezvous_dir", cfg.output_dir + "/rendezvous");
  std::shared_ptr<Store> store = std::make_shared<FileStore>(dir + "/" + RunId());
  env.store = store;
  const JobConfig* c = &cfg;
  env.make_communicator = [c, rank, store](const std::string& name) {
    return MakeWorkerCommunicator(*c, rank, *store, name);
  };
  env.make_ps_client = [c](const ClientOptions& o) { return std::make_unique<Client>(*c, o); };
  return env;
}

}  // namespace shoal
