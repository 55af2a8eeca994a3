#include "algorithms/job_keys.h"

#include "algorithms/facts.h"
#include "algorithms/optimizers/optimizer.h"
#include "common/error.h"

namespace shoal {

void CheckJobKeys(const JobConfig& cfg) {
  try {
    FactsOf(cfg.algorithm);
  } catch (const Error& e) {
    throw Error(cfg.algorithm_opts.Where("name") + ": " + e.what());
  }
  cfg.algorithm_opts.CheckKeys(KnownAlgorithmKeys(cfg.algorithm), "algorithm \"" + cfg.algorithm + "\"");
  CheckOptimizerKeys(cfg.optimizer, cfg.optimizer_opts, AlgorithmOptimizerKeys(cfg.algorithm));
  // The servers of a PS job build their learning-rate schedule from a plan of one global batch.
  if (!cfg.batch_schedule.empty() && FactsOf(cfg.algorithm).needs_servers)
    throw Error(cfg.path + ": [train] batch_schedule: not supported with algorithm \"" + cfg.algorithm +
                "\" (its servers keep one global batch); use a synchronous collective one such as allreduce");
}

}  // namespace shoal
