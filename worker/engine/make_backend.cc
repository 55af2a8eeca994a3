// Device dispatch lives apart from backend.cc so the CUDA backend can link against the
// shared helpers without a dependency cycle.
#include "common/error.h"
#include "worker/engine/backend.h"

namespace shoal {

std::unique_ptr<Backend> MakeBackend(const Device& d, int threads, DType compute) {
  if (d.is_cpu()) return MakeCpuBackend(threads, compute);
  SHOAL_CHECK(compute == DType::kF32, std::string("[model] precision = \"") + DTypeName(compute) + "\" on " +
                                          d.ToString() +
                                          ": mixed precision on CUDA workers is not built yet; use \"fp32\" there");
  return MakeCudaBackend(d.index);
}

}  // namespace shoal
