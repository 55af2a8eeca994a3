// Builds a worker's Communicator from the job: [algorithm] collective = "ring" (default),
// "torus2d", "hierarchical" or "nccl", meeting its peers through `store`.
#pragma once
#include <memory>
#include <string>

#include "algorithms/collectives/communicator.h"
#include "common/rendezvous/store.h"
#include "common/config.h"

namespace shoal {

// `name` prefixes the store keys, so several communicators of one job never meet the wrong
// peers. The store must outlive the wiring (the constructor's return).
std::unique_ptr<Communicator> MakeWorkerCommunicator(const JobConfig& cfg, int rank, Store& store,
                                                     const std::string& name = "ring");
// SHOAL_RUN_ID from the launcher, else the Slurm / Open MPI job id, else "0".
std::string RunId();

}  // namespace shoal
