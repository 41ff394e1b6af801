// AVX-512 VNNI int8 GEMM for block-quantized weights (Q8_0/Q4_0/Q4_1/Q5_0/Q5_1) times int8-quantized x
// rows (batched decode from qgemm_min_m rows): the AVX-512 tier's MatMulKernels::qgemm.
//
// The tier's block arithmetic (matmul_avx512.cc's GEMV has the same, so a row's result does not depend
// on how many rows share the call): per (x row, weight row) and 32-element block j, the exact int32 dot
// product T of the block's integer codes (nibbles for Q4 / Q5, q for Q8_0) and x's int8 codes, then in
// block order acc = fma(float(T), dw * dx, acc) and, for the Q4 / Q5 offset or min term, corr = fma(cw,
// sx, corr); y = acc (Q8_0) or acc + corr * kCorr.
//
// Layout: 16 weight rows per zmm, one int32 lane a row. Each block of 16 rows is unpacked into 8 zmm,
// zmm k holding bytes 4k..4k+3 of every row (an 8 x 8 dword transpose per 256-bit half, in registers);
// x's dword k is broadcast, so one vpdpbusd adds 4 products to 16 rows and 8 of them form T for all 16
// rows, whose float work is then one cvt, one mul and one fma per 16 rows (the 4-lane form this
// replaced spent 3 float ops per 4 rows and block, more than the dot products themselves).
// vpdpbusd multiplies unsigned by signed bytes: the weights enter unsigned (nibbles; q + 128 for Q8_0,
// whose dot then starts from -128 * sum(x) of the block).
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/avx512_util.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/scratch.h"

namespace lathe::kernels::cpu::avx512 {

namespace {


// One block of 16 weight rows: u[k] = bytes 4k..4k+3 (elements 4k..4k+3) of row r in lane r, unsigned;
// dw / cw: each row's scale and offset factor (cw = dw where the type has no min).
struct alignas(64) Group16 {
  uint8_t u[8][64];
  float dw[16];
  float cw[16];
};

// The int16 rows' block traits (avx2_util.h), shared with the AVX2 tier's int16 GEMM.
template <DType T>
using QT = avx2::Int16Block<T>;

// A block's 32 codes in element order (Q8_0: signed q, flipped to unsigned by the caller).
template <DType T>
inline __m256i RowCodes(const uint8_t* b) {
  using I = avx2::Block32<T>;
  if constexpr (I::kQ8) {
    return _mm256_loadu_si256((const __m256i*)(b + I::kQsOff));
  } else {
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m128i q = _mm_loadu_si128((const __m128i*)(b + I::kQsOff));
    __m128i lo = _mm_and_si128(q, m), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
    if constexpr (I::k5) {  // the fifth bits (u32 before the nibbles)
      uint32_t qh;
      std::memcpy(&qh, b + I::kQsOff - 4, 4);
      const __m128i x10 = _mm_set1_epi8(0x10);
      lo = _mm_or_si128(lo, _mm_maskz_mov_epi8((__mmask16)(qh & 0xffff), x10));
      hi = _mm_or_si128(hi, _mm_maskz_mov_epi8((__mmask16)(qh >> 16), x10));
    }
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
  }
}

// nr (1-16) rows from w (stride rb), all nb blocks, into g[0..nb); rows from nr on hold zero codes and
// scales. Per block: the 16 rows' codes as 8 zmm z[a] = [row a | row a + 4] (a < 4) or [row a + 4 |
// row a + 8] (a >= 4), then an 8 x 8 dword transpose in each 256-bit half (unpack 32, unpack 64) whose
// last step, a lane shuffle across the halves, also puts the rows in lane order 0..15.
// Q4_K: the rows' 8 sub-block scales (and mins) of a 256-block are decoded at its first sub-block.
template <DType T>
void UnpackGroup(const uint8_t* w, size_t rb, int nr, int64_t nb, Group16* g) {
  using I = QT<T>;
  alignas(64) static const uint8_t kZeros[192] = {};  // one block of zero codes and scales, for rows >= nr
  const uint8_t* rp[16];
  size_t st[16];
  for (int r = 0; r < 16; ++r) {
    rp[r] = r < nr ? w + r * rb : kZeros;
    st[r] = r < nr ? I::kBytes : 0;
  }
  alignas(64) float kdw[8][16] = {}, kcw[8][16] = {};
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32((int)rb));
  const __mmask16 live = Mask16(nr);
  for (int64_t j = 0; j < nb; ++j) {
    const auto codes = [&](int r) {
      if constexpr (I::kK) {
        return avx2::KCodes<T>(rp[r] + j / 8 * st[r], (int)(j % 8));
      } else {
        return RowCodes<T>(rp[r] + j * st[r]);
      }
    };
    const auto pair = [&](int r0, int r1) {
      return _mm512_inserti64x4(_mm512_castsi256_si512(codes(r0)), codes(r1), 1);
    };
    const auto transpose_half = [&](__m512i z0, __m512i z1, __m512i z2, __m512i z3, __m512i* a) {
      const __m512i l0 = _mm512_unpacklo_epi32(z0, z1), h0 = _mm512_unpackhi_epi32(z0, z1);
      const __m512i l1 = _mm512_unpacklo_epi32(z2, z3), h1 = _mm512_unpackhi_epi32(z2, z3);
      // a[k]'s 128-bit lanes: rows 0-3 of the half at dword k, at dword k + 4, rows 4-7 at k, at k + 4.
      a[0] = _mm512_unpacklo_epi64(l0, l1);
      a[1] = _mm512_unpackhi_epi64(l0, l1);
      a[2] = _mm512_unpacklo_epi64(h0, h1);
      a[3] = _mm512_unpackhi_epi64(h0, h1);
    };
    __m512i a0[4], a1[4];
    transpose_half(pair(0, 4), pair(1, 5), pair(2, 6), pair(3, 7), a0);
    transpose_half(pair(8, 12), pair(9, 13), pair(10, 14), pair(11, 15), a1);
    Group16& gb = g[j];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      __m512i lo = _mm512_shuffle_i32x4(a0[k], a1[k], _MM_SHUFFLE(2, 0, 2, 0));
      __m512i hi = _mm512_shuffle_i32x4(a0[k], a1[k], _MM_SHUFFLE(3, 1, 3, 1));
      if constexpr (I::kQ8) lo = _mm512_xor_si512(lo, flip), hi = _mm512_xor_si512(hi, flip);
      _mm512_store_si512(gb.u[k], lo);
      _mm512_store_si512(gb.u[k + 4], hi);
    }
    if constexpr (I::kK) {
      if (j % 8 == 0) {
        for (int r = 0; r < nr; ++r) {
          float dw[8], cw[8];
          avx2::KSubScales(rp[r] + j / 8 * st[r], dw, cw);
          for (int e = 0; e < 8; ++e) kdw[e][r] = dw[e], kcw[e][r] = cw[e];
        }
      }
      _mm512_store_ps(gb.dw, _mm512_load_ps(kdw[j % 8]));
      _mm512_store_ps(gb.cw, _mm512_load_ps(kcw[j % 8]));
    } else {
      const __m512i s = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, idx, w + j * I::kBytes, 1);
      const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(s));
      _mm512_store_ps(gb.dw, dw);
      _mm512_store_ps(gb.cw, I::kMin ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(s, 16))) : dw);
    }
  }
}

// dot[c][i][g] += the 32 products of block j's weight codes with the S code streams codes(c, i) (c < S; 8 vpdpbusd
// each), all off the same weight vectors: int8 x one stream, int16 x its hi and lo bytes (half the weight loads of
// two passes and twice the independent chains: ~10% faster on the Xeon, alternated).
template <int S, int MR, int NG, class Codes>
inline void BlockDots(const Group16* const* gb, int64_t j, Codes codes, __m512i (&dot)[S][MR][NG]) {
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    __m512i wv[NG];
#pragma GCC unroll 2
    for (int g = 0; g < NG; ++g) wv[g] = _mm512_load_si512(gb[g][j].u[k]);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
      for (int c = 0; c < S; ++c) {
        int32_t xd;
        std::memcpy(&xd, codes(c, i) + 4 * k, 4);
        const __m512i xv = _mm512_set1_epi32(xd);
#pragma GCC unroll 2
        for (int g = 0; g < NG; ++g) dot[c][i][g] = _mm512_dpbusd_epi32(dot[c][i][g], wv[g], xv);
      }
    }
  }
}

// y for MR x rows and NG groups of 16 weight rows over all nb blocks; `last` masks the stored lanes of
// the last group. XB = BlockQ8X (int8 x; xstart, Q8_0 only: per (x row, block) -128 * the sum of x's codes)
// or BlockQ16X (int16 x codes c = 256 hi + lo: the hi and the lo bytes' products in two chains, the lo one
// starting at Q8_0's -128 * csum, T = (hi sum << 8) + lo sum: the exact int32 T of one pass over c, |T| < 2^28).
template <DType T, int MR, int NG, class XB>
void Tile(const Group16* const* gb, const XB* x, const int32_t* xstart, int64_t nb, float* y, int64_t ldy,
          __mmask16 last) {
  using I = QT<T>;
  constexpr bool kX16 = std::is_same_v<XB, BlockQ16X>;
  __m512 acc[MR][NG], corr[MR][NG];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int g = 0; g < NG; ++g) acc[i][g] = corr[i][g] = _mm512_setzero_ps();
  for (int64_t j = 0; j < nb; ++j) {
    // kX16: stream 0 the hi bytes from 0, stream 1 the lo bytes from Q8_0's start; T = (hi << 8) + lo.
    constexpr int S = kX16 ? 2 : 1;
    __m512i ds[S][MR][NG];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      int32_t start = 0;
      if constexpr (kX16) {
        if constexpr (I::kQ8) start = -128 * x[i * nb + j].csum;
      } else {
        if constexpr (I::kQ8) start = xstart[i * nb + j];
      }
#pragma GCC unroll 2
      for (int g = 0; g < NG; ++g) {
        ds[0][i][g] = kX16 ? _mm512_setzero_si512() : _mm512_set1_epi32(start);
        if constexpr (kX16) ds[S - 1][i][g] = _mm512_set1_epi32(start);
      }
    }
    BlockDots<S, MR, NG>(gb, j, [&](int c, int i) -> const int8_t* {
      if constexpr (kX16) {
        return c == 0 ? x[i * nb + j].hi : x[i * nb + j].lo;
      } else {
        return x[i * nb + j].qs;
      }
    }, ds);
    __m512i dot[MR][NG];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
      for (int g = 0; g < NG; ++g)
        dot[i][g] = kX16 ? _mm512_add_epi32(_mm512_slli_epi32(ds[0][i][g], 8), ds[S - 1][i][g]) : ds[0][i][g];
    __m512 dw[NG], cw[NG];
#pragma GCC unroll 2
    for (int g = 0; g < NG; ++g) {
      dw[g] = _mm512_load_ps(gb[g][j].dw);
      cw[g] = I::kMin ? _mm512_load_ps(gb[g][j].cw) : dw[g];
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const XB& xb = x[i * nb + j];
      const __m512 dx = _mm512_set1_ps(xb.d);
#pragma GCC unroll 2
      for (int g = 0; g < NG; ++g) {
        acc[i][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][g]), _mm512_mul_ps(dw[g], dx), acc[i][g]);
        if constexpr (!I::kQ8) corr[i][g] = _mm512_fmadd_ps(cw[g], _mm512_set1_ps(xb.s), corr[i][g]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int g = 0; g < NG; ++g) {
      __m512 v = acc[i][g];
      if constexpr (!I::kQ8) v = _mm512_add_ps(v, _mm512_mul_ps(corr[i][g], _mm512_set1_ps(I::kCorr)));
      _mm512_mask_storeu_ps(y + i * ldy + 16 * g, g == NG - 1 ? last : (__mmask16)0xffff, v);
    }
}

// x rows per tile: the Q4 / Q5 offset accumulators take registers the Q8_0 tile spends on rows.
template <DType T>
constexpr int kMR = T == DType::kQ8_0 ? 4 : 3;

// The rows of the next pass (pf, pf_bytes) are prefetched a share before each tile, so the misses spread
// over the pass instead of queueing up in one burst.
template <DType T, int NG, class XB, int MR = kMR<T>>
void Tiles(const Group16* const* gb, const XB* x, const int32_t* xstart, int64_t m, int64_t nb, float* y,
           int64_t ldy, __mmask16 last, const char* pf, size_t pf_bytes) {
  const auto start = [&](int64_t i0) { return xstart ? xstart + i0 * nb : nullptr; };
  const int64_t n_tiles = (m + MR - 1) / MR;
  const size_t share = n_tiles > 0 ? (pf_bytes / (size_t)n_tiles + 64) & ~(size_t)63 : 0;
  size_t done = 0;
  int64_t i0 = 0;
  for (; i0 + MR <= m; i0 += MR) {
    for (const size_t e = std::min(pf_bytes, done + share); done < e; done += 64) _mm_prefetch(pf + done, _MM_HINT_T0);
    Tile<T, MR, NG, XB>(gb, x + i0 * nb, start(i0), nb, y + i0 * ldy, ldy, last);
  }
  if constexpr (MR > 1) {
    if (m > i0)
      Tiles<T, NG, XB, MR - 1>(gb, x + i0 * nb, start(i0), m - i0, nb, y + i0 * ldy, ldy, last, pf + done,
                               pf_bytes - done);
  } else {
    for (; done < pf_bytes; done += 64) _mm_prefetch(pf + done, _MM_HINT_T0);
  }
}

constexpr int kGroupRows = 32;  // two groups of 16 rows per pass over the x rows
constexpr int64_t kPrefetchPasses = 1;  // how many passes ahead the raw rows are prefetched

// Every run's x rows over each pass of kGroupRows weight rows, unpacked once for all of them.
template <DType T>
void QGemmRunsT(const uint8_t* w, size_t rb, int64_t n_rows, const QRun* runs, int n_runs, int64_t K) {
  const int64_t nb = K / 32;
  static thread_local std::vector<Group16> blocks_buf;
  static thread_local std::vector<int32_t> start_buf;
  Group16* blocks = Scratch(blocks_buf, (size_t)(2 * nb));
  // Q8_0 int8 runs without their starts: computed here, once per call.
  int64_t start_rows = 0;
  for (int r = 0; r < n_runs; ++r)
    if (T == DType::kQ8_0 && runs[r].x8 && !runs[r].xstart8) start_rows += runs[r].m;
  int32_t* own_starts = start_rows ? Scratch(start_buf, (size_t)(start_rows * nb)) : nullptr;
  const int32_t* starts[kMaxQRuns] = {};
  int64_t m_total = 0;
  LATHE_CHECK(n_runs <= kMaxQRuns);
  for (int r = 0, o = 0; r < n_runs; ++r) {
    m_total += runs[r].m;
    if (T != DType::kQ8_0 || !runs[r].x8) continue;
    if (runs[r].xstart8) {
      starts[r] = runs[r].xstart8;
    } else {
      XStarts(runs[r].x8, runs[r].m * nb, own_starts + o * nb);
      starts[r] = own_starts + o * nb;
      o += (int)runs[r].m;
    }
  }
  const Group16* gb[2] = {blocks, blocks + nb};
  for (int64_t r0 = 0; r0 < n_rows; r0 += kGroupRows) {
    const int nr = (int)std::min<int64_t>(kGroupRows, n_rows - r0);
    const int64_t next = r0 + kPrefetchPasses * kGroupRows;
    const char* pf = (const char*)(w + next * rb);
    // In whole lines (the shares in Tiles are too), so the shares end exactly at pf_bytes; the runs take
    // parts in proportion to their rows, the last one the rest.
    const size_t pf_bytes =
        next < n_rows ? ((size_t)std::min<int64_t>(kGroupRows, n_rows - next) * rb + 63) & ~(size_t)63 : 0;
    UnpackGroup<T>(w + r0 * rb, rb, std::min(nr, 16), nb, blocks);
    if (nr > 16) UnpackGroup<T>(w + (r0 + 16) * rb, rb, nr - 16, nb, blocks + nb);
    size_t pf_done = 0;
    int64_t m_done = 0;
    for (int r = 0; r < n_runs; ++r) {
      const QRun& q = runs[r];
      m_done += q.m;
      const size_t pf_end = r == n_runs - 1 ? pf_bytes : (pf_bytes * (size_t)m_done / (size_t)m_total) & ~(size_t)63;
      const char* p = pf + pf_done;
      const size_t pb = pf_end - pf_done;
      pf_done = pf_end;
      float* y = q.y + r0;
      if (q.x16) {
        if (nr > 16) Tiles<T, 2, BlockQ16X>(gb, q.x16, nullptr, q.m, nb, y, q.ldy, Mask16(nr - 16), p, pb);
        else Tiles<T, 1, BlockQ16X>(gb, q.x16, nullptr, q.m, nb, y, q.ldy, Mask16(nr), p, pb);
      } else {
        if (nr > 16) Tiles<T, 2, BlockQ8X>(gb, q.x8, starts[r], q.m, nb, y, q.ldy, Mask16(nr - 16), p, pb);
        else Tiles<T, 1, BlockQ8X>(gb, q.x8, starts[r], q.m, nb, y, q.ldy, Mask16(nr), p, pb);
      }
    }
  }
}

}  // namespace

// Q8_0's dot start per (x row, block): -128 * the sum of x's int8 codes (the weights enter as q + 128).
void XStarts(const BlockQ8X* x, int64_t n, int32_t* out) {
  const __m256i x80 = _mm256_set1_epi8((char)0x80);
  for (int64_t i = 0; i < n; ++i) {
    const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), x80, _mm256_loadu_si256((const __m256i*)x[i].qs));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(1, 0, 3, 2)));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, _MM_SHUFFLE(2, 3, 0, 1)));
    out[i] = -_mm_cvtsi128_si32(t);
  }
}

void QGemmRuns(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const QRun* runs, int n_runs, int64_t K) {
  LATHE_CHECK(K % 32 == 0);
  if (IsKQuant(t))  // int16 runs only (MatMulRowsWith)
    for (int r = 0; r < n_runs; ++r) LATHE_CHECK(runs[r].x16);
  avx2::WithInt16Type(t, K, "QGemmRuns",
                      [&](auto T) { QGemmRunsT<decltype(T)::value>(w, rb, n_rows, runs, n_runs, K); });
}

void QGemm(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t m, int64_t K, float* y,
           int64_t ldy) {
  LATHE_CHECK(n_rows % 4 == 0);
  QRun run;
  run.x8 = x;
  run.m = m;
  run.y = y;
  run.ldy = ldy;
  QGemmRuns(t, w, rb, n_rows, &run, 1, K);
}

// MatMulKernels::quantize_x16: per block d = amax / 32639, c = round-to-even(x / d) (x * (32639 / amax), the
// same rounding as the int8 quantizer), clamped to +-32639, split into hi / lo bytes.
void QuantizeX16(const float* x, int64_t K, BlockQ16X* out) {
  const __m512i lim = _mm512_set1_epi32(kQ16Max), x80 = _mm512_set1_epi32(128), xff = _mm512_set1_epi32(255);
  for (int64_t j = 0; j < K / 32; ++j) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * j), v1 = _mm512_loadu_ps(x + 32 * j + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / (float)kQ16Max, id = amax > 0 ? (float)kQ16Max / amax : 0.0f;
    const __m512 mul = _mm512_set1_ps(id);
    BlockQ16X& b = out[j];
    __m512i sum = _mm512_setzero_si512();
    const auto half = [&](__m512 v, int o) {
      __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(v, mul));  // MXCSR's round to nearest even
      c = _mm512_max_epi32(_mm512_min_epi32(c, lim), _mm512_sub_epi32(_mm512_setzero_si512(), lim));
      sum = _mm512_add_epi32(sum, c);
      const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(c, x80), xff), x80);
      const __m512i hi = _mm512_srai_epi32(_mm512_sub_epi32(c, lo), 8);
      _mm_storeu_si128((__m128i*)(b.lo + o), _mm512_cvtepi32_epi8(lo));
      _mm_storeu_si128((__m128i*)(b.hi + o), _mm512_cvtepi32_epi8(hi));
    };
    half(v0, 0);
    half(v1, 16);
    b.csum = _mm512_reduce_add_epi32(sum);
    b.d = d;
    b.s = d * (float)b.csum;
    b.pad = 0;
  }
}

}  // namespace lathe::kernels::cpu::avx512
