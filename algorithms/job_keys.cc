#include "algorithms/job_keys.h"

#include "algorithms/facts.h"
#include "algorithms/optimizers/optimizer.h"
#include "common/error.h"

namespace shoal {
namespace {

// What a job whose outer steps run among the live workers cannot have (yet): everything
// else that meets every rank (the balancer's all-gather, the streaming ring) or learns no
// deaths (a shared-directory rendezvous has no heartbeats). Worker checkpoints commit among
// the members of each round (algorithms/worker_checkpoints.h).
void CheckElastic(const JobConfig& cfg) {
  const ConfigSection& a = cfg.algorithm_opts;
  if (!a.Has("elastic")) return;
  if (cfg.algorithm != "diloco")
    throw Error(a.Where("elastic") + ": only with name = \"diloco\" (lost workers dropping out of the outer step)");
  if (!a.GetBool("elastic", false)) return;
  auto refuse = [&](const std::string& where, const std::string& what) {
    throw Error(where + ": not with elastic = true (" + what + ")");
  };
  if (a.GetInt("streaming", 0, 0, int64_t(1) << 30) > 0)
    refuse(a.Where("streaming"), "lost-worker tolerance works with streaming = 0 only");
  if (a.GetBool("balance", false)) refuse(a.Where("balance"), "the balancer meets every worker");
  if (a.GetString("collective", "ring") != "ring") refuse(a.Where("collective"), "the live workers meet on a ring");
  if (a.Has("rendezvous_dir")) refuse(a.Where("rendezvous_dir"), "deaths are learned from the coordinator");
}

}  // namespace

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
  CheckElastic(cfg);
}

bool SurvivesLostWorkers(const JobConfig& cfg) {
  return cfg.algorithm == "diloco" && cfg.algorithm_opts.GetBool("elastic", false);
}

}  // namespace shoal
