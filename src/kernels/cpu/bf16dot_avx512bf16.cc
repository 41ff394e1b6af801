// Products of bf16 values on vdpbf16ps (avx512_bf16: Cooper Lake, Sapphire Rapids, Zen 4 and later), one
// 8 x 48 register tile for all of them. Per C element the pair arithmetic of Bf16PairsReference
// (dispatch.h): per inner chunk (Bf16PairsChunk pairs) one chain acc = (acc + a[2p+1] b[2p+1]) + a[2p] b[2p]
// (each product exact in f32, each add rounded: what vdpbf16ps does, measured bit-identical on Zen 4 and as
// Intel documents it), the chunks added in order (the first stored unless accumulating). Operands are
// converted once per call: A to row-major pairs (read in place by the tile), B to 16-column pair strips
// (or given as such: BF16 inference weights, packed at load).
// - Inference (MatMulKernels::bf16_strips of the AVX-512 table on CPUs with the instruction): y = bf16(x) .
//   W^T from BF16 weights in pair strips (kernels::StripWeight::bf16_pairs), every M (decode, batched
//   decode, prefill) and thread count through the same tile, so a row's result does not depend on what it
//   is batched with. Against the f32 path on bf16 weights (convert, then FMA): half the instructions per
//   product and no conversion of W.
// - Training in bf16 mode: y = x W^T, dx = dy W and dW += dy^T x for operands that already hold bf16
//   values (the trainer rounds activations, gradients and trainable weights; a bf16 checkpoint's frozen
//   weights are bf16 as stored, an f32 one is rounded as packed), and the loss's bf16 head. The f32
//   path's training GEMM sums the same exact products one at a time instead.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/avx512_transpose.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/scratch.h"

namespace lathe::kernels::cpu::avx512bf16 {

namespace {

constexpr int kS = 3;            // strips per register tile
constexpr int kR = 8;            // A rows per register tile
constexpr int64_t kMBlock = 64;  // A rows per task

template <int R, int S>
void Tile(const uint32_t* a, int64_t lda, const uint32_t* b, int64_t sstride, int64_t np, float* c, int64_t ldc,
          bool store, int nc_last) {
  __m512 acc[R][S];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) acc[r][s] = _mm512_setzero_ps();
  for (int64_t p = 0; p < np; ++p) {
    __m512bh bv[S];
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) bv[s] = (__m512bh)_mm512_loadu_si512(b + s * sstride + p * 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r * lda + p]);
#pragma GCC unroll 16
      for (int s = 0; s < S; ++s) acc[r][s] = _mm512_dpbf16_ps(acc[r][s], bv[s], av);
    }
  }
  const __mmask16 last = (__mmask16)(nc_last >= 16 ? 0xffff : (1u << nc_last) - 1);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) {
      const __mmask16 m = s == S - 1 ? last : (__mmask16)0xffff;
      __m512 v = acc[r][s];
      if (!store) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, cr + 16 * s), v);
      _mm512_mask_storeu_ps(cr + 16 * s, m, v);
    }
  }
}

using TileFn = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, int64_t, float*, int64_t, bool, int);

template <int R>
TileFn TileFor(int s) {
  switch (s) {
    case 1: return Tile<R, 1>;
    case 2: return Tile<R, 2>;
    default: return Tile<R, 3>;
  }
}

TileFn TileFor(int r, int s) {
  switch (r) {
    case 1: return TileFor<1>(s);
    case 2: return TileFor<2>(s);
    case 3: return TileFor<3>(s);
    case 4: return TileFor<4>(s);
    case 5: return TileFor<5>(s);
    case 6: return TileFor<6>(s);
    case 7: return TileFor<7>(s);
    default: return TileFor<8>(s);
  }
}

// 16 f32 (bf16 values) -> 16 bf16, exact.
inline __m256i Bf16Of(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

// One row of L floats -> L bf16 (cvtneps, the tail masked), plus a 0 after an odd L: the row as (L + 1) / 2
// pairs. Every f32 -> bf16 conversion of this file goes through Bf16Of.
void RowToPairs(const float* a, int64_t L, uint16_t* o) {
  int64_t l = 0;
  for (; l + 16 <= L; l += 16) _mm256_storeu_si256((__m256i*)(o + l), Bf16Of(_mm512_loadu_ps(a + l)));
  if (l < L) {
    const __mmask16 m = (__mmask16)((1u << (L - l)) - 1);
    _mm256_mask_storeu_epi16(o + l, m, Bf16Of(_mm512_maskz_loadu_ps(m, a + l)));
  }
  if (L & 1) o[L] = 0;
}

// A's rows l-contiguous (x, dy: a[i * lda + l]) -> out[i * Lp + p] = pair (2p, 2p + 1) of row i.
void PairRows(ThreadPool& pool, const float* a, int64_t lda, int64_t R, int64_t L, uint32_t* out) {
  const int64_t Lp = (L + 1) / 2;
  pool.ParallelFor(R, 16, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) RowToPairs(a + i * lda, L, (uint16_t*)(out + i * Lp));
  }, 2.0 * R * L);
}

// Pairs of two rows (f32 holding bf16 values, or bf16): out[k] = (r0[k], r1[k]) for k < n; r1 null (the
// missing row of an odd count) gives 0.
template <typename T>
void PairTwoRows(const T* r0, const T* r1, int64_t n, uint32_t* out) {
  for (int64_t k = 0; k < n; k += 16) {
    const __mmask16 m = (__mmask16)(n - k >= 16 ? 0xffff : (1u << (n - k)) - 1);
    __m256i lo, hi = _mm256_setzero_si256();
    if constexpr (sizeof(T) == 4) {
      lo = Bf16Of(_mm512_maskz_loadu_ps(m, (const float*)r0 + k));
      if (r1) hi = Bf16Of(_mm512_maskz_loadu_ps(m, (const float*)r1 + k));
    } else {
      lo = _mm256_maskz_loadu_epi16(m, r0 + k);
      if (r1) hi = _mm256_maskz_loadu_epi16(m, r1 + k);
    }
    const __m512i d = _mm512_or_si512(_mm512_cvtepu16_epi32(lo), _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
    _mm512_mask_storeu_epi32(out + k, m, d);
  }
}

// A = M^T for a row-major M (L rows of R: dy in the weight gradient) -> out[i * Lp + p] = (M[2p][i],
// M[2p + 1][i]): pairs of two rows of M, then the (Lp x R) dword block transposed.
void PairRowsT(ThreadPool& pool, const float* m, int64_t ldm, int64_t L, int64_t R, uint32_t* out) {
  const int64_t Lp = (L + 1) / 2;
  constexpr int64_t kB = 16;
  pool.ParallelFor((Lp + kB - 1) / kB, 1, [&](int64_t b, int64_t e, int) {
    alignas(64) uint32_t tmp[kB * 16];
    for (int64_t pb = b; pb < e; ++pb) {
      const int64_t p0 = pb * kB, np = std::min(kB, Lp - p0);
      for (int64_t i0 = 0; i0 < R; i0 += 16) {
        const int64_t ni = std::min<int64_t>(16, R - i0);
        for (int64_t p = 0; p < np; ++p) {
          const int64_t l = 2 * (p0 + p);
          const float* r1 = l + 1 < L ? m + (l + 1) * ldm + i0 : nullptr;
          PairTwoRows<float>(m + l * ldm + i0, r1, ni, tmp + p * 16);
        }
        for (int64_t i = 0; i < ni; ++i)
          for (int64_t p = 0; p < np; ++p) out[(i0 + i) * Lp + p0 + p] = tmp[p * 16 + i];
      }
    }
  }, 2.0 * L * R);
}

// B(l, k) = m[l * ldm + k] (row-major, L x Kd) -> pair strips: strip s's pair p at out + (s * Lp + p) * 16,
// columns past Kd zero.
template <typename T>
void PairStripsRows(ThreadPool& pool, const T* m, int64_t ldm, int64_t L, int64_t Kd, uint32_t* out) {
  const int64_t Lp = (L + 1) / 2, n_strips = (Kd + 15) / 16;
  pool.ParallelFor(Lp, 8, [&](int64_t b, int64_t e, int) {
    std::vector<uint32_t> row((size_t)n_strips * 16, 0);
    for (int64_t p = b; p < e; ++p) {
      const T* r1 = 2 * p + 1 < L ? m + (2 * p + 1) * ldm : nullptr;
      PairTwoRows<T>(m + 2 * p * ldm, r1, Kd, row.data());
      for (int64_t s = 0; s < n_strips; ++s)
        std::memcpy(out + (s * Lp + p) * 16, row.data() + 16 * s, sizeof(uint32_t) * 16);
    }
  }, 2.0 * L * Kd);
}

// B(l, k) = W(k, l) for W (Kd, L) row-major (the forward's W^T) -> pair strips as above.
template <typename T>
void PairStripsT(ThreadPool& pool, const T* w, int64_t ldw, int64_t Kd, int64_t L, uint32_t* out) {
  const int64_t Lp = (L + 1) / 2, n_strips = (Kd + 15) / 16;
  pool.ParallelFor(n_strips, 1, [&](int64_t b, int64_t e, int) {
    std::vector<uint32_t> rows(16 * (size_t)Lp);
    for (int64_t s = b; s < e; ++s) {
      const int nj = (int)std::min<int64_t>(16, Kd - 16 * s);
      // Each W row's pairs (PairRows' form), then the 16 x Lp block transposed into the strip.
      for (int j = 0; j < 16; ++j) {
        uint32_t* o = rows.data() + j * Lp;
        if (j >= nj) {
          std::memset(o, 0, sizeof(uint32_t) * Lp);
          continue;
        }
        const T* r = w + (16 * s + j) * ldw;
        uint16_t* o16 = (uint16_t*)o;
        if constexpr (sizeof(T) == 4) {
          RowToPairs((const float*)r, L, o16);
        } else {
          std::memcpy(o16, r, sizeof(uint16_t) * L);
          if (L & 1) o16[L] = 0;
        }
      }
      uint32_t* st = out + s * Lp * 16;
      for (int64_t p = 0; p < Lp; ++p)
        for (int j = 0; j < 16; ++j) st[p * 16 + j] = rows[j * Lp + p];
    }
  }, 2.0 * Kd * L);
}

// One pair strip (Lp x 16 dwords, Lp = (L + 1) / 2) from 16 f32 rows of L values, ld apart (rows from nj
// on zero): per 16 pairs, each row's 32 values rounded to bf16 (Bf16Of; zero past L), then the 16 x 16
// dword block transposed in registers. The layout of PairStripsT's strips.
void StripOfRows(const float* rows, int64_t ld, int nj, int64_t L, uint32_t* st) {
  const int64_t Lp = (L + 1) / 2;
  for (int64_t p = 0; p < Lp; p += 16) {
    const int64_t l = 2 * p, n = std::min<int64_t>(32, L - l);
    const __mmask16 m0 = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
    const __mmask16 m1 = (__mmask16)(n >= 32 ? 0xffff : n <= 16 ? 0 : (1u << (n - 16)) - 1);
    __m512 r[16];  // dwords (bf16 pairs) moved as floats: the transpose only shuffles lanes
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      if (j < nj) {
        const float* row = rows + j * ld + l;
        const __m256i lo = Bf16Of(_mm512_maskz_loadu_ps(m0, row));
        const __m256i hi = Bf16Of(_mm512_maskz_loadu_ps(m1, row + 16));
        r[j] = _mm512_castsi512_ps(_mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1));
      } else {
        r[j] = _mm512_setzero_ps();
      }
    }
    Transpose16(r);
    const int64_t np = std::min<int64_t>(16, Lp - p);
    for (int64_t k = 0; k < np; ++k) _mm512_storeu_ps((float*)(st + (p + k) * 16), r[k]);
  }
}

// C(R, Kd) (=, or += with accumulate) A . B from A as row-major pairs (R x Lp) and B as pair strips.
void PairGemm(ThreadPool& pool, float* c, int64_t ldc, int64_t R, int64_t Kd, int64_t Lp, const uint32_t* a,
              const uint32_t* b, bool accumulate) {
  const int64_t n_strips = (Kd + 15) / 16, chunk = Bf16PairsChunk(Lp);
  const int64_t n_groups = (n_strips + kS - 1) / kS, n_mb = (R + kMBlock - 1) / kMBlock;
  const int64_t th = pool.size();
  const int64_t want = th > 1 ? 4 * th : 1;
  const int64_t per = std::max<int64_t>(1, n_groups / std::max<int64_t>(1, want / n_mb));
  const int64_t n_gr = (n_groups + per - 1) / per;
  pool.ParallelFor(n_mb * n_gr, 1, [&](int64_t tb, int64_t te, int) {
    for (int64_t t = tb; t < te; ++t) {
      const int64_t mb = t / n_gr, gr = t % n_gr;
      const int64_t m0 = mb * kMBlock, m1 = std::min(R, m0 + kMBlock);
      const int64_t g0 = gr * per, g1 = std::min(n_groups, g0 + per);
      for (int64_t p0 = 0; p0 < Lp; p0 += chunk) {
        const int64_t np = std::min(chunk, Lp - p0);
        for (int64_t g = g0; g < g1; ++g) {
          const int64_t s0 = g * kS, ns = std::min<int64_t>(kS, n_strips - s0);
          const int nc_last = (int)std::min<int64_t>(16, Kd - 16 * (s0 + ns - 1));
          const uint32_t* bs = b + (s0 * Lp + p0) * 16;
          for (int64_t i = m0; i < m1; i += kR) {
            const int r = (int)std::min<int64_t>(kR, m1 - i);
            TileFor(r, (int)ns)(a + i * Lp + p0, Lp, bs, Lp * 16, np, c + i * ldc + 16 * s0, ldc,
                                p0 == 0 && !accumulate, nc_last);
          }
        }
      }
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

}  // namespace

// y (M, N) (=, +=) x . W^T, W (N, K) f32 or bf16 holding bf16 values.
void TrainForward(ThreadPool& pool, float* y, const float* x, int64_t M, const Tensor& w, bool accumulate) {
  const int64_t N = w.shape[0], K = w.shape[1], Kp = (K + 1) / 2;
  uint32_t* a = ABuf((size_t)(M * Kp));
  uint32_t* b = BBuf((size_t)((N + 15) / 16 * 16 * Kp));
  PairRows(pool, x, K, M, K, a);
  if (w.dtype == DType::kBF16) {
    PairStripsT<uint16_t>(pool, (const uint16_t*)w.data, K, N, K, b);
  } else {
    LATHE_CHECK(w.dtype == DType::kF32);
    PairStripsT<float>(pool, (const float*)w.data, K, N, K, b);
  }
  PairGemm(pool, y, N, M, N, Kp, a, b, accumulate);
}

// dx (M, K) (=, +=) dy . W, W (N, K).
void TrainBackwardInput(ThreadPool& pool, float* dx, const float* dy, int64_t M, const Tensor& w, bool accumulate) {
  const int64_t N = w.shape[0], K = w.shape[1], Np = (N + 1) / 2;
  uint32_t* a = ABuf((size_t)(M * Np));
  uint32_t* b = BBuf((size_t)((K + 15) / 16 * 16 * Np));
  PairRows(pool, dy, N, M, N, a);
  if (w.dtype == DType::kBF16) {
    PairStripsRows<uint16_t>(pool, (const uint16_t*)w.data, K, N, K, b);
  } else {
    LATHE_CHECK(w.dtype == DType::kF32);
    PairStripsRows<float>(pool, (const float*)w.data, K, N, K, b);
  }
  PairGemm(pool, dx, K, M, K, Np, a, b, accumulate);
}

// dw (N, K) += dy^T . x, dy (M, N), x (M, K).
void TrainBackwardWeight(ThreadPool& pool, float* dw, const float* dy, const float* x, int64_t M, int64_t N,
                         int64_t K) {
  const int64_t Mp = (M + 1) / 2;
  uint32_t* a = ABuf((size_t)(N * Mp));
  uint32_t* b = BBuf((size_t)((K + 15) / 16 * 16 * Mp));
  PairRowsT(pool, dy, N, M, N, a);
  PairStripsRows<float>(pool, x, K, M, K, b);
  PairGemm(pool, dw, K, N, K, Mp, a, b, /*accumulate=*/true);
}

// logitsT (V, n) = W . x^T for a bf16 head W (V, C), C even: W's rows are already row-major pairs (read in
// place, nothing packed), x (n, C) goes into n / 16 pair strips; per element the pair arithmetic over C.
void HeadLogitsT(ThreadPool& pool, float* logits_t, const Tensor& w, const float* x, int64_t n) {
  const int64_t V = w.shape[0], C = w.shape[1], Cp = C / 2;
  LATHE_CHECK(w.dtype == DType::kBF16 && C % 2 == 0);
  uint32_t* b = BBuf((size_t)((n + 15) / 16 * 16 * Cp));
  PairStripsT<float>(pool, x, C, n, C, b);
  PairGemm(pool, logits_t, n, V, n, Cp, (const uint32_t*)w.data, b, /*accumulate=*/false);
}

// dw (V, C) += dyT . x for dyT (V, n) (the loss's dlogits^T, rounded to bf16 as packed) and x (n, C): pairs
// along the n tokens.
void HeadBackwardWeightT(ThreadPool& pool, float* dw, const float* dy_t, const float* x, int64_t n, int64_t V,
                         int64_t C) {
  const int64_t np = (n + 1) / 2;
  uint32_t* a = ABuf((size_t)(V * np));
  uint32_t* b = BBuf((size_t)((C + 15) / 16 * 16 * np));
  HeadWeightGradPairs(pool, dy_t, x, n, V, C, a, b);
  HeadWeightGradFromPairs(pool, dw, n, V, C, a, b);
}

void HeadWeightGradPairs(ThreadPool& pool, const float* dy_t, const float* x, int64_t n, int64_t V, int64_t C,
                         uint32_t* a, uint32_t* b) {
  PairRows(pool, dy_t, n, V, n, a);
  PairStripsRows<float>(pool, x, C, n, C, b);
}

void HeadWeightGradFromPairs(ThreadPool& pool, float* dw, int64_t n, int64_t V, int64_t C, const uint32_t* a,
                             const uint32_t* b) {
  PairGemm(pool, dw, C, V, C, (n + 1) / 2, a, b, /*accumulate=*/true);
}

void HeadBackwardInputT(ThreadPool& pool, float* dx, const float* dy_t, int64_t n, int64_t V, int64_t C,
                        const uint32_t* w_pairs) {
  const int64_t vp = (V + 1) / 2;
  uint32_t* a = ABuf((size_t)(n * vp));
  PairRowsT(pool, dy_t, n, V, n, a);
  PairGemm(pool, dx, C, n, C, vp, a, w_pairs, /*accumulate=*/false);
}

void PackPairStrips(ThreadPool& pool, const Tensor& w, uint32_t* out) {
  LATHE_CHECK(w.ndim() == 2 && w.dtype == DType::kBF16);
  PairStripsT<uint16_t>(pool, (const uint16_t*)w.data, w.shape[1], w.shape[0], w.shape[1], out);
}

void PackPairsAlongRows(ThreadPool& pool, const Tensor& w, uint32_t* out) {
  LATHE_CHECK(w.ndim() == 2 && w.dtype == DType::kBF16);
  PairStripsRows<uint16_t>(pool, (const uint16_t*)w.data, w.shape[1], w.shape[0], w.shape[1], out);
}

// MatMulKernels::bf16_dequant: y(M, N) = bf16(x) . bf16(W)^T for a block-quantized W (N, K). A task takes kS
// strips of W at a time: dequantized (k.dequant_rows, f32) into a per-thread buffer, rounded to bf16 pair
// strips (StripOfRows), and every row of x run over them; never the whole W. Per element the arithmetic of
// Bf16PairsReference on the rounded W, for every M: a row's result does not depend on its batch.
void DequantMatMul(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y) {
  const int64_t N = w.shape[0], K = w.shape[1], Kp = (K + 1) / 2, n_strips = (N + 15) / 16;
  if (M <= 0 || N <= 0) return;
  const int64_t chunk = Bf16PairsChunk(Kp), n_groups = (n_strips + kS - 1) / kS;
  const size_t rb = w.row_bytes();
  const uint8_t* wd = (const uint8_t*)w.data;
  uint32_t* a = ABuf((size_t)(M * Kp));
  PairRows(pool, x, K, M, K, a);
  pool.ParallelFor(n_groups, 1, [&](int64_t gb, int64_t ge, int) {
    static thread_local std::vector<float> rows_buf;
    static thread_local std::vector<uint32_t> strips_buf;
    float* rows = Scratch(rows_buf, (size_t)(16 * K));
    uint32_t* bs = Scratch(strips_buf, (size_t)(kS * 16 * Kp));
    for (int64_t g = gb; g < ge; ++g) {
      const int64_t s0 = g * kS, ns = std::min<int64_t>(kS, n_strips - s0);
      for (int64_t s = 0; s < ns; ++s) {
        const int nj = (int)std::min<int64_t>(16, N - 16 * (s0 + s));
        k.dequant_rows(w.dtype, wd + 16 * (s0 + s) * rb, rb, nj, K, rows, K);
        StripOfRows(rows, K, nj, K, bs + s * Kp * 16);
      }
      const int nc_last = (int)std::min<int64_t>(16, N - 16 * (s0 + ns - 1));
      const TileFn full = TileFor(kR, (int)ns);
      for (int64_t m0 = 0; m0 < M; m0 += kMBlock) {
        const int64_t m1 = std::min(M, m0 + kMBlock);
        for (int64_t p0 = 0; p0 < Kp; p0 += chunk) {
          const int64_t np = std::min(chunk, Kp - p0);
          for (int64_t i = m0; i < m1; i += kR) {
            const int r = (int)std::min<int64_t>(kR, m1 - i);
            (r == kR ? full : TileFor(r, (int)ns))(a + i * Kp + p0, Kp, bs + p0 * 16, Kp * 16, np,
                                                   y + i * N + 16 * s0, N, p0 == 0, nc_last);
          }
        }
      }
    }
  }, 2.0 * M * N * K);
}

// MatMulKernels::bf16_strips: y(M, N) = bf16(x) . W^T from pair strips (strip s's pair p of row j at
// ((s * Kp + p) * 16 + j) dwords, Kp = (K + 1) / 2).
void StripsMatMul(ThreadPool& pool, const float* x, int64_t M, const uint32_t* strips, int64_t N, int64_t K,
                  float* y) {
  if (M <= 0 || N <= 0) return;
  const int64_t Kp = (K + 1) / 2;
  uint32_t* a = ABuf((size_t)(M * Kp));
  PairRows(pool, x, K, M, K, a);
  PairGemm(pool, y, N, M, N, Kp, a, strips, /*accumulate=*/false);
}

}  // namespace lathe::kernels::cpu::avx512bf16
