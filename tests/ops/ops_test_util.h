// Helpers for the op tests: the ISA tiers to run, random inputs, weights in every dtype, and the
// normalized error ||y - ref|| / ||ref||.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

// n random blocks of an IsExtQuant type (no quantizer of ours makes them): every value, scale and
// min bit pattern uniformly random, the f16 factors set to finite magnitudes that give weights of
// ~0.01-0.1, the mins (dmin, Q5_1's m) near the values' mean so the weights are centred as trained
// weights are.
inline void RandomExtBlocks(DType t, int64_t n, uint32_t seed, uint8_t* out) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 1.0f);
  const DTypeInfo& info = GetDTypeInfo(t);
  for (int64_t b = 0; b < n; ++b) {
    uint8_t* blk = out + b * info.block_bytes;
    for (int i = 0; i < info.block_bytes; ++i) blk[i] = (uint8_t)(rng() & 0xff);
    auto set = [&](int off, float v) {
      const uint16_t h = F32ToF16(v);
      std::memcpy(blk + off, &h, 2);
    };
    const float d = u(rng);
    switch (t) {
      case DType::kQ5_0: set(0, 0.005f * d); break;
      case DType::kQ5_1: set(0, 0.004f * d), set(2, -15.5f * 0.004f * d * u(rng)); break;
      case DType::kQ2_K: set(80, 0.005f * d), set(82, 1.5f * 0.005f * d * u(rng)); break;
      case DType::kQ3_K: set(108, 0.001f * d); break;
      case DType::kQ4_K: set(0, 0.0002f * d), set(2, 7.5f * 0.0002f * d * u(rng)); break;
      case DType::kQ5_K: set(0, 0.0001f * d), set(2, 15.5f * 0.0001f * d * u(rng)); break;
      case DType::kQ6_K: set(208, 0.00003f * d); break;
      default: FAIL() << "RandomExtBlocks: " << DTypeName(t);
    }
  }
}

// K rounded up to whole blocks of dt (the K-quants' 256; GGUF rows are always whole blocks).
inline int64_t FitK(DType dt, int64_t K) {
  const int64_t bs = GetDTypeInfo(dt).block_size;
  return (K + bs - 1) / bs * bs;
}

inline TestWeight MakeWeight(DType dtype, int64_t N, int64_t K, uint32_t seed) {
  TestWeight w;
  if (IsExtQuant(dtype)) {
    const size_t rb = DTypeBytes(dtype, K);
    w.bytes.resize(rb * N + 64);
    RandomExtBlocks(dtype, N * K / GetDTypeInfo(dtype).block_size, seed, w.bytes.data());
    w.t.data = w.bytes.data();
    w.t.dtype = dtype;
    w.t.shape = {N, K};
    return w;
  }
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

// y(M, N) = x(M, K) . wd(N, K)^T in double, rounded to float: the reference for kernels that run f32
// against exactly dequantized weights (only their summation order differs).
inline std::vector<float> DoubleMatMul(const float* x, int64_t M, const float* wd, int64_t N, int64_t K) {
  std::vector<float> y(M * N);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += (double)x[m * K + k] * wd[n * K + k];
      y[m * N + n] = (float)s;
    }
  return y;
}

// Normalized error limits of MatMul vs ref::MatMul. The float types differ from the reference only in
// summation order. The GEMV path for block types quantizes x to int8 blocks of 32 (as llama.cpp does),
// which costs about 0.6% relative error on Gaussian data (measured 0.55-0.7% over the op tests'
// shapes); a handful of outputs does not average, so the limit is looser there. Block types keep int8
// x for every M (the int8 GEMM or the batched GEMV); only exact_activations takes the f32
// dequantize-panel path.
inline double MatMulErrorLimit(DType t, int64_t M, int64_t N = 1000) {
  if (IsQuantized(t)) return M * N >= 8 ? 1.2e-2 : 4e-2;
  return 2e-6;
}

// The same for packed weights (NF4/FP4/int8) vs DoubleMatMul: 4-bit decode and every prefill run f32
// against exactly dequantized values, only the summation order differs (measured <= 4e-7). The int8
// decode path quantizes x row-wise to int8 (LLM.int8), ~0.3-0.6 % normalized error on Gaussian data
// (measured), a few outputs average less.
inline double PackedMatMulErrorLimit(DType t, int64_t M, int64_t N) {
  if (t == DType::kI8Row && M < cpu::kGemvMaxM) return M * N >= 8 ? 1.2e-2 : 3e-2;
  return 2e-6;
}

inline std::string TierParamName(const ::testing::TestParamInfo<IsaTier>& info) {
  return IsaTierName(info.param);
}

}  // namespace lathe::kernels::testing
