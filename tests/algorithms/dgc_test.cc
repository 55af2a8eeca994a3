// DGC: exact top-k selection, exact decode, residuals keep what was not sent (and what
// the wire's rounding took off), momentum correction and masking as in Lin et al. 2018, the
// sparsity warm-up, and the wire encoding: exact round trips and corrupt input refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "algorithms/compressors/dgc_compressor.h"
#include "algorithms/compressors/sparse_codec.h"
#include "algorithms/compressors/topk.h"
#include "common/error.h"

namespace shoal {
namespace {

TEST(TopK, PicksExactlyTheKLargestMagnitudes) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd;
  for (int64_t n : {10, 1000, 100000}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = nd(rng);
    for (int64_t k : {int64_t(1), n / 100 + 1, n / 3}) {
      std::vector<int32_t> idx;
      std::vector<float> val;
      SampledTopK(x.data(), n, k, 5, rng, &idx, &val);
      ASSERT_EQ(int64_t(idx.size()), k);
      std::vector<float> mags;
      for (auto v : x) mags.push_back(std::fabs(v));
      std::sort(mags.rbegin(), mags.rend());
      float kth = mags[size_t(k - 1)];
      for (size_t t = 0; t < idx.size(); ++t) {
        EXPECT_GE(std::fabs(val[t]), kth);
        EXPECT_EQ(val[t], x[size_t(idx[t] - 5)]);
      }
      std::sort(idx.begin(), idx.end());
      EXPECT_EQ(std::unique(idx.begin(), idx.end()), idx.end());
    }
  }
}

TEST(Dgc, SparsityWarmup) {
  DgcOptions o;
  o.sparsity = 0.999;
  o.warmup_epochs = 4;
  DgcCompressor c(o, 1);
  EXPECT_DOUBLE_EQ(c.SparsityAt(0), 0.75);
  EXPECT_DOUBLE_EQ(c.SparsityAt(1.5), 0.9375);
  EXPECT_DOUBLE_EQ(c.SparsityAt(2), 1 - std::pow(0.25, 3));
  EXPECT_DOUBLE_EQ(c.SparsityAt(4), 0.999);
  EXPECT_EQ(DgcCompressor::KFor(1000, 0.999), 1);
  EXPECT_EQ(DgcCompressor::KFor(10000, 0.99), 100);
}

// With momentum 0 the accumulated residual plus everything sent equals the sum of all
// gradients: nothing is lost, only delayed.
TEST(Dgc, ResidualsKeepWhatWasNotSentAndDecodeIsExact) {
  DgcOptions o;
  o.sparsity = 0.9;
  o.warmup_epochs = 0;
  o.momentum = 0;
  DgcCompressor c(o, 7);
  const int64_t n = 2000;
  std::vector<float> w(static_cast<size_t>(n), 0.f), g(static_cast<size_t>(n));
  std::vector<ParamView> params = {{"t", w.data(), g.data(), n, false}};
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd;
  std::vector<double> total(static_cast<size_t>(n), 0.0);
  std::vector<float> decoded(static_cast<size_t>(n), 0.f);
  for (int step = 0; step < 20; ++step) {
    for (int64_t i = 0; i < n; ++i) {
      g[size_t(i)] = nd(rng);
      total[size_t(i)] += g[size_t(i)];
    }
    SparseGrad s = c.Compress(params, {0}, 10.0, 1);
    EXPECT_EQ(int64_t(s.idx.size()), DgcCompressor::KFor(n, 0.9));
    DgcCompressor::Decode(s, decoded.data(), n);
  }
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(decoded[size_t(i)] + c.residual()[0][size_t(i)], total[size_t(i)], 1e-4) << i;
}

// Momentum correction: u = m u + g, v += u; sent entries are cleared from u and v.
TEST(Dgc, MomentumCorrectionAndMasking) {
  DgcOptions o;
  o.sparsity = 0.5;  // 2 of 4 sent
  o.warmup_epochs = 0;
  o.momentum = 0.5;
  DgcCompressor c(o, 1);
  std::vector<float> w(4, 0.f), g = {4, 3, 0.5f, 0.25f};
  std::vector<ParamView> params = {{"t", w.data(), g.data(), 4, false}};
  SparseGrad s1 = c.Compress(params, {0}, 10, 1);
  std::vector<float> d1(4, 0.f);
  DgcCompressor::Decode(s1, d1.data(), 4);
  EXPECT_EQ(d1, (std::vector<float>{4, 3, 0, 0}));
  // step 2: u = [0+g0, 0+g1, 0.5*0.5+0.5, 0.5*0.25+0.25] = [4,3,0.75,0.375]; v = [4,3,1.25,0.625]
  SparseGrad s2 = c.Compress(params, {0}, 10, 1);
  std::vector<float> d2(4, 0.f);
  DgcCompressor::Decode(s2, d2.data(), 4);
  EXPECT_EQ(d2, (std::vector<float>{4, 3, 0, 0}));
  EXPECT_FLOAT_EQ(c.residual()[0][2], 1.25f);
  EXPECT_FLOAT_EQ(c.residual()[0][3], 0.625f);
}

TEST(Dgc, LocalClippingBoundsTheGlobalNorm) {
  DgcOptions o;
  o.sparsity = 0;  // send everything
  o.warmup_epochs = 0;
  o.momentum = 0;
  o.clip_norm = 2.0;
  DgcCompressor c(o, 1);
  std::vector<float> w(2, 0.f), g = {30, 40};  // norm 50
  std::vector<ParamView> params = {{"t", w.data(), g.data(), 2, false}};
  SparseGrad s = c.Compress(params, {0}, 10, 4);  // bound 2/sqrt(4) = 1
  std::vector<float> d(2, 0.f);
  DgcCompressor::Decode(s, d.data(), 2);
  // The wire's fp16 rounds what is sent; the velocity keeps the difference.
  EXPECT_NEAR(d[0], 0.6f, 0.6 / 1024);
  EXPECT_NEAR(d[1], 0.8f, 0.8 / 1024);
  EXPECT_NEAR(d[0] + c.residual()[0][0], 0.6f, 1e-7);
  EXPECT_NEAR(d[1] + c.residual()[0][1], 0.8f, 1e-7);
}

// A lenet-like layout at 99.9%: what one pair costs.
SparseLayout LenetLayout() {
  SparseLayout l;
  l.sizes = {800, 51200, 262144, 2560};
  for (int64_t n : l.sizes) l.counts.push_back(DgcCompressor::KFor(n, 0.999));
  return l;
}

// Sorted distinct indices and values of every magnitude (zeros, subnormals, huge) per tensor.
void RandomPairs(const SparseLayout& l, std::mt19937_64& rng, std::vector<int32_t>* idx, std::vector<float>* val) {
  idx->clear();
  val->clear();
  std::uniform_real_distribution<float> mant(-2.f, 2.f);
  std::uniform_int_distribution<int> expo(-140, 120);
  for (size_t t = 0; t < l.sizes.size(); ++t) {
    std::vector<int32_t> all(size_t(l.sizes[t]));
    for (size_t i = 0; i < all.size(); ++i) all[i] = int32_t(i);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(size_t(l.counts[t]));
    std::sort(all.begin(), all.end());
    int scale = expo(rng);  // one tensor's values within a few powers of two of each other
    for (int32_t i : all) {
      idx->push_back(i);
      float v = rng() % 7 == 0 ? 0.f : std::ldexp(mant(rng), scale - int(rng() % 6));
      val->push_back(v);
    }
  }
}

TEST(SparseCodec, RoundTripsExactlyAndCostsAbout4BytesAPair) {
  std::mt19937_64 rng(5);
  std::vector<SparseLayout> layouts = {LenetLayout()};
  for (int i = 0; i < 40; ++i) {
    SparseLayout l;
    int tensors = 1 + int(rng() % 5);
    for (int t = 0; t < tensors; ++t) {
      int64_t n = 1 + int64_t(rng() % (rng() % 2 ? 70000 : 40));
      l.sizes.push_back(n);
      l.counts.push_back(int64_t(rng() % uint64_t(std::min<int64_t>(n, 300) + 1)));
    }
    layouts.push_back(l);
  }
  for (const SparseLayout& l : layouts) {
    std::vector<int32_t> idx;
    std::vector<float> val;
    RandomPairs(l, rng, &idx, &val);
    std::vector<float> sent = val;
    std::vector<uint8_t> wire = SparseEncode(l, idx, &sent);
    ASSERT_EQ(int64_t(wire.size()), SparseEncodedBytes(l));
    // Rounding to fp16 under the tensor's power-of-two scale: at most 2^-10 of the tensor's
    // largest magnitude.
    size_t q = 0;
    for (size_t t = 0; t < l.sizes.size(); ++t) {
      float m = 0;
      for (int64_t c = 0; c < l.counts[t]; ++c) m = std::max(m, std::fabs(val[q + size_t(c)]));
      for (int64_t c = 0; c < l.counts[t]; ++c, ++q) {
        ASSERT_TRUE(std::isfinite(sent[q]));
        if (m > 0 && std::ilogb(m) >= -111) {
          EXPECT_LE(std::fabs(sent[q] - val[q]), std::ldexp(m, -10)) << val[q] << " sent as " << sent[q];
        } else {  // values too small to matter travel as 0 and stay in the residual
          EXPECT_EQ(sent[q], 0.f) << val[q];
        }
      }
    }
    std::vector<int32_t> got_idx;
    std::vector<float> got_val;
    SparseDecode(l, wire.data(), int64_t(wire.size()), &got_idx, &got_val, "rank 1");
    EXPECT_EQ(got_idx, idx);
    ASSERT_EQ(got_val.size(), sent.size());
    for (size_t i = 0; i < sent.size(); ++i) EXPECT_EQ(got_val[i], sent[i]) << i;  // the same bits
    // What was decoded encodes to the same bytes: nothing rounds twice.
    std::vector<float> again = got_val;
    EXPECT_EQ(SparseEncode(l, got_idx, &again), wire);
    EXPECT_EQ(again, got_val);
  }
  // Lenet at 99.9%: 319 pairs in 4 exponents + 2 bytes of value + 10-18 bits of index each.
  SparseLayout l = LenetLayout();
  int64_t pairs = 0;
  for (int64_t c : l.counts) pairs += c;
  EXPECT_EQ(pairs, 319);
  EXPECT_EQ(SparseEncodedBytes(l), 4 + 2 * 319 + (10 + 52 * 16 + 263 * 18 + 3 * 12 + 7) / 8);
  EXPECT_LT(double(SparseEncodedBytes(l)) / double(pairs), 4.3) << "the old form took 8 bytes a pair";
}

// Expects decoding `wire` under `l` to be refused with a message containing `want`, leaving
// the output untouched.
void ExpectRefused(const SparseLayout& l, const std::vector<uint8_t>& wire, const std::string& want) {
  int64_t total = 0;
  for (int64_t n : l.sizes) total += n;
  std::vector<float> out(size_t(total), 1.f);
  try {
    SparseDecodeAdd(l, wire.data(), int64_t(wire.size()), out.data(), "rank 3");
    ADD_FAILURE() << "accepted; wanted an error containing '" << want << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 3"), std::string::npos) << e.what();
  }
  for (float x : out) ASSERT_EQ(x, 1.f) << "a refused encoding changed the output";
}

TEST(SparseCodec, CorruptEncodingsAreRefusedWithAClearError) {
  // One tensor of 800 elements (10-bit indices), 3 pairs: 1 + 6 + 4 bytes.
  SparseLayout l;
  l.sizes = {800};
  l.counts = {3};
  std::vector<int32_t> idx = {5, 100, 700};
  std::vector<float> val = {0.5f, -1.f, 0.25f};
  std::vector<uint8_t> good = SparseEncode(l, idx, &val);
  ASSERT_EQ(good.size(), 11u);
  auto with_index = [&](int q, uint32_t i) {  // rewrites index q's 10 bits
    std::vector<uint8_t> w = good;
    for (int b = 0; b < 10; ++b) {
      int bit = q * 10 + b;
      uint8_t& byte = w[size_t(7 + bit / 8)];
      byte = uint8_t((byte & ~(1u << (bit % 8))) | (((i >> b) & 1u) << (bit % 8)));
    }
    return w;
  };
  ExpectRefused(l, std::vector<uint8_t>(good.begin(), good.end() - 1), "10 bytes where this step's layout has 11");
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  ExpectRefused(l, longer, "12 bytes");
  ExpectRefused(l, {}, "0 bytes");
  ExpectRefused(l, with_index(2, 1000), "index 1000 outside it");
  ExpectRefused(l, with_index(1, 5), "index 5 not above the one before (5)");
  ExpectRefused(l, with_index(2, 50), "not above the one before");
  std::vector<uint8_t> inf = good;
  inf[1 + 2] = 0x00;
  inf[1 + 3] = 0x7c;  // fp16 +inf
  ExpectRefused(l, inf, "decodes to");
  std::vector<uint8_t> nan = good;
  nan[1] = 0x01;
  nan[2] = 0x7e;
  ExpectRefused(l, nan, "decodes to");
  std::vector<uint8_t> big = good;
  big[0] = 113;   // the largest exponent an encoder writes: 2^113 x 2^-1 (0.5 here) is finite,
  big[3] = 0xff;  // but x 65504 is not
  big[4] = 0x7b;
  ExpectRefused(l, big, "decodes to");
  std::vector<uint8_t> exp = good;
  exp[0] = 120;
  ExpectRefused(l, exp, "exponent 120 outside");
  exp[0] = uint8_t(int8_t(-126));
  ExpectRefused(l, exp, "exponent -126 outside");
  std::vector<uint8_t> top = good;  // the largest value rounded up to 2^15 (32768 x 2^-14)
  top[3] = 0x00;
  top[4] = 0xf8;
  ExpectRefused(l, top, "where an encoder puts it in [2^14, 2^15)");
  std::vector<uint8_t> other = good;  // the largest value (-1 = -16384 x 2^-14) halved: the
  other[3] = 0x00;                    // values are fine, but an encoder would have written
  other[4] = 0xf0;                    // them under exponent -15
  ExpectRefused(l, other, "where an encoder puts it in [2^14, 2^15)");
  std::vector<uint8_t> pad = good;
  pad.back() |= 0x80;  // 30 bits of index in 4 bytes: the top 2 are padding
  ExpectRefused(l, pad, "non-zero padding");

  // Any single byte changed or any length: accepted as valid pairs, or refused; never
  // anything else (the sanitizer builds run this too).
  std::mt19937_64 rng(9);
  SparseLayout big_l = LenetLayout();
  std::vector<int32_t> bi;
  std::vector<float> bv;
  RandomPairs(big_l, rng, &bi, &bv);
  std::vector<uint8_t> bw = SparseEncode(big_l, bi, &bv);
  std::vector<float> out(size_t(800 + 51200 + 262144 + 2560), 0.f);
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<uint8_t> w = bw;
    if (trial % 10 == 0)
      w.resize(size_t(rng() % (bw.size() + 2)));
    else
      for (int f = 0; f < 1 + trial % 3; ++f) w[size_t(rng() % w.size())] ^= uint8_t(1 + rng() % 255);
    try {
      SparseDecodeAdd(big_l, w.data(), int64_t(w.size()), out.data(), "rank 0");
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("dgc: rank 0's encoding", 0), 0u) << e.what();
    }
  }
  for (float x : out) ASSERT_TRUE(std::isfinite(x));
}

// Values that fp16 would round up to the next power of two, huge and tiny ones: the bytes
// decode to values that encode to the same bytes.
TEST(SparseCodec, EdgesOfTheScaleRoundTrip) {
  SparseLayout l;
  l.sizes = {8, 8, 8, 8};
  l.counts = {2, 2, 2, 1};
  std::vector<int32_t> idx = {0, 7, 1, 2, 3, 4, 5};
  std::vector<float> val = {2.f - 1e-6f, -1.f,  // 2 - 1e-6 would round to 2^15 x 2^-14
                            3.0e38f,     -1.0e38f, 1e-35f, 1e-40f, std::ldexp(1.f, -120)};
  std::vector<float> sent = val;
  std::vector<uint8_t> wire = SparseEncode(l, idx, &sent);
  EXPECT_LT(sent[0], 2.f);
  EXPECT_NEAR(sent[0], 2.f, 2.f / 1024);
  EXPECT_NEAR(sent[2], 3.0e38f, 3.0e38f / 1024);
  EXPECT_EQ(sent[6], 0.f) << "under 2^-111: sent as 0, kept in the residual";
  std::vector<int32_t> got_idx;
  std::vector<float> got;
  SparseDecode(l, wire.data(), int64_t(wire.size()), &got_idx, &got, "rank 0");
  EXPECT_EQ(got, sent);
  std::vector<float> again = got;
  EXPECT_EQ(SparseEncode(l, got_idx, &again), wire);
}

TEST(SparseCodec, EncoderRefusesWhatItCannotCarry) {
  SparseLayout l;
  l.sizes = {10};
  l.counts = {2};
  std::vector<float> v = {1, 2};
  EXPECT_THROW(SparseEncode(l, {3, 3}, &v), Error);   // not increasing
  EXPECT_THROW(SparseEncode(l, {3, 10}, &v), Error);  // outside
  EXPECT_THROW(SparseEncode(l, {3}, &v), Error);      // count
  v = {1, std::nanf("")};
  EXPECT_THROW(SparseEncode(l, {1, 2}, &v), Error);
  l.counts = {11};
  EXPECT_THROW(SparseEncodedBytes(l), Error);
}

}  // namespace
}  // namespace shoal
