// The CUDA DeviceUpdater (algorithm.h): LocalUpdater's optimizer for on-device views, with
// DeviceOptimizer (algorithms/optimizers/optimizer_gpu.h) and one DeviceOptimizerState per
// tensor. Its own target so CPU-only targets never link CUDA; MakeAlgorithmEnv plugs it in.
#pragma once
#include <memory>

#include "algorithms/algorithm.h"

namespace shoal {

// The device form of `optimizer` (same rule, same hyper-parameters) on CUDA device
// `device`. Throws "optimizer "x" has no CUDA form" for a rule without one; a missing
// device is reported when the first state is made.
std::unique_ptr<DeviceUpdater> MakeCudaDeviceUpdater(const Optimizer& optimizer, int device);

}  // namespace shoal
