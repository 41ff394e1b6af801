// Products of bf16 values on vdpbf16ps (avx512_bf16: Cooper Lake, Sapphire Rapids, Zen 4 and later), one
// 8 x 48 register tile for all of them. Per C element the pair arithmetic of Bf16PairsReference
// (dispatch.h): per inner chunk (Bf16PairsChunk pairs) one chain acc = (acc + a[2p+1] b[2p+1]) + a[2p] b[2p]
// (each product exact in f32, each add rounded: what vdpbf16ps does, measured bit-identical on Zen 4 and as
// Intel documents it), the chunks added in order (the first stored unless accumulating). Operands are
// converted once per call: A to row-major pairs (read in place by the tile), B to 16-column pair strips
// (or given as such: BF16 inference weights, packed at load).
// - Inference (MatMulKernels::bf16_strips of the AVX-512 table on CPUs with the instruction): y = bf16(x) .
//   W^T from BF16 weights in pair strips (kernels::StripWeight::bf16_pairs), every M (decode, batched
//   decode, prefill) and thread count through the same per-element chain (the tile; up to 4 rows, which
//   stream W once, RowStrips over runs of strips), so a row's result does not depend on what it is batched
//   with. Against the f32 path on bf16 weights (convert, then FMA): half the instructions per product and no
//   conversion of W.
// - Training in bf16 mode: y = x W^T, dx = dy W and dW += dy^T x for operands that already hold bf16
//   values (the trainer rounds activations, gradients and trainable weights; a bf16 checkpoint's frozen
//   weights are bf16 as stored, an f32 one is rounded as packed), and the loss's bf16 head. The f32
//   path's training GEMM sums the same exact products one at a time instead.
// Where vdpbf16ps does fewer multiply-adds per second than two f32 FMAs (Bf16PairsOnFma: Intel's cores), the
// tiles take the FMA form of TileT (bf16_pairs.h): the same chains on FMAs, A widened to floats per call or
// inner chunk.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "core/check.h"
#include "core/cpu.h"
#include "kernels/cpu/bf16_amx.h"
#include "kernels/cpu/bf16_pairs.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/train_ops.h"
#include "kernels/cpu/scratch.h"
#include "kernels/kernels.h"

namespace lathe::kernels::cpu::avx512bf16 {

namespace {

constexpr int64_t kMBlock = 64;  // A rows per task
// Columns of a block-quantized W dequantized at a time: a whole number of quant blocks (256: every block type's size
// divides it).
constexpr int64_t kDequantCols = 256;

// A rows widened for the FMA tiles (per thread, grown never shrunk).
float* WideBuf(size_t n) {
  static thread_local std::vector<float> buf;
  return Scratch(buf, n);
}

// PairGemm's work on C rows [m0, m1) over strip groups [g0, g1) (kS strips each): a points at A's row m0.
// With fma (Bf16PairsOnFma) the tiles are the FMA form (TileFmaFor), each inner chunk's A rows widened first
// (WidenPairs: at most kMBlock x 2 x 384 floats per thread).
// Calls tile(r, ns, i, s0, bs, nc_last) for each register tile of C rows [m0, m1) (kR at a time) and strip groups
// [g0, g1) (kS strips each) of an inner chunk from pair p0: B's strips from bs, the last strip's valid columns.
template <class Tile>
void EachTile(int64_t m0, int64_t m1, int64_t g0, int64_t g1, int64_t Kd, int64_t Lp, int64_t p0, const uint32_t* b,
              const Tile& tile) {
  const int64_t n_strips = (Kd + 15) / 16;
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t s0 = g * kS, ns = std::min<int64_t>(kS, n_strips - s0);
    const int nc_last = (int)std::min<int64_t>(16, Kd - 16 * (s0 + ns - 1));
    const uint32_t* bs = b + (s0 * Lp + p0) * 16;
    for (int64_t i = m0; i < m1; i += kR) tile((int)std::min<int64_t>(kR, m1 - i), (int)ns, i, s0, bs, nc_last);
  }
}

// The FMA tiles of PairGemmBlock's inner chunk [p0, p0 + np), its A rows as floats holding bf16 values (row i at
// af + (i - m0) * ldaf, from the chunk's first pair on); store: C = the chunk's sums, else C += them.
void FmaChunkTiles(float* c, int64_t ldc, int64_t m0, int64_t m1, int64_t g0, int64_t g1, int64_t Kd, int64_t Lp,
                   int64_t p0, int64_t np, const float* af, int64_t ldaf, const uint32_t* b, bool store) {
  EachTile(m0, m1, g0, g1, Kd, Lp, p0, b, [&](int r, int ns, int64_t i, int64_t s0, const uint32_t* bs, int nc_last) {
    TileFmaFor(r, ns)(af + (i - m0) * ldaf, ldaf, bs, Lp * 16, np, c + i * ldc + 16 * s0, ldc, store, nc_last);
  });
}

void PairGemmBlock(float* c, int64_t ldc, int64_t m0, int64_t m1, int64_t g0, int64_t g1, int64_t Kd, int64_t Lp,
                   const uint32_t* a, int64_t lda, const uint32_t* b, bool accumulate, bool fma = false) {
  const int64_t chunk = Bf16PairsChunk(Lp);
  for (int64_t p0 = 0; p0 < Lp; p0 += chunk) {
    const int64_t np = std::min(chunk, Lp - p0);
    const bool store = p0 == 0 && !accumulate;
    if (fma) {
      float* af = WideBuf((size_t)((m1 - m0) * 2 * np));
      WidenPairs(a + p0, lda, m1 - m0, np, af, 2 * np);
      FmaChunkTiles(c, ldc, m0, m1, g0, g1, Kd, Lp, p0, np, af, 2 * np, b, store);
      continue;
    }
    EachTile(m0, m1, g0, g1, Kd, Lp, p0, b, [&](int r, int ns, int64_t i, int64_t s0, const uint32_t* bs, int nc_last) {
      TileFor(r, ns)(a + (i - m0) * lda + p0, lda, bs, Lp * 16, np, c + i * ldc + 16 * s0, ldc, store, nc_last);
    });
  }
}

// C(R, Kd) (=, or += with accumulate) A . B from A as row-major pairs (R x Lp) and B as pair strips.
// lda: A's row stride in dwords (0: Lp), for an A whose rows hold more pairs than this product sums over.
// Where UsesAmxBf16() the products run on AMX tiles (bf16_amx.h: AMX's arithmetic); amx = false keeps the pair
// tiles (StripsMatMul's own choice: it takes AMX for every M or the pair tiles for every M).
void PairGemm(ThreadPool& pool, float* c, int64_t ldc, int64_t R, int64_t Kd, int64_t Lp, const uint32_t* a,
              const uint32_t* b, bool accumulate, int64_t lda = 0, bool amx = true) {
  if (lda <= 0) lda = Lp;
  if (amx && UsesAmxBf16()) return amx::PairGemm(pool, c, ldc, R, Kd, Lp, a, lda, b, accumulate);
  const bool fma = Bf16PairsOnFma();
  const int64_t n_strips = (Kd + 15) / 16;
  const int64_t n_groups = (n_strips + kS - 1) / kS, n_mb = (R + kMBlock - 1) / kMBlock;
  const int64_t th = pool.size();
  const int64_t want = th > 1 ? 4 * th : 1;
  int64_t per = std::max<int64_t>(1, n_groups / std::max<int64_t>(1, want / n_mb));
  int64_t n_gr = (n_groups + per - 1) / per;
  // A few equal tasks that do not divide among the threads leave one thread a whole task short at the end:
  // the (576, 576) and (576, 1536) weight gradients of SmolLM2 were 9 tasks on 2 threads. Split the strip
  // groups evenly until they do (each C element is still one task's whole sum: the same bits).
  if (th > 1 && (n_mb * n_gr) % th != 0 && n_mb * n_gr < 8 * th) {
    for (int64_t p = per - 1; p >= 1; --p) {
      if (n_groups % p == 0 && (n_mb * (n_groups / p)) % th == 0) {
        per = p;
        n_gr = n_groups / p;
        break;
      }
    }
  }
  pool.ParallelFor(n_mb * n_gr, 1, [&](int64_t tb, int64_t te, int) {
    for (int64_t t = tb; t < te; ++t) {
      const int64_t mb = t / n_gr, gr = t % n_gr;
      const int64_t m0 = mb * kMBlock, m1 = std::min(R, m0 + kMBlock);
      const int64_t g0 = gr * per, g1 = std::min(n_groups, g0 + per);
      PairGemmBlock(c, ldc, m0, m1, g0, g1, Kd, Lp, a + m0 * lda, lda, b, accumulate, fma);
    }
  }, 2.0 * R * Kd * Lp * 2);
}

uint32_t* ABuf(size_t n) {
  static thread_local std::vector<uint32_t> buf;
  return Scratch(buf, n);
}
uint32_t* BBuf(size_t n) {
  static thread_local std::vector<uint32_t> buf;
  return Scratch(buf, n);
}

// A pair product's A operand from f32 rows: row-major pairs for the pair tiles (PairRows / PairRowsT, Lp dwords a
// row), or where the products run on AMX tiles (UsesAmxBf16) written straight into tile order (PairRowsTiled /
// PairRowsTTiled), so that amx::PairGemmTiled's tasks need no copy of their rows (amx::PairGemm's TileRows was ~6%
// of a bf16 training step). The same bits either way. PairGemmA runs C = A . B over either form; stride: A's row
// stride (row-major, 0: Lp) or its row pairs' (tiled, 0: TiledStride(Lp)), for the first Lp pairs of a wider A.
bool TiledA() { return UsesAmxBf16(); }
uint32_t* PackRowsA(ThreadPool& pool, const float* a, int64_t lda, int64_t R, int64_t L) {
  const int64_t Lp = (L + 1) / 2;
  if (TiledA()) {
    uint32_t* at = ABuf((size_t)amx::TiledDwords(R, Lp));
    PairRowsTiled(pool, a, lda, R, L, at, TiledStride(Lp));
    return at;
  }
  uint32_t* ap = ABuf((size_t)(R * Lp));
  PairRows(pool, a, lda, R, L, ap);
  return ap;
}
// A = M^T for M (L rows of R, ldm apart): R rows of (L + 1) / 2 pairs, into out (ColsADwords(L, R) dwords) or
// the thread's ABuf.
int64_t ColsADwords(int64_t L, int64_t R) {
  const int64_t Lp = (L + 1) / 2;
  return TiledA() ? amx::TiledDwords(R, Lp) : R * Lp;
}
uint32_t* PackColsA(ThreadPool& pool, const float* m, int64_t ldm, int64_t L, int64_t R, uint32_t* out = nullptr) {
  const int64_t Lp = (L + 1) / 2;
  if (TiledA()) {
    uint32_t* at = out ? out : ABuf((size_t)amx::TiledDwords(R, Lp));
    PairRowsTTiled(pool, m, ldm, L, R, at);
    return at;
  }
  uint32_t* ap = out ? out : ABuf((size_t)(R * Lp));
  PairRowsT(pool, m, ldm, L, R, ap);
  return ap;
}
void PairGemmA(ThreadPool& pool, float* c, int64_t ldc, int64_t R, int64_t Kd, int64_t Lp, const uint32_t* a,
               const uint32_t* b, bool accumulate, int64_t stride = 0) {
  if (TiledA()) return amx::PairGemmTiled(pool, c, ldc, R, Kd, Lp, a, stride, b, accumulate);
  PairGemm(pool, c, ldc, R, Kd, Lp, a, b, accumulate, stride, /*amx=*/false);
}
// A's pairs from pair p0 on (p0 a multiple of 16 in tile order).
const uint32_t* PairsFrom(const uint32_t* a, int64_t p0) { return TiledA() ? a + p0 / 16 * 512 : a + p0; }

// Rows of a W stored in another dtype (f16, block or packed quant), dequantized to f32 on their way to pairs.
float* DequantBuf(size_t n) {
  static thread_local std::vector<float> buf;
  return Scratch(buf, n);
}

}  // namespace

// W (Kd, L) as pair strips along L (the forward's W^T), strips sstride dwords apart. f32 and bf16 are read in
// place; any other dtype (f16, GGUF blocks, NF4 / FP4 / int8 bases) is dequantized 16 rows at a time
// (kernels::DequantizeRows) into a per-thread buffer and rounded from there: bf16(dequantized W), as
// bitsandbytes dequantizes into its bf16 compute dtype.
void StripsT(ThreadPool& pool, const Tensor& w, uint32_t* out, int64_t sstride) {
  const int64_t Kd = w.shape[0], L = w.shape[1];
  if (w.dtype == DType::kBF16) {
    PairStripsT<uint16_t>(pool, (const uint16_t*)w.data, L, Kd, L, out, sstride);
  } else if (w.dtype == DType::kF32) {
    PairStripsT<float>(pool, (const float*)w.data, L, Kd, L, out, sstride);
  } else {
    const int64_t Lp = (L + 1) / 2, ss = sstride > 0 ? sstride : Lp * 16;
    pool.ParallelFor((Kd + 15) / 16, 1, [&](int64_t b, int64_t e, int) {
      float* rows = DequantBuf((size_t)(16 * L));
      for (int64_t s = b; s < e; ++s) {
        const int nj = (int)std::min<int64_t>(16, Kd - 16 * s);
        DequantizeRows(w, 16 * s, nj, rows);
        StripOfRows(rows, L, nj, L, out + s * ss);
      }
    }, 4.0 * Kd * L);
  }
}
// W (L, Kd) as pair strips along its rows L (dX = dY W's B), strips sstride dwords apart; other dtypes as in
// StripsT, 16 rows (8 pairs) at a time.
void StripsRows(ThreadPool& pool, const Tensor& w, uint32_t* out, int64_t sstride) {
  const int64_t L = w.shape[0], Kd = w.shape[1];
  if (w.dtype == DType::kBF16) {
    PairStripsRows<uint16_t>(pool, (const uint16_t*)w.data, Kd, L, Kd, out, sstride);
  } else if (w.dtype == DType::kF32) {
    PairStripsRows<float>(pool, (const float*)w.data, Kd, L, Kd, out, sstride);
  } else {
    constexpr int64_t kPairs = 8;
    const int64_t Lp = (L + 1) / 2, ss = sstride > 0 ? sstride : Lp * 16;
    pool.ParallelFor((Lp + kPairs - 1) / kPairs, 1, [&](int64_t b, int64_t e, int) {
      float* rows = DequantBuf((size_t)(2 * kPairs * Kd));
      for (int64_t blk = b; blk < e; ++blk) {
        const int64_t p0 = blk * kPairs, np = std::min(kPairs, Lp - p0), r0 = 2 * p0;
        DequantizeRows(w, r0, std::min(2 * np, L - r0), rows);
        for (int64_t p = 0; p < np; ++p) {
          const float* r = rows + 2 * p * Kd;
          PairTwoRows<float>(r, r0 + 2 * p + 1 < L ? r + Kd : nullptr, Kd, out + (p0 + p) * 16, ss);
        }
      }
    }, 4.0 * L * Kd);
  }
}

// c (M, Kd) (=, +=) [a1 | a2] . [B1 ; B2]: one inner dimension of (L1 + 1) / 2 + (L2 + 1) / 2 pairs, a1's
// then a2's in each A row, w1's then w2's in each B strip (`strips`: StripsT or StripsRows).
template <typename Strips>
void ConcatPairGemm(ThreadPool& pool, float* c, int64_t M, int64_t Kd, const float* a1, int64_t L1, const float* a2,
                    int64_t L2, const Tensor& w1, const Tensor& w2, Strips strips, bool accumulate) {
  const int64_t L1p = (L1 + 1) / 2, Lp = L1p + (L2 + 1) / 2;
  // Tile order where a2's pairs start at a step (else A row-major, tiled per task by amx::PairGemm).
  const bool tiled = TiledA() && L1p % 16 == 0;
  uint32_t* a = ABuf(tiled ? (size_t)amx::TiledDwords(M, Lp) : (size_t)(M * Lp));
  uint32_t* b = BBuf((size_t)((Kd + 15) / 16 * 16 * Lp));
  if (tiled) {
    PairRowsTiled(pool, a1, L1, M, L1, a, TiledStride(Lp));
    PairRowsTiled(pool, a2, L2, M, L2, a, TiledStride(Lp), L1p / 16);
  } else {
    PairRows(pool, a1, L1, M, L1, a, Lp);
    PairRows(pool, a2, L2, M, L2, a + L1p, Lp);
  }
  strips(pool, w1, b, Lp * 16);
  strips(pool, w2, b + L1p * 16, Lp * 16);
  if (tiled) return amx::PairGemmTiled(pool, c, Kd, M, Kd, Lp, a, 0, b, accumulate);
  PairGemm(pool, c, Kd, M, Kd, Lp, a, b, accumulate);
}

// As ConcatPairGemm with a2 made from a1: mid (M, r) = a1 . R first, over the pairs of a1 already packed into
// A's rows (R as `rstrips` packs rw: r columns of pair strips), then a2 = second(mid) (M x L2, L2 = r).
template <typename Strips>
void ConcatPairGemmChained(ThreadPool& pool, float* c, int64_t M, int64_t Kd, const float* a1, int64_t L1,
                           const Tensor& w1, const Tensor& rw, Strips rstrips, float* mid, int64_t r,
                           const std::function<const float*(float*)>& second, const Tensor& w2, Strips strips,
                           bool accumulate) {
  const int64_t L1p = (L1 + 1) / 2, Lp = L1p + (r + 1) / 2;
  const bool tiled = TiledA() && L1p % 16 == 0;  // as in ConcatPairGemm
  const int64_t qs = TiledStride(Lp);
  uint32_t* a = ABuf(tiled ? (size_t)amx::TiledDwords(M, Lp) : (size_t)(M * Lp));
  if (tiled) {
    PairRowsTiled(pool, a1, L1, M, L1, a, qs);
  } else {
    PairRows(pool, a1, L1, M, L1, a, Lp);
  }
  uint32_t* rb = BBuf((size_t)((r + 15) / 16 * 16 * L1p));
  rstrips(pool, rw, rb, L1p * 16);
  if (tiled) {
    amx::PairGemmTiled(pool, mid, r, M, r, L1p, a, qs, rb, /*accumulate=*/false);
    PairRowsTiled(pool, second(mid), r, M, r, a, qs, L1p / 16);
  } else {
    PairGemm(pool, mid, r, M, r, L1p, a, rb, /*accumulate=*/false, Lp);
    PairRows(pool, second(mid), r, M, r, a + L1p, Lp);
  }
  uint32_t* b = BBuf((size_t)((Kd + 15) / 16 * 16 * Lp));
  strips(pool, w1, b, Lp * 16);
  strips(pool, w2, b + L1p * 16, Lp * 16);
  if (tiled) return amx::PairGemmTiled(pool, c, Kd, M, Kd, Lp, a, 0, b, accumulate);
  PairGemm(pool, c, Kd, M, Kd, Lp, a, b, accumulate);
}

// mid (M, r) = x . A^T, then y (M, N) (=, +=) x . W^T + second(mid) . B^T; W (N, K), A (r, K), B (N, r).
void TrainLoraForward(ThreadPool& pool, float* y, float* mid, const float* x, int64_t M, const Tensor& w,
                      const Tensor& a, const Tensor& b, const std::function<const float*(float*)>& second,
                      bool accumulate) {
  LATHE_CHECK(a.shape[1] == w.shape[1] && b.shape[0] == w.shape[0] && b.shape[1] == a.shape[0]);
  ConcatPairGemmChained(pool, y, M, w.shape[0], x, w.shape[1], w, a, StripsT, mid, a.shape[0], second, b, StripsT,
                        accumulate);
}

// dmid (M, r) = dy . B, then dx (M, K) (=, +=) dy . W + second(dmid) . A; W (N, K), B (N, r), A (r, K).
void TrainLoraBackwardInput(ThreadPool& pool, float* dx, float* dmid, const float* dy, int64_t M, const Tensor& w,
                            const Tensor& b, const Tensor& a, const std::function<const float*(float*)>& second,
                            bool accumulate) {
  LATHE_CHECK(a.shape[1] == w.shape[1] && b.shape[0] == w.shape[0] && b.shape[1] == a.shape[0]);
  ConcatPairGemmChained(pool, dx, M, w.shape[1], dy, w.shape[0], w, b, StripsRows, dmid, a.shape[0], second, a,
                        StripsRows, accumulate);
}

// y (M, N) (=, +=) x . W^T + x2 . W2^T, W (N, K), W2 (N, K2).
void TrainForwardPlus(ThreadPool& pool, float* y, const float* x, int64_t M, const Tensor& w, const float* x2,
                      const Tensor& w2, bool accumulate) {
  LATHE_CHECK(w2.shape[0] == w.shape[0]);
  ConcatPairGemm(pool, y, M, w.shape[0], x, w.shape[1], x2, w2.shape[1], w, w2, StripsT, accumulate);
}

// dx (M, K) (=, +=) dy . W + dy2 . W2, W (N, K), W2 (N2, K).
void TrainBackwardInputPlus(ThreadPool& pool, float* dx, const float* dy, int64_t M, const Tensor& w,
                            const float* dy2, const Tensor& w2, bool accumulate) {
  LATHE_CHECK(w2.shape[1] == w.shape[1]);
  ConcatPairGemm(pool, dx, M, w.shape[1], dy, w.shape[0], dy2, w2.shape[0], w, w2, StripsRows, accumulate);
}

// y (M, N) (=, +=) x . W^T, W (N, K) f32 or bf16 holding bf16 values.
void TrainForward(ThreadPool& pool, float* y, const float* x, int64_t M, const Tensor& w, bool accumulate) {
  const int64_t N = w.shape[0], K = w.shape[1], Kp = (K + 1) / 2;
  const uint32_t* a = PackRowsA(pool, x, K, M, K);
  uint32_t* b = BBuf((size_t)((N + 15) / 16 * 16 * Kp));
  StripsT(pool, w, b, 0);
  PairGemmA(pool, y, N, M, N, Kp, a, b, accumulate);
}

// dx (M, K) (=, +=) dy . W, W (N, K).
void TrainBackwardInput(ThreadPool& pool, float* dx, const float* dy, int64_t M, const Tensor& w, bool accumulate) {
  const int64_t N = w.shape[0], K = w.shape[1], Np = (N + 1) / 2;
  const uint32_t* a = PackRowsA(pool, dy, N, M, N);
  uint32_t* b = BBuf((size_t)((K + 15) / 16 * 16 * Np));
  StripsRows(pool, w, b, 0);
  PairGemmA(pool, dx, K, M, K, Np, a, b, accumulate);
}

float* CBuf(size_t n) {
  static thread_local std::vector<float> buf;
  return Scratch(buf, n);
}

// dw (N, K) += dy^T . x, dy (M, N), x (M, K). A narrow dw (LoRA's B: K = r) runs as dw^T (K, N) += x^T . dy:
// x^T's pairs are K short rows, dy goes into pair strips along M as it is (no transpose of the large operand)
// and the tile spans N instead of K. Per element the same chain over the same pairs (each pair's products
// a b = b a exactly, the chunks added in the same order onto the same start), so the same bits.
void TrainBackwardWeight(ThreadPool& pool, float* dw, const float* dy, const float* x, int64_t M, int64_t N,
                         int64_t K) {
  const int64_t Mp = (M + 1) / 2;
  if (K <= 16 * kS && N > 2 * K) {
    float* ct = CBuf((size_t)(K * N));
    TransposeF32(dw, N, K, K, ct, N);
    const uint32_t* a = PackColsA(pool, x, K, M, K);
    uint32_t* b = BBuf((size_t)((N + 15) / 16 * 16 * Mp));
    PairStripsRows<float>(pool, dy, N, M, N, b);
    PairGemmA(pool, ct, N, K, N, Mp, a, b, /*accumulate=*/true);
    TransposeF32(ct, K, N, N, dw, K);
    return;
  }
  const uint32_t* a = PackColsA(pool, dy, N, M, N);
  uint32_t* b = BBuf((size_t)((K + 15) / 16 * 16 * Mp));
  PairStripsRows<float>(pool, x, K, M, K, b);
  PairGemmA(pool, dw, K, N, K, Mp, a, b, /*accumulate=*/true);
}

// logitsT (V, n) = W . x^T for a bf16 head W (V, C), C even: W's rows are already row-major pairs (read in
// place, nothing packed), x (n, C) goes into n / 16 pair strips; per element the pair arithmetic over C.
void HeadLogitsT(ThreadPool& pool, float* logits_t, const Tensor& w, const float* x, int64_t n) {
  const int64_t V = w.shape[0], C = w.shape[1], Cp = C / 2;
  LATHE_CHECK(w.ndim() == 2 && C % 2 == 0);
  uint32_t* b = BBuf((size_t)((n + 15) / 16 * 16 * Cp));
  PairStripsT<float>(pool, x, C, n, C, b);
  if (w.dtype == DType::kBF16) {
    PairGemm(pool, logits_t, n, V, n, Cp, (const uint32_t*)w.data, b, /*accumulate=*/false);
    return;
  }
  // Another dtype: each task dequantizes its kMBlock rows of W (f32: reads them in place) and rounds them into
  // row pairs (a per-thread buffer), then runs PairGemm's block over every strip group: per element PairGemm's
  // chain on bf16(W).
  const int64_t n_groups = ((n + 15) / 16 + kS - 1) / kS;
  const bool amx_tiles = UsesAmxBf16(), fma = Bf16PairsOnFma();
  const bool f32 = w.dtype == DType::kF32;
  if (fma && !amx_tiles) {
    // The FMA tiles take A as floats holding bf16 values: each task's rows rounded straight into them (f32) or
    // dequantized there and rounded in place, with no pairs between (the bits RowToPairs + WidenPairs give).
    pool.ParallelFor((V + kMBlock - 1) / kMBlock, 1, [&](int64_t tb, int64_t te, int) {
      float* af = DequantBuf((size_t)(kMBlock * C));
      for (int64_t t = tb; t < te; ++t) {
        const int64_t m0 = t * kMBlock, m1 = std::min(V, m0 + kMBlock);
        if (!f32) kernels::DequantizeRows(w, m0, m1 - m0, af);
        kernels::RoundToBf16(af, f32 ? w.as<float>() + m0 * C : af, (m1 - m0) * C);
        const int64_t chunk = Bf16PairsChunk(Cp);
        for (int64_t p0 = 0; p0 < Cp; p0 += chunk)
          FmaChunkTiles(logits_t, n, m0, m1, 0, n_groups, n, Cp, p0, std::min(chunk, Cp - p0), af + 2 * p0, C, b,
                        p0 == 0);
      }
    }, 2.0 * V * n * C);
    return;
  }
  pool.ParallelFor((V + kMBlock - 1) / kMBlock, 1, [&](int64_t tb, int64_t te, int) {
    float* buf = f32 ? nullptr : DequantBuf((size_t)(kMBlock * C));
    static thread_local std::vector<uint32_t> abuf;
    uint32_t* a = Scratch(abuf, (size_t)(kMBlock * Cp));
    for (int64_t t = tb; t < te; ++t) {
      const int64_t m0 = t * kMBlock, m1 = std::min(V, m0 + kMBlock);
      const float* f = f32 ? w.as<float>() + m0 * C : buf;
      if (!f32) kernels::DequantizeRows(w, m0, m1 - m0, buf);
      for (int64_t i = 0; i < m1 - m0; ++i) RowToPairs(f + i * C, C, (uint16_t*)(a + i * Cp));
      if (amx_tiles) {
        amx::PairGemmBlock(logits_t, n, m0, m1, 0, (n + 15) / 16, n, Cp, a, Cp, b, Cp * 16, /*accumulate=*/false);
      } else {
        PairGemmBlock(logits_t, n, m0, m1, 0, n_groups, n, Cp, a, Cp, b, /*accumulate=*/false);
      }
    }
  }, 2.0 * V * n * C);
}

// dw (V, C) += dyT . x for dyT (V, n) (the loss's dlogits^T, rounded to bf16 as packed) and x (n, C): pairs
// along the n tokens.
bool HeadGradTiled(int64_t chunk_tokens) { return TiledA() && (chunk_tokens + 1) / 2 % 16 == 0; }

void HeadWeightGradPairs(ThreadPool& pool, const float* dy_t, const float* x, int64_t n, int64_t V, int64_t C,
                         uint32_t* a, int64_t offset, uint32_t* b, int64_t pairs, bool tiled) {
  if (tiled) {
    LATHE_CHECK(offset % 16 == 0);
    PairRowsTiled(pool, dy_t, n, V, n, a, TiledStride(pairs), offset / 16);
  } else {
    PairRows(pool, dy_t, n, V, n, a + offset, pairs);
  }
  PairStripsRows<float>(pool, x, C, n, C, b + 16 * offset, pairs * 16);
}

void HeadWeightGradFromPairs(ThreadPool& pool, float* dw, int64_t pairs, int64_t V, int64_t C, const uint32_t* a,
                             const uint32_t* b, bool tiled) {
  if (tiled) return amx::PairGemmTiled(pool, dw, C, V, C, pairs, a, 0, b, /*accumulate=*/true);
  PairGemm(pool, dw, C, V, C, pairs, a, b, /*accumulate=*/true);
}

int64_t HeadBackwardInputADwords(int64_t n, int64_t V) { return ColsADwords(V, n); }

void HeadBackwardInputT(ThreadPool& pool, float* dx, const float* dy_t, int64_t n, int64_t V, int64_t C,
                        const uint32_t* w_pairs, uint32_t* a_buf) {
  const int64_t vp = (V + 1) / 2;
  const uint32_t* a = PackColsA(pool, dy_t, n, V, n, a_buf);
  PairGemmA(pool, dx, C, n, C, vp, a, w_pairs, /*accumulate=*/false);
}

void HeadBackwardInputTRows(ThreadPool& pool, float* dx, const float* dy_t, int64_t n, const Tensor& w,
                            uint32_t* a_buf) {
  LATHE_CHECK(w.ndim() == 2);
  // On AMX tiles chunks of whole 16-pair steps: the chunks' accumulating calls then give one call's bits.
  const int64_t V = w.shape[0], C = w.shape[1], vp = (V + 1) / 2;
  const int64_t chunk = UsesAmxBf16() ? (Bf16PairsChunk(vp) + 15) / 16 * 16 : Bf16PairsChunk(vp);
  const uint32_t* a = PackColsA(pool, dy_t, n, V, n, a_buf);
  uint32_t* b = BBuf((size_t)((C + 15) / 16 * 16 * chunk));
  const uint16_t* wd = (const uint16_t*)w.data;
  // f32: the rows rounded as they are paired. Another dtype: the chunk's rows dequantized first (a buffer of the
  // calling thread's), then the same.
  static thread_local std::vector<float> fbuf;
  const bool as_stored = w.dtype == DType::kBF16 || w.dtype == DType::kF32;
  float* f = as_stored ? nullptr : Scratch(fbuf, (size_t)(2 * chunk * C));
  for (int64_t p0 = 0; p0 < vp; p0 += chunk) {  // Bf16PairsChunk(np) == np: one chain per call, as in one call
    const int64_t np = std::min(chunk, vp - p0), r0 = 2 * p0, rows = std::min(2 * np, V - r0);
    if (w.dtype == DType::kF32) {
      PairStripsRows<float>(pool, w.as<float>() + r0 * C, C, rows, C, b);
    } else if (f) {
      pool.ParallelFor(rows, 64, [&](int64_t rb, int64_t re, int) { kernels::DequantizeRows(w, r0 + rb, re - rb, f + rb * C); });
      PairStripsRows<float>(pool, f, C, rows, C, b);
    } else {
      PairStripsRows<uint16_t>(pool, wd + r0 * C, C, rows, C, b);
    }
    PairGemmA(pool, dx, C, n, C, np, PairsFrom(a, p0), b, /*accumulate=*/p0 > 0, TiledA() ? TiledStride(vp) : vp);
  }
}

void PackPairStrips(ThreadPool& pool, const Tensor& w, uint32_t* out) {
  LATHE_CHECK(w.ndim() == 2 && w.dtype == DType::kBF16);
  PairStripsT<uint16_t>(pool, (const uint16_t*)w.data, w.shape[1], w.shape[0], w.shape[1], out);
}

void PackPairsAlongRows(ThreadPool& pool, const Tensor& w, uint32_t* out) {
  LATHE_CHECK(w.ndim() == 2 && w.dtype == DType::kBF16);
  PairStripsRows<uint16_t>(pool, (const uint16_t*)w.data, w.shape[1], w.shape[0], w.shape[1], out);
}

namespace {

// Q8_0 / Q4_0 / Q4_1 rows straight to a bf16 pair strip (the st of StripOfRows): per 32-element block of
// the nj <= 16 rows, the 32 values DequantRow computes (d * q; fma(d, q, m) with m = -8 d for Q4_0), rounded
// by Bf16Of into the row's 16 pairs, the 16 rows transposed in registers: the bits of dequant_rows then
// StripOfRows without the f32 rows between them (stored and read back: half the dequantization's time
// at a prompt step's M). K: a multiple of 32.
template <DType T>
void StripOfBlockRows(const uint8_t* w, size_t rb, int nj, int64_t K, uint32_t* st) {
  constexpr bool kQ8 = T == DType::kQ8_0, kQ41 = T == DType::kQ4_1;
  constexpr size_t kBB = kQ8 ? sizeof(BlockQ8_0) : kQ41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  const int64_t nb = K / 32;
  for (int64_t j = 0; j < nb; ++j) {
    __m512 r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      if (i >= nj) {
        r[i] = _mm512_setzero_ps();
        continue;
      }
      const uint8_t* b = w + i * rb + j * kBB;
      const uint16_t* h = (const uint16_t*)b;
      const float df = _cvtsh_ss(h[0]);
      const __m512 d = _mm512_set1_ps(df);
      __m512 lo, hi;
      if constexpr (kQ8) {
        const __m256i q = _mm256_loadu_si256((const __m256i*)(b + 2));
        lo = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))));
        hi = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))));
      } else {
        const __m512 m = _mm512_set1_ps(kQ41 ? _cvtsh_ss(h[1]) : -8.0f * df);
        const __m128i q = _mm_loadu_si128((const __m128i*)(b + (kQ41 ? 4 : 2)));
        const __m128i mask = _mm_set1_epi8(0x0f);
        lo = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, mask))), m);
        hi = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), mask))), m);
      }
      r[i] = _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_zextsi256_si512(Bf16Of(lo)), Bf16Of(hi), 1));
    }
    Transpose16(r);
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) _mm512_storeu_ps((float*)(st + (16 * j + k) * 16), r[k]);
  }
}

// The fused form for the types that have one; false: dequant_rows + StripOfRows.
bool StripOfQuantRows(DType t, const uint8_t* w, size_t rb, int nj, int64_t K, uint32_t* st) {
  switch (t) {
    case DType::kQ8_0:
      StripOfBlockRows<DType::kQ8_0>(w, rb, nj, K, st);
      return true;
    case DType::kQ4_0:
      StripOfBlockRows<DType::kQ4_0>(w, rb, nj, K, st);
      return true;
    case DType::kQ4_1:
      StripOfBlockRows<DType::kQ4_1>(w, rb, nj, K, st);
      return true;
    default:
      return false;
  }
}

}  // namespace

namespace {

// A task's buffers for DequantStrips (the calling thread's): 16 x kDequantCols floats, ns strips of Kp pairs.
struct DequantScratch {
  float* rows;
  uint32_t* strips;
};
DequantScratch DequantBuffers(int64_t ns, int64_t Kp) {
  static thread_local std::vector<float> rows_buf;
  static thread_local std::vector<uint32_t> strips_buf;
  return {Scratch(rows_buf, (size_t)(16 * kDequantCols)), Scratch(strips_buf, (size_t)(ns * 16 * Kp))};
}

// W's strips s0 .. s0 + ns - 1 dequantized and rounded into bf16 pair strips at bs (Kp * 16 dwords apart).
void DequantStrips(const MatMulKernels& k, const Tensor& w, int64_t s0, int64_t ns, float* rows, uint32_t* bs) {
  const int64_t N = w.shape[0], K = w.shape[1], Kp = (K + 1) / 2;
  const size_t rb = w.row_bytes();
  const uint8_t* wd = (const uint8_t*)w.data;
  const DTypeInfo& qi = GetDTypeInfo(w.dtype);
  for (int64_t s = 0; s < ns; ++s) {
    const int nj = (int)std::min<int64_t>(16, N - 16 * (s0 + s));
    if (StripOfQuantRows(w.dtype, wd + 16 * (s0 + s) * rb, rb, nj, K, bs + s * Kp * 16)) continue;
    // kDequantCols columns of the 16 rows at a time (16 KiB of floats: they stay in L1 between
    // the dequantization and the packing; whole rows of K = 1536 were 96 KiB).
    for (int64_t c0 = 0; c0 < K; c0 += kDequantCols) {
      const int64_t L = std::min(kDequantCols, K - c0);
      k.dequant_rows(w.dtype, wd + 16 * (s0 + s) * rb + c0 / qi.block_size * qi.block_bytes, rb, nj, L, rows,
                     kDequantCols);
      StripOfRows(rows, kDequantCols, nj, L, bs + s * Kp * 16 + c0 / 2 * 16);
    }
  }
}

// Per task of g strips of W: dequantized into the thread's strips (DequantStrips), then run(s0, ns, strips).
template <typename Run>
void OverDequantStrips(const MatMulKernels& k, ThreadPool& pool, const Tensor& w, int64_t g, double work, Run run) {
  const int64_t Kp = (w.shape[1] + 1) / 2, n_strips = (w.shape[0] + 15) / 16;
  pool.ParallelFor((n_strips + g - 1) / g, 1, [&](int64_t tb, int64_t te, int) {
    const DequantScratch scratch = DequantBuffers(g, Kp);
    for (int64_t t = tb; t < te; ++t) {
      const int64_t s0 = t * g, ns = std::min<int64_t>(g, n_strips - s0);
      DequantStrips(k, w, s0, ns, scratch.rows, scratch.strips);
      run(s0, ns, (const uint32_t*)scratch.strips);
    }
  }, work);
}

// DequantMatMul on AMX tiles (UsesAmxBf16): x's pairs put in tile order once (every task reads all M rows), then
// per task kAmxStrips strips of W dequantized as above and all rows run over them (amx::PairGemmBlockTiled): per
// element AMX's arithmetic on the rounded W, for every M (a prompt row's result does not depend on its chunk).
constexpr int64_t kAmxStrips = 4;
void DequantMatMulAmx(const MatMulKernels& k, ThreadPool& pool, const uint32_t* a, int64_t M, const Tensor& w,
                      float* y) {
  const int64_t N = w.shape[0], K = w.shape[1], Kp = (K + 1) / 2;
  static thread_local std::vector<uint32_t> tiled_buf;
  const int64_t S = (Kp + 15) / 16, n_rp = (M + 31) / 32;
  uint32_t* at = Scratch(tiled_buf, (size_t)amx::TiledDwords(M, Kp));
  pool.ParallelFor(n_rp, 1, [&](int64_t b, int64_t e, int) {
    amx::TileRows(a + 32 * b * Kp, Kp, std::min(M, 32 * e) - 32 * b, Kp, at + b * S * 512);
  }, 2.0 * M * Kp);
  OverDequantStrips(k, pool, w, kAmxStrips, 2.0 * M * N * K, [&](int64_t s0, int64_t ns, const uint32_t* bs) {
    amx::PairGemmBlockTiled(y + 16 * s0, N, 0, M, 0, ns, N - 16 * s0, Kp, at, bs, Kp * 16, /*accumulate=*/false);
    amx::ReleaseTiles();
  });
}

}  // namespace

// MatMulKernels::bf16_dequant: y(M, N) = bf16(x) . bf16(W)^T for a block-quantized W (N, K). A task takes kS
// strips of W at a time: dequantized (k.dequant_rows, f32) into a per-thread buffer, rounded to bf16 pair
// strips (StripOfRows), and every row of x run over them; never the whole W. Per element the arithmetic of
// Bf16PairsReference on the rounded W, for every M: a row's result does not depend on its batch.
void DequantMatMul(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y) {
  const int64_t N = w.shape[0], K = w.shape[1], Kp = (K + 1) / 2;
  if (M <= 0 || N <= 0) return;
  const int64_t chunk = Bf16PairsChunk(Kp);
  LATHE_CHECK(kDequantCols % GetDTypeInfo(w.dtype).block_size == 0);
  uint32_t* a = ABuf((size_t)(M * Kp));
  PairRows(pool, x, K, M, K, a);
  if (UsesAmxBf16()) return DequantMatMulAmx(k, pool, a, M, w, y);
  const bool fma = Bf16PairsOnFma();
  float* af = nullptr;  // the FMA tiles' A: every task reads all M rows, so widened once
  if (fma) {
    af = WideBuf((size_t)(M * 2 * Kp));
    pool.ParallelFor(M, 16, [&](int64_t b, int64_t e, int) {
      WidenPairs(a + b * Kp, Kp, e - b, Kp, af + b * 2 * Kp, 2 * Kp);
    }, 2.0 * M * Kp);
  }
  OverDequantStrips(k, pool, w, kS, 2.0 * M * N * K, [&](int64_t s0, int64_t ns, const uint32_t* bs) {
    const int nc_last = (int)std::min<int64_t>(16, N - 16 * (s0 + ns - 1));
    const TileFn full = TileFor(kR, (int)ns);
    const TileFmaFn full_fma = TileFmaFor(kR, (int)ns);
    for (int64_t m0 = 0; m0 < M; m0 += kMBlock) {
      const int64_t m1 = std::min(M, m0 + kMBlock);
      for (int64_t p0 = 0; p0 < Kp; p0 += chunk) {
        const int64_t np = std::min(chunk, Kp - p0);
        for (int64_t i = m0; i < m1; i += kR) {
          const int r = (int)std::min<int64_t>(kR, m1 - i);
          if (fma) {
            (r == kR ? full_fma : TileFmaFor(r, (int)ns))(af + i * 2 * Kp + 2 * p0, 2 * Kp, bs + p0 * 16, Kp * 16, np,
                                                          y + i * N + 16 * s0, N, p0 == 0, nc_last);
          } else {
            (r == kR ? full : TileFor(r, (int)ns))(a + i * Kp + p0, Kp, bs + p0 * 16, Kp * 16, np,
                                                   y + i * N + 16 * s0, N, p0 == 0, nc_last);
          }
        }
      }
    }
  });
}

namespace {

// R A rows (a, lda dwords apart, Lp pairs) against NR full strips at once, strip r at bs[r] (anywhere in
// memory), row i's 16 results of strip r at c[r] + i * ldc: per (row, strip) and inner chunk the chain of
// TileT (acc from zero over the chunk's pairs, stored for the first chunk, added to C for the later
// ones), so the same bits.
// Each stream's line kRowAhead bytes on is fetched as its current one is read (the f32 strip GEMV's kStripAhead):
// the hardware prefetcher alone left the SmolLM2 bf16 decode's products at ~28 GB/s from DRAM on Zen 5 (2 threads),
// where the f32 ones, prefetching so, ran at 48-50. 1-thread decode, distances alternated three times: none 82-99,
// 256 74-92, 512 75-98, 1024 109-112, 2048 89-124, 4096 100-111 tok/s.
constexpr int kRowAhead = 1024;

template <int R, int NR>
void RowStrips(const uint32_t* a, int64_t lda, int64_t Lp, const uint32_t* const* bs, float* const* c, int64_t ldc) {
  const int64_t chunk = Bf16PairsChunk(Lp);
  for (int64_t p0 = 0; p0 < Lp; p0 += chunk) {
    const int64_t pe = std::min(Lp, p0 + chunk);
    __m512 acc[R][NR];
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_setzero_ps();
    for (int64_t p = p0; p < pe; ++p) {
      __m512bh bv[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        _mm_prefetch((const char*)(bs[r] + p * 16) + kRowAhead, _MM_HINT_T0);
        bv[r] = (__m512bh)_mm512_loadu_si512(bs[r] + p * 16);
      }
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[i * lda + p]);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], bv[r], av);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        float* ci = c[r] + i * ldc;
        _mm512_storeu_ps(ci, p0 == 0 ? acc[i][r] : _mm512_add_ps(_mm512_loadu_ps(ci), acc[i][r]));
      }
  }
}

// y(M, N) = A . B over pair strips for M <= kRowGemmMaxM A rows (decode, small decode batches), which read
// the weights once per product and so run at the memory's rate. The register tile walks kS adjacent strips
// side by side: kS streams of Lp * 64 bytes each, which the hardware prefetcher has to pick up again at
// every strip (~19 GB/s from DRAM on Zen 4 in the SmolLM2 decode, against ~24 for a row-major GEMV). Here a
// task's strips go in kRowRuns runs of consecutive strips, the j-th strip of every run together: kRowRuns
// long sequential streams. Per strip the arithmetic of the tile (RowStrips), so a row's results equal its
// results in any batch.
constexpr int kRowRuns = 4;
constexpr int64_t kRowGemmMaxM = 4;

template <int R>
void RowGemmR(ThreadPool& pool, float* y, int64_t N, int64_t Lp, const uint32_t* a, const uint32_t* b) {
  const int64_t full = N / 16;  // full strips
  const int64_t th = pool.size(), grain = std::max<int64_t>(kRowRuns, (full + 2 * th - 1) / (2 * th));
  pool.ParallelFor(full, grain, [&](int64_t sb, int64_t se, int) {
    const int64_t n = (se - sb) / kRowRuns;
    for (int64_t j = 0; j < n; ++j) {
      const uint32_t* bs[kRowRuns];
      float* cs[kRowRuns];
      for (int r = 0; r < kRowRuns; ++r) {
        const int64_t s = sb + r * n + j;
        bs[r] = b + s * Lp * 16;
        cs[r] = y + 16 * s;
      }
      RowStrips<R, kRowRuns>(a, Lp, Lp, bs, cs, N);
    }
    for (int64_t s = sb + kRowRuns * n; s < se; ++s) {
      const uint32_t* bs[1] = {b + s * Lp * 16};
      float* cs[1] = {y + 16 * s};
      RowStrips<R, 1>(a, Lp, Lp, bs, cs, N);
    }
  }, 2.0 * R * 16 * full * Lp * 2);
  // The partial last strip by the tile, with the strips of its tile group (recomputed: the same bits).
  if (full * 16 < N) PairGemmBlock(y, N, 0, R, full / kS, (full + kS) / kS, N, Lp, a, Lp, b, false);
}

void RowGemm(ThreadPool& pool, float* y, int64_t M, int64_t N, int64_t Lp, const uint32_t* a, const uint32_t* b) {
  switch (M) {
    case 1: return RowGemmR<1>(pool, y, N, Lp, a, b);
    case 2: return RowGemmR<2>(pool, y, N, Lp, a, b);
    case 3: return RowGemmR<3>(pool, y, N, Lp, a, b);
    default: return RowGemmR<4>(pool, y, N, Lp, a, b);
  }
}

}  // namespace

// MatMulKernels::bf16_strips: y(M, N) = bf16(x) . W^T from pair strips (strip s's pair p of row j at
// ((s * Kp + p) * 16 + j) dwords, Kp = (K + 1) / 2). Where UsesAmxBf16 every M (decode rows too, so a row's result
// does not depend on its batch) on AMX tiles: SmolLM2 BF16 pp512 on the Xeon 520 -> 1362 tok/s (1 thread), decode
// within the noise of RowGemm (memory-bound either way).
void StripsMatMul(ThreadPool& pool, const float* x, int64_t M, const uint32_t* strips, int64_t N, int64_t K,
                  float* y) {
  if (M <= 0 || N <= 0) return;
  const int64_t Kp = (K + 1) / 2;
  uint32_t* a = ABuf((size_t)(M * Kp));
  PairRows(pool, x, K, M, K, a);
  if (UsesAmxBf16()) return amx::PairGemm(pool, y, N, M, N, Kp, a, Kp, strips, /*accumulate=*/false);
  if (M <= kRowGemmMaxM) return RowGemm(pool, y, M, N, Kp, a, strips);
  PairGemm(pool, y, N, M, N, Kp, a, strips, /*accumulate=*/false, 0, /*amx=*/false);
}

}  // namespace lathe::kernels::cpu::avx512bf16
