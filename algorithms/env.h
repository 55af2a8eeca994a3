// The one place a worker's AlgorithmEnv is put together: the optimizer and LR schedule from
// [optimizer], the rendezvous store, and factories for the real Communicators and the
// parameter-server client. Algorithms receive it; tests build their own with fakes.
#pragma once
#include "algorithms/algorithm.h"

namespace shoal {

// The job's rendezvous store: the coordinator over the network (rank 0 of a job without
// servers starts it and keeps it in *coordinator), or [algorithm] rendezvous_dir when set.
std::shared_ptr<Store> MakeRendezvous(const JobConfig& cfg, int rank, std::shared_ptr<void>* coordinator);

// `steps_per_epoch`: global steps in one epoch (the worker's data loader knows it).
AlgorithmEnv MakeAlgorithmEnv(const JobConfig& cfg, int rank, int64_t steps_per_epoch, MetricsWriter* metrics,
                              bool resume);

}  // namespace shoal
