// Fuzzes the block-scaled int8/int4 decoder (algorithms/compressors/block_quant.h), which reads
// what other workers send (diloco's outer_wire):
//   u8 (bit 0: int4), u32 n (< 2^16), then the encoding (the rest)
// It must refuse with shoal::Error leaving the accumulator untouched, or decode to finite
// values no larger than their block's scale x L; encoding those values again and decoding
// gives them back within half a step of the new scale.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "algorithms/compressors/block_quant.h"
#include "common/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shoal::fuzz::Reader in{data, size};
  const shoal::BlockQuant q = in.U8() & 1 ? shoal::BlockQuant::kInt4 : shoal::BlockQuant::kInt8;
  const int64_t n = int64_t(in.U32() % (1u << 16));
  std::vector<float> acc(size_t(n), 1.f);
  try {
    shoal::AddDequantized(q, in.p, int64_t(in.n), n, acc.data(), "fuzz");
  } catch (const shoal::Error&) {
    for (float v : acc)
      if (v != 1.f) abort();  // refused before anything was added
    return 0;
  }
  // Accepted: the values alone (added onto 1 they would round).
  std::fill(acc.begin(), acc.end(), 0.f);
  shoal::AddDequantized(q, in.p, int64_t(in.n), n, acc.data(), "fuzz");
  const float L = q == shoal::BlockQuant::kInt8 ? 127.f : 7.f;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; b += shoal::kQuantBlock) {
    float scale;
    memcpy(&scale, in.p + b / shoal::kQuantBlock * (shoal::QuantizedBytes(q, shoal::kQuantBlock)), 4);
    for (int64_t i = b; i < std::min(n, b + shoal::kQuantBlock); ++i) {
      x[size_t(i)] = acc[size_t(i)];
      if (!std::isfinite(acc[size_t(i)]) || std::fabs(x[size_t(i)]) > scale * L * 1.0001f + 1e-30f) abort();
    }
  }
  std::vector<uint8_t> wire(size_t(shoal::QuantizedBytes(q, n)));
  shoal::QuantizeBlocks(q, x.data(), n, wire.data());
  std::vector<float> back(size_t(n), 0.f);
  shoal::AddDequantized(q, wire.data(), int64_t(wire.size()), n, back.data(), "fuzz again");
  for (int64_t b = 0; b < n; b += shoal::kQuantBlock) {
    float scale;
    memcpy(&scale, wire.data() + b / shoal::kQuantBlock * (shoal::QuantizedBytes(q, shoal::kQuantBlock)), 4);
    for (int64_t i = b; i < std::min(n, b + shoal::kQuantBlock); ++i)
      if (std::fabs(back[size_t(i)] - x[size_t(i)]) > scale / 2 * 1.0001f + 1e-30f) abort();
  }
  return 0;
}
