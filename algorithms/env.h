// The one place a worker's AlgorithmEnv is put together: the optimizer and LR schedule from
// [optimizer], the rendezvous store, and factories for the real Communicators and the
// parameter-server client. Algorithms receive it; tests build their own with fakes.
#pragma once
#include <functional>
#include <string>

#include "algorithms/algorithm.h"

namespace shoal {

// The job's rendezvous store: the coordinator over the network, or [algorithm]
// rendezvous_dir when set. In a job without servers, rank 0 starts the coordinator and every
// rank joins its membership (heartbeats); both live in *coordinator. `on_member_failure`
// runs once (from a background thread) when a member stops answering.
std::shared_ptr<Store> MakeRendezvous(const JobConfig& cfg, int rank, std::shared_ptr<void>* coordinator,
                                      std::function<void(const std::string&)> on_member_failure = nullptr);

// `batches`: the global batch and steps of each epoch (the worker's data loader knows the
// samples); env.steps_per_epoch is its first epoch's, env.total_steps its whole run's.
AlgorithmEnv MakeAlgorithmEnv(const JobConfig& cfg, int rank, const BatchSchedule& batches, MetricsWriter* metrics,
                              bool resume, std::function<void(const std::string&)> on_member_failure = nullptr);

}  // namespace shoal
