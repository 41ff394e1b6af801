// RmsNorm, SiluMul, Dot, Axpy and Softmax on every ISA tier against the scalar reference, over
// lengths that exercise full vectors, unrolled loops and masked tails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/kernels.h"
#include "ops_test_util.h"

namespace lathe::kernels {
namespace {

using testing::AllTiers;
using testing::NormalizedError;
using testing::RandomVec;

const int64_t kLengths[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65, 100, 576, 1000, 1536};

// Summation order and the polynomial exp (~2e-7 relative) are the only differences.
constexpr double kLimit = 2e-6;

class OpsTier : public ::testing::TestWithParam<IsaTier> {};

TEST_P(OpsTier, RmsNorm) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  for (int64_t C : kLengths) {
    const int64_t T = 3;
    const std::vector<float> x = RandomVec(T * C, 1, 3.0f), w = RandomVec(C, 2);
    std::vector<float> ref(T * C), out(T * C), inplace = x;
    ref::RmsNorm(x.data(), w.data(), ref.data(), T, C, 1e-5f);
    kt.rms_norm(x.data(), w.data(), out.data(), T, C, 1e-5f);
    EXPECT_LE(NormalizedError(out, ref), kLimit) << C;
    kt.rms_norm(inplace.data(), w.data(), inplace.data(), T, C, 1e-5f);  // out may alias x
    EXPECT_LE(NormalizedError(inplace, ref), kLimit) << C;
  }
}

TEST_P(OpsTier, SiluMul) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  for (int64_t n : kLengths) {
    std::vector<float> g = RandomVec(n, 3, 4.0f);
    if (n > 4) {
      g[0] = 95.0f;   // exp(-g) underflows
      g[1] = -95.0f;  // exp(-g) overflows: silu -> -0
      g[2] = 0.0f;
    }
    const std::vector<float> up = RandomVec(n, 4);
    std::vector<float> ref = g, out = g;
    ref::SiluMul(ref.data(), up.data(), n);
    kt.silu_mul(out.data(), up.data(), n);
    EXPECT_LE(NormalizedError(out, ref), kLimit) << n;
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(out[i])) << i;
  }
}

TEST_P(OpsTier, DotAndAxpy) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  for (int64_t n : kLengths) {
    const std::vector<float> a = RandomVec(n, 5), b = RandomVec(n, 6);
    double ref = 0, norm = 0;
    for (int64_t i = 0; i < n; ++i) {
      ref += (double)a[i] * b[i];
      norm += std::fabs((double)a[i] * b[i]);
    }
    EXPECT_LE(std::fabs(kt.dot(a.data(), b.data(), n) - ref), 1e-6 * norm + 1e-30) << n;
    std::vector<float> y = RandomVec(n, 7), yr = y;
    kt.axpy(y.data(), 0.37f, a.data(), n);
    for (int64_t i = 0; i < n; ++i) yr[i] += 0.37f * a[i];
    EXPECT_LE(NormalizedError(y, yr), 1e-7) << n;
  }
}

TEST_P(OpsTier, Softmax) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  for (int64_t n : kLengths) {
    for (float scale : {1.0f, 30.0f}) {
      std::vector<float> x = RandomVec(n, 8, scale);
      if (n > 3) x[n - 1] = -std::numeric_limits<float>::infinity();  // a masked attention score
      std::vector<float> ref = x, out = x;
      ref::Softmax(ref.data(), n);
      kt.softmax(out.data(), n);
      EXPECT_LE(NormalizedError(out, ref), kLimit) << n << " scale " << scale;
      double sum = 0;
      for (float v : out) sum += v;
      EXPECT_NEAR(sum, 1.0, 1e-5) << n;
      if (n > 3) {
        EXPECT_LE(out[n - 1], 1e-30f);
      }
    }
  }
}

// Every vector tier's softmax gives the AVX2 one's bits (the AVX-512 prompt attention runs its own softmax and
// must equal the decode kernel's, which runs the AVX2 one): every tail length, and n % 16 of 1..7 after
// whole chunks (the AVX2 kernel adds that tail to its second 8-lane sum).
TEST_P(OpsTier, SoftmaxBitsMatchAvx2) {
  LATHE_REQUIRE_TIER(GetParam());
  LATHE_REQUIRE_TIER(IsaTier::kAvx2);
  if (GetParam() == IsaTier::kScalar) GTEST_SKIP() << "the scalar reference sums in its own order";
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  const cpu::KernelTable& k2 = cpu::KernelsFor(IsaTier::kAvx2);
  for (int64_t n = 1; n <= 200; ++n) {
    std::vector<float> x = RandomVec(n, 40 + (uint32_t)n, 6.0f), want = x;
    kt.softmax(x.data(), n);
    k2.softmax(want.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(x[i], want[i]) << IsaTierName(GetParam()) << " n=" << n << " at " << i;
  }
}

// std::max_element's index on every tier: ties (the first wins), -inf, +inf, NaN anywhere (never larger;
// a NaN first element stays the answer), every tail length.
TEST_P(OpsTier, Argmax) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<int64_t> lengths(kLengths, kLengths + sizeof(kLengths) / sizeof(kLengths[0]));
  for (int64_t n = 2; n <= 40; ++n) lengths.push_back(n);
  lengths.push_back(49152);
  int cases = 0;
  for (int64_t n : lengths) {
    for (int variant = 0; variant < 12; ++variant) {
      std::vector<float> x = RandomVec(n, 100 + variant, 4.0f);
      if (variant == 1) for (float& v : x) v = std::round(v);  // many ties
      if (variant == 2) for (float& v : x) v = -inf;
      if (variant == 3) for (float& v : x) v = nan;
      if (variant == 4) x[0] = nan;
      if (variant == 5) x[n - 1] = nan, x[n / 2] = nan;
      if (variant == 6) x[0] = -inf;
      if (variant == 7) x[n - 1] = inf, x[n / 3] = inf;
      if (variant == 8) for (int64_t i = 0; i < n; i += 3) x[i] = nan;
      if (variant == 9) for (float& v : x) v = 1.0f;  // all equal: index 0
      if (variant == 10) x.back() = 100.0f;            // the last element, in the tail
      if (variant == 11) for (int64_t i = 1; i < n; ++i) x[i] = -inf;
      const int64_t want = std::max_element(x.begin(), x.end()) - x.begin();
      ASSERT_EQ(ref::Argmax(x.data(), n), want) << n << " variant " << variant;
      EXPECT_EQ(kt.argmax(x.data(), n), want) << n << " variant " << variant;
      ++cases;
    }
  }
  EXPECT_EQ(kt.argmax(std::vector<float>{3.0f}.data(), 1), 0);
  EXPECT_GT(cases, 500);
}

// A KV cache's rounding (kernels::RoundKv) on every tier: the scalar form's bits for f16 and bf16, over
// normal values, ties (exact halfway cases of both formats), f16 subnormals and underflow, values past
// f16's range (saturated), infinities and NaNs with payloads, at lengths with and without a tail.
TEST_P(OpsTier, RoundKvBitsMatchScalar) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  std::vector<float> x = RandomVec(1000, 77, 4.0f);
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, 70000.0f, -1e9f, 1e30f, inf, -inf, 1e-8f, -3e-8f,
                  5.96e-8f, 2.98e-8f, 6.1e-5f, 1e-40f, bits(0x7fc00000), bits(0xffc12345), bits(0x7f800001),
                  bits(0x3f808000), bits(0x3f818000), bits(0x3f800fff), bits(0x3f801000), bits(0x3f803000)})
    x.push_back(f);
  for (DType t : {DType::kF16, DType::kBF16}) {
    for (int64_t n : {(int64_t)x.size(), int64_t{7}, int64_t{8}, int64_t{17}}) {
      std::vector<uint16_t> want(n), got(n, 0xdead);
      // The special values at the front too, so that short lengths see them.
      std::vector<float> in(x.end() - std::min<int64_t>(n, 24), x.end());
      in.insert(in.end(), x.begin(), x.begin() + (n - (int64_t)in.size()));
      cpu::RoundKvScalar(t, in.data(), n, want.data());
      (kt.round_kv ? kt.round_kv : cpu::RoundKvScalar)(t, in.data(), n, got.data());
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[i], want[i]) << IsaTierName(GetParam()) << " " << DTypeName(t) << " x=" << in[i] << " at " << i;
    }
  }
  // The reference itself: saturation, not inf; NaN stays NaN; round to nearest even.
  uint16_t h[4];
  const float f16_cases[] = {70000.0f, -1e9f, bits(0x7fc00000), 1.0f + 1.0f / 2048};
  cpu::RoundKvScalar(DType::kF16, f16_cases, 4, h);
  EXPECT_EQ(h[0], 0x7bff);
  EXPECT_EQ(h[1], 0xfbff);
  EXPECT_EQ(h[2] & 0x7c00, 0x7c00);
  EXPECT_NE(h[2] & 0x3ff, 0);
  EXPECT_EQ(h[3], 0x3c00);  // 1 + 2^-11 is halfway: rounds to the even 1.0
}

INSTANTIATE_TEST_SUITE_P(Tiers, OpsTier, ::testing::ValuesIn(AllTiers()), testing::TierParamName);

TEST(OpsPublic, BestTierMatchesReference) {
  const int64_t n = 77;
  const std::vector<float> x = RandomVec(n, 20), w = RandomVec(n, 21);
  std::vector<float> a(n), b(n);
  RmsNorm(x.data(), w.data(), a.data(), 1, n, 1e-6f);
  ref::RmsNorm(x.data(), w.data(), b.data(), 1, n, 1e-6f);
  EXPECT_LE(NormalizedError(a, b), kLimit);
  a = x;
  b = x;
  SiluMul(a.data(), w.data(), n);
  ref::SiluMul(b.data(), w.data(), n);
  EXPECT_LE(NormalizedError(a, b), kLimit);
  a = x;
  b = x;
  Softmax(a.data(), n);
  ref::Softmax(b.data(), n);
  EXPECT_LE(NormalizedError(a, b), kLimit);
  double d = 0;
  for (int64_t i = 0; i < n; ++i) d += (double)x[i] * w[i];
  EXPECT_NEAR(Dot(x.data(), w.data(), n), d, 1e-4);
}

}  // namespace
}  // namespace lathe::kernels
