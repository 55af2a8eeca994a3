// A deliberately naive host implementation of the Backend contract (plain loops, double
// accumulators), used as an independent oracle for the CUDA backend where the oneDNN
// engine is not at hand. Test-only: slow and fp32-only.
#pragma once
#include <memory>

#include "worker/engine/backend.h"

namespace shoal {
std::unique_ptr<Backend> MakeHostReferenceBackend();
}  // namespace shoal
