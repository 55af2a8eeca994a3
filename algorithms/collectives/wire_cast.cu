// fp32 <-> fp16/bf16 of device buffers with common/dtype_bits.h, the steps the host's
// EncodeFloats / DecodeFloats take, so both paths round every value to the same bits.
#include "algorithms/collectives/wire_cast_kernel.h"
#include "common/dtype_bits.h"

#include <cstring>

namespace shoal {
namespace {

__device__ uint16_t ToHalf(float f) { return dtype_bits::HalfFromFloatBits(__float_as_uint(f)); }
__device__ float FromHalf(uint16_t h) { return __uint_as_float(dtype_bits::FloatBitsFromHalf(h)); }
__device__ uint16_t ToBf16(float f) { return dtype_bits::Bf16FromFloatBits(__float_as_uint(f)); }
__device__ float FromBf16(uint16_t h) { return __uint_as_float(dtype_bits::FloatBitsFromBf16(h)); }

__global__ void Encode(const float* src, int64_t n, int wire, uint16_t* dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = wire == 1 ? ToHalf(src[i]) : ToBf16(src[i]);
}

__global__ void Decode(const uint16_t* src, int64_t n, int wire, float* dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = wire == 1 ? FromHalf(src[i]) : FromBf16(src[i]);
}

unsigned Blocks(int64_t n) {
  int64_t b = (n + 255) / 256;
  return unsigned(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

}  // namespace

cudaError_t WireEncodeDevice(const float* src, int64_t n, int wire, void* dst, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (wire != 1 && wire != 2) return cudaErrorInvalidValue;
  Encode<<<Blocks(n), 256, 0, stream>>>(src, n, wire, static_cast<uint16_t*>(dst));
  return cudaGetLastError();
}

cudaError_t WireDecodeDevice(const void* src, int64_t n, int wire, float* dst, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (wire != 1 && wire != 2) return cudaErrorInvalidValue;
  Decode<<<Blocks(n), 256, 0, stream>>>(static_cast<const uint16_t*>(src), n, wire, dst);
  return cudaGetLastError();
}

}  // namespace shoal
