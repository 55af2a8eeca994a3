// A bf16 matrix product's oneDNN primitive, built once per shape and reused every step.
#pragma once
#include <dnnl.hpp>
#include <cstdint>
#include <vector>

#include "worker/engine/cpu/cpu_backend.h"

namespace shoal {

struct CpuBackend::MatmulPlan {
  dnnl::matmul prim;
  dnnl::memory a, b, c, scratch;
  std::vector<uint16_t> a16, b16;  // the operands rounded to bf16
};

}  // namespace shoal
