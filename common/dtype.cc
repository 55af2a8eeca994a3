#include "common/dtype.h"

#include <cmath>

#include "common/dtype_bits.h"
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

Precision ParsePrecision(const std::string& name) {
  if (name == "tf32") return Precision(DType::kF32, true);
  if (name == "fp32" || name == "bf16" || name == "fp16") return Precision(ParseDType(name));
  throw Error("expected \"fp32\", \"tf32\", \"bf16\" or \"fp16\", got \"" + name + "\"");
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return dtype_bits::HalfFromFloatBits(x);
}

float HalfToFloat(uint16_t h) {
  uint32_t x = dtype_bits::FloatBitsFromHalf(h);
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return dtype_bits::Bf16FromFloatBits(x);
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

void AddFloats(float* __restrict dst, const void* src, size_t n) {
  // GCC's vector type, loaded and stored by memcpy (no alignment assumed): SSE at the build's
  // -march=x86-64-v2, which -O2 alone does not give this loop (it cannot rule out aliasing).
  typedef float Lanes __attribute__((vector_size(16)));
  auto* in = static_cast<const unsigned char*>(src);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    Lanes a[4], b[4];
    std::memcpy(a, dst + i, sizeof a);
    std::memcpy(b, in + 4 * i, sizeof b);
    for (int k = 0; k < 4; ++k) a[k] += b[k];
    std::memcpy(dst + i, a, sizeof a);
  }
  for (; i < n; ++i) {
    float v;
    std::memcpy(&v, in + 4 * i, 4);
    dst[i] += v;
  }
}

}  // namespace shoal
