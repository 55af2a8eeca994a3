// DGC's top-k on the GPU: the same sampled-threshold selection as SampledTopK (topk.h),
// for gradients that live in device memory: exactly min(k, n) (index, value) pairs of the
// largest |x|, written to device arrays. The threshold comes from a 4096-value sample;
// entries above it are compacted with an atomic counter and trimmed exactly with a cub
// radix sort of the candidates (about k of them), not of all n.
#pragma once
#include <stdexcept>

#include "algorithms/compressors/topk_gpu_kernel.h"
#include "common/error.h"

namespace shoal {

// x: device pointer to n floats; out_idx / out_val: device arrays of at least k entries;
// scratch: device buffer of TopKGpuScratchBytes(n) bytes. Indices get `base` added.
// Synchronous; throws shoal::Error on CUDA errors, "no CUDA device" among them.
inline void SampledTopKGpu(const float* x, int64_t n, int64_t k, int64_t base, uint64_t seed, int32_t* out_idx,
                           float* out_val, void* scratch) {
  try {
    SampledTopKGpuRaw(x, n, k, base, seed, out_idx, out_val, scratch);
  } catch (const std::runtime_error& e) {
    throw Error(e.what());
  }
}

}  // namespace shoal
