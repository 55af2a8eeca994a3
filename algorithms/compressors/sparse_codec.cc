#include "algorithms/compressors/sparse_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/dtype.h"
#include "common/error.h"

namespace shoal {
namespace {

// A tensor's largest value goes to [2^14, 2^15) before rounding to fp16 (ilogb of a
// finite float is at most 127, so e <= 113), and no exponent goes below -125, where every
// fp16 value x 2^e is still an exact fp32 (fp16's finest step, 2^-24, times 2^-125 is fp32's
// finest): decoding never rounds, so decoded pairs encode to the same bytes. A tensor whose
// largest value is under 2^-111 sends zeros under e = 0 and keeps the values in its
// residual.
constexpr int kMaxExp = 127 - 14, kMinExp = -125;
constexpr uint16_t kBelow2To15 = 0x77ff;  // 32752, fp16's largest value under 2^15

int IndexBits(int64_t n) {
  int b = 1;
  while (b < 63 && (int64_t(1) << b) < n) ++b;
  return b;
}

void CheckLayout(const SparseLayout& l) {
  SHOAL_CHECK(l.sizes.size() == l.counts.size(), "dgc encoding: layout has " + std::to_string(l.sizes.size()) +
                                                     " tensor sizes but " + std::to_string(l.counts.size()) +
                                                     " pair counts");
  for (size_t t = 0; t < l.sizes.size(); ++t)
    SHOAL_CHECK(l.sizes[t] >= 0 && l.sizes[t] <= std::numeric_limits<int32_t>::max() && l.counts[t] >= 0 &&
                    l.counts[t] <= l.sizes[t],
                "dgc encoding: tensor " + std::to_string(t) + " has " + std::to_string(l.counts[t]) + " pairs for " +
                    std::to_string(l.sizes[t]) + " elements");
}

}  // namespace

int64_t SparseEncodedBytes(const SparseLayout& l) {
  CheckLayout(l);
  int64_t pairs = 0, bits = 0;
  for (size_t t = 0; t < l.sizes.size(); ++t) {
    pairs += l.counts[t];
    bits += l.counts[t] * IndexBits(l.sizes[t]);
  }
  return int64_t(l.sizes.size()) + 2 * pairs + (bits + 7) / 8;
}

std::vector<uint8_t> SparseEncode(const SparseLayout& l, const std::vector<int32_t>& idx, std::vector<float>* val) {
  const int64_t bytes = SparseEncodedBytes(l);
  const size_t T = l.sizes.size();
  int64_t pairs = 0;
  for (int64_t c : l.counts) pairs += c;
  SHOAL_CHECK(int64_t(idx.size()) == pairs && int64_t(val->size()) == pairs,
              "dgc encoding: " + std::to_string(idx.size()) + " indices and " + std::to_string(val->size()) +
                  " values for a layout of " + std::to_string(pairs) + " pairs");
  std::vector<uint8_t> out(size_t(bytes), 0);
  uint8_t* values = out.data() + T;
  uint8_t* bits = values + 2 * pairs;
  uint64_t acc = 0;
  int fill = 0;
  size_t p = 0;
  for (size_t t = 0; t < T; ++t) {
    const size_t first = p, end = p + size_t(l.counts[t]);
    float m = 0;
    for (size_t q = first; q < end; ++q) {
      float v = (*val)[q];
      SHOAL_CHECK(std::isfinite(v), "dgc encoding: tensor " + std::to_string(t) + "'s value " +
                                        std::to_string(q - first) + " is not finite");
      m = std::max(m, std::fabs(v));
    }
    const bool tiny = m > 0 && std::ilogb(m) - 14 < kMinExp;
    const int e = m == 0 || tiny ? 0 : std::ilogb(m) - 14;
    out[t] = uint8_t(int8_t(e));
    const int b = IndexBits(l.sizes[t]);
    for (size_t q = first; q < end; ++q) {
      int32_t i = idx[q];
      SHOAL_CHECK(i >= 0 && i < l.sizes[t] && (q == first || i > idx[q - 1]),
                  "dgc encoding: tensor " + std::to_string(t) + "'s index " + std::to_string(i) + " is outside its " +
                      std::to_string(l.sizes[t]) + " elements or not above the one before");
      uint16_t h = tiny ? 0 : FloatToHalf(std::ldexp((*val)[q], -e));  // a zero keeps its sign
      // Rounding up to 2^15 would make the largest value another exponent's: round down.
      if ((h & 0x7fff) > kBelow2To15) h = uint16_t((h & 0x8000) | kBelow2To15);
      (*val)[q] = std::ldexp(HalfToFloat(h), e);
      values[2 * q] = uint8_t(h & 0xff);
      values[2 * q + 1] = uint8_t(h >> 8);
      acc |= uint64_t(uint32_t(i)) << fill;
      fill += b;
      while (fill >= 8) {
        *bits++ = uint8_t(acc & 0xff);
        acc >>= 8;
        fill -= 8;
      }
    }
    p = end;
  }
  if (fill > 0) *bits++ = uint8_t(acc & 0xff);
  return out;
}

void SparseDecode(const SparseLayout& l, const uint8_t* data, int64_t bytes, std::vector<int32_t>* idx,
                  std::vector<float>* val, const std::string& who) {
  const int64_t want = SparseEncodedBytes(l);
  if (bytes != want)
    throw Error("dgc: " + who + "'s encoding has " + std::to_string(bytes) + " bytes where this step's layout has " +
                std::to_string(want));
  const size_t T = l.sizes.size();
  int64_t pairs = 0;
  for (int64_t c : l.counts) pairs += c;
  idx->assign(size_t(pairs), 0);
  val->assign(size_t(pairs), 0.f);
  const uint8_t* values = data + T;
  const uint8_t* bits = values + 2 * pairs;
  uint64_t acc = 0;
  int fill = 0;
  size_t p = 0;
  auto bad = [&](size_t t, const std::string& what) {
    return Error("dgc: " + who + "'s encoding is corrupt: tensor " + std::to_string(t) + " (" +
                 std::to_string(l.sizes[t]) + " elements): " + what);
  };
  for (size_t t = 0; t < T; ++t) {
    const int e = int8_t(data[t]);
    if (e > kMaxExp || e < kMinExp)
      throw bad(t, "exponent " + std::to_string(e) + " outside an encoder's [" + std::to_string(kMinExp) + ", " +
                       std::to_string(kMaxExp) + "]");
    const int b = IndexBits(l.sizes[t]);
    float top = 0;
    for (int64_t c = 0; c < l.counts[t]; ++c, ++p) {
      while (fill < b) {
        acc |= uint64_t(*bits++) << fill;
        fill += 8;
      }
      int64_t i = int64_t(acc & ((uint64_t(1) << b) - 1));
      acc >>= b;
      fill -= b;
      if (i >= l.sizes[t]) throw bad(t, "index " + std::to_string(i) + " outside it");
      if (c > 0 && i <= (*idx)[p - 1])
        throw bad(t,
                  "index " + std::to_string(i) + " not above the one before (" + std::to_string((*idx)[p - 1]) + ")");
      uint16_t h = uint16_t(values[2 * p] | (uint16_t(values[2 * p + 1]) << 8));
      float v = std::ldexp(HalfToFloat(h), e);
      if (!std::isfinite(v)) throw bad(t, "value at index " + std::to_string(i) + " decodes to " + std::to_string(v));
      (*idx)[p] = int32_t(i);
      (*val)[p] = v;
      top = std::max(top, std::fabs(HalfToFloat(h)));
    }
    // The exponent the encoder picks for these values, so that every accepted encoding is
    // the one the encoder writes for what it decodes to.
    bool canonical = top == 0 ? e == 0 : top >= 16384.f && top < 32768.f;
    if (!canonical)
      throw bad(t, "exponent " + std::to_string(e) + " leaves its largest value at " + std::to_string(top) +
                       " x 2^e, where an encoder puts it in [2^14, 2^15)");
  }
  // What is left of the last byte: padding, which the encoder leaves 0.
  if (acc != 0) throw Error("dgc: " + who + "'s encoding is corrupt: non-zero padding after the last index");
}

void SparseDecodeAdd(const SparseLayout& l, const uint8_t* data, int64_t bytes, float* out, const std::string& who) {
  std::vector<int32_t> idx;
  std::vector<float> val;
  SparseDecode(l, data, bytes, &idx, &val, who);
  size_t p = 0;
  int64_t base = 0;
  for (size_t t = 0; t < l.sizes.size(); ++t) {
    for (int64_t c = 0; c < l.counts[t]; ++c, ++p) out[base + idx[p]] += val[p];
    base += l.sizes[t];
  }
}

}  // namespace shoal
