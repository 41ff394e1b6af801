// AVX-512 (F/BW/VL/DQ + VNNI) matmul kernels: int8 GEMV for Q8_0/Q4_0/Q4_1 with vpdpbusd,
// f32/f16/bf16 GEMV on zmm, row dequantization and the 6 x 4 zmm FMA prefill panel.
// GCC 12 warns on its own _mm512_undefined_* inside the intrinsics headers (a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "core/check.h"
#include "kernels/cpu/avx512_util.h"
#include "kernels/cpu/dispatch.h"

namespace lathe::kernels::cpu::avx512 {

namespace {

// ---- activations -> int8 blocks ----------------------------------------------------------------

void QuantizeX(const float* x, int64_t K, BlockQ8X* out) {
  for (int64_t j = 0; j < K / 32; ++j) {
    const __m512 v0 = _mm512_loadu_ps(x + j * 32), v1 = _mm512_loadu_ps(x + j * 32 + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
    const __m512 mul = _mm512_set1_ps(id);
    // cvtps rounds to nearest even (default MXCSR); |values| <= 127 so the saturating narrow is exact.
    const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, mul));
    const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, mul));
    _mm_storeu_si128((__m128i*)out[j].qs, _mm512_cvtsepi32_epi8(i0));
    _mm_storeu_si128((__m128i*)(out[j].qs + 16), _mm512_cvtsepi32_epi8(i1));
    out[j].d = d;
    out[j].s = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
  }
}

// ---- int8 GEMV for block types (256-bit VNNI: one 32-byte block per instruction) ---------------

// Sum of 32 u8 x s8 products as 8 int32 lanes converted to float.
inline __m256 DotU8S8(__m256i u, __m256i s) {
  return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s));
}

inline __m256i UnpackNibbles(const uint8_t* qs) {
  // One broadcast load, then shift only the upper copy: 3 ops instead of 4.
  const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)qs));
  const __m256i both = _mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4));
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

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
    for (int i = 0; i < M; ++i) y[i * ldy + r] = Hsum256(_mm256_add_ps(acc0[i], acc1[i]));
  }
}

// Same algebra as the AVX2 GemvQ4: unsigned nibbles . int8 x, offset/min folded into s = dx*sum qx.
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
      y[i * ldy + r] = Hsum256(_mm256_add_ps(acc0[i], acc1[i])) + (kQ41 ? 1.0f : -8.0f) * (c0[i] + c1[i]);
  }
}

// ---- f32 / f16 / bf16 -----------------------------------------------------------------------------

// 16 weights from k, lanes outside `m` zero (masked loads never touch memory outside the mask).
template <DType T>
inline __m512 Load16(const uint8_t* row, int64_t k, __mmask16 m = 0xffff) {
  if constexpr (T == DType::kF32) {
    return _mm512_maskz_loadu_ps(m, (const float*)row + k);
  } else if constexpr (T == DType::kF16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t*)row + k));
  } else {
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t*)row + k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
}

// MR x rows times NR weight rows (dtype T, w_stride bytes apart; outputs y[i * ldy + j * y_step]),
// dot-product form: one 16-lane accumulator per output over k in steps of 16, the K tail as one
// masked step, the same reduce. The prefill panel (f32 rows) and the float GEMV both run it, so a
// row's result does not depend on M or on which of them computes it (batch invariance of float
// models' decode rows). At 6 x 4 for the panel: 24 zmm accumulators + 4 weight vectors + 1 x vector
// of the 32 registers; 10 loads per 24 FMAs.
template <DType T, int MR, int NR>
__attribute__((always_inline)) inline void DotTile(const float* x, int64_t ldx, const uint8_t* w, size_t w_stride,
                                                   int64_t K, float* y, int64_t ldy, int64_t y_step) {
  // Every loop over the tile fully unrolled: a rolled one (the reduce) made GCC keep acc in memory
  // and store all 24 accumulators every k step (measured 2.5x slower on a Xeon).
  __m512 acc[MR][NR];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) wv[j] = Load16<T>(w + j * w_stride, k);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < K) {
    const __mmask16 m = Mask16(K - k);
    __m512 wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) wv[j] = Load16<T>(w + j * w_stride, k, m);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) y[i * ldy + j * y_step] = _mm512_reduce_add_ps(acc[i][j]);
}

// The rows in 4 runs of n_rows / 4, row i of every run together: 4 long sequential streams (as the
// AVX2 tier; 4 adjacent rows at a time defeat the hardware prefetcher on short rows).
template <DType T, int M>
void GemvF(const uint8_t* w, size_t rb, int64_t n_rows, const float* x, int64_t K, float* y, int64_t ldy) {
  const int64_t run = n_rows / 4;
  for (int64_t i = 0; i < run; ++i) DotTile<T, M, 4>(x, K, w + i * rb, run * rb, K, y + i, ldy, run);
  for (int64_t r = run * 4; r < n_rows; ++r) DotTile<T, M, 1>(x, K, w + r * rb, rb, K, y + r, ldy, 1);
}

// Decode (M = 1): four weight rows per pass. Their four f16 scales are converted by one
// vcvtph2ps and multiplied by the x scale together, the Q4 offset/min terms of the four rows share
// one FMA, and the x block is loaded once: ~10 instead of ~14 instructions per block and row.
template <DType T>
inline __m256 RowBlockDot(const uint8_t* qs, __m256i xq) {
  if constexpr (T == DType::kQ8_0) {
    const __m256i q = _mm256_loadu_si256((const __m256i*)qs);
    return DotU8S8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xq, q));
  } else {
    return DotU8S8(UnpackNibbles(qs), xq);
  }
}

inline __m128i Load4Halves(const uint8_t* p0, size_t stride) {
  __m128i h = _mm_cvtsi32_si128(*(const uint16_t*)p0);
  h = _mm_insert_epi16(h, *(const uint16_t*)(p0 + stride), 1);
  h = _mm_insert_epi16(h, *(const uint16_t*)(p0 + 2 * stride), 2);
  return _mm_insert_epi16(h, *(const uint16_t*)(p0 + 3 * stride), 3);
}

template <DType T>
void Gemv1Rows4(const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t nb, float* y) {
  constexpr bool kQ8 = T == DType::kQ8_0, kQ41 = T == DType::kQ4_1;
  constexpr size_t kBB = kQ8 ? sizeof(BlockQ8_0) : kQ41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  constexpr size_t kQsOff = kQ41 ? 4 : 2;
  for (int64_t r = 0; r + 4 <= n_rows; r += 4) {
    const uint8_t* row = w + r * rb;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    __m128 corr = _mm_setzero_ps();
    // Interleaved access to four rows hides the stream from the hardware prefetcher (measured:
    // cold Q8_0 ran at half speed), so fetch the next four rows, linearly, one step ahead.
    const uint8_t* next = row + 4 * rb;
    const bool prefetch = r + 8 <= n_rows;
    for (int64_t j = 0; j < nb; ++j) {
      const uint8_t* b0 = row + j * kBB;
      if (prefetch) {
        const char* p = (const char*)next + j * 4 * kBB;
        _mm_prefetch(p, _MM_HINT_T0);
        _mm_prefetch(p + 64, _MM_HINT_T0);
        if constexpr (4 * kBB > 128) _mm_prefetch(p + 128, _MM_HINT_T0);
      }
      const __m128 dw = _mm_cvtph_ps(Load4Halves(b0, rb));
      const __m128 ds = _mm_mul_ps(dw, _mm_set1_ps(x[j].d));
      const __m256 ds2 = _mm256_set_m128(ds, ds);
      if constexpr (!kQ8) {
        const __m128 cw = kQ41 ? _mm_cvtph_ps(Load4Halves(b0 + 2, rb)) : dw;
        corr = _mm_fmadd_ps(cw, _mm_set1_ps(x[j].s), corr);
      }
      const __m256i xq = _mm256_loadu_si256((const __m256i*)x[j].qs);
      acc0 = _mm256_fmadd_ps(RowBlockDot<T>(b0 + kQsOff, xq), _mm256_shuffle_ps(ds2, ds2, 0x00), acc0);
      acc1 = _mm256_fmadd_ps(RowBlockDot<T>(b0 + rb + kQsOff, xq), _mm256_shuffle_ps(ds2, ds2, 0x55), acc1);
      acc2 =
          _mm256_fmadd_ps(RowBlockDot<T>(b0 + 2 * rb + kQsOff, xq), _mm256_shuffle_ps(ds2, ds2, 0xaa), acc2);
      acc3 =
          _mm256_fmadd_ps(RowBlockDot<T>(b0 + 3 * rb + kQsOff, xq), _mm256_shuffle_ps(ds2, ds2, 0xff), acc3);
    }
    alignas(16) float c[4];
    _mm_store_ps(c, _mm_mul_ps(corr, _mm_set1_ps(kQ41 ? 1.0f : -8.0f)));
    y[r] = Hsum256(acc0) + c[0];
    y[r + 1] = Hsum256(acc1) + c[1];
    y[r + 2] = Hsum256(acc2) + c[2];
    y[r + 3] = Hsum256(acc3) + c[3];
  }
}

// The same for M = 2 x rows (batched decode): ~25 % faster than the per-row kernel; kept apart
// from the M = 1 kernel, which the generalization slowed by 2-3 %.
template <DType T, int M>
void GemvRows4(const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t nb, float* y,
               int64_t ldy) {
  constexpr bool kQ8 = T == DType::kQ8_0, kQ41 = T == DType::kQ4_1;
  constexpr size_t kBB = kQ8 ? sizeof(BlockQ8_0) : kQ41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  constexpr size_t kQsOff = kQ41 ? 4 : 2;
  for (int64_t r = 0; r + 4 <= n_rows; r += 4) {
    const uint8_t* row = w + r * rb;
    __m256 acc[M][4];
    __m128 corr[M];
    for (int i = 0; i < M; ++i) {
      acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = _mm256_setzero_ps();
      corr[i] = _mm_setzero_ps();
    }
    // Interleaved access to four rows hides the stream from the hardware prefetcher (measured:
    // cold Q8_0 ran at half speed), so fetch the next four rows, linearly, one step ahead.
    const uint8_t* next = row + 4 * rb;
    const bool prefetch = r + 8 <= n_rows;
    for (int64_t j = 0; j < nb; ++j) {
      const uint8_t* b0 = row + j * kBB;
      if (prefetch) {
        const char* p = (const char*)next + j * 4 * kBB;
        _mm_prefetch(p, _MM_HINT_T0);
        _mm_prefetch(p + 64, _MM_HINT_T0);
        if constexpr (4 * kBB > 128) _mm_prefetch(p + 128, _MM_HINT_T0);
      }
      const __m128 dw = _mm_cvtph_ps(Load4Halves(b0, rb));
      __m128 cw = dw;
      if constexpr (kQ41) cw = _mm_cvtph_ps(Load4Halves(b0 + 2, rb));
#pragma GCC unroll 2
      for (int i = 0; i < M; ++i) {
        const BlockQ8X& xb = x[i * nb + j];
        const __m128 ds = _mm_mul_ps(dw, _mm_set1_ps(xb.d));
        const __m256 ds2 = _mm256_set_m128(ds, ds);
        if constexpr (!kQ8) corr[i] = _mm_fmadd_ps(cw, _mm_set1_ps(xb.s), corr[i]);
        const __m256i xq = _mm256_loadu_si256((const __m256i*)xb.qs);
        acc[i][0] =
            _mm256_fmadd_ps(RowBlockDot<T>(b0 + kQsOff, xq), _mm256_shuffle_ps(ds2, ds2, 0x00), acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(RowBlockDot<T>(b0 + rb + kQsOff, xq), _mm256_shuffle_ps(ds2, ds2, 0x55),
                                    acc[i][1]);
        acc[i][2] = _mm256_fmadd_ps(RowBlockDot<T>(b0 + 2 * rb + kQsOff, xq),
                                    _mm256_shuffle_ps(ds2, ds2, 0xaa), acc[i][2]);
        acc[i][3] = _mm256_fmadd_ps(RowBlockDot<T>(b0 + 3 * rb + kQsOff, xq),
                                    _mm256_shuffle_ps(ds2, ds2, 0xff), acc[i][3]);
      }
    }
    for (int i = 0; i < M; ++i) {
      alignas(16) float c[4];
      _mm_store_ps(c, _mm_mul_ps(corr[i], _mm_set1_ps(kQ41 ? 1.0f : -8.0f)));
      for (int q = 0; q < 4; ++q) y[i * ldy + r + q] = Hsum256(acc[i][q]) + c[q];
    }
  }
}

template <DType T, int M>
void QuantRows4(const uint8_t* w, size_t rb, int64_t n4, const BlockQ8X* x, int64_t nb, float* y,
                int64_t ldy) {
  if constexpr (M == 1) {
    Gemv1Rows4<T>(w, rb, n4, x, nb, y);
  } else {
    GemvRows4<T, M>(w, rb, n4, x, nb, y, ldy);
  }
}

template <int M>
void GemvM(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const void* x, int64_t K, float* y,
           int64_t ldy) {
  const BlockQ8X* xq = (const BlockQ8X*)x;
  const float* xf = (const float*)x;
  if constexpr (M <= 2) {
    if (n_rows >= 4 && IsQuantized(t)) {
      const int64_t n4 = n_rows / 4 * 4;
      switch (t) {
        case DType::kQ8_0:
          QuantRows4<DType::kQ8_0, M>(w, rb, n4, xq, K / 32, y, ldy);
          break;
        case DType::kQ4_0:
          QuantRows4<DType::kQ4_0, M>(w, rb, n4, xq, K / 32, y, ldy);
          break;
        case DType::kQ4_1:
          QuantRows4<DType::kQ4_1, M>(w, rb, n4, xq, K / 32, y, ldy);
          break;
        default:
          break;
      }
      if (n4 == n_rows) return;
      return GemvM<M>(t, w + n4 * rb, rb, n_rows - n4, x, K, y + n4, ldy);
    }
  }
  switch (t) {
    case DType::kQ8_0:
      return GemvQ8_0<M>(w, rb, n_rows, xq, K / 32, y, ldy);
    case DType::kQ4_0:
      return GemvQ4<M, false>(w, rb, n_rows, xq, K / 32, y, ldy);
    case DType::kQ4_1:
      return GemvQ4<M, true>(w, rb, n_rows, xq, K / 32, y, ldy);
    case DType::kF32:
      return GemvF<DType::kF32, M>(w, rb, n_rows, xf, K, y, ldy);
    case DType::kF16:
      return GemvF<DType::kF16, M>(w, rb, n_rows, xf, K, y, ldy);
    case DType::kBF16:
      return GemvF<DType::kBF16, M>(w, rb, n_rows, xf, K, y, ldy);
    default:
      LATHE_CHECK_MSG(false, "MatMul: unsupported weight dtype %s", DTypeName(t));
  }
}

void Gemv(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const void* x, int64_t m, int64_t K, float* y,
          int64_t ldy) {
  // Q5_0 / Q5_1 / K-quants: the AVX2 table's kernels (its 4-row Q5 GEMV, the 128-bit K-quant one).
  if (IsExtQuant(t)) return avx2::Table().mm.gemv(t, w, rb, n_rows, x, m, K, y, ldy);
  switch (m) {
    case 1:
      return GemvM<1>(t, w, rb, n_rows, x, K, y, ldy);
    case 2:
      return GemvM<2>(t, w, rb, n_rows, x, K, y, ldy);
    case 3:
      return GemvM<3>(t, w, rb, n_rows, x, K, y, ldy);
    default:
      return GemvM<4>(t, w, rb, n_rows, x, K, y, ldy);
  }
}

// ---- dequantization -------------------------------------------------------------------------------

template <DType T>
void DequantRowF(const uint8_t* row, int64_t K, float* out) {
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = Mask16(std::min<int64_t>(16, K - k));
    _mm512_mask_storeu_ps(out + k, m, Load16<T>(row, k, m));
  }
}

void DequantRow(DType t, const uint8_t* row, int64_t K, float* out) {
  if (IsExtQuant(t)) return avx2::ExtQuantDequantRow(t, row, K, out);
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
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(b[j].d));
        for (int h = 0; h < 2; ++h) {
          const __m128i q = _mm_loadu_si128((const __m128i*)(b[j].qs + 16 * h));
          _mm512_storeu_ps(out + j * 32 + 16 * h,
                           _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))));
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
        const __m512 d = _mm512_set1_ps(df);
        const __m512 m = _mm512_set1_ps(q41 ? _cvtsh_ss(h[1]) : -8.0f * df);
        const __m256i v = UnpackNibbles(b + (q41 ? 4 : 2));
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(v)));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(v, 1)));
        _mm512_storeu_ps(out + j * 32, _mm512_fmadd_ps(d, lo, m));
        _mm512_storeu_ps(out + j * 32 + 16, _mm512_fmadd_ps(d, hi, m));
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

// DotTile over f32 rows (the dequantized panel, or f32 weights in place).
template <int MR, int NR>
void Tile(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t K, float* y, int64_t ldy) {
  DotTile<DType::kF32, MR, NR>(x, ldx, (const uint8_t*)w, (size_t)ldw * sizeof(float), K, y, ldy, 1);
}

constexpr int kMR = 6, kNR = 4;

template <int NR>
void PanelN(const float* x, int64_t ldx, int64_t m_rows, const float* w, int64_t ldw, int64_t K, float* y,
            int64_t ldy) {
  int64_t i = 0;
  for (; i + kMR <= m_rows; i += kMR) Tile<kMR, NR>(x + i * ldx, ldx, w, ldw, K, y + i * ldy, ldy);
  const float* xi = x + i * ldx;
  float* yi = y + i * ldy;
  switch (m_rows - i) {
    case 5:
      Tile<5, NR>(xi, ldx, w, ldw, K, yi, ldy);
      break;
    case 4:
      Tile<4, NR>(xi, ldx, w, ldw, K, yi, ldy);
      break;
    case 3:
      Tile<3, NR>(xi, ldx, w, ldw, K, yi, ldy);
      break;
    case 2:
      Tile<2, NR>(xi, ldx, w, ldw, K, yi, ldy);
      break;
    case 1:
      Tile<1, NR>(xi, ldx, w, ldw, K, yi, ldy);
      break;
    default:
      break;
  }
}

void Panel(const float* x, int64_t ldx, int64_t m_rows, const float* w, int64_t ldw, int64_t n_rows,
           int64_t K, float* y, int64_t ldy) {
  switch (n_rows) {
    case 4:
      return PanelN<4>(x, ldx, m_rows, w, ldw, K, y, ldy);
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

MatMulKernels GetMatMulKernels() { return {QuantizeX, Gemv, DequantRows, Panel, kNR, kMR}; }

}  // namespace lathe::kernels::cpu::avx512
