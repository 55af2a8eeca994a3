// How a shard applies pushed gradients (op = apply) for the parameter-server algorithms,
// using the same optimizers as the workers (algorithms/optimizers). The workers' training
// plan (sent at registration) says which rule the algorithm wants:
//   apply_each (ps_async, ps_ssp): every push is applied at once (one worker's step);
//   mean_of_workers (ps_sync): pushes are summed until all workers' gradients for the step
//            are in, then the mean is applied once.
// The learning rate follows the plan's schedule; the step is counted in global steps
// (pushes / workers for apply_each). Tensors of one dimension (bias, batch-norm scale and
// shift) get no weight decay, as on the workers.
#pragma once
#include <memory>

#include "common/config.h"
#include "server/kv_shard.h"

namespace shoal {

// The job's [optimizer] as a shard's update rule, waiting for the workers' plan.
std::unique_ptr<UpdateRule> MakeServerUpdateRule(const JobConfig& cfg);

}  // namespace shoal
