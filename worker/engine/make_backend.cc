// Device dispatch lives apart from backend.cc so the CUDA backend can link against the
// shared helpers without a dependency cycle.
#include "worker/engine/backend.h"

namespace shoal {

std::unique_ptr<Backend> MakeBackend(const Device& d, int threads, DType compute) {
  if (d.is_cpu()) return MakeCpuBackend(threads, compute);
  return MakeCudaBackend(d.index, compute);
}

}  // namespace shoal
