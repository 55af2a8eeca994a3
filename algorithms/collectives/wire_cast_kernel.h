// The nvcc-compiled fp16/bf16 wire casts of NcclComm's device path (no Shoal headers: nvcc
// sees only this package). Rounding is round-to-nearest-even with the NaN/Inf/subnormal
// handling of common/dtype's EncodeFloats, bit for bit, so a device buffer reduced over an
// fp16/bf16 wire gives the bits a host buffer gives (tests/collectives/nccl_test.cc).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace shoal {

// wire: 1 = fp16, 2 = bf16 (DType's values). Asynchronous on `stream`; returns the launch
// error, cudaSuccess otherwise. n may be 0.
cudaError_t WireEncodeDevice(const float* src, int64_t n, int wire, void* dst, cudaStream_t stream);
cudaError_t WireDecodeDevice(const void* src, int64_t n, int wire, float* dst, cudaStream_t stream);

}  // namespace shoal
