// Top-k selection by sampled threshold (DGC, Lin et al. 2018): estimate the threshold
// from a random sample, keep entries above it, then trim to exactly k. Costs about one
// pass over the data instead of a sort.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace shoal {

// Appends to idx/val exactly min(k, n) entries of x with the largest |x| (ties broken
// arbitrarily); indices are offset by `base`. Entries are not ordered.
void SampledTopK(const float* x, int64_t n, int64_t k, int64_t base, std::mt19937_64& rng, std::vector<int32_t>* idx,
                 std::vector<float>* val);

}  // namespace shoal
