// The nvcc-compiled gradient scaling and finite check of CudaDeviceOps (no Shoal headers: nvcc sees only
// this package's own headers).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace shoal {

// p[i] *= f on `stream` (one float product each: the host loop's bits). Returns the launch
// error, cudaSuccess otherwise.
cudaError_t ScaleFloatsDevice(float* p, int64_t n, float f, cudaStream_t stream);

// Sets *flag (device memory) to 1 when any p[i] is NaN or inf, on `stream`; leaves it
// otherwise, so one flag can collect many spans. Returns the launch error.
cudaError_t FlagNonFiniteDevice(const float* p, int64_t n, int* flag, cudaStream_t stream);

}  // namespace shoal
