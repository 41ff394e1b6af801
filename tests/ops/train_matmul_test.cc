// MatMulBackwardInput (every weight dtype) and MatMulBackwardWeight on the scalar, AVX2 and AVX-512 tiers
// with 1 and 2 threads, against a double reference and double finite differences; odd shapes
// cross every block edge. LATHE_PERF=1 also prints GFLOP/s at M = 2048.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <tuple>
#include <vector>

#include "core/cpu.h"
#include "core/thread_pool.h"
#include "kernels/cpu/bf16_amx.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/train_dispatch.h"
#include "kernels/cpu/train_reference.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/train_ops.h"
#include "ops_test_util.h"
#include "train_test_util.h"

namespace lathe::kernels {
namespace {

using testing::Dequantized;
using testing::FiniteDiffGrad;
using testing::MakeWeight;
using testing::RandomVec;
using testing::RelErr;
using testing::ToDouble;

// f32 FMA sums of up to ~600 products vs a double reference: ~1e-7 typical, 1e-6 worst seen.
constexpr double kMatmulRefLimit = 5e-6;
constexpr double kMatmulFdLimit = 2e-6;

struct TrainShape {
  int64_t M, N, K;
};
// Cross kRowBlock (192), kColBlock (256), the 6 x 16 tile edges and (K-quants' 768-column blocks on
// AVX-512) the panel path's column blocks.
const TrainShape kQuantShapes[] = {{1, 1, 32}, {7, 13, 64}, {13, 300, 96}, {200, 37, 288}, {6, 16, 256}};
// Plus LoRA-like skinny shapes (rank 1 and 16 on either side), K = 1, inner dimensions in one chunk
// (<= 768), in 3 (1700 and the weight gradient's 900 tokens: uneven last chunk) and in several rounds
// of chunks (4200, 4300: the GEMM packs B round by round then), on the panel path (>= 192 columns) too; few rows
// over a long inner dimension (128 x 4300 x 72, 64 x 2000 x 200: the loss's input gradient, which 2 threads split
// by columns, kColSplitRows).
const TrainShape kF32Shapes[] = {{1, 1, 1},   {5, 7, 19},    {197, 261, 263}, {2, 259, 17}, {37, 16, 1},
                            {9, 1, 40},  {193, 600, 16}, {193, 16, 600}, {61, 3, 520}, {20, 530, 2},
                            {3, 4200, 40}, {4200, 3, 20}, {128, 4300, 72}, {70, 200, 1700}, {900, 250, 300},
                            {64, 2000, 200}};

class TrainMatMul : public ::testing::TestWithParam<std::tuple<IsaTier, int>> {};

TEST_P(TrainMatMul, BackwardInputMatchesReference) {
  const auto [tier, threads] = GetParam();
  LATHE_REQUIRE_TIER(tier);
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(tier);
  const cpu::KernelTable& kt = cpu::KernelsFor(tier);
  ThreadPool pool(threads);
  const DType dtypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                          DType::kQ5_0, DType::kQ5_1, DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K,
                          DType::kQ6_K};
  for (DType dt : dtypes) {
    std::vector<TrainShape> shapes(std::begin(kQuantShapes), std::end(kQuantShapes));
    if (dt == DType::kF32 || dt == DType::kF16 || dt == DType::kBF16)
      shapes.insert(shapes.end(), std::begin(kF32Shapes), std::end(kF32Shapes));
    if (IsKQuant(dt)) shapes = {{1, 1, 256}, {13, 300, 512}, {200, 37, 768}, {6, 16, 256}, {9, 20, 1024}};  // whole 256-blocks
    for (const TrainShape& s : shapes) {
      const testing::TestWeight w = MakeWeight(dt, s.N, s.K, 21);
      const std::vector<double> wd = Dequantized(w.t);
      const std::vector<float> dy = RandomVec(s.M * s.N, 22);
      const std::vector<double> dyd = ToDouble(dy);
      std::vector<double> ref(s.M * s.K);
      train_ref::MatMulBackwardInput<double>(ref.data(), dyd.data(), wd.data(), s.M, s.N, s.K);
      std::vector<float> dx(s.M * s.K, 123.0f);  // overwritten
      cpu::MatMulBackwardInputWith(tk, kt, pool, dx.data(), dy.data(), s.M, w.t, false);
      EXPECT_LE(RelErr(dx, ref), kMatmulRefLimit) << DTypeName(dt) << " " << s.M << "x" << s.N << "x" << s.K;
      // accumulate = true adds onto what is there.
      std::vector<float> acc = RandomVec(s.M * s.K, 23);
      std::vector<double> ref_acc = ToDouble(acc);
      for (size_t i = 0; i < ref_acc.size(); ++i) ref_acc[i] += ref[i];
      cpu::MatMulBackwardInputWith(tk, kt, pool, acc.data(), dy.data(), s.M, w.t, true);
      EXPECT_LE(RelErr(acc, ref_acc), kMatmulRefLimit) << DTypeName(dt) << " accumulate";
      // W packed once beforehand (a frozen head): the same bits, overwriting and accumulating; and
      // the same bits on one thread (the task split never changes what a C element sums).
      std::vector<float> packed(cpu::PackedBackwardInputFloats(s.N, s.K), 7.0f);
      cpu::PackForBackwardInputWith(tk, kt, pool, w.t, packed.data());
      std::vector<float> dxp(s.M * s.K, 123.0f), accp = RandomVec(s.M * s.K, 23), dx1(s.M * s.K, 5.0f);
      cpu::MatMulBackwardInputWith(tk, kt, pool, dxp.data(), dy.data(), s.M, w.t, false, packed.data());
      cpu::MatMulBackwardInputWith(tk, kt, pool, accp.data(), dy.data(), s.M, w.t, true, packed.data());
      EXPECT_EQ(dxp, dx) << DTypeName(dt) << " packed " << s.M << "x" << s.N << "x" << s.K;
      EXPECT_EQ(accp, acc) << DTypeName(dt) << " packed accumulate";
      ThreadPool one(1);
      cpu::MatMulBackwardInputWith(tk, kt, one, dx1.data(), dy.data(), s.M, w.t, false);
      EXPECT_EQ(dx1, dx) << DTypeName(dt) << " 1 thread";
      // dY given transposed (the loss's logits^T): the same sums in the same order, so the same bits.
      std::vector<float> dyT(s.N * s.M), dxt(s.M * s.K, 9.0f), acct = RandomVec(s.M * s.K, 23);
      for (int64_t m = 0; m < s.M; ++m)
        for (int64_t n = 0; n < s.N; ++n) dyT[n * s.M + m] = dy[m * s.N + n];
      cpu::MatMulBackwardInputTWith(tk, kt, pool, dxt.data(), dyT.data(), s.M, w.t, false);
      cpu::MatMulBackwardInputTWith(tk, kt, pool, acct.data(), dyT.data(), s.M, w.t, true, packed.data());
      EXPECT_EQ(dxt, dx) << DTypeName(dt) << " transposed dY " << s.M << "x" << s.N << "x" << s.K;
      EXPECT_EQ(acct, acc) << DTypeName(dt) << " transposed dY, packed, accumulate";
    }
  }
}

// LinearForward's GEMM (y = x . W^T) for the dtypes it takes, y overwritten.
TEST_P(TrainMatMul, ForwardMatchesReference) {
  const auto [tier, threads] = GetParam();
  LATHE_REQUIRE_TIER(tier);
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(tier);
  const cpu::KernelTable& kt = cpu::KernelsFor(tier);
  ThreadPool pool(threads);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<TrainShape> shapes(std::begin(kQuantShapes), std::end(kQuantShapes));
    shapes.insert(shapes.end(), std::begin(kF32Shapes), std::end(kF32Shapes));
    for (const TrainShape& s : shapes) {
      const testing::TestWeight w = MakeWeight(dt, s.N, s.K, 41);
      const std::vector<double> wd = Dequantized(w.t);
      const std::vector<float> x = RandomVec(s.M * s.K, 42);
      const std::vector<double> xd = ToDouble(x);
      std::vector<double> ref(s.M * s.N);
      train_ref::MatMul<double>(ref.data(), xd.data(), wd.data(), s.M, s.N, s.K);
      std::vector<float> y(s.M * s.N, 123.0f);
      cpu::MatMulForwardWith(tk, kt, pool, y.data(), x.data(), s.M, w.t);
      EXPECT_LE(RelErr(y, ref), kMatmulRefLimit) << DTypeName(dt) << " " << s.M << "x" << s.N << "x" << s.K;
      // accumulate: y0 + x . W^T (LoRA's scaled product added straight into the base output).
      const std::vector<float> y0 = RandomVec(s.M * s.N, 43);
      std::vector<float> ya = y0;
      std::vector<double> refa = ref;
      for (size_t i = 0; i < refa.size(); ++i) refa[i] += y0[i];
      cpu::MatMulForwardWith(tk, kt, pool, ya.data(), x.data(), s.M, w.t, /*accumulate=*/true);
      EXPECT_LE(RelErr(ya, refa), kMatmulRefLimit) << DTypeName(dt) << " accumulate " << s.M << "x" << s.N << "x" << s.K;
    }
  }
}

// Both micro-kernels against the scalar tier's and a double sum, for every row/column edge, both
// modes, and B as a packed strip (ldb 16) or read in place from a wider row-major matrix (ldb 37).
TEST(TrainGemmTile, KernelsMatchScalar) {
  LATHE_REQUIRE_TIER(IsaTier::kAvx2);
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(IsaTier::kAvx2);
  const cpu::TrainKernelTable& ts = cpu::TrainKernelsFor(IsaTier::kScalar);
  const int64_t lda = 67, ldc = 21;  // lda >= every L
  for (int64_t ldb : {(int64_t)cpu::kGemmTileC, (int64_t)37})
    for (int64_t L : {1, 2, 17, 64}) {
      const std::vector<float> a = RandomVec(6 * lda, 50), b = RandomVec(L * ldb, 51);
      const std::vector<float> ap = RandomVec(L * cpu::kGemmTileR, 53);  // packed A panel for gemm_tile
      for (int mr = 1; mr <= cpu::kGemmTileR; ++mr)
        for (int nc = 1; nc <= cpu::kGemmTileC; ++nc)
          for (bool overwrite : {false, true}) {
            const std::string where = "ldb " + std::to_string(ldb) + " L " + std::to_string(L) + " mr " +
                                      std::to_string(mr) + " nc " + std::to_string(nc);
            std::vector<float> c0 = RandomVec(6 * ldc, 52), c = c0, cs = c0;
            tk.gemm_tile_rows(a.data(), lda, b.data(), ldb, L, c.data(), ldc, mr, nc, overwrite);
            ts.gemm_tile_rows(a.data(), lda, b.data(), ldb, L, cs.data(), ldc, mr, nc, overwrite);
            for (int64_t i = 0; i < 6; ++i)
              for (int64_t j = 0; j < ldc; ++j) {
                double want = c0[i * ldc + j];
                if (i < mr && j < nc) {
                  want = overwrite ? 0.0 : want;
                  for (int64_t l = 0; l < L; ++l) want += (double)a[i * lda + l] * b[l * ldb + j];
                }
                ASSERT_NEAR(c[i * ldc + j], want, 1e-4) << "rows " << where << " i " << i << " j " << j;
                ASSERT_NEAR(cs[i * ldc + j], want, 1e-4) << "rows scalar " << where << " i " << i << " j " << j;
              }
            if (overwrite) continue;
            c = c0, cs = c0;
            tk.gemm_tile(ap.data(), b.data(), ldb, L, c.data(), ldc, mr, nc);
            ts.gemm_tile(ap.data(), b.data(), ldb, L, cs.data(), ldc, mr, nc);
            for (int64_t i = 0; i < 6; ++i)
              for (int64_t j = 0; j < ldc; ++j) {
                double want = c0[i * ldc + j];
                if (i < mr && j < nc)
                  for (int64_t l = 0; l < L; ++l) want += (double)ap[l * 6 + i] * b[l * ldb + j];
                ASSERT_NEAR(c[i * ldc + j], want, 1e-4) << "packed " << where << " i " << i << " j " << j;
                ASSERT_NEAR(cs[i * ldc + j], want, 1e-4) << "packed scalar " << where << " i " << i << " j " << j;
              }
          }
    }
}

// The two-strip kernels (AVX-512) give every C element the bits the AVX2 one-strip kernels give it:
// every row count, column counts 17..32, both modes, B packed (two strips ldb 16 apart in memory as
// separate arrays) or read in place (ldb 37, the second strip 16 columns on).
TEST(TrainGemmTile, TwoStripKernelsEqualOneStripAvx2) {
  LATHE_REQUIRE_TIER(IsaTier::kAvx512);
  const cpu::TrainKernelTable& tw = cpu::TrainKernelsFor(IsaTier::kAvx512);
  const cpu::TrainKernelTable& t2 = cpu::TrainKernelsFor(IsaTier::kAvx2);
  ASSERT_TRUE(tw.gemm_tile2 && tw.gemm_tile_rows2);
  const int64_t lda = 67, ldc = 37;
  for (int64_t ldb : {(int64_t)cpu::kGemmTileC, (int64_t)37})
    for (int64_t L : {1, 2, 17, 64}) {
      const std::vector<float> a = RandomVec(6 * lda, 60), ap = RandomVec(L * cpu::kGemmTileR, 61);
      const std::vector<float> bb = RandomVec(L * ldb + 16, 62), bb2 = RandomVec(L * ldb, 63);
      const float* b = bb.data();
      const float* b2 = ldb == cpu::kGemmTileC ? bb2.data() : b + cpu::kGemmTileC;
      for (int mr = 1; mr <= cpu::kGemmTileR; ++mr)
        for (int nc = cpu::kGemmTileC + 1; nc <= 2 * cpu::kGemmTileC; ++nc)
          for (bool overwrite : {false, true}) {
            const std::string where = "ldb " + std::to_string(ldb) + " L " + std::to_string(L) + " mr " +
                                      std::to_string(mr) + " nc " + std::to_string(nc);
            const std::vector<float> c0 = RandomVec(6 * ldc, 64);
            std::vector<float> c = c0, c2 = c0;
            tw.gemm_tile_rows2(a.data(), lda, b, b2, ldb, L, c.data(), ldc, mr, nc, overwrite);
            t2.gemm_tile_rows(a.data(), lda, b, ldb, L, c2.data(), ldc, mr, 16, overwrite);
            t2.gemm_tile_rows(a.data(), lda, b2, ldb, L, c2.data() + 16, ldc, mr, nc - 16, overwrite);
            ASSERT_EQ(c, c2) << "rows " << where << (overwrite ? " overwrite" : "");
            if (overwrite) continue;
            c = c0, c2 = c0;
            tw.gemm_tile2(ap.data(), b, b2, ldb, L, c.data(), ldc, mr, nc);
            t2.gemm_tile(ap.data(), b, ldb, L, c2.data(), ldc, mr, 16);
            t2.gemm_tile(ap.data(), b2, ldb, L, c2.data() + 16, ldc, mr, nc - 16);
            ASSERT_EQ(c, c2) << "packed " << where;
          }
    }
}

// The AVX-512 panel tile (8 rows x up to 3 strips over a packed A micro-panel, or over A's rows read
// in place) and its packing: every mr / nc / overwrite gives the AVX2 rows tile's bits (same FMAs in
// the same order per element), B read both from packed strips and in place with a row stride; rows >=
// mr and lanes >= nc untouched; one chain split over three calls through a partial tile gives the same bits.
TEST(TrainGemmTile, PanelKernelEqualsAvx2Tiles) {
  LATHE_REQUIRE_TIER(IsaTier::kAvx512);
  const cpu::TrainKernelTable& tw = cpu::TrainKernelsFor(IsaTier::kAvx512);
  const cpu::TrainKernelTable& t2 = cpu::TrainKernelsFor(IsaTier::kAvx2);
  ASSERT_TRUE(tw.gemm_panel && tw.gemm_panel_rows && tw.pack_panel_rows);
  const int pr = tw.panel_rows;
  ASSERT_EQ(pr, 8);
  ASSERT_EQ(tw.panel_cols, 3 * cpu::kGemmTileC);
  const int64_t lda = 70, ldc = 53;
  for (int64_t L : {1, 2, 7, 8, 17, 64}) {
    const std::vector<float> a = RandomVec(pr * lda, 80);
    // Packing: out[l * pr + i] = a[i * lda + l] for i < mr, zero above.
    std::vector<float> ap(L * pr);
    for (int mr = 1; mr <= pr; ++mr) {
      std::fill(ap.begin(), ap.end(), -1.0f);
      tw.pack_panel_rows(ap.data(), a.data(), lda, L, mr);
      for (int64_t l = 0; l < L; ++l)
        for (int i = 0; i < pr; ++i)
          ASSERT_EQ(ap[l * pr + i], i < mr ? a[i * lda + l] : 0.0f) << "pack L " << L << " mr " << mr;
    }
    tw.pack_panel_rows(ap.data(), a.data(), lda, L, pr);
    for (bool packed_b : {true, false}) {
      // Packed: strip s at b + s * L * 16, rows 16 apart. In place: rows 50 floats apart, strip s at 16 s.
      const int64_t ldb = packed_b ? cpu::kGemmTileC : 50, stride = packed_b ? L * cpu::kGemmTileC : cpu::kGemmTileC;
      const std::vector<float> bb = RandomVec(3 * L * 50 + 64, 81);
      for (int mr = 1; mr <= pr; ++mr)
        for (int nc = 1; nc <= tw.panel_cols; ++nc)
          for (bool overwrite : {false, true}) {
            const std::string where = std::string(packed_b ? "packed" : "in place") + " L " + std::to_string(L) +
                                      " mr " + std::to_string(mr) + " nc " + std::to_string(nc) +
                                      (overwrite ? " overwrite" : "");
            const std::vector<float> c0 = RandomVec(pr * ldc, 82);
            std::vector<float> c = c0, c2 = c0, c3 = c0, c4 = c0;
            tw.gemm_panel(ap.data(), bb.data(), stride, ldb, L, c.data(), ldc, mr, nc, overwrite, nullptr, nullptr);
            // The same chain in three calls through a partial tile (l in [0, L/3), [L/3, L/2), [L/2, L)).
            std::vector<float> part(pr * tw.panel_cols, -3.0f);
            const int64_t l1 = L / 3, l2 = L / 2;
            tw.gemm_panel(ap.data(), bb.data(), stride, ldb, l1, c4.data(), ldc, mr, nc, overwrite, nullptr,
                          part.data());
            tw.gemm_panel(ap.data() + l1 * pr, bb.data() + l1 * ldb, stride, ldb, l2 - l1, c4.data(), ldc, mr, nc,
                          overwrite, part.data(), part.data());
            ASSERT_EQ(c4, c0) << "partial calls left c alone, " << where;
            tw.gemm_panel(ap.data() + l2 * pr, bb.data() + l2 * ldb, stride, ldb, L - l2, c4.data(), ldc, mr, nc,
                          overwrite, part.data(), nullptr);
            tw.gemm_panel_rows(a.data(), lda, bb.data(), stride, ldb, L, c3.data(), ldc, mr, nc, overwrite, nullptr,
                               nullptr);
            // ... and with A's rows in place, in two calls.
            std::vector<float> c5 = c0, part5(pr * tw.panel_cols, -3.0f);
            tw.gemm_panel_rows(a.data(), lda, bb.data(), stride, ldb, l2, c5.data(), ldc, mr, nc, overwrite, nullptr,
                               part5.data());
            tw.gemm_panel_rows(a.data() + l2, lda, bb.data() + l2 * ldb, stride, ldb, L - l2, c5.data(), ldc, mr, nc,
                               overwrite, part5.data(), nullptr);
            for (int i0 = 0; i0 < mr; i0 += cpu::kGemmTileR)
              for (int j0 = 0; j0 < nc; j0 += cpu::kGemmTileC)
                t2.gemm_tile_rows(a.data() + i0 * lda, lda, bb.data() + j0 / cpu::kGemmTileC * stride, ldb, L,
                                  c2.data() + i0 * ldc + j0, ldc, std::min(cpu::kGemmTileR, mr - i0),
                                  std::min(cpu::kGemmTileC, nc - j0), overwrite);
            ASSERT_EQ(c, c2) << where;
            ASSERT_EQ(c3, c2) << "rows in place, " << where;
            ASSERT_EQ(c4, c2) << "split over partial tiles, " << where;
            ASSERT_EQ(c5, c2) << "rows in place split over a partial tile, " << where;
          }
    }
  }
}

// The GEMM driver with the AVX-512 table (strips in pairs where they can be) gives the AVX2 tier's
// results bit for bit: forward, input and weight gradients (both forms), odd shapes and two threads.
TEST(TrainGemmTile, Avx512DriverEqualsAvx2) {
  LATHE_REQUIRE_TIER(IsaTier::kAvx512);
  const cpu::TrainKernelTable& tw = cpu::TrainKernelsFor(IsaTier::kAvx512);
  const cpu::TrainKernelTable& t2 = cpu::TrainKernelsFor(IsaTier::kAvx2);
  const cpu::KernelTable& kt = cpu::KernelsFor(IsaTier::kAvx2);
  ThreadPool pool(2);
  for (const TrainShape& s : kF32Shapes) {
    const std::string where = std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K);
    const testing::TestWeight w = MakeWeight(DType::kF32, s.N, s.K, 70);
    const std::vector<float> x = RandomVec(s.M * s.K, 71), dy = RandomVec(s.M * s.N, 72);
    std::vector<float> y(s.M * s.N), y2(s.M * s.N);
    cpu::MatMulForwardWith(tw, kt, pool, y.data(), x.data(), s.M, w.t);
    cpu::MatMulForwardWith(t2, kt, pool, y2.data(), x.data(), s.M, w.t);
    EXPECT_EQ(y, y2) << "forward " << where;
    std::vector<float> dx(s.M * s.K), dx2(s.M * s.K);
    cpu::MatMulBackwardInputWith(tw, kt, pool, dx.data(), dy.data(), s.M, w.t, false);
    cpu::MatMulBackwardInputWith(t2, kt, pool, dx2.data(), dy.data(), s.M, w.t, false);
    EXPECT_EQ(dx, dx2) << "input grad " << where;
    std::vector<float> dw = RandomVec(s.N * s.K, 73), dw2 = dw;
    cpu::MatMulBackwardWeightWith(tw, pool, dw.data(), dy.data(), x.data(), s.M, s.N, s.K);
    cpu::MatMulBackwardWeightWith(t2, pool, dw2.data(), dy.data(), x.data(), s.M, s.N, s.K);
    EXPECT_EQ(dw, dw2) << "weight grad " << where;
    std::vector<float> dyT(s.N * s.M);
    for (int64_t m = 0; m < s.M; ++m)
      for (int64_t n = 0; n < s.N; ++n) dyT[n * s.M + m] = dy[m * s.N + n];
    dw = dw2 = RandomVec(s.N * s.K, 74);
    cpu::MatMulBackwardWeightTWith(tw, pool, dw.data(), dyT.data(), x.data(), s.M, s.N, s.K);
    cpu::MatMulBackwardWeightTWith(t2, pool, dw2.data(), dyT.data(), x.data(), s.M, s.N, s.K);
    EXPECT_EQ(dw, dw2) << "weight grad, transposed dY " << where;
  }
}

// The memory plan's bounds on the GEMM's shared panels (GemmAPanelFloatsWith / GemmBPanelFloatsWith, which the
// trainer's plan counts) cover what a 2-thread product takes: row-split products, the few-row column split (the
// loss's input gradient, 128 x 576 over a long inner dimension) and a few-row shape whose column split would need
// more B than the row-split plan (64 x 1360 over 5000: it keeps the row split). Each product runs on a fresh
// thread, whose panel buffers start empty.
TEST(TrainGemmPlan, SharedPanelsStayWithinTheMemoryPlan) {
  const cpu::TrainKernelTable& tk = cpu::TrainBest();
  const cpu::KernelTable& kt = cpu::Best();
  ThreadPool pool(2);
  const TrainShape shapes[] = {{128, 6000, 576}, {64, 5000, 1360}, {512, 1536, 576}, {200, 2500, 300}, {16, 3000, 100}};
  for (const TrainShape& s : shapes) {
    const std::string where = std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K);
    const testing::TestWeight w = MakeWeight(DType::kF32, s.N, s.K, 91);
    const std::vector<float> dyT = RandomVec(s.N * s.M, 92);
    std::vector<float> dx(s.M * s.K);
    cpu::GemmSharedFloats used;
    std::thread([&] {
      cpu::MatMulBackwardInputTWith(tk, kt, pool, dx.data(), dyT.data(), s.M, w.t, false);
      used = cpu::GemmSharedPanelFloats();
    }).join();
    // dX (M x K) = dY (M x N) . W: R = M, Kd = K, L = N, A = dY^T (rows not contiguous).
    EXPECT_LE(used.a, cpu::GemmAPanelFloatsWith(tk, s.M, s.K, s.N, /*a_rows_contiguous=*/false, false)) << where;
    EXPECT_LE(used.b, cpu::GemmBPanelFloatsWith(tk, s.K, s.N, 1)) << where;
    EXPECT_GT(used.b, 0) << where;
  }
}

// The "plus" products (LoRA's rank-r update inside the base product in f32 mode) are the products over the
// concatenated operands, bit for bit: y = [x | x2] . [W | W2]^T and dx = [dy | dy2] . [W ; W2] through the plain
// GEMM on copies (W's dtype dequantized exactly to f32 beside W2), with the second source split into the panels
// of a chunk, in the first or the second of two chunks, overwrite and accumulate, 1 and 2 threads.
TEST(TrainGemmPlus, EqualsTheProductOverConcatenatedOperands) {
  LATHE_REQUIRE_TIER(IsaTier::kAvx512);
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(IsaTier::kAvx512);
  const cpu::KernelTable& kt = cpu::KernelsFor(IsaTier::kAvx512);
  EXPECT_TRUE(cpu::PlusFusedWith(tk, 576, 576, 16));
  EXPECT_FALSE(cpu::PlusFusedWith(tk, 576, 1536, 16));  // 1552 takes 3 chunks, 1536 two
  EXPECT_FALSE(cpu::PlusFusedWith(tk, 16, 576, 16));    // narrow outputs: no panel path
  EXPECT_FALSE(cpu::PlusFusedWith(cpu::TrainKernelsFor(IsaTier::kAvx2), 576, 576, 16));
  struct Case {
    int64_t M, N, K, r;
  };
  // (output columns N for the forward, K for the input gradient: both >= 192.)
  const Case cases[] = {{1, 200, 576, 16}, {7, 192, 64, 1}, {130, 600, 576, 16}, {97, 384, 1520, 16},
                        {33, 250, 1500, 8}, {20, 193, 700, 3}};
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    for (const Case& c : cases)
      for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
        const std::string where = std::string(DTypeName(dt)) + " " + std::to_string(c.M) + "x" + std::to_string(c.N) +
                                  "x" + std::to_string(c.K) + " r" + std::to_string(c.r) + " threads " +
                                  std::to_string(threads);
        // Forward: W (N, K), W2 (N, r); output columns N.
        if (dt != DType::kQ8_0 && cpu::PlusFusedWith(tk, c.N, c.K, c.r)) {
          const testing::TestWeight w = MakeWeight(dt, c.N, c.K, 80);
          const testing::TestWeight w2 = MakeWeight(DType::kF32, c.N, c.r, 81);
          const std::vector<float> x = RandomVec(c.M * c.K, 82), x2 = RandomVec(c.M * c.r, 83);
          const std::vector<double> wd = Dequantized(w.t);
          const int64_t L = c.K + c.r;
          std::vector<float> xc(c.M * L), wc(c.N * L);
          for (int64_t m = 0; m < c.M; ++m)
            for (int64_t l = 0; l < L; ++l) xc[m * L + l] = l < c.K ? x[m * c.K + l] : x2[m * c.r + l - c.K];
          for (int64_t n = 0; n < c.N; ++n)
            for (int64_t l = 0; l < L; ++l)
              wc[n * L + l] = l < c.K ? (float)wd[n * c.K + l] : ((const float*)w2.t.data)[n * c.r + l - c.K];
          Tensor wct = w.t;
          wct.data = wc.data(), wct.dtype = DType::kF32, wct.shape = {c.N, L};
          for (bool acc : {false, true}) {
            std::vector<float> y = RandomVec(c.M * c.N, 84), ye = y;
            cpu::MatMulForwardPlusWith(tk, kt.mm, pool, y.data(), x.data(), c.M, w.t, x2.data(), w2.t, acc);
            cpu::MatMulForwardWith(tk, kt, pool, ye.data(), xc.data(), c.M, wct, acc);
            EXPECT_EQ(y, ye) << "forward " << where << (acc ? " accumulate" : "");
          }
        }
        // Input gradient: W (N, K) any dtype, W2 (r, K); output columns K.
        if (cpu::PlusFusedWith(tk, c.K, c.N, c.r) && c.K % 32 == 0) {
          const testing::TestWeight w = MakeWeight(dt, c.N, c.K, 90);
          const testing::TestWeight w2 = MakeWeight(DType::kF32, c.r, c.K, 91);
          const std::vector<float> dy = RandomVec(c.M * c.N, 92), dy2 = RandomVec(c.M * c.r, 93);
          const std::vector<double> wd = Dequantized(w.t);
          const int64_t L = c.N + c.r;
          std::vector<float> dyc(c.M * L), wc(L * c.K);
          for (int64_t m = 0; m < c.M; ++m)
            for (int64_t l = 0; l < L; ++l) dyc[m * L + l] = l < c.N ? dy[m * c.N + l] : dy2[m * c.r + l - c.N];
          for (int64_t l = 0; l < L; ++l)
            for (int64_t k = 0; k < c.K; ++k)
              wc[l * c.K + k] = l < c.N ? (float)wd[l * c.K + k] : ((const float*)w2.t.data)[(l - c.N) * c.K + k];
          Tensor wct = w.t;
          wct.data = wc.data(), wct.dtype = DType::kF32, wct.shape = {L, c.K};
          for (bool acc : {false, true}) {
            std::vector<float> dx = RandomVec(c.M * c.K, 94), dxe = dx;
            cpu::MatMulBackwardInputPlusWith(tk, kt, pool, dx.data(), dy.data(), c.M, w.t, dy2.data(), w2.t, acc);
            cpu::MatMulBackwardInputWith(tk, kt, pool, dxe.data(), dyc.data(), c.M, wct, acc);
            EXPECT_EQ(dx, dxe) << "input grad " << where << (acc ? " accumulate" : "");
          }
        }
      }
  }
}

// LoRA's dmid = dy . B and dB += dy^T . smid in one pass over dy (the AVX-512 table's lora_grad_pair) give the bits of
// the two separate products, across token tiles (tails of 1-7 tokens), two chunks of dy's columns (1536, 1700) and
// of tokens (900), ranks 1-16; and it declines ranks over 16, outputs of few rows and pools of two threads.
TEST(TrainGemmLoraPair, EqualsTheSeparateProducts) {
  LATHE_REQUIRE_TIER(IsaTier::kAvx512);
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(IsaTier::kAvx512);
  const cpu::KernelTable& kt = cpu::KernelsFor(IsaTier::kAvx512);
  ThreadPool pool(1), pool2(2);
  float f = 0;
  EXPECT_FALSE(cpu::LoraGradPairWith(tk, pool, &f, &f, &f, &f, &f, 8, 192, 17));
  EXPECT_FALSE(cpu::LoraGradPairWith(tk, pool, &f, &f, &f, &f, &f, 8, 18, 8));
  EXPECT_FALSE(cpu::LoraGradPairWith(tk, pool2, &f, &f, &f, &f, &f, 8, 192, 8));
  EXPECT_FALSE(cpu::LoraGradPairWith(cpu::TrainKernelsFor(IsaTier::kAvx2), pool, &f, &f, &f, &f, &f, 8, 192, 8));
  struct Case {
    int64_t M, out, r;
  };
  const Case cases[] = {{1, 192, 16}, {7, 19, 1}, {13, 576, 8}, {512, 1536, 16}, {900, 1700, 4}, {45, 200, 5}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.M) + "x" + std::to_string(c.out) + " r" + std::to_string(c.r));
    const testing::TestWeight b = MakeWeight(DType::kF32, c.out, c.r, 60);
    const std::vector<float> dy = RandomVec(c.M * c.out, 61), smid = RandomVec(c.M * c.r, 62);
    std::vector<float> dmid(c.M * c.r, 7.0f), dmid_want(c.M * c.r), db = RandomVec(c.out * c.r, 63), db_want = db;
    ASSERT_TRUE(cpu::LoraGradPairWith(tk, pool, dmid.data(), db.data(), dy.data(), smid.data(),
                                      (const float*)b.t.data, c.M, c.out, c.r));
    cpu::MatMulBackwardInputWith(tk, kt, pool, dmid_want.data(), dy.data(), c.M, b.t, false);
    cpu::MatMulBackwardWeightWith(tk, pool, db_want.data(), dy.data(), smid.data(), c.M, c.out, c.r);
    EXPECT_EQ(dmid, dmid_want);
    EXPECT_EQ(db, db_want);
  }
}

// LoRA's dA += dmid^T . x with x read in place (the AVX-512 table's lora_grad_a, column blocks over the pool) gives
// the bits of MatMulBackwardWeight's few-rows product: ranks 1-16, x widths across 16-column strips and 64-column
// blocks, tokens in one and in two chunks (900), 1 and 2 threads.
TEST(TrainGemmLoraGradA, EqualsTheFewRowsProduct) {
  LATHE_REQUIRE_TIER(IsaTier::kAvx512);
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(IsaTier::kAvx512);
  ThreadPool pool1(1), pool2(2);
  float f = 0;
  EXPECT_FALSE(cpu::LoraGradAWith(tk, pool1, &f, &f, &f, 8, 64, 17));
  EXPECT_FALSE(cpu::LoraGradAWith(cpu::TrainKernelsFor(IsaTier::kAvx2), pool1, &f, &f, &f, 8, 64, 8));
  struct Case {
    int64_t M, K, r;
  };
  const Case cases[] = {{1, 16, 1}, {7, 19, 16}, {512, 576, 16}, {900, 1536, 8}, {45, 200, 5}, {33, 64, 12}};
  for (ThreadPool* pool : {&pool1, &pool2})
    for (const Case& c : cases) {
      SCOPED_TRACE(std::to_string(c.M) + "x" + std::to_string(c.K) + " r" + std::to_string(c.r) + " threads " +
                   std::to_string(pool->size()));
      const std::vector<float> dmid = RandomVec(c.M * c.r, 64), x = RandomVec(c.M * c.K, 65);
      std::vector<float> da = RandomVec(c.r * c.K, 66), want = da;
      ASSERT_TRUE(cpu::LoraGradAWith(tk, *pool, da.data(), dmid.data(), x.data(), c.M, c.K, c.r));
      cpu::MatMulBackwardWeightWith(tk, *pool, want.data(), dmid.data(), x.data(), c.M, c.r, c.K);
      EXPECT_EQ(da, want);
    }
}

TEST_P(TrainMatMul, BackwardWeightMatchesReference) {
  const auto [tier, threads] = GetParam();
  LATHE_REQUIRE_TIER(tier);
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(tier);
  ThreadPool pool(threads);
  std::vector<TrainShape> shapes(std::begin(kQuantShapes), std::end(kQuantShapes));
  shapes.insert(shapes.end(), std::begin(kF32Shapes), std::end(kF32Shapes));
  for (const TrainShape& s : shapes) {
    const std::vector<float> dy = RandomVec(s.M * s.N, 24), x = RandomVec(s.M * s.K, 25);
    std::vector<float> dw = RandomVec(s.N * s.K, 26);
    std::vector<double> ref = ToDouble(dw);
    const std::vector<double> dyd = ToDouble(dy), xd = ToDouble(x);
    train_ref::MatMulBackwardWeight<double>(ref.data(), dyd.data(), xd.data(), s.M, s.N, s.K);
    std::vector<float> dw1 = dw;
    cpu::MatMulBackwardWeightWith(tk, pool, dw.data(), dy.data(), x.data(), s.M, s.N, s.K);
    EXPECT_LE(RelErr(dw, ref), kMatmulRefLimit) << s.M << "x" << s.N << "x" << s.K;
    ThreadPool one(1);
    cpu::MatMulBackwardWeightWith(tk, one, dw1.data(), dy.data(), x.data(), s.M, s.N, s.K);
    EXPECT_EQ(dw1, dw) << s.M << "x" << s.N << "x" << s.K << " 1 thread";
    // dY given transposed: within the reference tolerance (its rows feed the rows micro-kernel).
    std::vector<float> dyT(s.N * s.M), dwt = RandomVec(s.N * s.K, 26);
    for (int64_t m = 0; m < s.M; ++m)
      for (int64_t n = 0; n < s.N; ++n) dyT[n * s.M + m] = dy[m * s.N + n];
    cpu::MatMulBackwardWeightTWith(tk, pool, dwt.data(), dyT.data(), x.data(), s.M, s.N, s.K);
    EXPECT_LE(RelErr(dwt, ref), kMatmulRefLimit) << s.M << "x" << s.N << "x" << s.K << " transposed dY";
  }
}

// loss = sum(g * (x . W^T)): dX and dW against central differences of the double forward.
TEST_P(TrainMatMul, BackwardMatchesFiniteDifferences) {
  const auto [tier, threads] = GetParam();
  LATHE_REQUIRE_TIER(tier);
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(tier);
  const cpu::KernelTable& kt = cpu::KernelsFor(tier);
  ThreadPool pool(threads);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kQ4_1}) {
    const int64_t M = 7, N = 5, K = dt == DType::kF32 ? 9 : 32;
    const testing::TestWeight w = MakeWeight(dt, N, K, 27);
    const std::vector<double> wd = Dequantized(w.t);
    const std::vector<float> x = RandomVec(M * K, 28), g = RandomVec(M * N, 29);
    const std::vector<double> xd = ToDouble(x), gd = ToDouble(g);
    auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
      std::vector<double> y(M * N);
      train_ref::MatMul<double>(y.data(), xx.data(), ww.data(), M, N, K);
      return testing::Dot(y, gd);
    };
    const auto fd_dx = FiniteDiffGrad(xd, [&](const std::vector<double>& v) { return loss(v, wd); });
    const auto fd_dw = FiniteDiffGrad(wd, [&](const std::vector<double>& v) { return loss(xd, v); });
    std::vector<float> dx(M * K), dw(N * K, 0.0f);
    cpu::MatMulBackwardInputWith(tk, kt, pool, dx.data(), g.data(), M, w.t, false);
    cpu::MatMulBackwardWeightWith(tk, pool, dw.data(), g.data(), x.data(), M, N, K);
    EXPECT_LE(RelErr(dx, fd_dx), kMatmulFdLimit) << DTypeName(dt);
    EXPECT_LE(RelErr(dw, fd_dw), kMatmulFdLimit) << DTypeName(dt);
  }
}

INSTANTIATE_TEST_SUITE_P(TiersThreads, TrainMatMul,
                         ::testing::Combine(::testing::Values(IsaTier::kScalar, IsaTier::kAvx2, IsaTier::kAvx512),
                                            ::testing::Values(1, 2)),
                         [](const ::testing::TestParamInfo<std::tuple<IsaTier, int>>& info) {
                           return std::string(IsaTierName(std::get<0>(info.param))) + "_t" +
                                  std::to_string(std::get<1>(info.param));
                         });

// Throughput at training sizes; only with LATHE_PERF=1 (takes a few seconds).
TEST(TrainMatMulPerf, GflopsAtM2048) {
  if (!std::getenv("LATHE_PERF")) GTEST_SKIP() << "set LATHE_PERF=1";
  const int64_t M = 2048;
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    for (const auto& nk : {std::pair<int64_t, int64_t>{576, 576}, {1536, 576}, {2048, 2048}}) {
      const int64_t N = nk.first, K = nk.second;  // not a structured binding: clang-14 lambdas cannot capture those
      for (DType dt : {DType::kF32, DType::kBF16, DType::kQ4_0}) {
        const testing::TestWeight w = MakeWeight(dt, N, K, 30);
        const std::vector<float> dy = RandomVec(M * N, 31), x = RandomVec(M * K, 32);
        std::vector<float> dx(M * K), dw(N * K, 0.0f);
        auto time = [&](auto&& f) {
          f();  // warm-up
          double best = 1e30;
          for (int r = 0; r < 3; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            f();
            best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          }
          return 2.0 * M * N * K / best * 1e-9;
        };
        if (dt == DType::kF32) {  // baseline from the same run: the inference prefill MatMul, same FLOPs
          std::vector<float> y(M * N);
          const double gf = time([&] { MatMul(pool, x.data(), M, w.t, y.data()); });
          std::printf("threads=%d M=%lld N=%lld K=%lld f32   forward MatMul  %6.1f GFLOP/s (baseline)\n", threads,
                      (long long)M, (long long)N, (long long)K, gf);
        }
        const double gi = time([&] { MatMulBackwardInput(pool, dx.data(), dy.data(), M, w.t); });
        std::printf("threads=%d M=%lld N=%lld K=%lld %-5s backward_input  %6.1f GFLOP/s\n", threads, (long long)M,
                    (long long)N, (long long)K, DTypeName(dt), gi);
        if (dt == DType::kF32) {
          const double gw = time([&] { MatMulBackwardWeight(pool, dw.data(), dy.data(), x.data(), M, N, K); });
          std::printf("threads=%d M=%lld N=%lld K=%lld f32   backward_weight %6.1f GFLOP/s\n", threads,
                      (long long)M, (long long)N, (long long)K, gw);
        }
      }
    }
  }
}


// bf16 mixed precision's products on vdpbf16ps (kernels::*Bf16, CPUs with avx512_bf16): every element
// bit-identical to the pair arithmetic written out in scalar code (bf16 operands, per inner chunk of
// Bf16PairsChunk pairs one chain acc = (acc + a[2p+1] b[2p+1]) + a[2p] b[2p], chunks added in order),
// for y = x W^T (W bf16 and f32, the latter rounded as packed), dx = dy W and dW += dy^T x, at 1 and 2
// threads: odd inner dimensions, column tails, several chunks, partial row tiles, accumulate. On AMX tiles
// (UsesAmxBf16: the products' arithmetic is AMX's own, one tdpbf16ps per 16 pairs, whose internal rounding no
// chain of f32 adds reproduces) each element within (steps + 2) x 2^-24 of the sum of its terms' magnitudes
// of the exact sum instead: a dropped, doubled or misplaced product (a tail pair, a pair's halves swapped, a
// wrong column) is ~1/L of that sum, far outside; AmxProductsDependOnlyOnTheirRow checks AMX's own bits.
namespace {
struct PairExpect {
  std::vector<float> chain;         // the pair chains' bits
  std::vector<double> exact, mag;   // the exact sum (c0 included) and the sum of its terms' magnitudes
  int64_t steps = 0;                // AMX steps of 16 pairs
};
// C(i, k) over l < L of A(i, l) B(l, k); a(i, l), b(l, k) give bf16 values as floats.
template <typename FA, typename FB>
PairExpect PairRef(int64_t R, int64_t Kd, int64_t L, FA a, FB b, const std::vector<float>* c0) {
  const int64_t Lp = (L + 1) / 2, chunk = cpu::Bf16PairsChunk(Lp);
  PairExpect e;
  e.chain.resize(R * Kd), e.exact.resize(R * Kd), e.mag.resize(R * Kd);
  e.steps = (Lp + 15) / 16;
  for (int64_t i = 0; i < R; ++i)
    for (int64_t k = 0; k < Kd; ++k) {
      auto av = [&](int64_t l) { return l < L ? a(i, l) : 0.0f; };
      auto bv = [&](int64_t l) { return l < L ? b(l, k) : 0.0f; };
      float total = c0 ? (*c0)[i * Kd + k] : 0.0f;
      double ex = total, mag = std::fabs((double)total);
      for (int64_t p0 = 0; p0 < Lp; p0 += chunk) {
        float acc = 0.0f;
        for (int64_t p = p0; p < std::min(Lp, p0 + chunk); ++p) {
          acc = std::fma(av(2 * p + 1), bv(2 * p + 1), acc);
          acc = std::fma(av(2 * p), bv(2 * p), acc);
          for (int64_t l : {2 * p, 2 * p + 1}) {
            const double t = (double)av(l) * bv(l);
            ex += t, mag += std::fabs(t);
          }
        }
        total = p0 == 0 && !c0 ? acc : total + acc;
      }
      e.chain[i * Kd + k] = total, e.exact[i * Kd + k] = ex, e.mag[i * Kd + k] = mag;
    }
  return e;
}
::testing::AssertionResult MatchesPairs(const std::vector<float>& got, const PairExpect& e) {
  if (got.size() != e.chain.size()) return ::testing::AssertionFailure() << "size " << got.size();
  if (!UsesAmxBf16()) {
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != e.chain[i] && !(std::isnan(got[i]) && std::isnan(e.chain[i])))
        return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " vs the chain's " << e.chain[i];
    return ::testing::AssertionSuccess();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = (double)(e.steps + 2) * std::ldexp(1.0, -24) * e.mag[i];
    if (!(std::fabs(got[i] - e.exact[i]) <= bound))
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " vs exact " << e.exact[i]
                                           << " (bound " << bound << ")";
  }
  return ::testing::AssertionSuccess();
}
std::vector<float> Bf16Values(int64_t n, uint32_t seed) {
  std::vector<float> v = RandomVec(n, seed);
  for (float& f : v) f = BF16ToF32(F32ToBF16(f));
  return v;
}
}  // namespace

TEST(TrainBf16Dot, ProductsBitIdenticalToPairReference) {
  if (!UsesBf16Dot()) GTEST_SKIP() << "no avx512_bf16 (or LATHE_BF16_DOT=0)";
  uint32_t seed = 7100;
  struct S { int64_t M, N, K; };
  // S{70, 300, 16}, S{9, 33, 5}, S{800, 100, 8}: a narrow weight gradient (LoRA's B, K = r) computed transposed;
  // 800 rows = two inner chunks. S{40, 576, 576}: the weight gradient's 9 row blocks, split into 18 tasks on 2 threads.
  for (S s : {S{1, 16, 32}, S{9, 33, 37}, S{70, 100, 576}, S{65, 48, 1537}, S{130, 770, 64}, S{70, 300, 16},
              S{9, 33, 5}, S{800, 100, 8}, S{40, 576, 576}}) {
    const int64_t M = s.M, N = s.N, K = s.K;
    const std::vector<float> x = Bf16Values(M * K, seed++), dy = Bf16Values(M * N, seed++);
    const std::vector<float> wf = RandomVec(N * K, seed++);  // f32 W: rounded by the packing
    std::vector<uint16_t> wb(N * K);
    for (int64_t i = 0; i < N * K; ++i) wb[i] = F32ToBF16(wf[i]);
    Tensor tf, tb;
    tf.data = wf.data(), tf.dtype = DType::kF32, tf.shape = {N, K};
    tb.data = wb.data(), tb.dtype = DType::kBF16, tb.shape = {N, K};
    auto W = [&](int64_t n, int64_t k) { return BF16ToF32(wb[n * K + k]); };
    const std::vector<float> y0 = RandomVec(M * N, seed++), dx0 = RandomVec(M * K, seed++);
    const PairExpect yref = PairRef(M, N, K, [&](int64_t i, int64_t l) { return x[i * K + l]; },
                                            [&](int64_t l, int64_t n) { return W(n, l); }, nullptr);
    const PairExpect yacc = PairRef(M, N, K, [&](int64_t i, int64_t l) { return x[i * K + l]; },
                                            [&](int64_t l, int64_t n) { return W(n, l); }, &y0);
    const PairExpect dxref = PairRef(M, K, N, [&](int64_t i, int64_t l) { return dy[i * N + l]; }, W, nullptr);
    const PairExpect dxacc = PairRef(M, K, N, [&](int64_t i, int64_t l) { return dy[i * N + l]; }, W, &dx0);
    const std::vector<float> dw0 = RandomVec(N * K, seed++);
    const PairExpect dwref = PairRef(N, K, M, [&](int64_t n, int64_t m) { return dy[m * N + n]; },
                                             [&](int64_t m, int64_t k) { return x[m * K + k]; }, &dw0);
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      for (const Tensor* t : {&tb, &tf}) {
        std::vector<float> y(M * N, -1.0f);
        LinearForwardBf16(pool, y.data(), x.data(), M, *t);
        ASSERT_TRUE(MatchesPairs(y, yref)) << "forward " << DTypeName(t->dtype) << " M=" << M << " N=" << N << " K=" << K;
        y = y0;
        LinearForwardBf16(pool, y.data(), x.data(), M, *t, /*accumulate=*/true);
        ASSERT_TRUE(MatchesPairs(y, yacc)) << "forward += M=" << M;
        std::vector<float> dx(M * K, -1.0f);
        MatMulBackwardInputBf16(pool, dx.data(), dy.data(), M, *t);
        ASSERT_TRUE(MatchesPairs(dx, dxref)) << "input grad " << DTypeName(t->dtype) << " M=" << M << " N=" << N << " K=" << K;
        dx = dx0;
        MatMulBackwardInputBf16(pool, dx.data(), dy.data(), M, *t, /*accumulate=*/true);
        ASSERT_TRUE(MatchesPairs(dx, dxacc)) << "input grad += M=" << M;
      }
      std::vector<float> dw = dw0;
      MatMulBackwardWeightBf16(pool, dw.data(), dy.data(), x.data(), M, N, K);
      ASSERT_TRUE(MatchesPairs(dw, dwref)) << "weight grad M=" << M << " N=" << N << " K=" << K << " threads=" << threads;
    }
  }
}

// On AMX tiles (UsesAmxBf16) the products' own bits: a row's result does not depend on the other rows (the whole
// batch, its first row alone, its rows from 5 on) or on the thread count, and a product split along its inner
// dimension at 32 values (16 pairs: one tile step) into a call and an accumulating call gives the one call's bits
// (the accumulator is C's f32 value between steps); the weight gradient the same at 1 and 2 threads.
TEST(TrainBf16Dot, AmxProductsDependOnlyOnTheirRow) {
  if (!UsesAmxBf16()) GTEST_SKIP() << "no AMX tiles (amx_tile + amx_bf16 and the kernel's permission), or LATHE_BF16_PAIRS=dp|fma";
  uint32_t seed = 7900;
  struct S { int64_t M, N, K; };
  for (S s : {S{70, 100, 576}, S{37, 33, 97}, S{130, 48, 1537}}) {
    const int64_t M = s.M, N = s.N, K = s.K, K1 = 32, K2 = K - K1;
    const std::vector<float> x = Bf16Values(M * K, seed++), dy = Bf16Values(M * N, seed++);
    const std::vector<float> wf = RandomVec(N * K, seed++);
    std::vector<uint16_t> w(N * K);
    for (int64_t i = 0; i < N * K; ++i) w[i] = F32ToBF16(wf[i]);
    auto view = [](const void* d, int64_t rows, int64_t cols) {
      Tensor v;
      v.data = d, v.dtype = DType::kBF16, v.shape = {rows, cols};
      return v;
    };
    std::vector<float> x1(M * K1), x2(M * K2);
    std::vector<uint16_t> w1(N * K1), w2(N * K2);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k) (k < K1 ? x1[i * K1 + k] : x2[i * K2 + k - K1]) = x[i * K + k];
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) (k < K1 ? w1[n * K1 + k] : w2[n * K2 + k - K1]) = w[n * K + k];
    const Tensor W = view(w.data(), N, K), W1 = view(w1.data(), N, K1), W2 = view(w2.data(), N, K2);
    std::vector<float> y1t;
    std::vector<float> dw1t;
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      std::vector<float> y(M * N);
      LinearForwardBf16(pool, y.data(), x.data(), M, W);
      if (threads == 1) y1t = y;
      ASSERT_EQ(y, y1t) << "threads=" << threads << " M=" << M << " N=" << N << " K=" << K;
      std::vector<float> one(N), rest((M - 5) * N);
      LinearForwardBf16(pool, one.data(), x.data(), 1, W);
      LinearForwardBf16(pool, rest.data(), x.data() + 5 * K, M - 5, W);
      ASSERT_EQ(one, std::vector<float>(y.begin(), y.begin() + N)) << "row 0 alone, K=" << K;
      ASSERT_EQ(rest, std::vector<float>(y.begin() + 5 * N, y.end())) << "rows 5.. alone, K=" << K;
      std::vector<float> split(M * N);
      LinearForwardBf16(pool, split.data(), x1.data(), M, W1);
      LinearForwardBf16(pool, split.data(), x2.data(), M, W2, /*accumulate=*/true);
      ASSERT_EQ(split, y) << "split at 32, K=" << K;
      std::vector<float> dw(N * K, 0.5f);
      MatMulBackwardWeightBf16(pool, dw.data(), dy.data(), x.data(), M, N, K);
      if (threads == 1) dw1t = dw;
      ASSERT_EQ(dw, dw1t) << "weight grad threads=" << threads << " K=" << K;
    }
  }
}

// On AMX the products' A operand is packed straight into tile order (PairRowsTiled / PairRowsTTiled, then
// amx::PairGemmTiled) instead of row-major pairs that amx::PairGemm's tasks copy into tile order: the same bits.
// Checked against amx::PairGemm over operands paired here in plain C++ (pairs (v[2p], v[2p + 1]) of bf16, an odd
// length's last pair zero-padded; B in 16-column pair strips): forward, input and weight gradients (both of the
// latter's forms), the fused LoRA forms (x's pairs end at a whole step: the tiled concatenation), odd K and M
// rows past a row pair, 1 and 2 threads.
TEST(TrainBf16Dot, AmxTiledOperandsGiveTheRowMajorBits) {
  if (!UsesAmxBf16()) GTEST_SKIP() << "no AMX tiles (amx_tile + amx_bf16 and the kernel's permission), or LATHE_BF16_PAIRS=dp|fma";
  uint32_t seed = 8100;
  auto bits = [](float f) { return (uint32_t)F32ToBF16(f); };
  // Rows of A (R x L, a(i, l)) as row-major pairs.
  auto rows = [&](int64_t R, int64_t L, auto a) {
    const int64_t Lp = (L + 1) / 2;
    std::vector<uint32_t> out(R * Lp);
    for (int64_t i = 0; i < R; ++i)
      for (int64_t p = 0; p < Lp; ++p)
        out[i * Lp + p] = bits(a(i, 2 * p)) | (2 * p + 1 < L ? bits(a(i, 2 * p + 1)) << 16 : 0u);
    return out;
  };
  // B (L x Kd, b(l, k)) as pair strips: strip s's pair p at (s * Lp + p) * 16.
  auto strips = [&](int64_t L, int64_t Kd, auto b) {
    const int64_t Lp = (L + 1) / 2, ns = (Kd + 15) / 16;
    std::vector<uint32_t> out(ns * Lp * 16, 0);
    for (int64_t k = 0; k < Kd; ++k)
      for (int64_t p = 0; p < Lp; ++p)
        out[(k / 16 * Lp + p) * 16 + k % 16] =
            bits(b(2 * p, k)) | (2 * p + 1 < L ? bits(b(2 * p + 1, k)) << 16 : 0u);
    return out;
  };
  struct S { int64_t M, N, K, r; };
  for (S s : {S{70, 100, 576, 16}, S{37, 33, 97, 5}, S{33, 48, 1537, 8}, S{130, 20, 64, 4}}) {
    const int64_t M = s.M, N = s.N, K = s.K, r = s.r;
    const std::vector<float> x = Bf16Values(M * K, seed++), dy = Bf16Values(M * N, seed++);
    const std::vector<float> x2 = Bf16Values(M * r, seed++), bw = Bf16Values(N * r, seed++);
    const std::vector<float> w = Bf16Values(N * K, seed++);
    Tensor W, B;
    W.data = w.data(), W.dtype = DType::kF32, W.shape = {N, K};
    B.data = bw.data(), B.dtype = DType::kF32, B.shape = {N, r};
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      const std::string at = " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                             " threads=" + std::to_string(threads);
      {  // y = x W^T
        std::vector<float> got(M * N), want(M * N);
        LinearForwardBf16(pool, got.data(), x.data(), M, W);
        const auto a = rows(M, K, [&](int64_t i, int64_t l) { return x[i * K + l]; });
        const auto b = strips(K, N, [&](int64_t l, int64_t n) { return w[n * K + l]; });
        cpu::amx::PairGemm(pool, want.data(), N, M, N, (K + 1) / 2, a.data(), (K + 1) / 2, b.data(), false);
        ASSERT_EQ(got, want) << "forward" << at;
      }
      {  // dx = dy W
        std::vector<float> got(M * K), want(M * K);
        MatMulBackwardInputBf16(pool, got.data(), dy.data(), M, W);
        const auto a = rows(M, N, [&](int64_t i, int64_t l) { return dy[i * N + l]; });
        const auto b = strips(N, K, [&](int64_t l, int64_t k) { return w[l * K + k]; });
        cpu::amx::PairGemm(pool, want.data(), K, M, K, (N + 1) / 2, a.data(), (N + 1) / 2, b.data(), false);
        ASSERT_EQ(got, want) << "input gradient" << at;
      }
      for (int64_t kk : {K, r}) {  // dw (N, kk) += dy^T x[:, :kk]: kk = r takes the narrow form (dw^T += x^T dy)
        std::vector<float> xs(M * kk);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t k = 0; k < kk; ++k) xs[i * kk + k] = x[i * K + k];
        std::vector<float> got(N * kk, 0.25f), want(N * kk, 0.25f);
        MatMulBackwardWeightBf16(pool, got.data(), dy.data(), xs.data(), M, N, kk);
        if (kk <= 16 * 4 && N > 2 * kk) {  // the narrow form's own order of operands: dw^T (kk, N) += x^T . dy
          std::vector<float> wt(kk * N);
          for (int64_t n = 0; n < N; ++n)
            for (int64_t k = 0; k < kk; ++k) wt[k * N + n] = want[n * kk + k];
          const auto a = rows(kk, M, [&](int64_t k, int64_t l) { return xs[l * kk + k]; });
          const auto b = strips(M, N, [&](int64_t l, int64_t n) { return dy[l * N + n]; });
          cpu::amx::PairGemm(pool, wt.data(), N, kk, N, (M + 1) / 2, a.data(), (M + 1) / 2, b.data(), true);
          for (int64_t n = 0; n < N; ++n)
            for (int64_t k = 0; k < kk; ++k) want[n * kk + k] = wt[k * N + n];
        } else {
          const auto a = rows(N, M, [&](int64_t n, int64_t l) { return dy[l * N + n]; });
          const auto b = strips(M, kk, [&](int64_t l, int64_t k) { return xs[l * kk + k]; });
          cpu::amx::PairGemm(pool, want.data(), kk, N, kk, (M + 1) / 2, a.data(), (M + 1) / 2, b.data(), true);
        }
        ASSERT_EQ(got, want) << "weight gradient kk=" << kk << at;
      }
      {  // y = x W^T + x2 B^T: one inner dimension of x's pairs then x2's
        const int64_t Kp = (K + 1) / 2, Lp = Kp + (r + 1) / 2;
        std::vector<float> got(M * N), want(M * N);
        LinearForwardBf16Plus(pool, got.data(), x.data(), M, W, x2.data(), B);
        const auto cat = [&](int64_t i, int64_t l) {
          return l < 2 * Kp ? (l < K ? x[i * K + l] : 0.0f) : (l - 2 * Kp < r ? x2[i * r + l - 2 * Kp] : 0.0f);
        };
        const auto catb = [&](int64_t l, int64_t n) {
          return l < 2 * Kp ? (l < K ? w[n * K + l] : 0.0f) : (l - 2 * Kp < r ? bw[n * r + l - 2 * Kp] : 0.0f);
        };
        const auto a = rows(M, 2 * Lp, cat);
        const auto b = strips(2 * Lp, N, catb);
        cpu::amx::PairGemm(pool, want.data(), N, M, N, Lp, a.data(), Lp, b.data(), false);
        ASSERT_EQ(got, want) << "fused forward" << at;
      }
    }
  }
}

// The fused forms (LinearForwardBf16Plus / MatMulBackwardInputBf16Plus: LoRA's rank-r update inside the base
// product): the pair reference over the concatenated inner dimension, x's (K + 1) / 2 pairs (an odd K's last
// pair padded with a zero) then x2's; W and W2 in either dtype; 1 and 2 threads; accumulate.
TEST(TrainBf16Dot, FusedProductsBitIdenticalToPairReference) {
  if (!UsesBf16Dot()) GTEST_SKIP() << "no avx512_bf16 (or LATHE_BF16_DOT=0)";
  uint32_t seed = 7300;
  struct S { int64_t M, N, K, r; };
  for (S s : {S{9, 33, 37, 5}, S{70, 100, 576, 16}, S{65, 48, 1537, 8}}) {
    const int64_t M = s.M, N = s.N, K = s.K, r = s.r, Kp = (K + 1) / 2, rp = (r + 1) / 2;
    const std::vector<float> x = Bf16Values(M * K, seed++), x2 = Bf16Values(M * r, seed++);
    const std::vector<float> dy = Bf16Values(M * N, seed++), dy2 = Bf16Values(M * r, seed++);
    // W (N, K); forward's W2 = LoRA B (N, r); backward's W2 = LoRA A (r, K).
    const std::vector<float> w = Bf16Values(N * K, seed++), bw = Bf16Values(N * r, seed++), aw = Bf16Values(r * K, seed++);
    std::vector<uint16_t> w16(N * K), bw16(N * r), aw16(r * K);
    for (int64_t i = 0; i < N * K; ++i) w16[i] = F32ToBF16(w[i]);
    for (int64_t i = 0; i < N * r; ++i) bw16[i] = F32ToBF16(bw[i]);
    for (int64_t i = 0; i < r * K; ++i) aw16[i] = F32ToBF16(aw[i]);
    auto view = [](const void* d, DType t, int64_t rows, int64_t cols) {
      Tensor v;
      v.data = d, v.dtype = t, v.shape = {rows, cols};
      return v;
    };
    // Concatenated inner index l < 2 (Kp + rp): l < 2 Kp from the first product (zero at an odd K's pad).
    auto cat = [](int64_t l, int64_t L1, int64_t L1p, int64_t L2, auto f1, auto f2) {
      if (l < 2 * L1p) return l < L1 ? f1(l) : 0.0f;
      const int64_t j = l - 2 * L1p;
      return j < L2 ? f2(j) : 0.0f;
    };
    const int64_t Lf = 2 * (Kp + rp), Lb = 2 * ((N + 1) / 2 + rp);
    const std::vector<float> y0 = RandomVec(M * N, seed++), dx0 = RandomVec(M * K, seed++);
    const auto fa = [&](int64_t i, int64_t l) {
      return cat(l, K, Kp, r, [&](int64_t k) { return x[i * K + k]; }, [&](int64_t j) { return x2[i * r + j]; });
    };
    const auto fb = [&](int64_t l, int64_t n) {
      return cat(l, K, Kp, r, [&](int64_t k) { return w[n * K + k]; }, [&](int64_t j) { return bw[n * r + j]; });
    };
    const auto ba = [&](int64_t i, int64_t l) {
      return cat(l, N, (N + 1) / 2, r, [&](int64_t n) { return dy[i * N + n]; }, [&](int64_t j) { return dy2[i * r + j]; });
    };
    const auto bb = [&](int64_t l, int64_t k) {
      return cat(l, N, (N + 1) / 2, r, [&](int64_t n) { return w[n * K + k]; }, [&](int64_t j) { return aw[j * K + k]; });
    };
    const PairExpect yref = PairRef(M, N, Lf, fa, fb, nullptr), yacc = PairRef(M, N, Lf, fa, fb, &y0);
    const PairExpect dxref = PairRef(M, K, Lb, ba, bb, nullptr), dxacc = PairRef(M, K, Lb, ba, bb, &dx0);
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      for (DType t : {DType::kBF16, DType::kF32}) {
        const bool h = t == DType::kBF16;
        const Tensor W = view(h ? (const void*)w16.data() : w.data(), t, N, K);
        const Tensor B = view(h ? (const void*)bw16.data() : bw.data(), t, N, r);
        const Tensor A = view(h ? (const void*)aw16.data() : aw.data(), t, r, K);
        std::vector<float> y(M * N, -1.0f);
        LinearForwardBf16Plus(pool, y.data(), x.data(), M, W, x2.data(), B);
        ASSERT_TRUE(MatchesPairs(y, yref)) << "fused forward " << DTypeName(t) << " M=" << M << " N=" << N << " K=" << K;
        y = y0;
        LinearForwardBf16Plus(pool, y.data(), x.data(), M, W, x2.data(), B, /*accumulate=*/true);
        ASSERT_TRUE(MatchesPairs(y, yacc)) << "fused forward += " << DTypeName(t) << " K=" << K;
        std::vector<float> dx(M * K, -1.0f);
        MatMulBackwardInputBf16Plus(pool, dx.data(), dy.data(), M, W, dy2.data(), A);
        ASSERT_TRUE(MatchesPairs(dx, dxref)) << "fused input grad " << DTypeName(t) << " M=" << M << " N=" << N << " K=" << K;
        dx = dx0;
        MatMulBackwardInputBf16Plus(pool, dx.data(), dy.data(), M, W, dy2.data(), A, /*accumulate=*/true);
        ASSERT_TRUE(MatchesPairs(dx, dxacc)) << "fused input grad += " << DTypeName(t) << " K=" << K;
      }
    }
  }
}

// LoRA's chained forms (LoraForwardBf16 / LoraBackwardInputBf16: the rank-r product and the fused one over one
// packing of x / dy) give the bits of the separate calls: mid of LinearForwardBf16 (dmid of
// MatMulBackwardInputBf16), then the fused product on second(mid); second may rewrite mid in place.
TEST(TrainBf16Dot, ChainedLoraProductsEqualTheSeparateCalls) {
  if (!UsesBf16Dot()) GTEST_SKIP() << "no avx512_bf16 (or LATHE_BF16_DOT=0)";
  uint32_t seed = 7500;
  struct S { int64_t M, N, K, r; };
  for (S s : {S{9, 33, 37, 5}, S{70, 100, 576, 16}, S{65, 48, 1537, 8}}) {
    const int64_t M = s.M, N = s.N, K = s.K, r = s.r;
    const std::vector<float> x = Bf16Values(M * K, seed++), dy = Bf16Values(M * N, seed++);
    std::vector<float> w = RandomVec(N * K, seed++), aw = RandomVec(r * K, seed++), bw = RandomVec(N * r, seed++);
    std::vector<uint16_t> w16(N * K);
    for (int64_t i = 0; i < N * K; ++i) w16[i] = F32ToBF16(w[i]);
    auto view = [](const void* d, DType t, int64_t rows, int64_t cols) {
      Tensor v;
      v.data = d, v.dtype = t, v.shape = {rows, cols};
      return v;
    };
    const Tensor a = view(aw.data(), DType::kF32, r, K), b = view(bw.data(), DType::kF32, N, r);
    const float scale = 0.75f;
    std::vector<float> tmp;
    const auto second = [&](float* m) {  // as the trainer's ScaledMid: scale * bf16(m)
      tmp.resize(M * r);
      RoundToBf16(tmp.data(), m, M * r);
      for (float& v : tmp) v *= scale;
      return (const float*)tmp.data();
    };
    const auto scale_in_place = [&](float* m) {
      for (int64_t i = 0; i < M * r; ++i) m[i] *= scale;
      return (const float*)m;
    };
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      for (const Tensor& wt : {view(w16.data(), DType::kBF16, N, K), view(w.data(), DType::kF32, N, K)})
        for (bool acc : {false, true}) {
          const std::vector<float> y0 = RandomVec(M * N, seed), dx0 = RandomVec(M * K, seed + 1);
          std::vector<float> mid(M * r), y = y0, mid_ref(M * r), y_ref = y0;
          LoraForwardBf16(pool, y.data(), mid.data(), x.data(), M, wt, a, b, second, acc);
          LinearForwardBf16(pool, mid_ref.data(), x.data(), M, a);
          LinearForwardBf16Plus(pool, y_ref.data(), x.data(), M, wt, second(mid_ref.data()), b, acc);
          ASSERT_EQ(mid, mid_ref) << "mid M=" << M << " threads=" << threads;
          ASSERT_EQ(y, y_ref) << "y M=" << M << " N=" << N << " K=" << K << " acc=" << acc;
          std::vector<float> dmid(M * r), dx = dx0, dmid_ref(M * r), dx_ref = dx0;
          LoraBackwardInputBf16(pool, dx.data(), dmid.data(), dy.data(), M, wt, b, a, scale_in_place, acc);
          MatMulBackwardInputBf16(pool, dmid_ref.data(), dy.data(), M, b);
          MatMulBackwardInputBf16Plus(pool, dx_ref.data(), dy.data(), M, wt, scale_in_place(dmid_ref.data()), a, acc);
          ASSERT_EQ(dmid, dmid_ref) << "dmid M=" << M;
          ASSERT_EQ(dx, dx_ref) << "dx M=" << M << " N=" << N << " K=" << K << " acc=" << acc;
        }
    }
  }
}

// A W stored in any other dtype (f16, GGUF blocks, the K-quants, NF4 / FP4 with double quant, LLM.int8) is
// dequantized a few rows at a time and rounded as packed: every product gives the bits of the same call on
// bf16(DequantizeRows(W)) as a BF16 tensor (an odd N takes StripsRows' lone last row; 1 and 2 threads).
TEST(TrainBf16Dot, OtherDtypesAreTheirRoundedDequantizedValues) {
  if (!UsesBf16Dot()) GTEST_SKIP() << "no avx512_bf16 (or LATHE_BF16_DOT=0)";
  uint32_t seed = 7700;
  struct S { int64_t M, N, K, r; };
  for (S s : {S{9, 33, 256, 5}, S{70, 100, 512, 16}}) {
    const int64_t M = s.M, N = s.N, K = s.K, r = s.r;
    const std::vector<float> x = Bf16Values(M * K, seed++), dy = Bf16Values(M * N, seed++);
    const std::vector<float> x2 = Bf16Values(M * r, seed++), dy2 = Bf16Values(M * r, seed++);
    std::vector<float> aw = RandomVec(r * K, seed++), bw = RandomVec(N * r, seed++);
    auto view = [](const void* d, DType t, int64_t rows, int64_t cols) {
      Tensor v;
      v.data = d, v.dtype = t, v.shape = {rows, cols};
      return v;
    };
    const Tensor a = view(aw.data(), DType::kF32, r, K), b = view(bw.data(), DType::kF32, N, r);
    const std::vector<float> wf = RandomVec(N * K, seed++, 0.05f);
    for (DType t : {DType::kF16, DType::kQ8_0, DType::kQ4_1, DType::kQ4_K, DType::kNF4DQ, DType::kFP4, DType::kI8Row}) {
      SCOPED_TRACE(StrFormat("%s M=%lld N=%lld K=%lld", DTypeName(t), (long long)M, (long long)N, (long long)K));
      testing::TestWeight gw;
      PackedWeight pw;
      Tensor w;
      if (IsPackedQuant(t)) {
        auto q = QuantizeWeight(view(wf.data(), DType::kF32, N, K), t);
        ASSERT_TRUE(q.ok()) << q.status().message();
        pw = std::move(*q);
        w = pw.view();
      } else {
        gw = MakeWeight(t, N, K, seed++);
        w = gw.t;
      }
      std::vector<float> deq(N * K);
      DequantizeRows(w, 0, N, deq.data());
      std::vector<uint16_t> w16(N * K);
      for (int64_t i = 0; i < N * K; ++i) w16[i] = F32ToBF16(deq[i]);
      const Tensor wb = view(w16.data(), DType::kBF16, N, K);
      for (int threads : {1, 2}) {
        ThreadPool pool(threads);
        for (bool acc : {false, true}) {
          const std::vector<float> y0 = RandomVec(M * N, seed), dx0 = RandomVec(M * K, seed + 1);
          std::vector<float> y = y0, y_ref = y0;
          LinearForwardBf16(pool, y.data(), x.data(), M, w, acc);
          LinearForwardBf16(pool, y_ref.data(), x.data(), M, wb, acc);
          ASSERT_EQ(y, y_ref) << "forward threads=" << threads << " acc=" << acc;
          std::vector<float> dx = dx0, dx_ref = dx0;
          MatMulBackwardInputBf16(pool, dx.data(), dy.data(), M, w, acc);
          MatMulBackwardInputBf16(pool, dx_ref.data(), dy.data(), M, wb, acc);
          ASSERT_EQ(dx, dx_ref) << "input grad threads=" << threads << " acc=" << acc;
          y = y_ref = y0;
          LinearForwardBf16Plus(pool, y.data(), x.data(), M, w, x2.data(), b, acc);
          LinearForwardBf16Plus(pool, y_ref.data(), x.data(), M, wb, x2.data(), b, acc);
          ASSERT_EQ(y, y_ref) << "fused forward threads=" << threads;
          dx = dx_ref = dx0;
          MatMulBackwardInputBf16Plus(pool, dx.data(), dy.data(), M, w, dy2.data(), a, acc);
          MatMulBackwardInputBf16Plus(pool, dx_ref.data(), dy.data(), M, wb, dy2.data(), a, acc);
          ASSERT_EQ(dx, dx_ref) << "fused input grad threads=" << threads;
          const auto keep = [](float* m) { return (const float*)m; };
          std::vector<float> mid(M * r), mid_ref(M * r);
          y = y_ref = y0;
          LoraForwardBf16(pool, y.data(), mid.data(), x.data(), M, w, a, b, keep, acc);
          LoraForwardBf16(pool, y_ref.data(), mid_ref.data(), x.data(), M, wb, a, b, keep, acc);
          ASSERT_EQ(y, y_ref) << "chained LoRA forward threads=" << threads;
          dx = dx_ref = dx0;
          LoraBackwardInputBf16(pool, dx.data(), mid.data(), dy.data(), M, w, b, a, keep, acc);
          LoraBackwardInputBf16(pool, dx_ref.data(), mid_ref.data(), dy.data(), M, wb, b, a, keep, acc);
          ASSERT_EQ(dx, dx_ref) << "chained LoRA input grad threads=" << threads;
        }
      }
    }
  }
}

// A bf16 head's loss case: x (T, C) and a bf16 head (V, C) from seeds, every fifth token from the fourth unlabelled.
struct Bf16HeadCase {
  int64_t T, V, C;
  std::vector<float> x;
  std::vector<uint16_t> wb;
  Tensor w;
  std::vector<int32_t> labels;
  Bf16HeadCase(int64_t t, int64_t v, int64_t c, uint32_t seed) : T(t), V(v), C(c), x(RandomVec(t * c, seed)) {
    const std::vector<float> wf = RandomVec(V * C, seed + 1, 0.3f);
    wb.resize(V * C);
    for (int64_t i = 0; i < V * C; ++i) wb[i] = F32ToBF16(wf[i]);
    w.data = wb.data(), w.dtype = DType::kBF16, w.shape = {V, C};
    labels.resize(T);
    for (int64_t i = 0; i < T; ++i) labels[i] = i % 5 == 3 ? kIgnoreLabel : (int32_t)((i * 131) % V);
  }
};

// The head gradient's pairs in AMX tile order (HeadGradTiled: chunks of a multiple of 32 tokens): held back and added
// later (AddHeadGrad), or added chunk by chunk in storage the caller gives, the direct call's bits; either is the
// bf16-rounded gradient (a wrong layout would be far off). 72 labelled tokens: chunks 32, 32, 8.
TEST(TrainBf16Dot, HeadGradientPairsInTileOrder) {
  if (!UsesBf16Dot()) GTEST_SKIP() << "no avx512_bf16 (or LATHE_BF16_DOT=0)";
  const Bf16HeadCase hc(90, 333, 64, 7400);
  const int64_t T = hc.T, V = hc.V, C = hc.C;
  const std::vector<float>& x = hc.x;
  const Tensor& w = hc.w;
  const std::vector<int32_t>& labels = hc.labels;
  EXPECT_EQ(cpu::avx512bf16::HeadGradTiled(32), UsesAmxBf16());
  EXPECT_FALSE(cpu::avx512bf16::HeadGradTiled(16));
  const std::vector<float> dw0 = RandomVec(V * C, 7402, 1e-3f);
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    std::vector<float> dx32(T * C), dx16(T * C), dxl(T * C), dw32 = dw0, dw16 = dw0, dwl = dw0;
    const float l32 = CrossEntropyBackward(pool, dx32.data(), dw32.data(), x.data(), T, w, labels.data(), 72.0f, 1.0f,
                                           32, nullptr, /*bf16=*/true);
    const float l16 = CrossEntropyBackward(pool, dx16.data(), dw16.data(), x.data(), T, w, labels.data(), 72.0f, 1.0f,
                                           16, nullptr, /*bf16=*/true);
    EXPECT_EQ(l32, l16);
    HeadGradParts later;
    EXPECT_EQ(l32, CrossEntropyBackward(pool, dxl.data(), nullptr, x.data(), T, w, labels.data(), 72.0f, 1.0f, 32,
                                        nullptr, /*bf16=*/true, &later));
    EXPECT_EQ(later.tokens, (std::vector<int64_t>{32, 32, 8}));
    EXPECT_EQ(later.tiled, UsesAmxBf16());
    EXPECT_EQ((int64_t)(later.a.size() + later.b.size()) * 4, HeadGradPartsBytes(V, C, 72, 32));
    AddHeadGrad(pool, dwl.data(), later);
    ASSERT_EQ(dwl, dw32) << threads;
    // One chunk's pairs at a time in the caller's storage (a trainer's worker reuses it call after call).
    std::vector<float> dxs(T * C), dws = dw0;
    HeadGradParts storage;
    EXPECT_EQ(l32, CrossEntropyBackward(pool, dxs.data(), dws.data(), x.data(), T, w, labels.data(), 72.0f, 1.0f, 32,
                                        nullptr, /*bf16=*/true, &storage));
    EXPECT_TRUE(storage.tokens.empty());
    EXPECT_GE((int64_t)(storage.a.size() + storage.b.size()) * 4, HeadGradPartsBytes(V, C, 32, 32));
    EXPECT_LT((int64_t)(storage.a.size() + storage.b.size()) * 4, HeadGradPartsBytes(V, C, 72, 32));
    ASSERT_EQ(dws, dw32) << threads;
    ASSERT_EQ(dxs, dx32) << threads;
    // Against the double gradient from the bf16-rounded dlogits' source (the f32 path's dw).
    std::vector<float> dwf = dw0, dxf(T * C);
    CrossEntropyBackward(pool, dxf.data(), dwf.data(), x.data(), T, w, labels.data(), 72.0f);
    double num = 0, den = 0;
    for (int64_t i = 0; i < V * C; ++i)
      num += (dw32[i] - dwf[i]) * (dw32[i] - dwf[i]), den += (dwf[i] - dw0[i]) * (dwf[i] - dw0[i]);
    EXPECT_LT(std::sqrt(num / den), 2e-2) << threads;
  }
}

// The loss over a bf16 head in bf16 mode on vdpbf16ps (CrossEntropy*(..., bf16 = true)): its logits are
// the pair arithmetic's (Bf16PairsReference on x and the head), so the loss equals a double softmax over
// those logits (up to f32 softmax rounding) and differs from the f32 path's (x not rounded); dx and dw take
// dlogits rounded to bf16. dx from the head unpacked (its pairs built one inner chunk at a time: an odd V,
// two chunks of 256 and 245 pairs) equals dx from the head packed whole, bit for bit.
TEST(TrainBf16Dot, CrossEntropyLogitsArePairArithmetic) {
  if (!UsesBf16Dot()) GTEST_SKIP() << "no avx512_bf16 (or LATHE_BF16_DOT=0)";
  const Bf16HeadCase hc(37, 1001, 64, 7300);
  const int64_t T = hc.T, V = hc.V, C = hc.C;
  const std::vector<float>& x = hc.x;
  const std::vector<uint16_t>& wb = hc.wb;
  const Tensor& w = hc.w;
  const std::vector<int32_t>& labels = hc.labels;
  std::vector<float> logits(T * V);
  cpu::Bf16PairsReference(x.data(), T, w, logits.data());
  double loss_ref = 0;
  std::vector<double> dx_ref(T * C, 0.0);
  const double norm = 29.0;
  for (int64_t t = 0; t < T; ++t) {
    if (labels[t] == kIgnoreLabel) continue;
    const float* l = &logits[t * V];
    double mx = *std::max_element(l, l + V), sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
    loss_ref += (mx + std::log(sum) - l[labels[t]]) / norm;
    for (int64_t v = 0; v < V; ++v) {
      const double g = (std::exp(l[v] - mx) / sum - (v == labels[t])) / norm;
      for (int64_t c = 0; c < C; ++c) dx_ref[t * C + c] += g * BF16ToF32(wb[v * C + c]);
    }
  }
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    std::vector<float> dx(T * C, -1.0f), dx32(T * C);
    const float loss = CrossEntropyBackward(pool, dx.data(), nullptr, x.data(), T, w, labels.data(), (float)norm,
                                            1.0f, 16, nullptr, /*bf16=*/true);
    EXPECT_NEAR(loss, loss_ref, 2e-6 * loss_ref) << threads;
    EXPECT_EQ(loss, CrossEntropyForward(pool, x.data(), T, w, labels.data(), (float)norm, 16, /*bf16=*/true));
    const float loss32 = CrossEntropyBackward(pool, dx32.data(), nullptr, x.data(), T, w, labels.data(), (float)norm);
    EXPECT_NE(loss, loss32);  // x really rounded
    EXPECT_NEAR(loss, loss32, 1e-2 * loss32);
    // dw_head += dlogits^T x with dlogits and x rounded to bf16: within bf16's rounding of the double
    // reference, and not equal to it (the rounding is applied).
    std::vector<float> dw0 = RandomVec(V * C, 7302, 1e-3f), dw = dw0;
    CrossEntropyBackward(pool, dx.data(), dw.data(), x.data(), T, w, labels.data(), (float)norm, 1.0f, 16, nullptr,
                         /*bf16=*/true);
    std::vector<double> dw_ref(dw0.begin(), dw0.end());
    for (int64_t t = 0; t < T; ++t) {
      if (labels[t] == kIgnoreLabel) continue;
      const float* l = &logits[t * V];
      double mx = *std::max_element(l, l + V), sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(l[v] - mx);
      for (int64_t v = 0; v < V; ++v) {
        const double g = (std::exp(l[v] - mx) / sum - (v == labels[t])) / norm;
        for (int64_t c = 0; c < C; ++c) dw_ref[v * C + c] += g * BF16ToF32(F32ToBF16(x[t * C + c]));
      }
    }
    double num = 0, den = 0;
    for (int64_t i = 0; i < V * C; ++i)
      num += (dw[i] - dw_ref[i]) * (dw[i] - dw_ref[i]), den += (dw_ref[i] - dw0[i]) * (dw_ref[i] - dw0[i]);
    EXPECT_LT(std::sqrt(num / den), 1e-2) << threads;
    EXPECT_GT(std::sqrt(num / den), 1e-5) << threads;
    // Held back (HeadGradParts: every chunk's pairs one block after another, odd chunks padded) and added later,
    // one product per chunk: the direct call's bits, the loss and dx unchanged; the same at either thread count.
    // Chunks of 7: five of them (7, 7, 7, 7, 2 labelled tokens).
    {
      HeadGradParts later;
      std::vector<float> dx7(T * C), dxl(T * C, -1.0f), dw7 = dw0, dwl = dw0;
      const float loss7 = CrossEntropyBackward(pool, dx7.data(), dw7.data(), x.data(), T, w, labels.data(),
                                               (float)norm, 1.0f, 7, nullptr, /*bf16=*/true);
      EXPECT_EQ(loss7, CrossEntropyBackward(pool, dxl.data(), nullptr, x.data(), T, w, labels.data(), (float)norm,
                                            1.0f, 7, nullptr, /*bf16=*/true, &later));
      EXPECT_EQ(dxl, dx7) << threads;
      EXPECT_EQ(later.tokens, (std::vector<int64_t>{7, 7, 7, 7, 2}));
      AddHeadGrad(pool, dwl.data(), later);
      ASSERT_EQ(dwl, dw7) << threads;
      static std::vector<float> dw7_one_thread;
      if (threads == 1) dw7_one_thread = dw7;
      ASSERT_EQ(dw7, dw7_one_thread) << threads;
      double n7 = 0;
      for (int64_t i = 0; i < V * C; ++i) n7 += (dw7[i] - dw_ref[i]) * (dw7[i] - dw_ref[i]);
      EXPECT_LT(std::sqrt(n7 / den), 1e-2) << threads;
    }
    // dx from the head packed as bf16 pairs (PackForBackwardInputBf16): dlogits rounded to bf16, so within
    // bf16's rounding of the double reference and not equal to the f32 dx; the loss unchanged.
    PackedBackwardB packed;
    PackForBackwardInputBf16(pool, w, &packed);
    EXPECT_TRUE(packed.data.empty());
    EXPECT_EQ((int64_t)packed.pairs.size() * 4, PackedBackwardBPairBytes(V, C));
    std::vector<float> dxp(T * C, -1.0f);
    EXPECT_EQ(loss, CrossEntropyBackward(pool, dxp.data(), nullptr, x.data(), T, w, labels.data(), (float)norm, 1.0f,
                                         16, &packed, /*bf16=*/true));
    num = den = 0;
    for (int64_t i = 0; i < T * C; ++i) num += (dxp[i] - dx_ref[i]) * (dxp[i] - dx_ref[i]), den += dx_ref[i] * dx_ref[i];
    EXPECT_LT(std::sqrt(num / den), 1e-2) << threads;
    EXPECT_GT(std::sqrt(num / den), 1e-6) << threads;
    ASSERT_EQ(dx, dxp) << threads;
    for (int64_t t = 0; t < T; ++t)  // ignored tokens: zero rows
      if (labels[t] == kIgnoreLabel) {
        for (int64_t c = 0; c < C; ++c) ASSERT_EQ(dxp[t * C + c], 0.0f);
      }
  }
}

// A head stored in a GGUF block type (a quantized-base run keeps the GGUF's head as stored) or in f32 (a trained
// head's masters; a quantized-base run's f32 head) takes the bf16 loss's products on its rows (dequantized and)
// rounded to bf16 as they are paired (HeadLogitsT by row blocks, HeadBackwardInputTRows by inner chunks: an odd V,
// two chunks): loss, dx and the head gradient bit for bit those of the same head as bf16 values, at 1 and 2 threads.
TEST(TrainBf16Dot, CrossEntropyOverAnF32OrBlockQuantizedHeadIsItsBf16Rounding) {
  if (!UsesBf16Dot()) GTEST_SKIP() << "no avx512_bf16 (or LATHE_BF16_DOT=0)";
  const int64_t T = 37, V = 1001, C = 64;
  const std::vector<float> x = RandomVec(T * C, 7310), wf = RandomVec(V * C, 7311, 0.3f);
  std::vector<int32_t> labels(T);
  for (int64_t t = 0; t < T; ++t) labels[t] = t % 5 == 3 ? kIgnoreLabel : (int32_t)((t * 131) % V);
  for (DType type : {DType::kQ8_0, DType::kQ4_1, DType::kF32}) {
    std::vector<uint8_t> wq(DTypeBytes(type, V * C));
    if (type == DType::kF32) {
      std::memcpy(wq.data(), wf.data(), wq.size());
    } else {
      for (int64_t r = 0; r < V; ++r) QuantizeRow(type, &wf[r * C], C, wq.data() + r * DTypeBytes(type, C));
    }
    Tensor q;
    q.data = wq.data(), q.dtype = type, q.shape = {V, C};
    std::vector<float> deq(V * C);
    DequantizeRows(q, 0, V, deq.data());
    std::vector<uint16_t> wb(V * C);
    for (int64_t i = 0; i < V * C; ++i) wb[i] = F32ToBF16(deq[i]);
    Tensor b;
    b.data = wb.data(), b.dtype = DType::kBF16, b.shape = {V, C};
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      std::vector<float> dxq(T * C, -1.0f), dxb(T * C, -2.0f);
      const float lq = CrossEntropyBackward(pool, dxq.data(), nullptr, x.data(), T, q, labels.data(), 29.0f, 1.0f, 16,
                                            nullptr, /*bf16=*/true);
      const float lb = CrossEntropyBackward(pool, dxb.data(), nullptr, x.data(), T, b, labels.data(), 29.0f, 1.0f, 16,
                                            nullptr, /*bf16=*/true);
      EXPECT_EQ(lq, lb) << DTypeName(type) << " threads " << threads;
      EXPECT_EQ(dxq, dxb) << DTypeName(type) << " threads " << threads;
      // With the head's gradient (as full fine-tuning takes it), the caller's storage for one chunk's pairs.
      std::vector<float> dwq = RandomVec(V * C, 7312, 1e-3f), dwb = dwq;
      HeadGradParts storage;
      EXPECT_EQ(lq, CrossEntropyBackward(pool, dxq.data(), dwq.data(), x.data(), T, q, labels.data(), 29.0f, 1.0f, 16,
                                         nullptr, /*bf16=*/true, &storage));
      EXPECT_EQ(lb, CrossEntropyBackward(pool, dxb.data(), dwb.data(), x.data(), T, b, labels.data(), 29.0f, 1.0f, 16,
                                         nullptr, /*bf16=*/true));
      EXPECT_EQ(dxq, dxb) << DTypeName(type) << " threads " << threads;
      EXPECT_EQ(dwq, dwb) << DTypeName(type) << " threads " << threads;
      EXPECT_EQ(lq, CrossEntropyForward(pool, x.data(), T, q, labels.data(), 29.0f, 16, /*bf16=*/true));
      // Not the f32 path's loss (x and the head really rounded).
      EXPECT_NE(lq, CrossEntropyForward(pool, x.data(), T, q, labels.data(), 29.0f, 16, /*bf16=*/false));
    }
  }
}

}  // namespace
}  // namespace lathe::kernels
