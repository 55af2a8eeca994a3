// Argument checks and the parallel threshold the CPU backend's source files share.
#pragma once
#include <string>

#include "common/error.h"
#include "worker/engine/tensor.h"

namespace shoal {

// Below this many elements an OpenMP fork costs more than the loop.
constexpr int64_t kParallelMin = 1 << 15;

inline void CheckF32(const Tensor& t, const char* op, const char* arg) {
  SHOAL_CHECK(t.defined(), std::string("CpuBackend::") + op + ": " + arg + " is undefined");
  SHOAL_CHECK(t.dtype() == DType::kF32, std::string("CpuBackend::") + op + ": " + arg + " is " + DTypeName(t.dtype()) +
                                            ", the CPU backend computes in fp32 only");
  SHOAL_CHECK(t.device().is_cpu(),
              std::string("CpuBackend::") + op + ": " + arg + " lives on " + t.device().ToString() + ", not the CPU");
}

inline void CheckSameShape(const Tensor& a, const Tensor& b, const char* op) {
  SHOAL_CHECK(a.shape() == b.shape(), std::string("CpuBackend::") + op + ": shapes " + ShapeString(a.shape()) +
                                          " and " + ShapeString(b.shape()) + " differ");
}

}  // namespace shoal
