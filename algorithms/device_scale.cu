#include "algorithms/device_scale.h"

namespace shoal {
namespace {

__global__ void ScaleKernel(float* p, int64_t n, float f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __fmul_rn(p[i], f);  // never fused into anything: the host's product
}

__global__ void FlagNonFiniteKernel(const float* p, int64_t n, int* flag) {
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    bad |= !isfinite(p[i]);
  if (bad) *flag = 1;  // a benign race: every writer writes 1
}

int Blocks(int64_t n) {
  int64_t blocks = (n + 255) / 256;
  return int(blocks < 4096 ? blocks : 4096);
}

}  // namespace

cudaError_t FlagNonFiniteDevice(const float* p, int64_t n, int* flag, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  FlagNonFiniteKernel<<<unsigned(Blocks(n)), 256, 0, stream>>>(p, n, flag);
  return cudaGetLastError();
}

cudaError_t ScaleFloatsDevice(float* p, int64_t n, float f, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ScaleKernel<<<unsigned(Blocks(n)), 256, 0, stream>>>(p, n, f);
  return cudaGetLastError();
}

}  // namespace shoal
