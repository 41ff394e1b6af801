// Half/bfloat16 conversions and dtype tables.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

namespace lathe {
namespace {

TEST(DType, F16RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = F16ToF32((uint16_t)h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f))));
      continue;
    }
    EXPECT_EQ(F32ToF16(f), (uint16_t)h) << "half 0x" << std::hex << h;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  // 1 + 2^-11 is exactly halfway between 1 and the next half (1 + 2^-10): ties to even -> 1.
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // rounds up to inf
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (zero)
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);
}

TEST(DType, BF16) {
  EXPECT_EQ(F32ToBF16(1.0f), 0x3f80);
  EXPECT_EQ(BF16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(F32ToBF16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie to even
  EXPECT_EQ(F32ToBF16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(NAN))));
}

TEST(DType, Sizes) {
  EXPECT_EQ(DTypeBytes(DType::kQ4_1, 64), 40u);
  EXPECT_EQ(DTypeBytes(DType::kQ8_0, 32), 34u);
  EXPECT_EQ(DTypeBytes(DType::kBF16, 3), 6u);
  DType t;
  EXPECT_TRUE(ParseDType("Q4_1", &t));
  EXPECT_EQ(t, DType::kQ4_1);
  EXPECT_TRUE(ParseDType("q5_k", &t));
  EXPECT_EQ(t, DType::kQ5_K);
  EXPECT_EQ(DTypeBytes(DType::kQ4_K, 512), 288u);
  EXPECT_EQ(DTypeBytes(DType::kQ6_K, 256), 210u);
  EXPECT_EQ(DTypeBytes(DType::kQ5_0, 64), 44u);
  EXPECT_FALSE(ParseDType("iq4_xs", &t));
}

}  // namespace
}  // namespace lathe
