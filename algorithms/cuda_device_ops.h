// The CUDA DeviceOps (algorithm.h): LocalUpdater's optimizer for on-device views with
// DeviceOptimizer (algorithms/optimizers/optimizer_gpu.h, one DeviceOptimizerState per
// tensor), the fusion buffer's memory and copies, gradient scaling. Its own target so
// CPU-only targets never link CUDA; MakeAlgorithmEnv plugs it in for a CUDA worker.
#pragma once
#include <memory>

#include "algorithms/algorithm.h"

namespace shoal {

// On CUDA device `device`. NewUpdater throws "optimizer "x" has no CUDA form" for a rule
// without one; a missing device is reported by the first call that touches it.
std::shared_ptr<DeviceOps> MakeCudaDeviceOps(int device);

}  // namespace shoal
