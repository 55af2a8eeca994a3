// Device dispatch lives apart from backend.cc so the CUDA backend can link against the
// shared helpers without a dependency cycle.
#include "worker/engine/backend.h"

#include "common/dtype.h"

namespace shoal {

std::unique_ptr<Backend> MakeBackend(const Device& d, int threads, const Precision& p) {
  if (d.is_cpu()) return MakeCpuBackend(threads, p.compute);
  return MakeCudaBackend(d.index, p.compute, p.tf32);
}

}  // namespace shoal
