#include "common/cuda/platform.h"

#include "common/error.h"

namespace shoal {

int CudaDeviceCount(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  if (why) *why = n > 0 ? std::to_string(n) + " CUDA device(s)" : "cudaGetDeviceCount found 0 devices";
  return n;
}

void CheckCuda(cudaError_t e, const std::string& where) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  throw Error(where + ": " + cudaGetErrorString(e));
}

}  // namespace shoal
