#include "algorithms/compressors/topk.h"

#include <algorithm>
#include <cmath>

namespace shoal {

void SampledTopK(const float* x, int64_t n, int64_t k, int64_t base, std::mt19937_64& rng, std::vector<int32_t>* idx,
                 std::vector<float>* val) {
  k = std::min(k, n);
  if (k <= 0) return;
  std::vector<std::pair<float, int64_t>> cand;  // (|x|, i)
  if (k * 4 >= n) {
    for (int64_t i = 0; i < n; ++i) cand.emplace_back(std::fabs(x[i]), i);
  } else {
    // Threshold at the (1 - k/n) quantile of a sample, a little lower so that usually
    // more than k entries pass and the exact trim below picks the k largest of them.
    int64_t s = std::min<int64_t>(n, std::max<int64_t>(256, n / 100));
    std::vector<float> sample(static_cast<size_t>(s));
    std::uniform_int_distribution<int64_t> pick(0, n - 1);
    for (auto& v : sample) v = std::fabs(x[pick(rng)]);
    double q = 1.0 - 1.5 * double(k) / double(n);
    int64_t qi = std::clamp<int64_t>(int64_t(q * double(s)), 0, s - 1);
    std::nth_element(sample.begin(), sample.begin() + qi, sample.end());
    float thr = sample[size_t(qi)];
    for (int attempt = 0; attempt < 4; ++attempt) {
      cand.clear();
      for (int64_t i = 0; i < n; ++i)
        if (std::fabs(x[i]) >= thr) cand.emplace_back(std::fabs(x[i]), i);
      if (int64_t(cand.size()) >= k) break;
      thr *= 0.5f;  // the sample overestimated: widen
      if (attempt == 2) thr = 0;
    }
  }
  if (int64_t(cand.size()) > k) {
    std::nth_element(cand.begin(), cand.begin() + (k - 1), cand.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    cand.resize(size_t(k));
  }
  for (auto& [a, i] : cand) {
    idx->push_back(int32_t(base + i));
    val->push_back(x[i]);
  }
}

}  // namespace shoal
