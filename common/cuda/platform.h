// CUDA runtime facts every GPU user needs (the engine's CUDA backend, NCCL, GPU top-k),
// without linking cuDNN or cuBLAS. Links only libcudart, never the driver, so binaries load
// on machines without a GPU and report "no device" there.
#pragma once
#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "common/device_fence.h"

namespace shoal {

// Number of usable CUDA devices (0 without a driver or GPU); *why gets the reason, and
// *transient whether a retry may find them (devices busy or not ready, rather than none).
int CudaDeviceCount(std::string* why = nullptr, bool* transient = nullptr);

// Whether `e` says what this machine lacks (no device or driver, a device index beyond
// those present, an unsupported feature): the same on every retry. Everything else (out of
// memory, a busy or failed device, a launch failure) may pass.
bool CudaErrorIsPermanent(cudaError_t e);

// Throws shoal::Error("<where>: <CUDA message>") when e is not cudaSuccess (TransientError
// unless CudaErrorIsPermanent), clearing the sticky error first so the next call starts clean.
void CheckCuda(cudaError_t e, const std::string& where);

// A marker of the work queued on `stream` so far (a cudaEvent recorded there, destroyed with
// the fence); `where` names the caller in errors.
std::shared_ptr<const DeviceFence> RecordCudaFence(cudaStream_t stream, const std::string& where);

}  // namespace shoal
