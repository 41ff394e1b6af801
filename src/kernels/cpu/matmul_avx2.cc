// AVX2 + FMA + F16C matmul kernels: int8 GEMV for Q8_0/Q4_0/Q4_1 (x quantized to int8 blocks,
// maddubs/madd dot products), f32/f16/bf16 GEMV, row dequantization and the f32 FMA prefill panel.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/quant_rows.h"
#include "kernels/cpu/scratch.h"

namespace lathe::kernels::cpu::avx2 {

namespace {

// ---- activations -> int8 blocks ----------------------------------------------------------------

void QuantizeX(const float* x, int64_t K, BlockQ8X* out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t j = 0; j < K / 32; ++j) {
    const float* p = x + j * 32;
    __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8);
    __m256 v2 = _mm256_loadu_ps(p + 16), v3 = _mm256_loadu_ps(p + 24);
    __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_and_ps(v1, abs_mask)),
                              _mm256_max_ps(_mm256_and_ps(v2, abs_mask), _mm256_and_ps(v3, abs_mask)));
    const float amax = HmaxPs(mx);
    const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
    const __m256 mul = _mm256_set1_ps(id);
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, mul), kRound));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, mul), kRound));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, mul), kRound));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, mul), kRound));
    const int sum = HsumEpi32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
    // packs interleave 128-bit lanes; the permute restores element order.
    __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    q = _mm256_permutevar8x32_epi32(q, perm);
    _mm256_storeu_si256((__m256i*)out[j].qs, q);
    out[j].d = d;
    out[j].s = d * (float)sum;
  }
}

// ---- int8 GEMV for block types ------------------------------------------------------------------

// Sum of 32 u8 x s8 products as 8 int32 lanes converted to float. REQUIRES |products| such that
// adjacent pairs fit int16 (true for |u| <= 128, |s| <= 127).
inline __m256 DotU8S8(__m256i u, __m256i s) {
  const __m256i p16 = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

// Two blocks per step with separate accumulators: one FMA chain per block would cap the loop at
// the FMA latency instead of the memory bandwidth.
template <int M>
void GemvQ8_0(const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t nb, float* y,
              int64_t ldy) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const BlockQ8_0* wb = (const BlockQ8_0*)(w + r * rb);
    __m256 acc0[M], acc1[M];
    for (int i = 0; i < M; ++i) acc0[i] = acc1[i] = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 2 <= nb; j += 2) {
      const __m256i q0 = _mm256_loadu_si256((const __m256i*)wb[j].qs);
      const __m256i q1 = _mm256_loadu_si256((const __m256i*)wb[j + 1].qs);
      const __m256i a0 = _mm256_sign_epi8(q0, q0), a1 = _mm256_sign_epi8(q1, q1);
      const float d0 = _cvtsh_ss(wb[j].d), d1 = _cvtsh_ss(wb[j + 1].d);
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) {
        const BlockQ8X* xb = x + i * nb + j;
        const __m256i s0 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)xb[0].qs), q0);
        const __m256i s1 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)xb[1].qs), q1);
        acc0[i] = _mm256_fmadd_ps(DotU8S8(a0, s0), _mm256_set1_ps(d0 * xb[0].d), acc0[i]);
        acc1[i] = _mm256_fmadd_ps(DotU8S8(a1, s1), _mm256_set1_ps(d1 * xb[1].d), acc1[i]);
      }
    }
    for (; j < nb; ++j) {
      const __m256i q0 = _mm256_loadu_si256((const __m256i*)wb[j].qs);
      const __m256i a0 = _mm256_sign_epi8(q0, q0);
      const float d0 = _cvtsh_ss(wb[j].d);
      for (int i = 0; i < M; ++i) {
        const BlockQ8X* xb = x + i * nb + j;
        const __m256i s0 = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)xb[0].qs), q0);
        acc0[i] = _mm256_fmadd_ps(DotU8S8(a0, s0), _mm256_set1_ps(d0 * xb[0].d), acc0[i]);
      }
    }
    for (int i = 0; i < M; ++i) y[i * ldy + r] = HsumPs(_mm256_add_ps(acc0[i], acc1[i]));
  }
}

// Q4_0: d*(q - 8) . dx*qx = d*dx*(q . qx) - 8*d*(dx*sum qx). Q4_1: (d*q + m) . dx*qx
// = d*dx*(q . qx) + m*(dx*sum qx). Both keep the nibbles unsigned for maddubs and fold the offset
// or min into a per-block scalar term (kept in two chains, like the vector accumulators).
template <int M, bool kQ41>
void GemvQ4(const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t nb, float* y,
            int64_t ldy) {
  constexpr size_t kBB = kQ41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  constexpr size_t kQsOff = kQ41 ? 4 : 2;
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = w + r * rb;
    __m256 acc0[M], acc1[M];
    float c0[M], c1[M];
    for (int i = 0; i < M; ++i) {
      acc0[i] = acc1[i] = _mm256_setzero_ps();
      c0[i] = c1[i] = 0;
    }
    auto scales = [&](const uint8_t* b, float* d, float* c) {
      const uint16_t* h = (const uint16_t*)b;
      *d = _cvtsh_ss(h[0]);
      *c = kQ41 ? _cvtsh_ss(h[1]) : *d;  // Q4_0's -8 is applied once per row
    };
    int64_t j = 0;
    for (; j + 2 <= nb; j += 2) {
      const uint8_t* b0 = row + j * kBB;
      const uint8_t* b1 = b0 + kBB;
      const __m256i v0 = UnpackNibbles(b0 + kQsOff), v1 = UnpackNibbles(b1 + kQsOff);
      float d0, d1, m0, m1;
      scales(b0, &d0, &m0);
      scales(b1, &d1, &m1);
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) {
        const BlockQ8X* xb = x + i * nb + j;
        const __m256 p0 = DotU8S8(v0, _mm256_loadu_si256((const __m256i*)xb[0].qs));
        const __m256 p1 = DotU8S8(v1, _mm256_loadu_si256((const __m256i*)xb[1].qs));
        acc0[i] = _mm256_fmadd_ps(p0, _mm256_set1_ps(d0 * xb[0].d), acc0[i]);
        acc1[i] = _mm256_fmadd_ps(p1, _mm256_set1_ps(d1 * xb[1].d), acc1[i]);
        c0[i] += m0 * xb[0].s;
        c1[i] += m1 * xb[1].s;
      }
    }
    for (; j < nb; ++j) {
      const uint8_t* b0 = row + j * kBB;
      const __m256i v0 = UnpackNibbles(b0 + kQsOff);
      float d0, m0;
      scales(b0, &d0, &m0);
      for (int i = 0; i < M; ++i) {
        const BlockQ8X* xb = x + i * nb + j;
        const __m256 p0 = DotU8S8(v0, _mm256_loadu_si256((const __m256i*)xb[0].qs));
        acc0[i] = _mm256_fmadd_ps(p0, _mm256_set1_ps(d0 * xb[0].d), acc0[i]);
        c0[i] += m0 * xb[0].s;
      }
    }
    for (int i = 0; i < M; ++i)
      y[i * ldy + r] = HsumPs(_mm256_add_ps(acc0[i], acc1[i])) + (kQ41 ? 1.0f : -8.0f) * (c0[i] + c1[i]);
  }
}

// ---- f32 / f16 / bf16 -----------------------------------------------------------------------------

template <DType T>
inline __m256 Load8(const uint8_t* row, int64_t k) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps((const float*)row + k);
  } else if constexpr (T == DType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)row + k)));
  } else {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)((const uint16_t*)row + k)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
}

template <DType T>
inline float LoadScalar(const uint8_t* row, int64_t k) {
  if constexpr (T == DType::kF32) {
    return ((const float*)row)[k];
  } else if constexpr (T == DType::kF16) {
    return _cvtsh_ss(((const uint16_t*)row)[k]);
  } else {
    return BF16ToF32(((const uint16_t*)row)[k]);
  }
}

// Eight weights of a row from k, the lanes from n on zero (the masked K tail: as the panel's
// masked loads of its dequantized rows read them).
template <DType T>
inline __m256 Load8Tail(const uint8_t* row, int64_t k, int64_t n) {
  if constexpr (T == DType::kF32) {
    return _mm256_maskload_ps((const float*)row + k, TailMask(n));
  } else {
    alignas(16) uint16_t h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(h, (const uint16_t*)row + k, sizeof(uint16_t) * (size_t)n);
    return Load8<T>((const uint8_t*)h, 0);
  }
}

// {HsumPs(v[0]), .., HsumPs(v[3])} bit for bit: the same pairs of lanes added in the same order ((k, k +
// 4), then (0, 2) and (1, 3), then (0, 1)), the last two levels for the four vectors at once (17
// operations instead of 4 x 6). 128-bit shuffles only (cross-lane 256-bit ones are slow on Zen 1).
__attribute__((always_inline)) inline __m128 Hsum4Ps(const __m256 (&v)[4]) {
  __m128 t[4];
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) t[p] = _mm_add_ps(_mm256_castps256_ps128(v[p]), _mm256_extractf128_ps(v[p], 1));
  const __m128 q0 = _mm_add_ps(_mm_shuffle_ps(t[0], t[1], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m128 q1 = _mm_add_ps(_mm_shuffle_ps(t[2], t[3], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm_shuffle_ps(t[2], t[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm_add_ps(_mm_shuffle_ps(q0, q1, _MM_SHUFFLE(2, 0, 2, 0)), _mm_shuffle_ps(q0, q1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// MR x rows times NR weight rows (dtype T, w_stride bytes apart; outputs y[i * ldy + j * y_step]),
// dot-product form: one 8-lane accumulator per output over k in steps of 8 from k0 (continuing
// `acc`), the K tail as one masked step, HsumPs. The prefill panel (f32 rows, from k0 = 0) and the
// float GEMV both run it, so a row's result does not depend on M or on which of them computes it
// (batch invariance of float models' decode rows). At 4 x 3 for the panel: 12 accumulators + 3
// weight vectors + 1 x vector = all 16 ymm registers; 7 loads per 12 FMAs.
template <DType T, int MR, int NR>
__attribute__((always_inline)) inline void DotTile(__m256 (&acc)[MR][NR], int64_t k, const float* x, int64_t ldx,
                                                   const uint8_t* w, size_t w_stride, int64_t K, float* y, int64_t ldy,
                                                   int64_t y_step) {
  for (; k + 8 <= K; k += 8) {
    __m256 wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) wv[j] = Load8<T>(w + j * w_stride, k);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < K) {
    const __m256i mask = TailMask(K - k);
    __m256 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = Load8Tail<T>(w + j * w_stride, k, K - k);
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_maskload_ps(x + i * ldx + k, mask);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  constexpr int kN = MR * NR;
  if constexpr (kN < 4) {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) y[i * ldy + j * y_step] = HsumPs(acc[i][j]);
  } else {
    // Accumulators in groups of 4 (the last padded with zeros) through Hsum4Ps; the same sums.
#pragma GCC unroll 4
    for (int g = 0; g < (kN + 3) / 4; ++g) {
      __m256 v[4];
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) v[u] = g * 4 + u < kN ? acc[(g * 4 + u) / NR][(g * 4 + u) % NR] : _mm256_setzero_ps();
      alignas(16) float s4[4];
      _mm_store_ps(s4, Hsum4Ps(v));
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u)
        if (g * 4 + u < kN) y[(g * 4 + u) / NR * ldy + (g * 4 + u) % NR * y_step] = s4[u];
    }
  }
}

// Float weights, R weight rows (`step` rows apart, outputs y + j * step) x M x rows per pass with
// DotTile's arithmetic; R * M chains hide the FMA latency.
// kSplit (CPUs that run 256-bit operations as two halves) with BF16: the full 8-steps keep each
// 8-lane accumulator as two 128-bit ones, one for the even and one for the odd elements of every 8
// (a shift and an and widen 4 bf16 each, where a zero-extend and a shift of 256 bits cost 4 ops on
// such CPUs), against x permuted the same way (xp, once per call). Lane by lane they add the same
// products in the same order as the 8-lane accumulator, and one unpack puts the lanes back in its
// order before DotTile's tail and sum: the same bits.
template <DType T, int M, int R, bool kSplit>
void GemvFRows(const uint8_t* w, size_t rb, int64_t step, const float* x, const float* xp, int64_t K, float* y,
               int64_t ldy) {
  rb *= (size_t)step;
  __m256 acc[M][R];
  int64_t k = 0;
  if constexpr (kSplit && T == DType::kBF16) {
    __m128 ev[M][R], od[M][R];
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < R; ++j) ev[i][j] = od[i][j] = _mm_setzero_ps();
    const __m128i hi16 = _mm_set1_epi32((int)0xffff0000u);
    for (; k + 8 <= K; k += 8) {
      __m128 we[R], wo[R];
#pragma GCC unroll 4
      for (int j = 0; j < R; ++j) {
        const __m128i v = _mm_loadu_si128((const __m128i*)((const uint16_t*)(w + j * rb) + k));
        we[j] = _mm_castsi128_ps(_mm_slli_epi32(v, 16));
        wo[j] = _mm_castsi128_ps(_mm_and_si128(v, hi16));
      }
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) {
        const __m128 xe = _mm_loadu_ps(xp + i * K + k), xo = _mm_loadu_ps(xp + i * K + k + 4);
#pragma GCC unroll 4
        for (int j = 0; j < R; ++j) {
          ev[i][j] = _mm_fmadd_ps(xe, we[j], ev[i][j]);
          od[i][j] = _mm_fmadd_ps(xo, wo[j], od[i][j]);
        }
      }
    }
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < R; ++j)
        acc[i][j] = _mm256_set_m128(_mm_unpackhi_ps(ev[i][j], od[i][j]), _mm_unpacklo_ps(ev[i][j], od[i][j]));
  } else {
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < R; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  DotTile<T, M, R>(acc, k, x, K, w, rb, K, y, ldy, step);
}

template <DType T, int M, bool kSplit>
void GemvF(const uint8_t* w, size_t rb, int64_t n_rows, const float* x, int64_t K, float* y, int64_t ldy) {
  // R * M accumulators (twice as many 128-bit ones in the split BF16 form) + R weight vectors
  // within the 16 registers.
  constexpr bool kHalves = kSplit && T == DType::kBF16;
  constexpr int R = kHalves ? (M == 1 ? 4 : M == 2 ? 2 : 1) : (M <= 2 ? 4 : 2);
  const float* xp = nullptr;
  if constexpr (kHalves) {  // x by 8s as [0 2 4 6 1 3 5 7] (the tail is read from x itself)
    static thread_local std::vector<float> xp_buf;
    float* p = Scratch(xp_buf, (size_t)(M * K + 1));
    for (int i = 0; i < M; ++i)
      for (int64_t c = 0; c + 8 <= K; c += 8) {
        const __m128 a = _mm_loadu_ps(x + i * K + c), b = _mm_loadu_ps(x + i * K + c + 4);
        _mm_storeu_ps(p + i * K + c, _mm_shuffle_ps(a, b, 0x88));
        _mm_storeu_ps(p + i * K + c + 4, _mm_shuffle_ps(a, b, 0xdd));
      }
    xp = p;
  }
  // The rows in R runs of n_rows / R, row i of every run together: R long sequential streams,
  // which the hardware prefetcher follows (R adjacent rows at a time read at ~2/3 of the DRAM rate
  // for BF16 rows of 576).
  const int64_t run = n_rows / R;
  for (int64_t i = 0; i < run; ++i) GemvFRows<T, M, R, kSplit>(w + i * rb, rb, run, x, xp, K, y + i, ldy);
  for (int64_t r = run * R; r < n_rows; ++r) GemvFRows<T, M, 1, kSplit>(w + r * rb, rb, 1, x, xp, K, y + r, ldy);
}

template <int M, bool kSplit>
void GemvM(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const void* x, int64_t K, float* y,
           int64_t ldy) {
  const BlockQ8X* xq = (const BlockQ8X*)x;
  const float* xf = (const float*)x;
  {  // every M: the 4-row kernels give each row the M = 1 arithmetic (batched rows bit-identical)
    if (n_rows >= 4 && IsQuantized(t)) {
      const int64_t n4 = n_rows / 4 * 4;
      switch (t) {
        case DType::kQ8_0:
          QuantRows4<DType::kQ8_0, M, kSplit>(w, rb, n4, xq, K / 32, y, ldy);
          break;
        case DType::kQ4_0:
          QuantRows4<DType::kQ4_0, M, kSplit>(w, rb, n4, xq, K / 32, y, ldy);
          break;
        case DType::kQ4_1:
          QuantRows4<DType::kQ4_1, M, kSplit>(w, rb, n4, xq, K / 32, y, ldy);
          break;
        case DType::kQ5_0:
          QuantRows4<DType::kQ5_0, M, kSplit>(w, rb, n4, xq, K / 32, y, ldy);
          break;
        case DType::kQ5_1:
          QuantRows4<DType::kQ5_1, M, kSplit>(w, rb, n4, xq, K / 32, y, ldy);
          break;
        default:
          break;
      }
      if (n4 == n_rows) return;
      return GemvM<M, kSplit>(t, w + n4 * rb, rb, n_rows - n4, x, K, y + n4, ldy);
    }
  }
  switch (t) {
    case DType::kQ5_0:  // the N % 4 tail rows (always the same rows: chunks start at multiples of 4)
    case DType::kQ5_1:
      return ExtQuantGemv(t, w, rb, n_rows, xq, M, K, y, ldy);
    case DType::kQ8_0:
      return GemvQ8_0<M>(w, rb, n_rows, xq, K / 32, y, ldy);
    case DType::kQ4_0:
      return GemvQ4<M, false>(w, rb, n_rows, xq, K / 32, y, ldy);
    case DType::kQ4_1:
      return GemvQ4<M, true>(w, rb, n_rows, xq, K / 32, y, ldy);
    case DType::kF32:
      return GemvF<DType::kF32, M, kSplit>(w, rb, n_rows, xf, K, y, ldy);
    case DType::kF16:
      return GemvF<DType::kF16, M, kSplit>(w, rb, n_rows, xf, K, y, ldy);
    case DType::kBF16:
      return GemvF<DType::kBF16, M, kSplit>(w, rb, n_rows, xf, K, y, ldy);
    default:
      LATHE_CHECK_MSG(false, "MatMul: unsupported weight dtype %s", DTypeName(t));
  }
}

template <bool kSplit>
void Gemv(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const void* x, int64_t m, int64_t K, float* y,
          int64_t ldy) {
  if (IsKQuant(t)) return ExtQuantGemv(t, w, rb, n_rows, (const BlockQ8X*)x, m, K, y, ldy);
  switch (m) {
    case 1:
      return GemvM<1, kSplit>(t, w, rb, n_rows, x, K, y, ldy);
    case 2:
      return GemvM<2, kSplit>(t, w, rb, n_rows, x, K, y, ldy);
    case 3:
      return GemvM<3, kSplit>(t, w, rb, n_rows, x, K, y, ldy);
    default:
      return GemvM<4, kSplit>(t, w, rb, n_rows, x, K, y, ldy);
  }
}

// ---- dequantization -------------------------------------------------------------------------------

template <DType T>
void DequantRowF(const uint8_t* row, int64_t K, float* out) {
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) _mm256_storeu_ps(out + k, Load8<T>(row, k));
  for (; k < K; ++k) out[k] = LoadScalar<T>(row, k);
}

void DequantRow(DType t, const uint8_t* row, int64_t K, float* out) {
  if (IsExtQuant(t)) return ExtQuantDequantRow(t, row, K, out);
  const int64_t nb = K / 32;
  switch (t) {
    case DType::kF32:
      return DequantRowF<DType::kF32>(row, K, out);
    case DType::kF16:
      return DequantRowF<DType::kF16>(row, K, out);
    case DType::kBF16:
      return DequantRowF<DType::kBF16>(row, K, out);
    case DType::kQ8_0: {
      const BlockQ8_0* b = (const BlockQ8_0*)row;
      for (int64_t j = 0; j < nb; ++j) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b[j].d));
        for (int h = 0; h < 4; ++h) {
          const __m128i q = _mm_loadl_epi64((const __m128i*)(b[j].qs + 8 * h));
          _mm256_storeu_ps(out + j * 32 + 8 * h,
                           _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
        }
      }
      return;
    }
    case DType::kQ4_0:
    case DType::kQ4_1: {
      const bool q41 = t == DType::kQ4_1;
      const size_t bb = q41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
      for (int64_t j = 0; j < nb; ++j) {
        const uint8_t* b = row + j * bb;
        const uint16_t* h = (const uint16_t*)b;
        const float df = _cvtsh_ss(h[0]);
        const __m256 d = _mm256_set1_ps(df);
        const __m256 m = _mm256_set1_ps(q41 ? _cvtsh_ss(h[1]) : -8.0f * df);
        alignas(32) uint8_t v[32];
        _mm256_store_si256((__m256i*)v, UnpackNibbles(b + (q41 ? 4 : 2)));
        for (int g = 0; g < 4; ++g) {
          const __m256i u = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(v + 8 * g)));
          _mm256_storeu_ps(out + j * 32 + 8 * g, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(u), m));
        }
      }
      return;
    }
    default:
      LATHE_CHECK_MSG(false, "DequantizeRows: unsupported dtype %s", DTypeName(t));
  }
}

void DequantRows(DType t, const uint8_t* w, size_t rb, int64_t n_rows, int64_t K, float* out, int64_t ldo) {
  for (int64_t r = 0; r < n_rows; ++r) DequantRow(t, w + r * rb, K, out + r * ldo);
}

// ---- prefill panel: MR x rows times NR weight rows, dot-product form ------------------------------

// DotTile over f32 rows (the dequantized panel, or f32 weights in place) from zero.
template <int MR, int NR>
void Tile(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t K, float* y, int64_t ldy) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  DotTile<DType::kF32, MR, NR>(acc, 0, x, ldx, (const uint8_t*)w, (size_t)ldw * sizeof(float), K, y, ldy, 1);
}

constexpr int kMR = 4, kNR = 3;

template <int NR>
void PanelN(const float* x, int64_t ldx, int64_t m_rows, const float* w, int64_t ldw, int64_t K, float* y,
            int64_t ldy) {
  int64_t i = 0;
  for (; i + kMR <= m_rows; i += kMR) Tile<kMR, NR>(x + i * ldx, ldx, w, ldw, K, y + i * ldy, ldy);
  switch (m_rows - i) {
    case 3:
      Tile<3, NR>(x + i * ldx, ldx, w, ldw, K, y + i * ldy, ldy);
      break;
    case 2:
      Tile<2, NR>(x + i * ldx, ldx, w, ldw, K, y + i * ldy, ldy);
      break;
    case 1:
      Tile<1, NR>(x + i * ldx, ldx, w, ldw, K, y + i * ldy, ldy);
      break;
    default:
      break;
  }
}

void Panel(const float* x, int64_t ldx, int64_t m_rows, const float* w, int64_t ldw, int64_t n_rows,
           int64_t K, float* y, int64_t ldy) {
  switch (n_rows) {
    case 3:
      return PanelN<3>(x, ldx, m_rows, w, ldw, K, y, ldy);
    case 2:
      return PanelN<2>(x, ldx, m_rows, w, ldw, K, y, ldy);
    case 1:
      return PanelN<1>(x, ldx, m_rows, w, ldw, K, y, ldy);
    default:
      LATHE_CHECK(n_rows > 0 && n_rows <= kNR);
  }
}

}  // namespace

MatMulKernels GetMatMulKernels(bool split) {
  MatMulKernels k = {QuantizeX, split ? Gemv<true> : Gemv<false>, DequantRows, Panel, kNR, kMR, 4};
  k.qgemm = split ? QGemm<true> : QGemm<false>;
  k.qgemm_runs = split ? QGemmRuns<true> : QGemmRuns<false>;
  k.quantize_x16 = QuantizeX16;
  k.tier = IsaTier::kAvx2;
  return k;
}

}  // namespace lathe::kernels::cpu::avx2
