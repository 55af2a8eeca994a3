// Fuzzes dgc's wire decoder (algorithms/compressors/sparse_codec.h), which reads what other
// workers send:
//   u8 tensors (1-4), per tensor u32 size (< 2^20) and u16 pairs (clamped to size), then the
//   encoding (the rest)
// It must refuse with shoal::Error or return pairs the encoder writes the same bytes for.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "algorithms/compressors/sparse_codec.h"
#include "common/error.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shoal::fuzz::Reader in{data, size};
  shoal::SparseLayout l;
  int tensors = 1 + int(in.U8() % 4);
  for (int t = 0; t < tensors; ++t) {
    int64_t n = int64_t(in.U32() % (1u << 20));
    l.sizes.push_back(n);
    l.counts.push_back(std::min<int64_t>(n, in.U16()));
  }
  std::vector<int32_t> idx;
  std::vector<float> val;
  try {
    shoal::SparseDecode(l, in.p, int64_t(in.n), &idx, &val, "fuzz");
  } catch (const shoal::Error&) {
    return 0;
  }
  size_t q = 0;
  for (size_t t = 0; t < l.sizes.size(); ++t)
    for (int64_t c = 0; c < l.counts[t]; ++c, ++q)
      if (idx[q] < 0 || idx[q] >= l.sizes[t] || !std::isfinite(val[q])) abort();
  // Accepted bytes are canonical: the encoder writes the same ones for what was decoded.
  std::vector<float> again = val;
  std::vector<uint8_t> wire = shoal::SparseEncode(l, idx, &again);
  if (wire.size() != in.n || !std::equal(wire.begin(), wire.end(), in.p) || again != val) abort();
  return 0;
}
