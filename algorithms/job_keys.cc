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
}

}  // namespace shoal
