// The fp16 and bf16 roundings as integer steps on a float's bits, written once for the host
// (common/dtype.cc) and the device (algorithms/collectives/wire_cast.cu): both paths round
// every value to the same bits (CUDA's __float2half_rn differs in NaN payloads). Round to
// nearest even; overflow to infinity; NaN stays a quiet NaN.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define SHOAL_HOST_DEVICE __host__ __device__
#else
#define SHOAL_HOST_DEVICE
#endif

namespace shoal {
namespace dtype_bits {

SHOAL_HOST_DEVICE inline uint16_t HalfFromFloatBits(uint32_t x) {
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x007fffffu;
  int32_t exp = int32_t((x >> 23) & 0xff);
  if (exp == 0xff) return uint16_t(sign | 0x7c00u | (mant ? 0x200u : 0));  // inf / nan
  exp = exp - 127 + 15;
  if (exp >= 0x1f) return uint16_t(sign | 0x7c00u);  // overflow -> inf
  if (exp <= 0) {                                    // subnormal or zero
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
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) ++half;  // may carry into exp: fine
  return uint16_t(half);
}

SHOAL_HOST_DEVICE inline uint32_t FloatBitsFromHalf(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return sign;
    int e = -1;  // subnormal: normalize
    do {
      ++e;
      mant <<= 1;
    } while (!(mant & 0x400u));
    return sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  if (exp == 0x1f) return sign | 0x7f800000u | (mant << 13);
  return sign | ((exp + 127 - 15) << 23) | (mant << 13);
}

SHOAL_HOST_DEVICE inline uint16_t Bf16FromFloatBits(uint32_t x) {
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);  // quiet nan
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return uint16_t(x >> 16);
}

SHOAL_HOST_DEVICE inline uint32_t FloatBitsFromBf16(uint16_t h) { return uint32_t(h) << 16; }

}  // namespace dtype_bits
}  // namespace shoal
