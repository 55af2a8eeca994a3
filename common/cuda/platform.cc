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

namespace {

// "driver supports CUDA 12.4, runtime 13.0": a driver older than the runtime is the usual
// reason nvidia-smi shows a GPU that CUDA cannot use.
std::string CudaVersions() {
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  auto v = [](int x) { return std::to_string(x / 1000) + "." + std::to_string((x % 1000) / 10); };
  return (driver == 0 ? std::string("no NVIDIA driver loaded") : "driver supports CUDA " + v(driver)) + ", runtime " +
         v(runtime);
}

}  // namespace

int CudaDeviceCount(std::string* why, bool* transient) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (transient) *transient = e != cudaSuccess && !CudaErrorIsPermanent(e);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = std::string(cudaGetErrorString(e)) + " (" + CudaVersions() + ")";
    return 0;
  }
  if (why)
    *why =
        n > 0 ? std::to_string(n) + " CUDA device(s)" : "cudaGetDeviceCount found 0 devices (" + CudaVersions() + ")";
  return n;
}

void CheckCuda(cudaError_t e, const std::string& where) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  if (!CudaErrorIsPermanent(e)) throw TransientError(where + ": " + cudaGetErrorString(e));
  throw Error(where + ": " + cudaGetErrorString(e));
}

namespace {

class CudaFence : public DeviceFence {
 public:
  explicit CudaFence(cudaEvent_t e) : event_(e) {}
  ~CudaFence() override { cudaEventDestroy(event_); }
  void Wait() const override { CheckCuda(cudaEventSynchronize(event_), "CudaFence::Wait"); }
  void* native() const override { return event_; }

 private:
  cudaEvent_t event_;
};

}  // namespace

std::shared_ptr<const DeviceFence> RecordCudaFence(cudaStream_t stream, const std::string& where) {
  cudaEvent_t e = nullptr;
  CheckCuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), where + ": cudaEventCreate");
  auto fence = std::make_shared<CudaFence>(e);
  CheckCuda(cudaEventRecord(e, stream), where + ": cudaEventRecord");
  return fence;
}

}  // namespace shoal
