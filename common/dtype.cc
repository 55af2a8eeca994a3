#include "common/dtype.h"

#include <cmath>

#include "common/error.h"

namespace shoal {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "fp32";
    case DType::kF16:
      return "fp16";
    case DType::kBF16:
      return "bf16";
  }
  return "unknown";
}

DType ParseDType(const std::string& name) {
  if (name == "fp32" || name == "float32") return DType::kF32;
  if (name == "fp16" || name == "float16") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  throw Error("unknown dtype '" + name + "' (expected fp32, fp16 or bf16)");
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
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

float HalfToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: normalize
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
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);  // quiet nan
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return uint16_t(x >> 16);
}

void EncodeFloats(const float* src, size_t n, DType t, void* dst) {
  if (t == DType::kF32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  auto* out = static_cast<uint16_t*>(dst);
  if (t == DType::kF16)
    for (size_t i = 0; i < n; ++i) out[i] = FloatToHalf(src[i]);
  else
    for (size_t i = 0; i < n; ++i) out[i] = FloatToBf16(src[i]);
}

void DecodeFloats(const void* src, size_t n, DType t, float* dst) {
  if (t == DType::kF32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  // Received frames may start at any byte offset: load each half by memcpy, never through
  // a misaligned uint16_t pointer.
  auto* in = static_cast<const unsigned char*>(src);
  auto at = [in](size_t i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    return h;
  };
  if (t == DType::kF16)
    for (size_t i = 0; i < n; ++i) dst[i] = HalfToFloat(at(i));
  else
    for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(at(i));
}

}  // namespace shoal
