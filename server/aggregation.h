// How a shard applies pushed gradients for the parameter-server algorithms, using the same
// optimizers as the workers (algorithms/optimizers):
//   ps_async, ps_ssp: every push is applied at once (one worker's step);
//   ps_sync: pushes are summed until all `world` workers' gradients for the step are in,
//            then the mean is applied once.
// The learning rate follows the job's schedule; the step is counted in global steps
// (pushes / world for async). Tensors of one dimension (bias, batch-norm scale and shift)
// get no weight decay, as on the workers.
#pragma once
#include <memory>

#include "common/config.h"
#include "server/kv_shard.h"

namespace shoal {

// Steps per epoch of one worker, computed from the training set exactly as the workers'
// data loader does, so the server's schedule lines up with theirs.
int64_t StepsPerEpoch(const JobConfig& cfg);

// nullptr when the job's algorithm does not use a server-side optimizer.
std::unique_ptr<UpdateRule> MakeServerUpdateRule(const JobConfig& cfg);

}  // namespace shoal
