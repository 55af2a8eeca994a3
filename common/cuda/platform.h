// CUDA runtime facts every GPU user needs (the engine's CUDA backend, NCCL, GPU top-k),
// without linking cuDNN or cuBLAS. Links only libcudart, never the driver, so binaries load
// on machines without a GPU and report "no device" there.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

namespace shoal {

// Number of usable CUDA devices (0 without a driver or GPU); *why gets the reason.
int CudaDeviceCount(std::string* why = nullptr);

// Throws shoal::Error("<where>: <CUDA message>") when e is not cudaSuccess, clearing the
// sticky error first so the next call starts clean.
void CheckCuda(cudaError_t e, const std::string& where);

}  // namespace shoal
