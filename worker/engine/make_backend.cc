// Device dispatch lives apart from backend.cc so the CUDA backend can link against the
// shared helpers without a dependency cycle.
#include "common/error.h"
#include "worker/engine/backend.h"

namespace shoal {

std::unique_ptr<Backend> MakeBackend(const Device& d, int threads) {
  if (d.is_cpu()) return MakeCpuBackend(threads);
  return MakeCudaBackend(d.index);
}

}  // namespace shoal
