// Dense values quantized in blocks with one scale each (absmax): diloco's int8 and int4
// pseudo-gradients on the wire. A block is kQuantBlock values (the last may be shorter):
// its fp32 scale s = absmax / L (little-endian, 4 bytes), then every value as the integer
// q = round(x / s) in [-L, L] (L = 127 for int8, one byte each; L = 7 for int4, q + 8 in a
// nibble, two per byte, low nibble first, a 0 nibble padding an odd block). A value decodes
// to q x s, so its error is at most s / 2 = absmax / (2L) of its block. Sizes follow from n,
// which sender and receiver both know: nothing on the wire says how long anything is.
#pragma once
#include <cstdint>
#include <string>

namespace shoal {

enum class BlockQuant { kInt8, kInt4 };

constexpr int64_t kQuantBlock = 256;

// Bytes of an encoding of n values.
int64_t QuantizedBytes(BlockQuant q, int64_t n);
// Encodes n values into out (QuantizedBytes(q, n) bytes). Throws shoal::Error naming the
// first value that is not finite.
void QuantizeBlocks(BlockQuant q, const float* x, int64_t n, uint8_t* out);
// acc[i] += the i-th decoded value, for an encoding of n values in `bytes` bytes. A corrupt
// encoding (wrong size, a scale that is negative or so large that L x scale is not finite, an
// integer the encoder never writes: -128 in int8, nibble 0 or a set padding nibble in int4)
// throws shoal::Error naming `who` and the block, before acc is touched.
void AddDequantized(BlockQuant q, const uint8_t* in, int64_t bytes, int64_t n, float* acc, const std::string& who);

}  // namespace shoal
