// Helpers for the op tests: the ISA tiers to run, random inputs, weights in every dtype, and the
// normalized error ||y - ref|| / ||ref||.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "core/tensor.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/reference.h"

namespace lathe::kernels::testing {

inline const std::vector<IsaTier>& AllTiers() {
  static const std::vector<IsaTier> t = {IsaTier::kScalar, IsaTier::kAvx2, IsaTier::kAvx512};
  return t;
}

inline bool CpuHasTier(IsaTier t) {
  const CpuFeatures& f = GetCpuFeatures();
  return t == IsaTier::kScalar || (t == IsaTier::kAvx2 && f.HasAvx2Tier()) ||
         (t == IsaTier::kAvx512 && f.HasAvx512Tier());
}

// Skips the test when the CPU lacks the tier (the AVX-512 tests run on AVX-512 machines).
#define LATHE_REQUIRE_TIER(tier)                                                 \
  do {                                                                           \
    if (!::lathe::kernels::testing::CpuHasTier(tier))                            \
      GTEST_SKIP() << "CPU lacks the " << ::lathe::IsaTierName(tier) << " tier"; \
  } while (0)

inline std::vector<float> RandomVec(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A (N, K) weight in dtype t made from random floats with the reference quantizer; owns its bytes.
struct TestWeight {
  std::vector<uint8_t> bytes;
  Tensor t;
};

inline TestWeight MakeWeight(DType dtype, int64_t N, int64_t K, uint32_t seed) {
  TestWeight w;
  const std::vector<float> f = RandomVec(N * K, seed, 0.05f);
  const size_t rb = DTypeBytes(dtype, K);
  w.bytes.resize(rb * N + 64);  // slack so an over-read past the last row would not fault silently
  for (int64_t n = 0; n < N; ++n) ref::QuantizeRow(dtype, f.data() + n * K, K, w.bytes.data() + n * rb);
  w.t.data = w.bytes.data();
  w.t.dtype = dtype;
  w.t.shape = {N, K};
  return w;
}

inline double NormalizedError(const std::vector<float>& y, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double d = (double)y[i] - ref[i];
    num += d * d;
    den += (double)ref[i] * ref[i];
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

inline std::string TierParamName(const ::testing::TestParamInfo<IsaTier>& info) {
  return IsaTierName(info.param);
}

}  // namespace lathe::kernels::testing
