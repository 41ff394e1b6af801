// AVX-512 (F/BW/VL/DQ) matmul kernels: f32/f16/bf16 GEMV on zmm, row dequantization and the 6 x 4
// zmm FMA prefill panel; the 32-element block types' 4-row GEMV on zmm (QuantRowsZ) in the arithmetic of
// the VNNI int8 GEMM (qgemm_avx512.cc), the K-quants on the AVX2 table's int8 GEMV.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/avx512_util.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/quant_rows.h"

namespace lathe::kernels::cpu::avx512 {

namespace {

// Q4 nibbles of one block (16 bytes) as 32 bytes in element order, for the dequantizer.
inline __m256i UnpackNibbles(const uint8_t* qs) {
  // One broadcast load, then shift only the upper copy: 3 ops instead of 4.
  const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)qs));
  const __m256i both = _mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4));
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
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

// s[4 (i % 4) + i / 4] = _mm512_reduce_add_ps(v[i]) for 16 vectors at once, bit for bit: the same
// pairs of lanes added in the same order ((k, k + 8), then (k, k + 4), (0, 2) and (1, 3), (0, 1)), as a
// transposing network of 15 adds and 30 shuffles instead of 16 x (4 adds + 4 shuffles/extracts).
__attribute__((always_inline)) inline __m512 Reduce16(const __m512 (&v)[16]) {
  __m512 r[8], q[4], o[2];
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p)
    r[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p)
    q[p] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * p], r[2 * p + 1], 0x88),
                         _mm512_shuffle_f32x4(r[2 * p], r[2 * p + 1], 0xDD));
#pragma GCC unroll 2
  for (int p = 0; p < 2; ++p)
    o[p] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * p], q[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(q[2 * p], q[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_ps(o[0], o[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(o[0], o[1], _MM_SHUFFLE(3, 1, 3, 1)));
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
  constexpr int kN = MR * NR;
  if constexpr (kN < 8) {
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) y[i * ldy + j * y_step] = _mm512_reduce_add_ps(acc[i][j]);
  } else {
    // Accumulators in groups of 16 (the last padded with zeros) through Reduce16; same sums.
    const __m512i natural = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
#pragma GCC unroll 2
    for (int g = 0; g < (kN + 15) / 16; ++g) {
      __m512 v[16];
#pragma GCC unroll 16
      for (int u = 0; u < 16; ++u) v[u] = g * 16 + u < kN ? acc[(g * 16 + u) / NR][(g * 16 + u) % NR] : _mm512_setzero_ps();
      alignas(64) float s[16];
      _mm512_store_ps(s, _mm512_permutexvar_ps(natural, Reduce16(v)));  // s[u] = sum of v[u]
#pragma GCC unroll 16
      for (int u = 0; u < 16; ++u)
        if (g * 16 + u < kN) y[(g * 16 + u) / NR * ldy + (g * 16 + u) % NR * y_step] = s[u];
    }
  }
}

// The rows in 4 runs of n_rows / 4, row i of every run together: 4 long sequential streams (as the
// AVX2 tier; 4 adjacent rows at a time defeat the hardware prefetcher on short rows).
template <DType T, int M>
void GemvF(const uint8_t* w, size_t rb, int64_t n_rows, const float* x, int64_t K, float* y, int64_t ldy) {
  const int64_t run = n_rows / 4;
  for (int64_t i = 0; i < run; ++i) DotTile<T, M, 4>(x, K, w + i * rb, run * rb, K, y + i, ldy, run);
  for (int64_t r = run * 4; r < n_rows; ++r) DotTile<T, M, 1>(x, K, w + r * rb, rb, K, y + r, ldy, 1);
}

template <int M>
void GemvM(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const float* x, int64_t K, float* y, int64_t ldy) {
  switch (t) {
    case DType::kF32:
      return GemvF<DType::kF32, M>(w, rb, n_rows, x, K, y, ldy);
    case DType::kF16:
      return GemvF<DType::kF16, M>(w, rb, n_rows, x, K, y, ldy);
    case DType::kBF16:
      return GemvF<DType::kBF16, M>(w, rb, n_rows, x, K, y, ldy);
    default:
      LATHE_CHECK_MSG(false, "MatMul: unsupported weight dtype %s", DTypeName(t));
  }
}

// Decode rows of the 32-element block types (M = 1-4 x rows) with four weight rows per zmm, row q in
// 128-bit lane q, in the tier's block arithmetic (qgemm_avx512.cc, whose int8 GEMM takes over from
// qgemm_min_m rows and must give every row the same bits): per block the exact int32 dot product T of
// the codes (4 partial lanes from two vpdpbusd, on the nibbles (+ fifth bits) for Q4 / Q5, on q + 128
// from a start of -128 * (x lane sums) for Q8_0, then summed across the lanes), in block order acc =
// fma(float(T), dw * dx, acc) and the Q4 / Q5 offset or min term corr = fma(cw, sx, corr); y = acc
// (Q8_0) or acc + corr * kCorr. The rows go in 4 runs of n_rows / 4 (4 long streams). REQUIRES n_rows
// % 4 == 0.
template <DType T, int M>
void QuantRowsZ(const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t nb, float* y, int64_t ldy) {
  using B = avx2::Block32<T>;
  constexpr bool kQ8 = B::kQ8, kMin = B::kMin, k5 = B::k5;
  constexpr size_t kBB = B::kBytes, kQsOff = B::kQsOff;
  constexpr float kCorr = B::kCorr;
  const int64_t run = n_rows / 4;
  const size_t rs = run * rb;  // bytes between the 4 rows of a step
  static thread_local std::vector<int32_t> bias_buf;  // Q8_0: 4 int32 per (x row, block)
  int32_t* bias = nullptr;
  if constexpr (kQ8) {
    bias_buf.resize((size_t)(4 * M * nb));
    bias = bias_buf.data();
    const __m128i x80 = _mm_set1_epi8((char)0x80);
    for (int64_t i = 0; i < M * nb; ++i) {
      __m128i sx = _mm_dpbusd_epi32(_mm_setzero_si128(), x80, _mm_loadu_si128((const __m128i*)x[i].qs));
      sx = _mm_dpbusd_epi32(sx, x80, _mm_loadu_si128((const __m128i*)(x[i].qs + 16)));
      _mm_storeu_si128((__m128i*)(bias + 4 * i), _mm_sub_epi32(_mm_setzero_si128(), sx));
    }
  }
  const __m512i flip = _mm512_set1_epi8((char)0x80), low4 = _mm512_set1_epi8(0x0f), x10 = _mm512_set1_epi8(0x10);
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  for (int64_t r = 0; r < run; ++r) {
    const uint8_t* row = w + r * rb;
    __m512 acc[M];
    __m128 corr[M];
    for (int i = 0; i < M; ++i) acc[i] = _mm512_setzero_ps(), corr[i] = _mm_setzero_ps();
    for (int64_t j = 0; j < nb; ++j) {
      const uint8_t* b0 = row + j * kBB;
      const __m128 dw = _mm_cvtph_ps(Load4Halves(b0, rs));
      __m128 cw = dw;
      if constexpr (kMin) cw = _mm_cvtph_ps(Load4Halves(b0 + 2, rs));
      const uint8_t* q = b0 + kQsOff;
      __m512i u0, u1;
      if constexpr (kQ8) {
        // [row0 h0 | row0 h1 | row1 h0 | row1 h1], the same for rows 2, 3; then the halves gathered.
        const __m512i t01 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)q)),
                                               _mm256_loadu_si256((const __m256i*)(q + rs)), 1);
        const __m512i t23 =
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(q + 2 * rs))),
                               _mm256_loadu_si256((const __m256i*)(q + 3 * rs)), 1);
        u0 = _mm512_xor_si512(_mm512_shuffle_i64x2(t01, t23, _MM_SHUFFLE(2, 0, 2, 0)), flip);
        u1 = _mm512_xor_si512(_mm512_shuffle_i64x2(t01, t23, _MM_SHUFFLE(3, 1, 3, 1)), flip);
      } else {
        __m512i p = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i*)q));
        p = _mm512_inserti32x4(p, _mm_loadu_si128((const __m128i*)(q + rs)), 1);
        p = _mm512_inserti32x4(p, _mm_loadu_si128((const __m128i*)(q + 2 * rs)), 2);
        p = _mm512_inserti32x4(p, _mm_loadu_si128((const __m128i*)(q + 3 * rs)), 3);
        u0 = _mm512_and_si512(p, low4);
        u1 = _mm512_and_si512(_mm512_srli_epi16(p, 4), low4);
        if constexpr (k5) {  // the fifth bits (u32 before the nibbles): row q's at mask bits 16 q ..
          uint64_t m0 = 0, m1 = 0;
          for (int qr = 0; qr < 4; ++qr) {
            uint32_t qh;
            std::memcpy(&qh, q - 4 + qr * rs, 4);
            m0 |= (uint64_t)(qh & 0xffff) << (16 * qr);
            m1 |= (uint64_t)(qh >> 16) << (16 * qr);
          }
          u0 = _mm512_or_si512(u0, _mm512_maskz_mov_epi8(m0, x10));
          u1 = _mm512_or_si512(u1, _mm512_maskz_mov_epi8(m1, x10));
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) {
        const BlockQ8X& xb = x[i * nb + j];
        if constexpr (!kQ8) corr[i] = _mm_fmadd_ps(cw, _mm_set1_ps(xb.s), corr[i]);
        __m512i d = kQ8 ? _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(bias + 4 * (i * nb + j))))
                        : _mm512_setzero_si512();
        d = _mm512_dpbusd_epi32(d, u0, _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)xb.qs)));
        d = _mm512_dpbusd_epi32(d, u1, _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(xb.qs + 16))));
        d = _mm512_add_epi32(d, _mm512_shuffle_epi32(d, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2)));
        d = _mm512_add_epi32(d, _mm512_shuffle_epi32(d, (_MM_PERM_ENUM)_MM_SHUFFLE(2, 3, 0, 1)));  // T, 4 times
        const __m512 ds = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_mul_ps(dw, _mm_set1_ps(xb.d))));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), ds, acc[i]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < M; ++i) {
      alignas(64) float a[16], c[4];
      _mm512_store_ps(a, acc[i]);
      _mm_store_ps(c, _mm_mul_ps(corr[i], _mm_set1_ps(kCorr)));
      for (int qr = 0; qr < 4; ++qr) y[i * ldy + r + qr * run] = kQ8 ? a[4 * qr] : a[4 * qr] + c[qr];
    }
  }
}

template <DType T>
void QuantRowsZM(const uint8_t* w, size_t rb, int64_t n4, const BlockQ8X* xq, int64_t m, int64_t K, float* y,
                 int64_t ldy) {
  switch (m) {
    case 1:
      return QuantRowsZ<T, 1>(w, rb, n4, xq, K / 32, y, ldy);
    case 2:
      return QuantRowsZ<T, 2>(w, rb, n4, xq, K / 32, y, ldy);
    case 3:
      return QuantRowsZ<T, 3>(w, rb, n4, xq, K / 32, y, ldy);
    default:
      return QuantRowsZ<T, 4>(w, rb, n4, xq, K / 32, y, ldy);
  }
}

void Gemv(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const void* x, int64_t m, int64_t K, float* y,
          int64_t ldy) {
  // The 32-element block types: four rows per zmm (QuantRowsZ, this tier's block arithmetic, shared with
  // its int8 GEMM), N % 4 tail rows and the K-quants on the AVX2 table's int8 kernels.
  const bool block32 = t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_0 ||
                       t == DType::kQ5_1;
  if (block32 && n_rows >= 4) {
    const int64_t n4 = n_rows / 4 * 4;
    const BlockQ8X* xq = (const BlockQ8X*)x;
    switch (t) {
      case DType::kQ8_0:
        QuantRowsZM<DType::kQ8_0>(w, rb, n4, xq, m, K, y, ldy);
        break;
      case DType::kQ4_0:
        QuantRowsZM<DType::kQ4_0>(w, rb, n4, xq, m, K, y, ldy);
        break;
      case DType::kQ4_1:
        QuantRowsZM<DType::kQ4_1>(w, rb, n4, xq, m, K, y, ldy);
        break;
      case DType::kQ5_0:
        QuantRowsZM<DType::kQ5_0>(w, rb, n4, xq, m, K, y, ldy);
        break;
      default:
        QuantRowsZM<DType::kQ5_1>(w, rb, n4, xq, m, K, y, ldy);
        break;
    }
    if (n4 == n_rows) return;
    return avx2::Table().mm.gemv(t, w + n4 * rb, rb, n_rows - n4, x, m, K, y + n4, ldy);
  }
  if (IsQuantized(t)) return avx2::Table().mm.gemv(t, w, rb, n_rows, x, m, K, y, ldy);
  const float* xf = (const float*)x;
  switch (m) {
    case 1:
      return GemvM<1>(t, w, rb, n_rows, xf, K, y, ldy);
    case 2:
      return GemvM<2>(t, w, rb, n_rows, xf, K, y, ldy);
    case 3:
      return GemvM<3>(t, w, rb, n_rows, xf, K, y, ldy);
    default:
      return GemvM<4>(t, w, rb, n_rows, xf, K, y, ldy);
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

// Block types take the AVX2 table's x quantization. Q8_0 / Q4_* / Q5_* run this tier's own block arithmetic
// (exact int32 block dot products, one float fma per block: qgemm_avx512.cc), in the 4-row zmm GEMV below
// qgemm_min_m rows and the VNNI int8 GEMM from there, so a row's result does not depend on the batch; it
// differs from the AVX2 tier's (4 float partial sums per block) in the last bits. K-quants take the AVX2
// table's GEMV; the float types the zmm DotTile.
MatMulKernels GetMatMulKernels() {
  const MatMulKernels& a2 = avx2::Table().mm;
  MatMulKernels k = {a2.quantize_x, Gemv, DequantRows, Panel, kNR, kMR, a2.gemv_exact_m};
  k.qgemm = QGemm;
  k.qgemm_min_m = 8;
  k.qgemm_runs = QGemmRuns;
  k.x_starts = XStarts;
  k.quantize_x16 = QuantizeX16;
  if (GetCpuFeatures().avx512_bf16 && (BestIsaTier() != IsaTier::kAvx512 || UsesBf16Dot())) {
    k.bf16_strips = avx512bf16::StripsMatMul;
    k.bf16_dequant = avx512bf16::DequantMatMul;
  }
  return k;
}

}  // namespace lathe::kernels::cpu::avx512
