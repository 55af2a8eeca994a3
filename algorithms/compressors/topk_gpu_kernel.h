// The nvcc-compiled half of topk_gpu.h (no Shoal headers: nvcc sees only this package).
#pragma once
#include <cstddef>
#include <cstdint>

namespace shoal {

// Throws std::runtime_error; use SampledTopKGpu (topk_gpu.h), which turns it into shoal::Error.
void SampledTopKGpuRaw(const float* x, int64_t n, int64_t k, int64_t base, uint64_t seed, int32_t* out_idx,
                       float* out_val, void* scratch);
size_t TopKGpuScratchBytes(int64_t n);

}  // namespace shoal
