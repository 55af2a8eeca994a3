// What a parameter-server shard must know of the training to run the job's optimizer. The
// workers send it at registration (msg::Kind::PLAN to every shard), so a server never
// loads the data set to learn it.
#pragma once
#include <cstdint>
#include <string>

#include "common/messages/schema.capnp.h"

namespace shoal {

// The PS algorithms keep one clock per worker on the shards beside the model (a control
// tensor of one float): so the tensors a checkpoint holds also say how many workers wrote it.
constexpr const char* kWorkerClockPrefix = "__shoal/clock/";
inline std::string WorkerClockName(int rank) { return kWorkerClockPrefix + std::to_string(rank); }
// The asynchronous PS modes' stop decision (the step it was taken at; 0 = none).
constexpr const char* kStopTensor = "__shoal/stop";

struct TrainingPlan {
  int64_t steps_per_epoch = 1;  // global steps in one epoch
  int64_t total_steps = 1;      // global steps of the run (the LR schedule's horizon)
  msg::ServerRule rule = msg::ServerRule::NONE;
  int workers = 1;           // workers whose pushes make one global step
  int64_t global_batch = 1;  // samples in one global step
  bool operator==(const TrainingPlan& o) const {
    return steps_per_epoch == o.steps_per_epoch && total_steps == o.total_steps && rule == o.rule &&
           workers == o.workers && global_batch == o.global_batch;
  }
  bool operator!=(const TrainingPlan& o) const { return !(*this == o); }
};

inline void ToWire(const TrainingPlan& p, msg::TrainingPlan::Builder b) {
  b.setStepsPerEpoch(p.steps_per_epoch);
  b.setTotalSteps(p.total_steps);
  b.setRule(p.rule);
  b.setWorkers(p.workers);
  b.setGlobalBatch(p.global_batch);
}

inline TrainingPlan FromWire(msg::TrainingPlan::Reader r) {
  TrainingPlan p;
  p.steps_per_epoch = r.getStepsPerEpoch();
  p.total_steps = r.getTotalSteps();
  p.rule = r.getRule();
  p.workers = r.getWorkers();
  p.global_batch = r.getGlobalBatch();
  return p;
}

}  // namespace shoal
