// The block-scaled int8/int4 encoding (algorithms/compressors/block_quant.h): sizes, a block
// decoded by hand, the error bound on random values, and corrupt encodings refused before
// anything is added.
#include "algorithms/compressors/block_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"

namespace shoal {
namespace {

std::vector<uint8_t> Encode(BlockQuant q, const std::vector<float>& x) {
  std::vector<uint8_t> out(size_t(QuantizedBytes(q, int64_t(x.size()))));
  QuantizeBlocks(q, x.data(), int64_t(x.size()), out.data());
  return out;
}

std::vector<float> Decode(BlockQuant q, const std::vector<uint8_t>& e, size_t n) {
  std::vector<float> acc(n, 0.f);
  AddDequantized(q, e.data(), int64_t(e.size()), int64_t(n), acc.data(), "test");
  return acc;
}

TEST(BlockQuant, SizesFollowFromTheCount) {
  EXPECT_EQ(QuantizedBytes(BlockQuant::kInt8, 0), 0);
  EXPECT_EQ(QuantizedBytes(BlockQuant::kInt8, 256), 4 + 256);
  EXPECT_EQ(QuantizedBytes(BlockQuant::kInt8, 257), 4 + 256 + 4 + 1);
  EXPECT_EQ(QuantizedBytes(BlockQuant::kInt4, 256), 4 + 128);
  EXPECT_EQ(QuantizedBytes(BlockQuant::kInt4, 513), 2 * (4 + 128) + 4 + 1);
  // mlp's 269,322 parameters: 1,053 blocks.
  EXPECT_EQ(QuantizedBytes(BlockQuant::kInt8, 269322), 1053 * 4 + 269322);
  EXPECT_EQ(QuantizedBytes(BlockQuant::kInt4, 269322), 1053 * 4 + 269322 / 2);
}

TEST(BlockQuant, ABlockByHand) {
  // absmax 1.27: int8 scale 0.01, so 0.5 -> 50, -1.27 -> -127, 0.004 -> 0 (0.4 rounds to 0);
  // int4 scale 1.27 / 7: 0.5 / 0.18143 = 2.76 -> 3, -1.27 -> -7, 0.004 -> 0.
  const std::vector<float> x = {0.5f, -1.27f, 0.004f};
  std::vector<uint8_t> e8 = Encode(BlockQuant::kInt8, x);
  ASSERT_EQ(e8.size(), 7u);
  float s8;
  memcpy(&s8, e8.data(), 4);
  EXPECT_FLOAT_EQ(s8, 1.27f / 127.f);
  EXPECT_EQ(int8_t(e8[4]), 50);
  EXPECT_EQ(int8_t(e8[5]), -127);
  EXPECT_EQ(int8_t(e8[6]), 0);
  std::vector<float> d8 = Decode(BlockQuant::kInt8, e8, 3);
  EXPECT_FLOAT_EQ(d8[0], 50 * s8);
  EXPECT_FLOAT_EQ(d8[1], -127 * s8);
  EXPECT_EQ(d8[2], 0.f);

  std::vector<uint8_t> e4 = Encode(BlockQuant::kInt4, x);
  ASSERT_EQ(e4.size(), 6u);
  float s4;
  memcpy(&s4, e4.data(), 4);
  EXPECT_FLOAT_EQ(s4, 1.27f / 7.f);
  EXPECT_EQ(e4[4], uint8_t((3 + 8) | ((-7 + 8) << 4)));
  EXPECT_EQ(e4[5], uint8_t(0 + 8));  // the odd block's last nibble pads with 0
  std::vector<float> d4 = Decode(BlockQuant::kInt4, e4, 3);
  EXPECT_FLOAT_EQ(d4[0], 3 * s4);
  EXPECT_FLOAT_EQ(d4[1], -7 * s4);
  EXPECT_EQ(d4[2], 0.f);
}

TEST(BlockQuant, ErrorIsAtMostHalfAStepOfItsBlockAndDecodingAdds) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 1.f);
  const size_t n = 3 * 256 + 77;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = dist(rng) * (i < 256 ? 1e-4f : 3.f);  // blocks of other magnitudes
  x[300] = 0;
  for (BlockQuant q : {BlockQuant::kInt8, BlockQuant::kInt4}) {
    const float L = q == BlockQuant::kInt8 ? 127.f : 7.f;
    std::vector<uint8_t> e = Encode(q, x);
    std::vector<float> acc(n, 1.f);  // decoding adds onto what is there
    AddDequantized(q, e.data(), int64_t(e.size()), int64_t(n), acc.data(), "test");
    for (size_t b = 0; b < n; b += 256) {
      float absmax = 0;
      for (size_t i = b; i < std::min(n, b + 256); ++i) absmax = std::max(absmax, std::fabs(x[i]));
      for (size_t i = b; i < std::min(n, b + 256); ++i)
        ASSERT_LE(std::fabs((acc[i] - 1.f) - x[i]), absmax / L / 2 * 1.0001f + 1e-6f) << "element " << i;
    }
    EXPECT_EQ(acc[300], 1.f);
  }
}

TEST(BlockQuant, AllZeroBlocksAndNonFiniteValues) {
  std::vector<float> z(300, 0.f);
  for (BlockQuant q : {BlockQuant::kInt8, BlockQuant::kInt4})
    for (float v : Decode(q, Encode(q, z), z.size())) EXPECT_EQ(v, 0.f);
  std::vector<float> bad = {1.f, NAN, 2.f};
  try {
    Encode(BlockQuant::kInt8, bad);
    FAIL() << "a NaN was encoded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("value 1 is not finite"), std::string::npos) << e.what();
  }
}

TEST(BlockQuant, CorruptEncodingsAreRefusedBeforeAnythingIsAdded) {
  const std::vector<float> x = {0.5f, -1.27f, 0.004f};
  auto refused = [&](BlockQuant q, std::vector<uint8_t> e, int64_t n, const std::string& why) {
    std::vector<float> acc(size_t(n), 5.f);
    try {
      AddDequantized(q, e.data(), int64_t(e.size()), n, acc.data(), "rank 2's pseudo-gradient");
      ADD_FAILURE() << "accepted: " << why;
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("rank 2's pseudo-gradient"), std::string::npos) << err.what();
      EXPECT_NE(std::string(err.what()).find(why), std::string::npos) << err.what();
    }
    for (float v : acc) EXPECT_EQ(v, 5.f) << why;
  };
  std::vector<uint8_t> e8 = Encode(BlockQuant::kInt8, x), e4 = Encode(BlockQuant::kInt4, x);
  refused(BlockQuant::kInt8, std::vector<uint8_t>(e8.begin(), e8.end() - 1), 3, "6 bytes where 3 values take 7");
  std::vector<uint8_t> c = e8;
  const float neg = -1.f, inf = INFINITY;
  memcpy(c.data(), &neg, 4);
  refused(BlockQuant::kInt8, c, 3, "block 0 has scale");
  memcpy(c.data(), &inf, 4);
  refused(BlockQuant::kInt8, c, 3, "block 0 has scale");
  const float huge = 3e38f;  // 127 x huge overflows
  memcpy(c.data(), &huge, 4);
  refused(BlockQuant::kInt8, c, 3, "block 0 has scale");
  c = e8;
  c[6] = 0x80;
  refused(BlockQuant::kInt8, c, 3, "holds -128");
  c = e4;
  c[4] = 0x0b;  // high nibble 0
  refused(BlockQuant::kInt4, c, 3, "holds nibble 0");
  c = e4;
  c[5] = 0x18;  // padding nibble set
  refused(BlockQuant::kInt4, c, 3, "padding nibble");
}

}  // namespace
}  // namespace shoal
