// Builds a worker's Communicator from the job: [algorithm] collective = "ring" (default)
// with rendezvous through a FileStore under the job's output_dir (one machine or a shared
// filesystem), keyed by the run id so a stale run's files are never read.
#pragma once
#include <memory>

#include "algorithms/algorithm.h"
#include "algorithms/collectives/communicator.h"

namespace shoal {

std::unique_ptr<Communicator> MakeWorkerCommunicator(const AlgorithmEnv& env, const std::string& name = "ring");
// SHOAL_RUN_ID from the launcher, else the Slurm / Open MPI job id, else "0".
std::string RunId();

}  // namespace shoal
