// Packed NF4/FP4 (+DQ) and LLM.int8 weights: MatMul (decode and prefill) and MatMulBackwardInput on
// every ISA tier the CPU has, vs the scalar tier and vs a double dequantize-then-matmul; the int8
// outlier decomposition; quantize errors; LATHE_PERF=1 GFLOP/s vs the q4_1 / bf16 kernels.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/train_dispatch.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/train_ops.h"
#include "ops_test_util.h"

namespace lathe::kernels {
namespace {

using testing::NormalizedError;
using testing::RandomVec;

const DType kPacked[] = {DType::kNF4, DType::kFP4, DType::kNF4DQ, DType::kFP4DQ, DType::kI8Row};

struct QShape {
  int64_t N, K;
};
// K a multiple of 64 (the 4-bit block); N crossing the 16-row decode chunks and the panels.
const QShape kShapes[] = {{1, 64}, {5, 128}, {37, 192}, {67, 576}, {13, 1536}};

PackedWeight MakePacked(DType t, int64_t N, int64_t K, uint32_t seed) {
  std::vector<float> f = RandomVec(N * K, seed, 0.05f);
  Tensor src{f.data(), DType::kF32, {N, K}};
  auto pw = QuantizeWeight(src, t, "test");
  LATHE_CHECK(pw.ok());
  return std::move(*pw);
}

// y = x . W^T in double with W dequantized by the reference.
std::vector<float> DoubleRef(const std::vector<float>& x, int64_t M, const Tensor& w) {
  const int64_t N = w.shape[0], K = w.shape[1];
  std::vector<float> wd(N * K);
  DequantizePacked(w, wd.data());
  return testing::DoubleMatMul(x.data(), M, wd.data(), N, K);
}

class QuantMatMulTier : public ::testing::TestWithParam<IsaTier> {};

TEST_P(QuantMatMulTier, MatchesDoubleReferenceAndScalarTier) {
  const IsaTier tier = GetParam();
  LATHE_REQUIRE_TIER(tier);
  const cpu::KernelTable& kt = cpu::KernelsFor(tier);
  const cpu::KernelTable& ks = cpu::KernelsFor(IsaTier::kScalar);
  uint32_t seed = 1;
  for (DType t : kPacked) {
    for (const QShape& s : kShapes) {
      PackedWeight pw = MakePacked(t, s.N, s.K, seed++);
      const Tensor w = pw.view();
      for (int64_t M : {1, 2, 3, 4, 7, 33}) {
        SCOPED_TRACE(std::string(DTypeName(t)) + " M=" + std::to_string(M) + " N=" + std::to_string(s.N) +
                     " K=" + std::to_string(s.K));
        const std::vector<float> x = RandomVec(M * s.K, seed++);
        const std::vector<float> ref = DoubleRef(x, M, w);
        ThreadPool pool1(1);
        std::vector<float> y(M * s.N, -1.0f), ys(M * s.N, -1.0f);
        cpu::MatMulWith(kt.mm, pool1, x.data(), M, w, y.data());
        cpu::MatMulWith(ks.mm, pool1, x.data(), M, w, ys.data());
        EXPECT_LE(NormalizedError(y, ref), testing::PackedMatMulErrorLimit(t, M, s.N));
        EXPECT_LE(NormalizedError(ys, ref), testing::PackedMatMulErrorLimit(t, M, s.N));
        EXPECT_LE(NormalizedError(y, ys), t == DType::kI8Row ? 2e-6 : 2e-6);
        ThreadPool pool2(2);
        std::vector<float> y2(M * s.N, -2.0f);
        cpu::MatMulWith(kt.mm, pool2, x.data(), M, w, y2.data());
        EXPECT_EQ(y2, y) << "2 threads";
      }
    }
  }
}

TEST_P(QuantMatMulTier, BackwardInputMatchesDoubleReference) {
  const IsaTier tier = GetParam();
  LATHE_REQUIRE_TIER(tier);
  const cpu::KernelTable& kt = cpu::KernelsFor(tier);
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(tier);
  uint32_t seed = 100;
  for (DType t : kPacked) {
    for (const QShape& s : {QShape{37, 192}, QShape{300, 320}, QShape{13, 1536}}) {
      PackedWeight pw = MakePacked(t, s.N, s.K, seed++);
      const Tensor w = pw.view();
      std::vector<float> wd(s.N * s.K);
      DequantizePacked(w, wd.data());
      for (int64_t M : {1, 7, 200}) {
        SCOPED_TRACE(std::string(DTypeName(t)) + " M=" + std::to_string(M) + " N=" + std::to_string(s.N));
        const std::vector<float> dy = RandomVec(M * s.N, seed++);
        std::vector<float> ref(M * s.K);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t k = 0; k < s.K; ++k) {
            double acc = 1.0;  // the accumulate run adds onto 1.0
            for (int64_t n = 0; n < s.N; ++n) acc += (double)dy[m * s.N + n] * wd[n * s.K + k];
            ref[m * s.K + k] = (float)acc;
          }
        for (int threads : {1, 2}) {
          ThreadPool pool(threads);
          std::vector<float> dx(M * s.K, 1.0f);
          cpu::MatMulBackwardInputWith(tk, kt, pool, dx.data(), dy.data(), M, w, /*accumulate=*/true);
          EXPECT_LE(NormalizedError(dx, ref), 5e-6) << threads << " threads";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, QuantMatMulTier, ::testing::ValuesIn(testing::AllTiers()),
                         testing::TierParamName);

TEST(QuantMatMul, Int8OutlierColumnsGoThroughF32) {
  // One huge activation column: LLM.int8 keeps it out of the int8 quantization of x, so the other
  // columns keep their resolution (without the decomposition x's absmax would be 300 and the error
  // ~10x larger); the outlier column's contribution is exact up to f32 rounding.
  const int64_t N = 96, K = 256, M = 2;
  PackedWeight pw = MakePacked(DType::kI8Row, N, K, 7);
  std::vector<float> x = RandomVec(M * K, 8);
  x[0 * K + 11] = 300.0f;
  x[1 * K + 200] = -6.0f;  // exactly the threshold: bitsandbytes counts |x| >= 6 as an outlier
  const std::vector<float> ref = DoubleRef(x, M, pw.view());
  for (IsaTier tier : {IsaTier::kScalar, IsaTier::kAvx2}) {
    if (!testing::CpuHasTier(tier)) continue;
    ThreadPool pool(1);
    std::vector<float> y(M * N);
    quant::Int8DecomposedMatMul(quant::QuantKernelsFor(tier), pool, x.data(), M, pw.view(), y.data(), 6.0f);
    EXPECT_LE(NormalizedError(y, ref), 1e-2) << IsaTierName(tier);
    // Without the decomposition (threshold above every |x|) the error is far larger.
    std::vector<float> y_plain(M * N);
    quant::Int8DecomposedMatMul(quant::QuantKernelsFor(tier), pool, x.data(), M, pw.view(), y_plain.data(),
                                1e9f);
    EXPECT_GT(NormalizedError(y_plain, ref), 3 * NormalizedError(y, ref)) << IsaTierName(tier);
  }
}

TEST(QuantMatMul, PublicEntryPointsUseThePackedBuffer) {
  PackedWeight pw = MakePacked(DType::kNF4DQ, 20, 128, 3);
  std::vector<float> all(20 * 128), rows(5 * 128);
  DequantizePacked(pw.view(), all.data());
  DequantizeRows(pw.view(), 7, 5, rows.data());
  EXPECT_EQ(std::vector<float>(all.begin() + 7 * 128, all.begin() + 12 * 128), rows);
  ThreadPool pool(1);
  const std::vector<float> x = RandomVec(128, 4);
  std::vector<float> y(20);
  MatMul(pool, x.data(), 1, pw.view(), y.data());
  EXPECT_LE(NormalizedError(y, DoubleRef(x, 1, pw.view())), 2e-6);
}

TEST(QuantMatMul, QuantizeRejectsBadInput) {
  std::vector<float> f(3 * 96, 0.5f);
  auto r = QuantizeWeight(Tensor{f.data(), DType::kF32, {3, 96}}, DType::kNF4,
                          "model.layers.0.mlp.up_proj.weight");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("model.layers.0.mlp.up_proj.weight"), std::string::npos);
  EXPECT_NE(r.status().message().find("cols % 64"), std::string::npos);
  EXPECT_FALSE(QuantizeWeight(Tensor{f.data(), DType::kF32, {288}}, DType::kI8Row, "w").ok());
  EXPECT_FALSE(QuantizeWeight(Tensor{f.data(), DType::kI32, {3, 96}}, DType::kI8Row, "w").ok());
  f[100] = NAN;
  auto n = QuantizeWeight(Tensor{f.data(), DType::kF32, {3, 96}}, DType::kI8Row, "w");
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("row 1"), std::string::npos) << n.status().message();
  // A header that disagrees with the tensor is refused.
  PackedWeight pw = MakePacked(DType::kNF4, 4, 64, 1);
  EXPECT_TRUE(ValidatePacked(pw.view()).ok());
  Tensor wrong = pw.view();
  wrong.shape = {2, 128};
  EXPECT_FALSE(ValidatePacked(wrong).ok());
  wrong = pw.view();
  wrong.dtype = DType::kFP4;
  EXPECT_FALSE(ValidatePacked(wrong).ok());
}

TEST(QuantMatMul, BfloatSourceQuantizesLikeItsF32Value) {
  std::vector<float> f = RandomVec(8 * 64, 5);
  std::vector<uint16_t> h(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    h[i] = F32ToBF16(f[i]);
    f[i] = BF16ToF32(h[i]);
  }
  for (DType t : kPacked) {
    auto a = QuantizeWeight(Tensor{f.data(), DType::kF32, {8, 64}}, t);
    auto b = QuantizeWeight(Tensor{h.data(), DType::kBF16, {8, 64}}, t);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->bytes(), b->bytes());
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->bytes()), 0) << DTypeName(t);
  }
}

// LATHE_PERF=1: GFLOP/s of the packed formats vs q4_1 / bf16 at SmolLM2-135M shapes, one thread
// (MatMul decode M = 1 and prefill M = 512; MatMulBackwardInput M = 512 vs bf16).
TEST(QuantMatMul, Perf) {
  if (!std::getenv("LATHE_PERF")) GTEST_SKIP() << "set LATHE_PERF=1";
  ThreadPool pool(1);
  const QShape shapes[] = {{576, 576}, {1536, 576}, {576, 1536}};
  for (int64_t M : {1, 512}) {
    for (const QShape& s : shapes) {
      const std::vector<float> x = RandomVec(M * s.K, 9);
      std::vector<float> y(M * s.N);
      auto time = [&](const Tensor& w) {
        MatMul(pool, x.data(), M, w, y.data());
        const int reps = M == 1 ? 200 : 3;
        double best = 1e30;
        for (int r = 0; r < 3; ++r) {
          auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < reps; ++i) MatMul(pool, x.data(), M, w, y.data());
          best = std::min(
              best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
        }
        return 2.0 * M * s.N * s.K / best * 1e-9;
      };
      testing::TestWeight q41 = testing::MakeWeight(DType::kQ4_1, s.N, s.K, 1);
      testing::TestWeight bf = testing::MakeWeight(DType::kBF16, s.N, s.K, 1);
      const double g_q41 = time(q41.t), g_bf = time(bf.t);
      std::printf("M=%-4lld %4lldx%-4lld  q4_1 %6.1f  bf16 %6.1f GFLOP/s |", (long long)M, (long long)s.N,
                  (long long)s.K, g_q41, g_bf);
      for (DType t : {DType::kNF4, DType::kNF4DQ, DType::kI8Row}) {
        PackedWeight pw = MakePacked(t, s.N, s.K, 2);
        const double g = time(pw.view());
        std::printf("  %s %6.1f (%.2fx bf16)", DTypeName(t), g, g / g_bf);
      }
      std::printf("\n");
    }
  }
  // The QLoRA backward: dX = dY . W through the frozen weight, M = 512 tokens.
  const int64_t M = 512;
  for (const QShape& s : shapes) {
    const std::vector<float> dy = RandomVec(M * s.N, 10);
    std::vector<float> dx(M * s.K);
    auto time = [&](const Tensor& w) {
      MatMulBackwardInput(pool, dx.data(), dy.data(), M, w);
      double best = 1e30;
      for (int r = 0; r < 3; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        MatMulBackwardInput(pool, dx.data(), dy.data(), M, w);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return 2.0 * M * s.N * s.K / best * 1e-9;
    };
    testing::TestWeight bf = testing::MakeWeight(DType::kBF16, s.N, s.K, 1);
    const double g_bf = time(bf.t);
    std::printf("backward_input M=%lld %4lldx%-4lld  bf16 %6.1f GFLOP/s |", (long long)M, (long long)s.N,
                (long long)s.K, g_bf);
    for (DType t : {DType::kNF4DQ, DType::kI8Row}) {
      PackedWeight pw = MakePacked(t, s.N, s.K, 2);
      const double g = time(pw.view());
      std::printf("  %s %6.1f (%.2fx bf16)", DTypeName(t), g, g / g_bf);
    }
    std::printf("\n");
  }
}

}  // namespace
}  // namespace lathe::kernels
