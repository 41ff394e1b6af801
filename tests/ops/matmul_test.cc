// MatMul and DequantizeRows on every ISA tier and weight dtype against the scalar reference, over
// odd shapes, on the GEMV, panel, chain GEMV and GEMM paths (cpu::kGemvMaxM, cpu::kChainGemvMaxM),
// single- and multi-threaded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/train_dispatch.h"
#include "kernels/kernels.h"
#include "ops_test_util.h"

namespace lathe::kernels {
namespace {

using testing::AllTiers;
using testing::FitK;
using testing::MakeWeight;
using testing::NormalizedError;
using testing::RandomVec;

const DType kWeightTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                              DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ2_K, DType::kQ3_K,
                              DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};


struct Shape {
  int64_t N, K;
};
// K not a multiple of 256 (nor, for float types, of 8 or 32); N not a multiple of any tile.
const Shape kBlockShapes[] = {{1, 32}, {5, 64}, {37, 96}, {50, 288}, {67, 576}, {13, 1536}};
const Shape kFloatShapes[] = {{1, 1}, {3, 7}, {9, 37}, {17, 100}, {40, 129}, {11, 576}};

class MatMulTier : public ::testing::TestWithParam<IsaTier> {};

void CheckMatMul(IsaTier tier, DType dt, int64_t M, int64_t N, int64_t K, uint32_t seed) {
  K = FitK(dt, K);
  const cpu::KernelTable& kt = cpu::KernelsFor(tier);
  testing::TestWeight w = MakeWeight(dt, N, K, seed);
  const std::vector<float> x = RandomVec(M * K, seed + 1);
  std::vector<float> ref(M * N), y1(M * N, -1.0f);
  ref::MatMul(x.data(), M, w.t, ref.data());
  ThreadPool pool1(1);
  cpu::MatMulWith(kt.mm, pool1, x.data(), M, w.t, y1.data());
  const double err = NormalizedError(y1, ref);
  EXPECT_LE(err, testing::MatMulErrorLimit(dt, M, N))
      << IsaTierName(tier) << " " << DTypeName(dt) << " M=" << M << " N=" << N << " K=" << K;
  // Multi-threaded runs compute every element with the same code: bitwise equal.
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    std::vector<float> yt(M * N, -2.0f);
    cpu::MatMulWith(kt.mm, pool, x.data(), M, w.t, yt.data());
    ASSERT_EQ(yt, y1) << threads << " threads, " << DTypeName(dt) << " M=" << M << " N=" << N << " K=" << K;
  }
}

TEST_P(MatMulTier, AllDtypesOddShapes) {
  LATHE_REQUIRE_TIER(GetParam());
  uint32_t seed = 1;
  for (DType dt : kWeightTypes) {
    const bool block = IsQuantized(dt);
    for (const Shape& s : block ? std::vector<Shape>(std::begin(kBlockShapes), std::end(kBlockShapes))
                                : std::vector<Shape>(std::begin(kFloatShapes), std::end(kFloatShapes))) {
      for (int64_t M : {1, 2, 3, 4, 5, 8, 16, 17, 18, 31, 64})
        CheckMatMul(GetParam(), dt, M, s.N, s.K, seed++);
    }
  }
}

// Shapes of the real model (SmolLM2-135M) on both paths, including a large N that spans many
// prefill tasks and GEMV chunks.
TEST_P(MatMulTier, ModelShapes) {
  LATHE_REQUIRE_TIER(GetParam());
  uint32_t seed = 1000;
  for (DType dt : kWeightTypes) {
    CheckMatMul(GetParam(), dt, 1, 576, 576, seed++);
    CheckMatMul(GetParam(), dt, 3, 1536, 576, seed++);
    CheckMatMul(GetParam(), dt, 1, 576, 1536, seed++);
    CheckMatMul(GetParam(), dt, 33, 192, 576, seed++);
    CheckMatMul(GetParam(), dt, 100, 577, 1536, seed++);
    CheckMatMul(GetParam(), dt, 517, 70, 576, seed++);  // several x blocks of the int8 GEMM
  }
}

// Large activations and a zero x row: the int8 scale must handle amax == 0 and big magnitudes.
TEST_P(MatMulTier, ZeroAndLargeActivations) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  for (DType dt : kWeightTypes) {
    const int64_t M = 3, N = 21, K = FitK(dt, 128);
    testing::TestWeight w = MakeWeight(dt, N, K, 77);
    std::vector<float> x = RandomVec(M * K, 78, 1000.0f);
    for (int64_t k = 0; k < K; ++k) x[K + k] = 0;  // row 1 all zero
    std::vector<float> ref(M * N), y(M * N);
    ref::MatMul(x.data(), M, w.t, ref.data());
    ThreadPool pool(1);
    cpu::MatMulWith(kt.mm, pool, x.data(), M, w.t, y.data());
    EXPECT_LE(NormalizedError(y, ref), testing::MatMulErrorLimit(dt, M, N)) << DTypeName(dt);
    for (int64_t n = 0; n < N; ++n) EXPECT_EQ(y[N + n], 0.0f) << DTypeName(dt);
  }
}

// The GEMV kernel takes up to 4 x rows per call; MatMul uses it for M < kGemvMaxM only, so call
// it directly for every row count, with a row stride of y wider than N.
TEST_P(MatMulTier, GemvKernelEveryRowCount) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  for (DType dt : kWeightTypes) {
    for (int64_t m = 1; m <= 4; ++m) {
      const int64_t N = 23, K = IsQuantized(dt) ? FitK(dt, 320) : 301, ldy = N + 2;
      testing::TestWeight w = MakeWeight(dt, N, K, 30 + (uint32_t)m);
      const std::vector<float> x = RandomVec(m * K, 40 + (uint32_t)m);
      std::vector<float> ref(m * N), yk(m * ldy, 0.0f), y(m * N);
      ref::MatMul(x.data(), m, w.t, ref.data());
      std::vector<cpu::BlockQ8X> xq(m * K / 32 + 1);
      const void* xa = x.data();
      if (IsQuantized(dt)) {
        for (int64_t i = 0; i < m; ++i) kt.mm.quantize_x(x.data() + i * K, K, xq.data() + i * (K / 32));
        xa = xq.data();
      }
      kt.mm.gemv(dt, w.bytes.data(), w.t.row_bytes(), N, xa, m, K, yk.data(), ldy);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t n = 0; n < N; ++n) y[i * N + n] = yk[i * ldy + n];
      EXPECT_LE(NormalizedError(y, ref), IsQuantized(dt) ? 1.2e-2 : 2e-6) << DTypeName(dt) << " m=" << m;
    }
  }
}

TEST_P(MatMulTier, DequantizeRowsMatchesReference) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  for (DType dt : kWeightTypes) {
    for (int64_t K : {32, 96, 576}) {
      if (!IsQuantized(dt) && K == 96) K = 101;
      K = FitK(dt, K);
      const int64_t N = 7;
      testing::TestWeight w = MakeWeight(dt, N, K, 5);
      const size_t rb = w.t.row_bytes();
      std::vector<float> ref(3 * K), out(3 * K);
      for (int64_t r = 0; r < 3; ++r)
        ref::DequantizeRow(dt, w.bytes.data() + (2 + r) * rb, K, ref.data() + r * K);
      kt.mm.dequant_rows(dt, w.bytes.data() + 2 * rb, rb, 3, K, out.data(), K);
      // Q4_1 may round d*q + m once (FMA) instead of twice; everything else is exact.
      EXPECT_LE(NormalizedError(out, ref), dt == DType::kQ4_1 ? 1e-7 : 0.0) << DTypeName(dt) << " K=" << K;
    }
  }
}

// The int8 GEMM kernel called directly (tiers that have one): every m (tile remainders 1-3), a row
// stride of y wider than N; each element bit-identical to the GEMV kernel on that x row alone
// (the M = 1 path) and within the int8 limit of the reference.
TEST_P(MatMulTier, QuantGemmKernelEqualsGemvPerRow) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  if (!kt.mm.qgemm) GTEST_SKIP() << IsaTierName(GetParam()) << " has no int8 GEMM";
  uint32_t seed = 900;
  for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1}) {
    for (Shape s : {Shape{4, 32}, Shape{24, 96}, Shape{40, 576}, Shape{8, 1536}}) {
      for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 9, 13}) {
        const int64_t K = s.K, N = s.N, nb = K / 32, ldy = N + 3;
        testing::TestWeight w = MakeWeight(dt, N, K, seed++);
        const std::vector<float> x = RandomVec(m * K, seed++);
        std::vector<cpu::BlockQ8X> xq(m * nb);
        for (int64_t i = 0; i < m; ++i) kt.mm.quantize_x(x.data() + i * K, K, xq.data() + i * nb);
        std::vector<float> yk(m * ldy, -5.0f), y1(N), ref(m * N), y(m * N);
        kt.mm.qgemm(dt, w.bytes.data(), w.t.row_bytes(), N, xq.data(), m, K, yk.data(), ldy);
        ref::MatMul(x.data(), m, w.t, ref.data());
        for (int64_t i = 0; i < m; ++i) {
          kt.mm.gemv(dt, w.bytes.data(), w.t.row_bytes(), N, xq.data() + i * nb, 1, K, y1.data(), N);
          for (int64_t n = 0; n < N; ++n) {
            ASSERT_EQ(yk[i * ldy + n], y1[n]) << DTypeName(dt) << " m=" << m << " row " << i << " n=" << n;
            y[i * N + n] = yk[i * ldy + n];
          }
          for (int64_t n = N; n < ldy && i + 1 < m; ++n) ASSERT_EQ(yk[i * ldy + n], -5.0f);  // untouched
        }
        EXPECT_LE(NormalizedError(y, ref), m * N >= 8 ? 1.2e-2 : 4e-2)
            << DTypeName(dt) << " m=" << m << " N=" << N << " K=" << K;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, MatMulTier, ::testing::ValuesIn(AllTiers()), testing::TierParamName);

// Batched decode: for block-quantized weights every row of a batched MatMul (M up to
// kGemvQuantMaxM) runs the M = 1 kernel, so it is bit-identical to the same row computed alone,
// on every tier and thread count, including N not a multiple of 4 and the multi-block head shape.
// Float weights: the GEMV (M < kGemvMaxM) and the panel (the rest) share one per-row arithmetic,
// so there too a row's result does not depend on M.
TEST_P(MatMulTier, BatchedRowsBitIdenticalToSingleRow) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  uint32_t seed = 500;
  for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ2_K,
                   DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<Shape> shapes = {Shape{37, 96}, Shape{577, 576}, Shape{130, 1536}, Shape{2051, 64}};
    // The newer types (slow on the scalar tier): one and several blocks per row, and more rows than
    // one batched-GEMV block (64 KiB).
    if (IsExtQuant(dt)) shapes = {Shape{37, 96}, Shape{2051, 64}};
    if (IsKQuant(dt)) shapes = {Shape{37, 512}, Shape{577, 256}};
    if (!IsQuantized(dt)) shapes = {Shape{37, 96}, Shape{67, 576}, Shape{17, 100}};  // 100: a K tail of 4
    for (Shape s : shapes) {
      for (int64_t M : {int64_t{2}, int64_t{3}, int64_t{5}, int64_t{7}, cpu::kGemvQuantMaxM, int64_t{17},
                        int64_t{34}, int64_t{67}}) {
        // From the tier's qgemm_min_m: the int8 GEMM where the tier has one, else the batched GEMV.
        testing::TestWeight w = MakeWeight(dt, s.N, s.K, seed++);
        const std::vector<float> x = RandomVec(M * s.K, seed++);
        for (int threads : {1, 2}) {
          ThreadPool pool(threads);
          std::vector<float> y(M * s.N, -1.0f), y1(s.N, -2.0f);
          cpu::MatMulWith(kt.mm, pool, x.data(), M, w.t, y.data());
          for (int64_t m = 0; m < M; ++m) {
            ThreadPool pool1(1 + (int)(m % 2));  // alone on 1 or 2 threads
            cpu::MatMulWith(kt.mm, pool1, x.data() + m * s.K, 1, w.t, y1.data());
            ASSERT_TRUE(std::equal(y1.begin(), y1.end(), y.begin() + m * s.N))
                << IsaTierName(GetParam()) << " " << DTypeName(dt) << " M=" << M << " row " << m
                << " N=" << s.N << " K=" << s.K << " threads=" << threads;
          }
        }
      }
    }
  }
}

// The chain GEMV kernel (MatMulWith's path for block types' f32 rows below kChainGemvMaxM) gives every
// element the bits of the GEMM driver's y = x W^T (MatMulForwardWith: the path from kChainGemvMaxM rows
// on, and the trainer's forward): K tails of every length, several inner chunks (K > 768, and 1537: chunks of 528,
// 528, 481), N not a multiple of the kernel's 8 / 16 rows, 1 to 4 x rows with strided x and y.
TEST_P(MatMulTier, ChainGemvEqualsTheGemmPerElement) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(GetParam());
  ASSERT_NE(tk.chain_gemv, nullptr);
  uint32_t seed = 2100;
  ThreadPool pool(1);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (Shape s : {Shape{1, 1}, Shape{3, 7}, Shape{17, 37}, Shape{9, 33}, Shape{40, 100}, Shape{33, 576},
                    Shape{21, 1536}, Shape{16, 1537}, Shape{7, 63}}) {
      testing::TestWeight w = MakeWeight(dt, s.N, s.K, seed++);
      for (int m = 1; m <= 4; ++m) {
        const int64_t ldx = s.K + 3, ldy = s.N + 5;
        const std::vector<float> xs = RandomVec(m * ldx, seed++);
        std::vector<float> x(m * s.K), ref(m * s.N, -1.0f), yk(m * ldy, -2.0f), y(m * s.N);
        for (int i = 0; i < m; ++i) std::copy_n(xs.begin() + i * ldx, s.K, x.begin() + i * s.K);
        cpu::MatMulForwardWith(tk, kt, pool, ref.data(), x.data(), m, w.t);
        tk.chain_gemv(dt, w.bytes.data(), w.t.row_bytes(), s.N, xs.data(), ldx, m, s.K,
                      cpu::GemmInnerChunk(s.K), yk.data(), ldy);
        for (int i = 0; i < m; ++i)
          for (int64_t n = 0; n < s.N; ++n) y[i * s.N + n] = yk[i * ldy + n];
        ASSERT_EQ(y, ref) << IsaTierName(GetParam()) << " " << DTypeName(dt) << " N=" << s.N << " K=" << s.K
                          << " m=" << m;
        for (int i = 0; i < m; ++i)  // nothing written past N in y's rows
          for (int64_t n = s.N; n < ldy; ++n) ASSERT_EQ(yk[i * ldy + n], -2.0f);
      }
    }
  }
}

// On AMX tiles (UsesAmxBf16) the bf16 products take AMX's arithmetic (kernels/cpu/bf16_amx.h), whose rounding no
// scalar chain reproduces: ref = each row of x alone (one_row: an M = 1 call), and each element within (steps + 3) x
// 2^-24 of the sum of its products' magnitudes of the exact sum of bf16(x) times the bf16 weights wb (N x K). The
// callers then check every M and thread count against ref bit for bit (a row's result does not depend on its batch).
template <typename F>
::testing::AssertionResult AmxRowsReference(F one_row, const std::vector<float>& x, int64_t M, int64_t N, int64_t K,
                                            const std::vector<uint16_t>& wb, std::vector<float>* ref) {
  ref->assign(M * N, -1.0f);
  for (int64_t i = 0; i < M; ++i) one_row(x.data() + i * K, ref->data() + i * N);
  const double tol = (double)((K + 1) / 2 / 16 + 3) * std::ldexp(1.0, -24);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < N; ++n) {
      double ex = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double t = (double)BF16ToF32(F32ToBF16(x[i * K + k])) * BF16ToF32(wb[n * K + k]);
        ex += t, mag += std::fabs(t);
      }
      const double got = (*ref)[i * N + n];
      if (!(std::fabs(got - ex) <= tol * mag))
        return ::testing::AssertionFailure() << "row " << i << " column " << n << ": " << got << " vs exact " << ex;
    }
  return ::testing::AssertionSuccess();
}

// Float weights packed in strips (kernels::StripWeight): MatMulStrips gives every element the bits of
// the GEMM driver's y = x W^T on the unpacked W (MatMulForwardWith) at every M, on both of its paths
// (strip GEMV below kStripGemvMaxM rows, the GEMM from it on) and any thread count: N not a multiple
// of 16 (zero-padded strips), K tails, several inner chunks, more strips than one GEMV block; (520, 800):
// one x row's long runs of strips (M = 1) on every thread count.
TEST_P(MatMulTier, StripsEqualTheGemmAtEveryM) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(GetParam());
  uint32_t seed = 2500;
  ThreadPool pool1(1);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (Shape s : {Shape{1, 5}, Shape{17, 37}, Shape{40, 100}, Shape{200, 576}, Shape{33, 1537}, Shape{520, 800}}) {
      testing::TestWeight w = MakeWeight(dt, s.N, s.K, seed++), other_w = MakeWeight(dt, s.N, s.K, seed++);
      std::vector<uint8_t> packed(StripWeightBytes(dt, s.N, s.K));
      const StripWeight sw = cpu::PackStripWeightWith(kt.mm, pool1, w.t, packed.data());
      for (int64_t M : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, cpu::kStripGemvMaxM - 1,
                        cpu::kStripGemvMaxM, int64_t{41}}) {
        const std::vector<float> x = RandomVec(M * s.K, seed++);
        std::vector<float> ref(M * s.N, -1.0f);
        if (sw.bf16_pairs && UsesAmxBf16()) {  // on AMX tiles: AMX's arithmetic
          const std::vector<uint16_t> wb((const uint16_t*)w.t.data, (const uint16_t*)w.t.data + s.N * s.K);
          ASSERT_TRUE(AmxRowsReference(
              [&](const float* xi, float* yi) { cpu::MatMulStripsWith(kt.mm, pool1, xi, 1, sw, yi); }, x, M, s.N,
              s.K, wb, &ref));
        } else if (sw.bf16_pairs) {  // vdpbf16ps strips (CPUs with avx512_bf16): their own arithmetic
          cpu::Bf16PairsReference(x.data(), M, w.t, ref.data());
        } else {
          cpu::MatMulForwardWith(tk, kt, pool1, ref.data(), x.data(), M, w.t);
          // Another weight's product in between: the packed panels the strips' fill should write are
          // not left over from the reference's (the same layout in the same scratch).
          std::vector<float> other(M * s.N);
          cpu::MatMulForwardWith(tk, kt, pool1, other.data(), x.data(), M, other_w.t);
        }
        for (int threads : {1, 2, 3}) {
          ThreadPool pool(threads);
          std::vector<float> y(M * s.N, -2.0f);
          cpu::MatMulStripsWith(kt.mm, pool, x.data(), M, sw, y.data());
          ASSERT_EQ(y, ref) << IsaTierName(GetParam()) << " " << DTypeName(dt) << " N=" << s.N << " K=" << s.K
                            << " M=" << M << " threads=" << threads;
        }
      }
    }
  }
}

// A shared-x product (shared(pool, ys)) against one call per weight (one(pool, i, y)) on 1-3 threads: each of the
// Ns.size() outputs (M x Ns[i]) bit for bit.
template <typename One, typename Shared>
::testing::AssertionResult SharedEqualsOneCallEach(const std::vector<int64_t>& Ns, int64_t M, const One& one,
                                                   const Shared& shared) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<std::vector<float>> want, got;
    std::vector<float*> ys;
    for (size_t i = 0; i < Ns.size(); ++i) {
      want.emplace_back(M * Ns[i], -1.0f);
      one(pool, i, want.back().data());
      got.emplace_back(M * Ns[i], -2.0f);
    }
    for (auto& g : got) ys.push_back(g.data());
    shared(pool, std::span<float* const>(ys));
    for (size_t i = 0; i < Ns.size(); ++i)
      if (got[i] != want[i]) return ::testing::AssertionFailure() << "weight " << i << " threads=" << threads;
  }
  return ::testing::AssertionSuccess();
}

// Strip weights that share x (q / k / v, gate / up): MatMulStripsShared gives each y the bits of its own
// MatMulStrips call at every M (the GEMV rows, and the GEMM's rows where x is packed once for all the weights)
// and thread count: products wide enough for the panel path (x shared), narrow ones (each its own), two inner
// chunks (K = 1537), a prompt longer than one A micro-panel superblock would hold whole (M = 1900, K = 576).
TEST_P(MatMulTier, SharedStripsEqualOneCallPerWeight) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  uint32_t seed = 2600;
  ThreadPool pool1(1);
  struct Case {
    int64_t K;
    std::vector<int64_t> Ns;
    std::vector<int64_t> Ms;
  };
  const Case cases[] = {{576, {200, 192, 576}, {1, 5, cpu::kStripGemvMaxM, 41, 300}},
                        {100, {17, 40}, {3, 41}},
                        {1537, {240, 33}, {cpu::kStripGemvMaxM, 70}},
                        {576, {1536, 1536}, {1900}}};
  const bool panel = cpu::TrainKernelsFor(GetParam()).gemm_panel != nullptr;  // tiers where x can be shared
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const Case& c : cases) {
      // The long prompt (a plan of several superblocks: x packed per call again) once, f32; tiers without the panel
      // path (each weight its own call whatever M) on the short ones: under ASan these are the slow cases.
      if (c.Ms.front() > 1000 && (!panel || dt != DType::kF32)) continue;
      std::vector<testing::TestWeight> ws;
      std::vector<std::vector<uint8_t>> packed;
      std::vector<StripWeight> sws;
      for (int64_t N : c.Ns) {
        ws.push_back(MakeWeight(dt, N, c.K, seed++));
        packed.emplace_back(StripWeightBytes(dt, N, c.K));
      }
      for (size_t i = 0; i < ws.size(); ++i) sws.push_back(cpu::PackStripWeightWith(kt.mm, pool1, ws[i].t, packed[i].data()));
      std::vector<const StripWeight*> sw_ptrs;
      for (const StripWeight& sw : sws) sw_ptrs.push_back(&sw);
      for (int64_t M : c.Ms) {
        if (!panel && M > 64) continue;
        const std::vector<float> x = RandomVec(M * c.K, seed++);
        ASSERT_TRUE(SharedEqualsOneCallEach(
            c.Ns, M,
            [&](ThreadPool& pool, size_t i, float* y) { cpu::MatMulStripsWith(kt.mm, pool, x.data(), M, sws[i], y); },
            [&](ThreadPool& pool, std::span<float* const> ys) {
              cpu::MatMulStripsSharedWith(kt.mm, pool, x.data(), M, sw_ptrs, ys);
            }))
            << IsaTierName(GetParam()) << " " << DTypeName(dt) << " K=" << c.K << " M=" << M;
      }
    }
  }
}

// BF16 weights on CPUs with avx512_bf16 (the AVX-512 table's bf16_strips): packed in pair strips and
// multiplied with vdpbf16ps, every element bit-identical to the scalar definition of that arithmetic
// (Bf16PairsReference: x rounded to bf16, pairs odd element first, chunks added in order; on AMX tiles AMX's, within
// its bound of the exact sum) at every M and thread count, so a row's result does not depend on its batch; N and K
// tails (odd K), several inner chunks, partial strip groups. Without the instruction the table keeps the f32-arithmetic strips.
TEST(Bf16PairStrips, BitIdenticalToTheReference) {
  if (!GetCpuFeatures().HasAvx512Tier() || !GetCpuFeatures().avx512_bf16)
    GTEST_SKIP() << "no avx512_bf16 on this CPU";
  const cpu::KernelTable& kt = cpu::KernelsFor(IsaTier::kAvx512);
  ASSERT_NE(kt.mm.bf16_strips, nullptr);
  uint32_t seed = 2700;
  ThreadPool pool1(1);
  // (520, 800): decode rows' runs of strips (M <= 4) with two inner chunks, several strips per run.
  for (Shape s : {Shape{1, 5}, Shape{17, 37}, Shape{40, 100}, Shape{200, 576}, Shape{33, 1537}, Shape{100, 770},
                  Shape{64, 2}, Shape{520, 800}}) {
    testing::TestWeight w = MakeWeight(DType::kBF16, s.N, s.K, seed++);
    std::vector<uint8_t> packed(StripWeightBytes(DType::kBF16, s.N, s.K));
    const StripWeight sw = cpu::PackStripWeightWith(kt.mm, pool1, w.t, packed.data());
    ASSERT_TRUE(sw.bf16_pairs);
    for (int64_t M : {1, 2, 3, 4, 5, 7, 8, 9, 19, 20, 41, 64, 70, 130}) {
      const std::vector<float> x = RandomVec(M * s.K, seed++);
      std::vector<float> ref(M * s.N, -1.0f);
      if (UsesAmxBf16()) {
        const std::vector<uint16_t> wb((const uint16_t*)w.t.data, (const uint16_t*)w.t.data + s.N * s.K);
        ASSERT_TRUE(AmxRowsReference(
            [&](const float* xi, float* yi) { cpu::MatMulStripsWith(kt.mm, pool1, xi, 1, sw, yi); }, x, M, s.N, s.K,
            wb, &ref))
            << "N=" << s.N << " K=" << s.K;
      } else {
        cpu::Bf16PairsReference(x.data(), M, w.t, ref.data());
      }
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        std::vector<float> y(M * s.N + 16, -2.0f);
        cpu::MatMulStripsWith(kt.mm, pool, x.data(), M, sw, y.data());
        ASSERT_TRUE(std::equal(ref.begin(), ref.end(), y.begin()))
            << "N=" << s.N << " K=" << s.K << " M=" << M << " threads=" << threads;
        for (int i = 0; i < 16; ++i) ASSERT_EQ(y[M * s.N + i], -2.0f) << "written past y";
      }
    }
  }
  // The arithmetic is not the f32 one: x is rounded to bf16 (so results differ), within bf16's error.
  testing::TestWeight w = MakeWeight(DType::kBF16, 64, 576, 99);
  const std::vector<float> x = RandomVec(3 * 576, 98);
  std::vector<float> yp(3 * 64), yf(3 * 64);
  cpu::Bf16PairsReference(x.data(), 3, w.t, yp.data());
  cpu::MatMulForwardWith(cpu::TrainKernelsFor(IsaTier::kAvx512), kt, pool1, yf.data(), x.data(), 3, w.t);
  double num = 0, den = 0;
  for (size_t i = 0; i < yp.size(); ++i) num += (yp[i] - yf[i]) * (yp[i] - yf[i]), den += yf[i] * yf[i];
  EXPECT_GT(num, 0.0);
  EXPECT_LT(std::sqrt(num / den), 1e-2);
}

// The form of the pair tiles (Bf16PairsOnFma) follows LATHE_BF16_PAIRS when it is set: ctest runs the bf16 pair
// tests once with each form forced (ops.bf16_pairs_dp / _fma), and those runs check that form only if this holds.
TEST(Bf16PairStrips, FormFollowsTheEnvironment) {
  const char* env = std::getenv("LATHE_BF16_PAIRS");
  if (!UsesBf16Dot()) {
    EXPECT_FALSE(Bf16PairsOnFma());
  } else if (env && !std::strcmp(env, "fma")) {
    EXPECT_TRUE(Bf16PairsOnFma());
  } else if (env && !std::strcmp(env, "dp")) {
    EXPECT_FALSE(Bf16PairsOnFma());
  } else {
    GTEST_SKIP() << "LATHE_BF16_PAIRS not set: the form is this CPU's measured choice ("
                 << (Bf16PairsOnFma() ? "fma" : "dp") << ")";
  }
}

// Prompt rows of block-quantized weights on CPUs with avx512_bf16 (MatMulBf16With, the table's bf16_dequant):
// each dequantized weight (the scalar reference dequantizer's value) rounded to bf16, then exactly the pair
// arithmetic of Bf16PairsReference on that bf16 W (on AMX tiles: AMX's, within its bound of the exact sum), bit for
// bit at every M and thread count (a prompt row's result does not depend on its chunk), every block type, N and K
// tails, several inner chunks.
TEST(Bf16DequantRows, BitIdenticalToTheReferenceOnRoundedW) {
  if (!GetCpuFeatures().HasAvx512Tier() || !GetCpuFeatures().avx512_bf16)
    GTEST_SKIP() << "no avx512_bf16 on this CPU";
  const cpu::KernelTable& kt = cpu::KernelsFor(IsaTier::kAvx512);
  ASSERT_NE(kt.mm.bf16_dequant, nullptr);
  uint32_t seed = 3100;
  ThreadPool pool1(1);
  for (DType dt : kWeightTypes) {
    if (!IsQuantized(dt)) continue;
    for (Shape s : {Shape{17, 64}, Shape{70, 576}, Shape{13, 1536}, Shape{100, 800}}) {
      const int64_t K = FitK(dt, s.K), N = s.N;
      testing::TestWeight w = MakeWeight(dt, N, K, seed++);
      std::vector<float> f((size_t)(N * K));
      for (int64_t n = 0; n < N; ++n) ref::DequantizeRow(dt, w.bytes.data() + n * w.t.row_bytes(), K, f.data() + n * K);
      std::vector<uint16_t> wb(f.size());
      for (size_t i = 0; i < f.size(); ++i) wb[i] = F32ToBF16(f[i]);
      const Tensor wr{wb.data(), DType::kBF16, {N, K}};
      for (int64_t M : {1, 2, 7, 8, 9, 20, 65, 130}) {
        const std::vector<float> x = RandomVec(M * K, seed++);
        std::vector<float> ref(M * N, -1.0f);
        if (UsesAmxBf16()) {
          ASSERT_TRUE(AmxRowsReference(
              [&](const float* xi, float* yi) { cpu::MatMulBf16With(kt.mm, pool1, xi, 1, w.t, yi); }, x, M, N, K,
              wb, &ref))
              << DTypeName(dt) << " N=" << N << " K=" << K;
        } else {
          cpu::Bf16PairsReference(x.data(), M, wr, ref.data());
        }
        for (int threads : {1, 2, 3}) {
          ThreadPool pool(threads);
          std::vector<float> y(M * N + 16, -2.0f);
          cpu::MatMulBf16With(kt.mm, pool, x.data(), M, w.t, y.data());
          ASSERT_TRUE(std::equal(ref.begin(), ref.end(), y.begin()))
              << DTypeName(dt) << " N=" << N << " K=" << K << " M=" << M << " threads=" << threads;
          for (int i = 0; i < 16; ++i) ASSERT_EQ(y[M * N + i], -2.0f) << "written past y";
        }
      }
      // Within bf16's error of the f32 product on the dequantized W.
      const std::vector<float> x = RandomVec(3 * K, seed++);
      std::vector<float> yb(3 * N), yf(3 * N);
      cpu::MatMulBf16With(kt.mm, pool1, x.data(), 3, w.t, yb.data());
      ref::MatMul(x.data(), 3, w.t, yf.data());
      EXPECT_LT(NormalizedError(yb, yf), 1e-2) << DTypeName(dt);
      EXPECT_NE(yb, yf) << DTypeName(dt) << ": not the f32 arithmetic";
    }
  }
  // Without the bf16 dot product (other tables) the prompt rows keep f32 activations.
  const cpu::KernelTable& a2 = cpu::KernelsFor(IsaTier::kAvx2);
  EXPECT_EQ(a2.mm.bf16_dequant, nullptr);
}

// Block-quantized weights with f32 activations (prompt rows, exact_activations) take the float path
// on dequantized rows: a row's result does not depend on M either (chunked prefill, prefix caching).
TEST_P(MatMulTier, ExactRowsBitIdenticalToSingleRow) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  uint32_t seed = 2300;
  for (DType dt : {DType::kQ8_0, DType::kQ4_1, DType::kQ4_K, DType::kQ6_K}) {
    const Shape s = IsKQuant(dt) ? Shape{37, 512} : Shape{70, 576};
    for (int64_t M : {int64_t{2}, int64_t{5}, cpu::kChainGemvMaxM - 1, cpu::kChainGemvMaxM, int64_t{34}}) {
      testing::TestWeight w = MakeWeight(dt, s.N, s.K, seed++);
      const std::vector<float> x = RandomVec(M * s.K, seed++);
      ThreadPool pool(2);
      std::vector<float> y(M * s.N, -1.0f), y1(s.N, -2.0f);
      cpu::MatMulWith(kt.mm, pool, x.data(), M, w.t, y.data(), /*exact_activations=*/true);
      for (int64_t m = 0; m < M; ++m) {
        cpu::MatMulWith(kt.mm, pool, x.data() + m * s.K, 1, w.t, y1.data(), /*exact_activations=*/true);
        ASSERT_TRUE(std::equal(y1.begin(), y1.end(), y.begin() + m * s.N))
            << IsaTierName(GetParam()) << " " << DTypeName(dt) << " M=" << M << " row " << m;
      }
    }
  }
}

// MatMulShared (q/k/v, gate/up) gives each weight bit for bit its own MatMul's result, on every tier
// and thread count: on the joined M = 1 GEMV path (mixed dtypes, N not a multiple of 4, a weight
// of fewer rows than a chunk) and where it falls back to one MatMul each (M > 1, exact activations,
// different K).
TEST_P(MatMulTier, SharedEqualsOneMatMulPerWeight) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::KernelTable& kt = cpu::KernelsFor(GetParam());
  struct Case {
    std::vector<DType> dts;
    std::vector<int64_t> ns;
    int64_t K;
  };
  const Case cases[] = {
      {{DType::kQ8_0, DType::kQ8_0, DType::kQ8_0}, {576, 192, 192}, 576},
      {{DType::kQ4_1, DType::kQ4_0, DType::kQ8_0}, {67, 5, 130}, 96},
      {{DType::kBF16, DType::kF32}, {1536, 1536}, 64},
      {{DType::kF16, DType::kQ4_1, DType::kF32, DType::kQ8_0}, {3, 36, 2051, 4}, 32},
      {{DType::kQ4_K, DType::kQ5_0, DType::kQ6_K, DType::kQ5_1}, {67, 5, 130, 36}, 512},  // a Q4_K_M file's mix
  };
  uint32_t seed = 1700;
  for (const Case& c : cases) {
    std::vector<testing::TestWeight> ws;
    std::vector<const Tensor*> wp;
    for (size_t i = 0; i < c.dts.size(); ++i) ws.push_back(MakeWeight(c.dts[i], c.ns[i], c.K, seed++));
    for (const auto& w : ws) wp.push_back(&w.t);
    for (int64_t M : {1, 2, 17}) {
      const std::vector<float> x = RandomVec(M * c.K, seed++);
      for (bool exact : {false, true}) {
        for (int threads : {1, 2, 3}) {
          ThreadPool pool(threads);
          std::vector<std::vector<float>> ys, ref;
          std::vector<float*> yp;
          for (size_t i = 0; i < ws.size(); ++i) {
            ys.emplace_back(M * c.ns[i], -1.0f);
            ref.emplace_back(M * c.ns[i], -2.0f);
            cpu::MatMulWith(kt.mm, pool, x.data(), M, ws[i].t, ref.back().data(), exact);
          }
          for (auto& y : ys) yp.push_back(y.data());
          cpu::MatMulSharedWith(kt.mm, pool, x.data(), M, wp, yp, exact);
          for (size_t i = 0; i < ws.size(); ++i)
            ASSERT_EQ(ys[i], ref[i]) << IsaTierName(GetParam()) << " weight " << i << " " << DTypeName(c.dts[i])
                                     << " M=" << M << " exact=" << exact << " threads=" << threads;
        }
      }
    }
  }
  // Weights with different K: one MatMul each.
  testing::TestWeight a = MakeWeight(DType::kQ8_0, 40, 64, 1), b = MakeWeight(DType::kQ8_0, 40, 96, 2);
  const std::vector<float> x = RandomVec(96, 3);
  std::vector<float> ya(40), yb(40), ra(40), rb(40);
  ThreadPool pool(2);
  const Tensor* wp[] = {&a.t, &b.t};
  float* yp[] = {ya.data(), yb.data()};
  cpu::MatMulSharedWith(kt.mm, pool, x.data(), 1, wp, yp);
  cpu::MatMulWith(kt.mm, pool, x.data(), 1, a.t, ra.data());
  cpu::MatMulWith(kt.mm, pool, x.data(), 1, b.t, rb.data());
  EXPECT_EQ(ya, ra);
  EXPECT_EQ(yb, rb);
}

// The AVX2 tier's int8 kernels come in two forms of one arithmetic (avx2_util.h, Dot4Q4): 128-bit
// (CPUs that split 256-bit operations, Zen 1) and full width (two weight rows per vector). Both run
// on any AVX2 CPU and must give bit-identical results on the GEMV (M <= 16) and int8 GEMM (M > 16)
// paths, tails of N included; the tier tests above cover the form this CPU takes, this the other.
// Likewise the BF16 GEMV (128-bit halves of the panel's 8-lane accumulators vs full width).
TEST(Avx2Forms, SplitAndFullWidthBitIdentical) {
  LATHE_REQUIRE_TIER(IsaTier::kAvx2);
  const cpu::MatMulKernels& split = cpu::avx2::Table(true).mm;
  const cpu::MatMulKernels& full = cpu::avx2::Table(false).mm;
  ASSERT_NE(split.gemv, full.gemv);
  ASSERT_NE(split.qgemm, full.qgemm);
  uint32_t seed = 1300;
  for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kBF16}) {
    for (Shape s : {Shape{4, 32}, Shape{37, 96}, Shape{130, 576}, Shape{66, 1536}, Shape{9, 100}}) {
      if (IsQuantized(dt) && s.K % 32 != 0) continue;
      for (int64_t M : {1, 2, 3, 4, 5, 16, 17, 22, 34}) {
        testing::TestWeight w = MakeWeight(dt, s.N, s.K, seed++);
        const std::vector<float> x = RandomVec(M * s.K, seed++);
        std::vector<float> ys(M * s.N, -1.0f), yf(M * s.N, -2.0f), ref(M * s.N);
        ThreadPool pool(2);
        cpu::MatMulWith(split, pool, x.data(), M, w.t, ys.data());
        cpu::MatMulWith(full, pool, x.data(), M, w.t, yf.data());
        ASSERT_EQ(ys, yf) << DTypeName(dt) << " M=" << M << " N=" << s.N << " K=" << s.K;
        ref::MatMul(x.data(), M, w.t, ref.data());
        EXPECT_LE(NormalizedError(ys, ref), testing::MatMulErrorLimit(dt, M, s.N))
            << DTypeName(dt) << " M=" << M << " N=" << s.N << " K=" << s.K;
      }
    }
  }
}

// The AVX-512 tier's block arithmetic, written out in scalar code: per (x row, weight row) and block, the
// exact int32 dot product T of the weight codes (q for Q8_0; nibble (+ fifth bit) for Q4 / Q5) and x's
// int8 codes, acc = fma(float(T), dw * dx, acc) and corr = fma(cw, sx, corr) in block order, y = acc (Q8_0)
// or acc + corr * kCorr (cw = the min for Q4_1 / Q5_1, else dw; kCorr = 1, or -8 / -16 for the offset).
// XB = BlockQ8X (int8 codes qs) or BlockQ16X (int16 codes 256 hi + lo): the same block arithmetic.
template <class XB>
float TierBlockDot(DType dt, const uint8_t* row, const XB* x, int64_t nb) {
  const auto rounded = [](float v) {  // one rounding per step, never contracted into an fma
    volatile float r = v;
    return (float)r;
  };
  float acc = 0.0f, corr = 0.0f;
  if (dt == DType::kQ4_K || dt == DType::kQ5_K) {  // per 32-element sub-block: dw = d * sc, cw = dmin * m, kCorr = -1
    ref::DecodedBlock db;
    for (int64_t j = 0; j < nb; ++j) {
      if (j % 8 == 0) ref::DecodeBlock(dt, row + j / 8 * GetDTypeInfo(dt).block_bytes, &db);
      int32_t t = 0;
      for (int e = 0; e < 32; ++e) {
        const int code = db.q[32 * (j % 8) + e];
        if constexpr (std::is_same_v<XB, cpu::BlockQ16X>) {
          t += code * (256 * x[j].hi[e] + x[j].lo[e]);
        } else {
          t += code * x[j].qs[e];
        }
      }
      const float dw = db.d * (float)db.sc[2 * (j % 8)], cw = db.dmin * (float)db.mn[2 * (j % 8)];
      acc = std::fma((float)t, rounded(dw * x[j].d), acc);
      corr = std::fma(cw, x[j].s, corr);
    }
    return rounded(acc + rounded(corr * -1.0f));
  }
  const bool q8 = dt == DType::kQ8_0, k5 = dt == DType::kQ5_0 || dt == DType::kQ5_1;
  const bool min = dt == DType::kQ4_1 || dt == DType::kQ5_1;
  const size_t bytes = (size_t)GetDTypeInfo(dt).block_bytes;
  for (int64_t j = 0; j < nb; ++j) {
    const uint8_t* b = row + j * bytes;
    uint16_t h[2];
    std::memcpy(h, b, 4);
    const float dw = F16ToF32(h[0]), cw = min ? F16ToF32(h[1]) : dw;
    const uint8_t* qs = b + (min ? 4 : 2) + (k5 ? 4 : 0);
    uint32_t qh = 0;
    if (k5) std::memcpy(&qh, qs - 4, 4);
    int32_t t = 0;
    for (int e = 0; e < 32; ++e) {
      const int code = q8 ? (int)(int8_t)b[2 + e]
                          : (e < 16 ? qs[e] & 15 : qs[e - 16] >> 4) | (k5 ? (int)(qh >> e & 1) << 4 : 0);
      if constexpr (std::is_same_v<XB, cpu::BlockQ16X>) {
        t += code * (256 * x[j].hi[e] + x[j].lo[e]);
      } else {
        t += code * x[j].qs[e];
      }
    }
    acc = std::fma((float)t, rounded(dw * x[j].d), acc);
    corr = std::fma(cw, x[j].s, corr);
  }
  if (q8) return acc;
  const float k = min ? 1.0f : k5 ? -16.0f : -8.0f;
  return rounded(acc + rounded(corr * k));
}

// Q8_0 / Q4_* / Q5_* on the AVX-512 tier: the 4-row zmm GEMV (below qgemm_min_m rows) and the VNNI int8
// GEMM (from there) both give every row the bits of TierBlockDot above, for the GEMV's 1-7 x rows and the
// GEMM's tile remainders, N with and without a 16-row remainder; the N % 4 tail rows run the AVX2 tier's
// kernel and give its bits.
TEST(Avx512Tier, BlockTypesMatchTheScalarBlockArithmetic) {
  LATHE_REQUIRE_TIER(IsaTier::kAvx512);
  const cpu::MatMulKernels& a512 = cpu::KernelsFor(IsaTier::kAvx512).mm;
  const cpu::MatMulKernels& a2 = cpu::KernelsFor(IsaTier::kAvx2).mm;
  uint32_t seed = 1700;
  for (DType dt : {DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    for (Shape s : {Shape{4, 32}, Shape{37, 96}, Shape{36, 64}, Shape{130, 576}, Shape{66, 1536}, Shape{200, 64}}) {
      for (int64_t M : {1, 2, 3, 4, 5, 7, 8, 16, 17, 22, 34}) {
        testing::TestWeight w = MakeWeight(dt, s.N, s.K, seed++);
        const std::vector<float> x = RandomVec(M * s.K, seed++);
        const int64_t nb = s.K / 32, n4 = s.N / 4 * 4;
        std::vector<cpu::BlockQ8X> xq(M * nb);
        for (int64_t i = 0; i < M; ++i) a512.quantize_x(x.data() + i * s.K, s.K, xq.data() + i * nb);
        std::vector<float> y512(M * s.N, -1.0f), y2(M * s.N, -2.0f);
        ThreadPool pool(2);
        cpu::MatMulWith(a512, pool, x.data(), M, w.t, y512.data());
        cpu::MatMulWith(a2, pool, x.data(), M, w.t, y2.data());
        for (int64_t i = 0; i < M; ++i)
          for (int64_t n = 0; n < s.N; ++n) {
            const float want = n < n4 ? TierBlockDot(dt, w.bytes.data() + n * w.t.row_bytes(), xq.data() + i * nb, nb)
                                      : y2[i * s.N + n];
            ASSERT_EQ(y512[i * s.N + n], want)
                << DTypeName(dt) << " M=" << M << " N=" << s.N << " K=" << s.K << " row " << i << " n=" << n;
          }
      }
    }
  }
}

// The int16 x quantizer of prompt rows, written out: per block d = amax / kQ16Max, c = round-half-even(x *
// (kQ16Max / amax)) clamped to +-kQ16Max, c = 256 hi + lo with lo in [-128, 127], csum = sum(c), s = d * csum.
void QuantizeX16Model(const float* x, int64_t K, cpu::BlockQ16X* out) {
  for (int64_t j = 0; j < K / 32; ++j) {
    const float* p = x + 32 * j;
    float amax = 0;
    for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(p[e]));
    const float d = amax / (float)cpu::kQ16Max, id = amax > 0 ? (float)cpu::kQ16Max / amax : 0.0f;
    int32_t sum = 0;
    for (int e = 0; e < 32; ++e) {
      volatile float v = p[e] * id;  // one rounding, as the vector multiply
      const int32_t c = std::clamp((int32_t)std::nearbyint((float)v), -cpu::kQ16Max, cpu::kQ16Max);
      const int32_t lo = ((c + 128) & 255) - 128;
      out[j].lo[e] = (int8_t)lo;
      out[j].hi[e] = (int8_t)((c - lo) / 256);
      sum += c;
    }
    out[j].csum = sum;
    out[j].d = d;
    out[j].s = d * (float)sum;
  }
}

// The int16 tiers: AVX2 (vpmaddwd on int16 codes) and AVX-512 (vpdpbusd on their two bytes) give int16 rows
// the same bits.
class Int16Tier : public ::testing::TestWithParam<IsaTier> {};
INSTANTIATE_TEST_SUITE_P(Tiers, Int16Tier, ::testing::Values(IsaTier::kAvx2, IsaTier::kAvx512),
                         testing::TierParamName);

// Code e of a block in the layout of tier t's quantize_x16 (dispatch.h, BlockQ16X).
int32_t TierCode(IsaTier t, const cpu::BlockQ16X& b, int e) {
  return t == IsaTier::kAvx512 ? 256 * b.hi[e] + b.lo[e] : b.c[e];
}

TEST_P(Int16Tier, QuantizerMatchesTheModel) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::MatMulKernels& k = cpu::KernelsFor(GetParam()).mm;
  ASSERT_NE(k.quantize_x16, nullptr);
  const int64_t K = 192;
  std::vector<float> x = RandomVec(K, 1900);
  for (int e = 32; e < 64; ++e) x[e] = 0.0f;          // an all-zero block
  x[70] = 1e4f;                                        // one huge element: the rest round to small codes
  for (int e = 96; e < 128; ++e) x[e] = e % 2 ? 0.5f : -0.5f;  // every code at +-kQ16Max
  x[130] = 2.5f * 1e-3f;
  std::vector<cpu::BlockQ16X> a(K / 32), b(K / 32);
  k.quantize_x16(x.data(), K, a.data());
  QuantizeX16Model(x.data(), K, b.data());
  for (int64_t j = 0; j < K / 32; ++j) {
    EXPECT_EQ(a[j].d, b[j].d) << j;
    EXPECT_EQ(a[j].s, b[j].s) << j;
    EXPECT_EQ(a[j].csum, b[j].csum) << j;
    for (int e = 0; e < 32; ++e) {
      const int32_t code = TierCode(GetParam(), a[j], e);
      ASSERT_EQ(code, 256 * b[j].hi[e] + b[j].lo[e]) << j << " " << e;
      const float back = (float)code * a[j].d;
      EXPECT_LE(std::fabs(back - x[32 * j + e]), 0.5001f * a[j].d + 1e-30f) << j << " " << e;
    }
  }
  EXPECT_EQ(a[1].csum, 0);
  EXPECT_EQ(TierCode(GetParam(), a[3], 0), -cpu::kQ16Max);
  EXPECT_EQ(TierCode(GetParam(), a[3], 1), cpu::kQ16Max);
  EXPECT_EQ(b[3].hi[0], -127);
  EXPECT_EQ(b[3].lo[0], -127);
}

// Prompt rows on the int16 tiers (MatMulInt16With; Q8_0 / Q4_* / Q5_* / Q4_K / Q5_K): every row has the bits of
// TierBlockDot over its int16 codes, for every M (1 to past a tile and an x block), N with and without a 16-, 8- or
// 4-row remainder, and 1-3 threads; and the products are far closer to the f32 reference than the int8 ones.
TEST_P(Int16Tier, PromptRowsMatchTheScalarBlockArithmetic) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::MatMulKernels& k = cpu::KernelsFor(GetParam()).mm;
  uint32_t seed = 2000;
  for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K}) {
    for (Shape s : {Shape{4, 32}, Shape{37, 96}, Shape{130, 576}, Shape{66, 1536}, Shape{201, 64}, Shape{20, 256},
                    Shape{37, 512}}) {
      if (IsKQuant(dt) && s.K % 256 != 0) continue;
      for (int64_t M : {1, 2, 3, 5, 8, 17, 34}) {
        testing::TestWeight w = MakeWeight(dt, s.N, s.K, seed++);
        ASSERT_TRUE(cpu::Int16Takes(k, w.t));
        const std::vector<float> x = RandomVec(M * s.K, seed++);
        const int64_t nb = s.K / 32;
        std::vector<cpu::BlockQ16X> xq(M * nb);
        for (int64_t i = 0; i < M; ++i) QuantizeX16Model(x.data() + i * s.K, s.K, xq.data() + i * nb);
        std::vector<float> y(M * s.N, -1.0f), y8(M * s.N), ref(M * s.N);
        ThreadPool pool(1 + (int)(seed % 3));
        cpu::MatMulInt16With(k, pool, x.data(), M, w.t, y.data());
        for (int64_t i = 0; i < M; ++i)
          for (int64_t n = 0; n < s.N; ++n)
            ASSERT_EQ(y[i * s.N + n], TierBlockDot(dt, w.bytes.data() + n * w.t.row_bytes(), xq.data() + i * nb, nb))
                << DTypeName(dt) << " M=" << M << " N=" << s.N << " K=" << s.K << " row " << i << " n=" << n;
        cpu::MatMulWith(k, pool, x.data(), M, w.t, y8.data());
        ref::MatMul(x.data(), M, w.t, ref.data());
        const double e16 = NormalizedError(y, ref), e8 = NormalizedError(y8, ref);
        EXPECT_LE(e16, 1e-4) << DTypeName(dt) << " M=" << M << " N=" << s.N;
        EXPECT_LT(e16 * 20, e8) << DTypeName(dt) << " M=" << M << " N=" << s.N;
      }
    }
  }
  // The public entry point takes it for these types where this CPU's policy says int16 (Int16PromptRows: not
  // where vdpbf16ps runs at its own rate or AMX tiles run the bf16 rows, unless LATHE_INT16_PROMPT forces it), never
  // for Q6_K or float weights.
  testing::TestWeight q8 = MakeWeight(DType::kQ8_0, 8, 64, 1), f = MakeWeight(DType::kF32, 8, 64, 2);
  testing::TestWeight q6k = MakeWeight(DType::kQ6_K, 8, 256, 3);
  EXPECT_EQ(Int16PromptRowsDefault(), !(UsesBf16Dot() && (!Bf16PairsOnFma() || UsesAmxBf16())));
  if (!std::getenv("LATHE_INT16_PROMPT")) {
    EXPECT_EQ(Int16PromptRows(), Int16PromptRowsDefault());
  }
  EXPECT_EQ(MatMulInt16Takes(q8.t), Int16PromptRows() && cpu::Best().mm.qgemm_runs != nullptr);
  EXPECT_FALSE(MatMulInt16Takes(f.t));
  EXPECT_FALSE(MatMulInt16Takes(q6k.t));
  EXPECT_TRUE(cpu::Int16Takes(cpu::KernelsFor(IsaTier::kAvx2).mm, q8.t));
  EXPECT_FALSE(cpu::Int16Takes(cpu::KernelsFor(IsaTier::kScalar).mm, q8.t));
}

// A step's sampled (int8) and prompt (int16) rows in one MatMulRowsWith call: every int8 row has the bits MatMul
// gives it alone (M = 1), every int16 row the bits of MatMulInt16With on its own, for run patterns with one run,
// alternating runs (more than kMaxQRuns of them), several x-row blocks (K = 1536, M = 250) and N % 4 tails.
TEST_P(Int16Tier, MixedRowRunsEqualEachRowsOwnCall) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::MatMulKernels& k = cpu::KernelsFor(GetParam()).mm;
  uint32_t seed = 2100;
  struct Case {
    Shape s;
    std::vector<RowRun> runs;
  };
  std::vector<RowRun> many;
  for (int i = 0; i < 2 * cpu::kMaxQRuns + 3; ++i) many.push_back({1 + i % 3, i % 2 == 1});
  const std::vector<Case> cases = {
      {{130, 576}, {{3, false}, {9, true}}},
      {{201, 64}, {{1, true}, {2, false}, {5, true}, {1, false}}},
      {{66, 1536}, {{200, true}, {20, false}, {30, true}}},
      {{64, 96}, many},
      {{48, 64}, {{7, false}}},
      {{48, 64}, {{7, true}}},
  };
  for (DType dt : {DType::kQ8_0, DType::kQ4_1, DType::kQ5_0, DType::kQ4_K, DType::kQ5_K}) {
    for (Case c : cases) {
      if (IsKQuant(dt)) c.s.K = (c.s.K + 255) / 256 * 256;  // whole 256-blocks
      int64_t M = 0;
      for (const RowRun& r : c.runs) M += r.n_rows;
      testing::TestWeight w = MakeWeight(dt, c.s.N, c.s.K, seed++);
      const std::vector<float> x = RandomVec(M * c.s.K, seed++);
      std::vector<float> y(M * c.s.N, -1.0f), one(c.s.N);
      ThreadPool pool(1 + (int)(seed % 3));
      cpu::MatMulRowsWith(k, pool, x.data(), M, w.t, y.data(), c.runs);
      int64_t m = 0;
      for (const RowRun& r : c.runs)
        for (int64_t i = 0; i < r.n_rows; ++i, ++m) {
          if (r.int16) {
            cpu::MatMulInt16With(k, pool, x.data() + m * c.s.K, 1, w.t, one.data());
          } else {
            cpu::MatMulWith(k, pool, x.data() + m * c.s.K, 1, w.t, one.data());
          }
          ASSERT_EQ(std::vector<float>(y.begin() + m * c.s.N, y.begin() + (m + 1) * c.s.N), one)
              << DTypeName(dt) << " N=" << c.s.N << " K=" << c.s.K << " row " << m << (r.int16 ? " int16" : " int8");
        }
    }
  }
}

// Weights that share x (q / k / v, gate / up) in one MatMulRowsSharedWith call: each y equals its own MatMulRowsWith
// call bit for bit: one dtype and mixed ones (Q8_0's dot starts computed for the int8 rows when any weight needs
// them), prompt rows alone, int8 and int16 runs together, K-quants (int16 rows alone share x; with int8 rows each
// weight keeps its own calls), N % 4 tails, 1-3 threads.
TEST_P(Int16Tier, SharedRowsEqualOneCallPerWeight) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::MatMulKernels& k = cpu::KernelsFor(GetParam()).mm;
  uint32_t seed = 2200;
  struct Case {
    int64_t K;
    std::vector<DType> dts;
    std::vector<int64_t> Ns;
    std::vector<RowRun> runs;
  };
  const std::vector<Case> cases = {
      {576, {DType::kQ4_1, DType::kQ4_1, DType::kQ4_1}, {130, 66, 66}, {{40, true}}},
      {576, {DType::kQ8_0, DType::kQ4_1, DType::kQ5_0}, {64, 50, 33}, {{3, false}, {9, true}, {2, false}}},
      {1536, {DType::kQ4_0, DType::kQ8_0}, {66, 48}, {{100, true}, {20, false}, {30, true}}},
      {512, {DType::kQ4_K, DType::kQ5_K}, {64, 40}, {{25, true}}},
      {512, {DType::kQ4_K, DType::kQ4_1}, {64, 40}, {{5, false}, {25, true}}},
      {64, {DType::kQ8_0, DType::kQ8_0}, {48, 20}, {{7, false}}},
  };
  for (const Case& c : cases) {
    int64_t M = 0;
    for (const RowRun& r : c.runs) M += r.n_rows;
    std::vector<testing::TestWeight> ws;
    std::vector<const Tensor*> wp;
    for (size_t i = 0; i < c.dts.size(); ++i) ws.push_back(MakeWeight(c.dts[i], c.Ns[i], c.K, seed++));
    for (const testing::TestWeight& w : ws) wp.push_back(&w.t);
    const std::vector<float> x = RandomVec(M * c.K, seed++);
    ASSERT_TRUE(SharedEqualsOneCallEach(
        c.Ns, M,
        [&](ThreadPool& pool, size_t i, float* y) { cpu::MatMulRowsWith(k, pool, x.data(), M, ws[i].t, y, c.runs); },
        [&](ThreadPool& pool, std::span<float* const> ys) {
          cpu::MatMulRowsSharedWith(k, pool, x.data(), M, wp, ys, c.runs);
        }))
        << IsaTierName(GetParam()) << " K=" << c.K << " first dtype " << DTypeName(c.dts[0]);
  }
}

// The public entry points (best tier) agree with the reference too.
TEST(MatMulPublic, BestTierAndDequantizeRows) {
  ThreadPool pool(2);
  for (DType dt : kWeightTypes) {
    for (int64_t M : {1, 3, 20}) {
      const int64_t N = 45, K = FitK(dt, 320);
      testing::TestWeight w = MakeWeight(dt, N, K, 9);
      const std::vector<float> x = RandomVec(M * K, 10);
      std::vector<float> ref(M * N), y(M * N);
      ref::MatMul(x.data(), M, w.t, ref.data());
      MatMul(pool, x.data(), M, w.t, y.data());
      EXPECT_LE(NormalizedError(y, ref), testing::MatMulErrorLimit(dt, M))
          << DTypeName(dt) << " M=" << M;
    }
    const int64_t N = 6, K = FitK(dt, 64);
    testing::TestWeight w = MakeWeight(dt, N, K, 11);
    std::vector<float> ref(2 * K), out(2 * K);
    for (int r = 0; r < 2; ++r)
      ref::DequantizeRow(dt, w.bytes.data() + (3 + r) * w.t.row_bytes(), K, ref.data() + r * K);
    DequantizeRows(w.t, 3, 2, out.data());
    EXPECT_LE(NormalizedError(out, ref), 1e-7) << DTypeName(dt);
  }
}

// QuantizeRow must stay bit-identical to the reference (which mirrors ggml's *_ref quantizers).
TEST(QuantizeRowPublic, BitIdenticalToReference) {
  for (DType dt : kWeightTypes) {
    if (IsExtQuant(dt)) continue;  // read-only types (GGUF files made by llama.cpp): no quantizer
    const int64_t n = 320;
    std::vector<float> x = RandomVec(n, 12);
    x[5] = 0;
    x[40] = -3.5f;  // a clear amax for the negative-max Q4_0 rule
    const size_t nb = DTypeBytes(dt, n);
    std::vector<uint8_t> a(nb), b(nb);
    QuantizeRow(dt, x.data(), n, a.data());
    ref::QuantizeRow(dt, x.data(), n, b.data());
    EXPECT_EQ(a, b) << DTypeName(dt);
  }
}

}  // namespace
}  // namespace lathe::kernels

namespace lathe::kernels {
namespace {

// Every tier's table is wired to that tier and complete, whether or not this CPU can run it (the
// AVX-512 table is only read here, never called, on CPUs without AVX-512).
TEST(KernelDispatch, TablesAreCompleteAndTagged) {
  for (IsaTier t : AllTiers()) {
    // A table is built with its tier's instructions (the AVX-512 one zeroes its fields with a zmm store): only
    // on CPUs that have the tier (tests/emu checks the AVX-512 table elsewhere).
    if (!testing::CpuHasTier(t)) continue;
    const cpu::KernelTable& kt = cpu::KernelsFor(t);
    EXPECT_EQ(kt.tier, t);
    EXPECT_TRUE(kt.mm.quantize_x && kt.mm.gemv && kt.mm.dequant_rows && kt.mm.panel) << IsaTierName(t);
    EXPECT_GT(kt.mm.panel_rows, 0);
    EXPECT_GT(kt.mm.tile_m, 0);
    EXPECT_TRUE(kt.rms_norm && kt.silu_mul && kt.dot && kt.axpy && kt.softmax) << IsaTierName(t);
  }
  EXPECT_EQ(cpu::Best().tier, BestIsaTier());
}

}  // namespace
}  // namespace lathe::kernels
