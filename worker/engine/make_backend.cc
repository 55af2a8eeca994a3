// Device dispatch lives apart from backend.cc so the CUDA backend can link against the
// shared helpers without a dependency cycle.
#include "worker/engine/backend.h"

#include "common/dtype.h"
#include "common/error.h"

namespace shoal {

Precision ParsePrecision(const std::string& name) {
  if (name == "tf32") return Precision(DType::kF32, true);
  if (name == "fp32" || name == "bf16" || name == "fp16") return Precision(ParseDType(name));
  throw Error("precision \"" + name + "\": expected fp32, tf32, bf16 or fp16");
}

std::unique_ptr<Backend> MakeBackend(const Device& d, int threads, const Precision& p) {
  if (d.is_cpu()) return MakeCpuBackend(threads, p.compute);
  return MakeCudaBackend(d.index, p.compute, p.tf32);
}

}  // namespace shoal
