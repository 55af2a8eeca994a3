// Element types of tensors on the wire and in memory, and fp16/bf16 conversion.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace shoal {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// Tensor shapes Shoal accepts anywhere (the wire, checkpoints): one limit, so a tensor a
// shard accepted can always be checkpointed and loaded again.
constexpr size_t kMaxTensorDims = 8;
constexpr int64_t kMaxTensorDimSize = int64_t(1) << 40;     // elements along one dimension
constexpr uint64_t kMaxTensorElements = uint64_t(1) << 40;  // elements in all

inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }
const char* DTypeName(DType t);
// Parses "fp32" | "fp16" | "bf16"; throws shoal::Error naming the bad value otherwise.
DType ParseDType(const std::string& name);

// A job's [model] precision: "fp32" | "tf32" | "bf16" | "fp16". tf32 is fp32 with TF32
// tensor-core math on CUDA workers, and plain fp32 on CPU workers (CPUs have no TF32).
struct Precision {
  Precision(DType c = DType::kF32, bool t = false) : compute(c), tf32(t) {}  // NOLINT: a DType is a precision
  DType compute;
  bool tf32;
};
// Throws shoal::Error "expected "fp32", "tf32", "bf16" or "fp16", got "NAME"".
Precision ParsePrecision(const std::string& name);

uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBf16(float f);  // round to nearest even
inline float Bf16ToFloat(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Converts n fp32 values to dst's type (dst holds n * DTypeSize(t) bytes) and back.
void EncodeFloats(const float* src, size_t n, DType t, void* dst);
void DecodeFloats(const void* src, size_t n, DType t, float* dst);

// dst[i] += src's i-th fp32 value, for n values; src may start at any byte offset (a received
// frame) and must not overlap dst. Four lanes at a time: the ring and the shards sum whole
// tensors with it, and a float-by-float loop measured as a sixth of a ring all-reduce's time.
void AddFloats(float* dst, const void* src, size_t n);

}  // namespace shoal
