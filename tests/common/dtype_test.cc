#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"

namespace shoal {
namespace {

TEST(DType, HalfExactValuesRoundTrip) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 0.000060975552f, 5.9604645e-8f, 1024.0f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(f)), f) << f;
  }
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);  // overflow -> inf
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, HalfRoundsToNearestEven) {
  // 1 + 2^-11 lies exactly between 1 and 1 + 2^-10: ties go to the even mantissa (1.0).
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1000, 1000);
  for (int i = 0; i < 10000; ++i) {
    float f = u(rng);
    float back = HalfToFloat(FloatToHalf(f));
    EXPECT_LE(std::fabs(back - f), std::fabs(f) * std::ldexp(1.0f, -11) + 1e-7f);
  }
}

TEST(DType, Bf16) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1e6, 1e6);
  for (int i = 0; i < 10000; ++i) {
    float f = u(rng);
    EXPECT_LE(std::fabs(Bf16ToFloat(FloatToBf16(f)) - f), std::fabs(f) * std::ldexp(1.0f, -8));
  }
}

TEST(DType, EncodeDecodeAndNames) {
  std::vector<float> v = {0.5f, -1.25f, 3.0f};
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<uint8_t> buf(v.size() * DTypeSize(t));
    EncodeFloats(v.data(), v.size(), t, buf.data());
    std::vector<float> out(v.size());
    DecodeFloats(buf.data(), v.size(), t, out.data());
    EXPECT_EQ(out, v) << DTypeName(t);
    EXPECT_EQ(ParseDType(DTypeName(t)), t);
  }
  EXPECT_THROW(ParseDType("int8"), Error);
}

// The ring and the shards sum received frames with AddFloats: any byte offset, any count,
// and exactly the sum a float-by-float loop gives (every rank must end bit-identical).
TEST(DType, AddFloatsSumsUnalignedSourcesExactly) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (size_t n : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(17), size_t(1000), size_t(4099)}) {
    for (size_t offset : {size_t(0), size_t(1), size_t(3)}) {
      std::vector<float> dst(n), src(n), want(n);
      for (size_t i = 0; i < n; ++i) {
        dst[i] = dist(rng);
        src[i] = dist(rng);
        want[i] = dst[i] + src[i];
      }
      std::vector<unsigned char> frame(offset + 4 * n);
      if (n) std::memcpy(frame.data() + offset, src.data(), 4 * n);
      AddFloats(dst.data(), frame.data() + offset, n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(dst[i], want[i]) << "n " << n << " offset " << offset << " i " << i;
    }
  }
}

}  // namespace
}  // namespace shoal
