// The worker's training loop: data shard -> model on a backend -> gradients ->
// Algorithm::Step -> metrics; evaluates each epoch and stops at the target accuracy.
#pragma once
#include <cstdint>
#include <string>

#include "common/config.h"

namespace shoal {

struct TrainerOptions {
  int rank = 0;
  bool resume = false;  // continue from the job's newest complete checkpoint
  bool fresh = false;   // start over, deleting an earlier run's checkpoints
  bool rejoin = false;  // restarted alone while the job's other processes run (ps_sync with resume; diloco elastic)
  int threads = 0;      // 0: from the job file
};

struct TrainResult {
  int64_t steps = 0;
  double test_accuracy = 0;
  double samples_per_s = 0;
  int64_t bytes_sent = 0;
};

// Runs the whole job for this worker; throws shoal::Error on bad input.
TrainResult Train(const JobConfig& cfg, const TrainerOptions& opts);

}  // namespace shoal
