// Small deterministic generators shared by the data code. Hand-written so every worker,
// compiler and standard library draws the same numbers from the same seed (std::shuffle
// and std::uniform_int_distribution are implementation-defined).
#pragma once
#include <cstdint>

namespace shoal {
namespace data {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t MixSeed(uint64_t a, uint64_t b) { return SplitMix64(a ^ SplitMix64(b + 0x632be59bd9b4e019ULL)); }

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(SplitMix64(seed)) {}
  uint64_t Next() {
    s_ += 0x9e3779b97f4a7c15ULL;
    uint64_t z = s_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), n > 0 (Lemire's multiply-shift; the bias is below 2^-32 for any n
  // a data set can have).
  uint64_t Below(uint64_t n) { return uint64_t((unsigned __int128)Next() * n >> 64); }
  // Uniform in [0, 1), 53 random bits.
  double Uniform() { return double(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t s_;
};

}  // namespace data
}  // namespace shoal
