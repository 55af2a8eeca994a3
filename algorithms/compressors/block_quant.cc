#include "algorithms/compressors/block_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"

namespace shoal {
namespace {

int Levels(BlockQuant q) { return q == BlockQuant::kInt8 ? 127 : 7; }

int64_t PayloadBytes(BlockQuant q, int64_t len) { return q == BlockQuant::kInt8 ? len : (len + 1) / 2; }

}  // namespace

int64_t QuantizedBytes(BlockQuant q, int64_t n) {
  const int64_t full = n / kQuantBlock, last = n % kQuantBlock;
  return full * (4 + PayloadBytes(q, kQuantBlock)) + (last > 0 ? 4 + PayloadBytes(q, last) : 0);
}

void QuantizeBlocks(BlockQuant q, const float* x, int64_t n, uint8_t* out) {
  const int L = Levels(q);
  for (int64_t b = 0; b < n; b += kQuantBlock) {
    const int64_t len = std::min(kQuantBlock, n - b);
    float absmax = 0;
    for (int64_t i = 0; i < len; ++i) {
      SHOAL_CHECK(std::isfinite(x[b + i]), "quantizing: value " + std::to_string(b + i) + " is not finite");
      absmax = std::max(absmax, std::fabs(x[b + i]));
    }
    const float scale = absmax / float(L);
    memcpy(out, &scale, 4);
    out += 4;
    auto level = [&](float v) {
      // absmax / L can round so that |v| / scale lands a hair above L: clamp.
      return scale > 0 ? std::clamp(int(std::lrint(v / scale)), -L, L) : 0;
    };
    if (q == BlockQuant::kInt8) {
      for (int64_t i = 0; i < len; ++i) out[i] = uint8_t(int8_t(level(x[b + i])));
    } else {
      memset(out, 0, size_t(PayloadBytes(q, len)));
      for (int64_t i = 0; i < len; ++i) out[i / 2] |= uint8_t((level(x[b + i]) + 8) << (4 * (i % 2)));
    }
    out += PayloadBytes(q, len);
  }
}

void AddDequantized(BlockQuant q, const uint8_t* in, int64_t bytes, int64_t n, float* acc, const std::string& who) {
  SHOAL_CHECK(bytes == QuantizedBytes(q, n), who + ": " + std::to_string(bytes) + " bytes where " + std::to_string(n) +
                                                 " values take " + std::to_string(QuantizedBytes(q, n)));
  // Check every block first, so a corrupt encoding changes nothing.
  const uint8_t* p = in;
  for (int64_t b = 0; b < n; b += kQuantBlock) {
    const int64_t len = std::min(kQuantBlock, n - b);
    float scale;
    memcpy(&scale, p, 4);
    const std::string where = who + ": block " + std::to_string(b / kQuantBlock);
    SHOAL_CHECK(std::isfinite(scale * float(Levels(q))) && scale >= 0, where + " has scale " + std::to_string(scale));
    const uint8_t* v = p + 4;
    if (q == BlockQuant::kInt8) {
      for (int64_t i = 0; i < len; ++i) SHOAL_CHECK(v[i] != 0x80, where + " holds -128");
    } else {
      for (int64_t i = 0; i < len; ++i) SHOAL_CHECK(((v[i / 2] >> (4 * (i % 2))) & 15) != 0, where + " holds nibble 0");
      SHOAL_CHECK(len % 2 == 0 || (v[len / 2] >> 4) == 0, where + " has a set padding nibble");
    }
    p += 4 + PayloadBytes(q, len);
  }
  for (int64_t b = 0; b < n; b += kQuantBlock) {
    const int64_t len = std::min(kQuantBlock, n - b);
    float scale;
    memcpy(&scale, in, 4);
    const uint8_t* v = in + 4;
    if (q == BlockQuant::kInt8) {
      for (int64_t i = 0; i < len; ++i) acc[b + i] += float(int8_t(v[i])) * scale;
    } else {
      for (int64_t i = 0; i < len; ++i) acc[b + i] += float(int((v[i / 2] >> (4 * (i % 2))) & 15) - 8) * scale;
    }
    in += 4 + PayloadBytes(q, len);
  }
}

}  // namespace shoal
