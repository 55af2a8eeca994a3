#include "common/cuda/platform.h"

#include "common/error.h"

namespace shoal {

bool CudaErrorIsPermanent(cudaError_t e) {
  switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorNotSupported:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorCompatNotSupportedOnDevice:
      return true;
    default:
      return false;
  }
}

int CudaDeviceCount(std::string* why, bool* transient) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (transient) *transient = e != cudaSuccess && !CudaErrorIsPermanent(e);
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
  if (!CudaErrorIsPermanent(e)) throw TransientError(where + ": " + cudaGetErrorString(e));
  throw Error(where + ": " + cudaGetErrorString(e));
}

}  // namespace shoal
