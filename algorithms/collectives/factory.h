// Builds a worker's Communicator from the job: [algorithm] collective = "ring" (default),
// "torus2d", "hierarchical" or "nccl", meeting its peers through `store`.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "algorithms/collectives/communicator.h"
#include "common/rendezvous/store.h"
#include "common/config.h"

namespace shoal {

// `name` prefixes the store keys, so several communicators of one job never meet the wrong
// peers. The store must outlive the wiring (the constructor's return).
std::unique_ptr<Communicator> MakeWorkerCommunicator(const JobConfig& cfg, int rank, Store& store,
                                                     const std::string& name = "ring");
// [algorithm] collective_timeout_ms: how long a collective may go without progress.
int CollectiveTimeoutMs(const JobConfig& cfg);
// A ring among `members` only (job ranks, ascending, `rank` among them): ring rank i is
// members[i]. The job's ring options ([algorithm] collective_timeout_ms, segment_bytes,
// [security] keys); diloco's outer steps among the live workers (algorithms/live_quorum.h).
std::unique_ptr<Communicator> MakeMemberRing(const JobConfig& cfg, int rank, const std::vector<int>& members,
                                             Store& store, const std::string& name);
// SHOAL_RUN_ID from the launcher, else the Slurm / Open MPI job id, else "0".
std::string RunId();

}  // namespace shoal
