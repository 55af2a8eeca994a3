// Device twins of common/dtype.cc's FloatToHalf / HalfToFloat / FloatToBf16 / Bf16ToFloat:
// the same integer steps (not __float2half_rn, whose NaN payloads differ), so both paths
// round every value to the same bits.
#include "algorithms/collectives/wire_cast_kernel.h"

#include <cstring>

namespace shoal {
namespace {

__device__ uint16_t ToHalf(float f) {
  uint32_t x = __float_as_uint(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x007fffffu;
  int32_t exp = int32_t((x >> 23) & 0xff);
  if (exp == 0xff) return uint16_t(sign | 0x7c00u | (mant ? 0x200u : 0));
  exp = exp - 127 + 15;
  if (exp >= 0x1f) return uint16_t(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return uint16_t(sign);
    mant |= 0x00800000u;
    uint32_t shift = uint32_t(14 - exp);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = sign | (uint32_t(exp) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;
  return uint16_t(half);
}

__device__ float FromHalf(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while (!(mant & 0x400u));
      x = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return __uint_as_float(x);
}

__device__ uint16_t ToBf16(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return uint16_t(x >> 16);
}

__device__ float FromBf16(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

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
