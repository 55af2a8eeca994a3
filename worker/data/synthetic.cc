#include "worker/data/synthetic.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "worker/data/random.h"

namespace shoal {
namespace data {

std::shared_ptr<Dataset> MakeSynthetic(const std::string& path, const DatasetOptions& o) {
  const std::string where = "[data] synthetic";
  SHOAL_CHECK(o.synthetic_samples > 0, where + ": samples must be > 0, got " + std::to_string(o.synthetic_samples));
  SHOAL_CHECK(o.synthetic_image_size > 0 && o.synthetic_image_size <= 4096,
              where + ": image_size must be in 1..4096, got " + std::to_string(o.synthetic_image_size));
  SHOAL_CHECK(o.synthetic_channels > 0 && o.synthetic_channels <= 64,
              where + ": channels must be in 1..64, got " + std::to_string(o.synthetic_channels));
  const int64_t classes = o.num_classes > 0 ? o.num_classes : o.synthetic_classes;
  SHOAL_CHECK(classes > 0, where + ": classes must be > 0, got " + std::to_string(classes));
  SHOAL_CHECK(o.synthetic_pool > 0, where + ": pool must be > 0");

  int64_t n = o.synthetic_samples;
  if (o.max_samples > 0) n = std::min(n, o.max_samples);
  const int64_t pool = std::min(n, o.synthetic_pool);
  const int64_t S = o.synthetic_image_size, C = o.synthetic_channels, numel = C * S * S;

  Rng rng(MixSeed(o.seed, 0x5717ULL));

  std::vector<uint8_t> pixels(size_t(pool * numel));
  for (size_t k = 0; k < pixels.size(); k += 8) {
    uint64_t r = rng.Next();
    memcpy(pixels.data() + k, &r, std::min<size_t>(8, pixels.size() - k));
  }
  std::vector<int32_t> pool_labels(static_cast<size_t>(pool));
  for (auto& l : pool_labels) l = int32_t(rng.Below(uint64_t(classes)));
  uint64_t salt = 0;
  for (char ch : path) salt = salt * 131 + uint8_t(ch);
  Rng draw(MixSeed(o.seed, salt));
  std::vector<int64_t> rows(static_cast<size_t>(n));
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    // The first `pool` samples cover every pool image once; the rest draw at random.
    rows[size_t(i)] = i < pool ? i : int64_t(draw.Below(uint64_t(pool)));
    labels[size_t(i)] = pool_labels[size_t(rows[size_t(i)])];
  }
  std::string source = "synthetic:" + (path.empty() ? std::string("train") : path);
  return Dataset::FromU8(source, {C, S, S}, std::move(pixels), std::move(labels), classes, std::move(rows));
}

}  // namespace data
}  // namespace shoal
