// oneDNN glue private to the CPU backend.
#pragma once
#include <dnnl.hpp>

#include "worker/engine/cpu/cpu_backend.h"

namespace shoal {

struct CpuBackend::Dnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
};

}  // namespace shoal
