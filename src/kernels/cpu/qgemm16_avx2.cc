// AVX2 int16 GEMM for the prompt rows of block-quantized weights (Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q4_K /
// Q5_K): the AVX2 tier's MatMulKernels::qgemm_runs and quantize_x16.
//
// The arithmetic is the AVX-512 tier's int16 rows' (qgemm_avx512.cc), bit for bit: per (x row, weight row) and
// 32-element block j the exact int32 dot T of the weight codes (q for Q8_0, the 4- / 5-bit codes for Q4 / Q5,
// the sub-block's codes for Q4_K / Q5_K) and x's int16 codes c, then in block order acc = fma(float(T), dw * dx,
// acc) and corr = fma(cw, sx, corr); y = acc (Q8_0) or acc + corr * kCorr.
//
// Where the AVX-512 tier feeds c to vpdpbusd as two int8 halves, here c stays int16 (BlockQ16X::c, this file's
// quantizer) and the weight codes are widened to int16 once per pass of weight rows: vpmaddwd multiplies 16
// int16 pairs into 8 int32 lanes, so one instruction and its vpaddd add 16 products where an f32 FMA adds 8 (on
// Zen 3, measured alone: 8 vpmaddwd + 8 vpaddd in 1.3-1.4x the time of 8 FMAs, i.e. 1.4-1.5x the multiply-adds
// of the f32 path the prompt rows took on this tier before). Exact: |c| <= 32639 and |code| <= 128, so a lane's
// pair is below 2^24 and a block's 16 pairs below 2^28.
//
// Layout: 8 weight rows per ymm, one int32 lane a row. A block of 8 rows is unpacked into 16 ymm, ymm k
// holding elements 2k and 2k + 1 of every row as two int16 (an 8 x 8 dword transpose of each half of the
// widened codes); x's dword k (codes 2k, 2k + 1) is broadcast, so 16 vpmaddwd + 16 vpaddd form T for 8 rows.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/scratch.h"

namespace lathe::kernels::cpu::avx2 {

namespace {

// One block of 8 weight rows: p[k] = elements 2k, 2k + 1 of row r in dword r (int16 codes); dw / cw: each
// row's scale and offset factor (cw = dw where the type has no min).
struct alignas(32) Group8 {
  int32_t p[16][8];
  float dw[8];
  float cw[8];
};

// A block's 32 codes widened to int16: lo = elements 0-15, hi = 16-31 (Q8_0 signed, the others unsigned).
template <DType T>
inline void RowCodes16(const uint8_t* b, int sub, __m256i* lo, __m256i* hi) {
  using I = Int16Block<T>;
  if constexpr (I::kK) {
    const __m256i q = KCodes<T>(b, sub);
    *lo = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(q));
    *hi = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1));
  } else if constexpr (I::kQ8) {
    *lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + I::kQsOff)));
    *hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + I::kQsOff + 16)));
  } else {
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m128i q = _mm_loadu_si128((const __m128i*)(b + I::kQsOff));
    __m128i l = _mm_and_si128(q, m), h = _mm_and_si128(_mm_srli_epi16(q, 4), m);
    if constexpr (I::k5) {  // the fifth bits (u32 before the nibbles)
      __m128i h0, h1;
      FifthBits(b + I::kQsOff - 4, &h0, &h1);
      l = _mm_or_si128(l, h0);
      h = _mm_or_si128(h, h1);
    }
    *lo = _mm256_cvtepu8_epi16(l);
    *hi = _mm256_cvtepu8_epi16(h);
  }
}

// out[k] = dword k of every r[i] (lane i): an 8 x 8 dword transpose.
inline void Transpose8(const __m256i* r, __m256i* out) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 4h..4h+3: u[4h + d] holds dwords d (low lane) and d + 4 (high lane)
    u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
  }
  for (int d = 0; d < 4; ++d) {
    out[d] = _mm256_permute2x128_si256(u[d], u[4 + d], 0x20);
    out[d + 4] = _mm256_permute2x128_si256(u[d], u[4 + d], 0x31);
  }
}

// nr (1-8) rows from w (stride rb), all nb blocks, into g[0..nb); rows from nr on hold zero codes and scales.
template <DType T>
void UnpackGroup(const uint8_t* w, size_t rb, int nr, int64_t nb, Group8* g) {
  using I = Int16Block<T>;
  float kdw[8][8] = {}, kcw[8][8] = {};  // Q4_K / Q5_K: [sub-block][row] of the current 256-block
  for (int64_t j = 0; j < nb; ++j) {
    Group8& gb = g[j];
    __m256i lo[8], hi[8];
    for (int r = 0; r < 8; ++r) {
      if (r >= nr) {
        lo[r] = hi[r] = _mm256_setzero_si256();
        continue;
      }
      const uint8_t* rp = w + r * rb;
      if constexpr (I::kK) {
        RowCodes16<T>(rp + j / 8 * I::kBytes, (int)(j % 8), &lo[r], &hi[r]);
      } else {
        RowCodes16<T>(rp + j * I::kBytes, 0, &lo[r], &hi[r]);
      }
    }
    Transpose8(lo, (__m256i*)gb.p[0]);
    Transpose8(hi, (__m256i*)gb.p[8]);
    for (int r = 0; r < 8; ++r) {
      if (r >= nr) {
        gb.dw[r] = gb.cw[r] = 0.0f;
        continue;
      }
      const uint8_t* rp = w + r * rb;
      if constexpr (I::kK) {
        if (j % 8 == 0) {
          float dw[8], cw[8];
          KSubScales(rp + j / 8 * I::kBytes, dw, cw);
          for (int e = 0; e < 8; ++e) kdw[e][r] = dw[e], kcw[e][r] = cw[e];
        }
        gb.dw[r] = kdw[j % 8][r];
        gb.cw[r] = kcw[j % 8][r];
      } else {
        uint16_t h[2];
        std::memcpy(h, rp + j * I::kBytes, 4);
        gb.dw[r] = _cvtsh_ss(h[0]);
        gb.cw[r] = I::kMin ? _cvtsh_ss(h[1]) : gb.dw[r];
      }
    }
  }
}

// y for MR x rows and NG groups of 8 weight rows over all nb blocks; the last group stores `last` lanes.
// The block sums stay in registers through a block's 16 pairs; the float accumulators live in memory (one
// load and store per block), and the Q4 / Q5 offset term runs in its own pass over the blocks (the same fma
// sequence per element as in the block loop, so the same bits).
template <DType T, int MR, int NG>
void Tile(const Group8* const* gb, const BlockQ16X* x, int64_t nb, float* y, int64_t ldy, int last) {
  using I = Int16Block<T>;
  alignas(32) float acc[MR][NG][8] = {};
  for (int64_t j = 0; j < nb; ++j) {
    __m256i dot[MR][NG];  // pair 0's products start the sums
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) {
      __m256i wv[NG];
#pragma GCC unroll 2
      for (int g = 0; g < NG; ++g) wv[g] = _mm256_load_si256((const __m256i*)gb[g][j].p[k]);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        int32_t xd;
        std::memcpy(&xd, x[i * nb + j].c + 2 * k, 4);
        const __m256i xv = _mm256_set1_epi32(xd);
#pragma GCC unroll 2
        for (int g = 0; g < NG; ++g) {
          const __m256i p = _mm256_madd_epi16(wv[g], xv);
          dot[i][g] = k == 0 ? p : _mm256_add_epi32(dot[i][g], p);
          // Keeps each sum one chain in a register: left alone, GCC reassociates the 16 adds into a tree and
          // spills every vpmaddwd result to the stack first (measured 0.6x the f32 path's rate).
          __asm__("" : "+x"(dot[i][g]));
        }
      }
    }
#pragma GCC unroll 2
    for (int g = 0; g < NG; ++g) {
      const __m256 dw = _mm256_load_ps(gb[g][j].dw);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m256 ds = _mm256_mul_ps(dw, _mm256_set1_ps(x[i * nb + j].d));
        _mm256_store_ps(acc[i][g], _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i][g]), ds, _mm256_load_ps(acc[i][g])));
      }
    }
  }
  __m256 out[MR][NG];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int g = 0; g < NG; ++g) out[i][g] = _mm256_load_ps(acc[i][g]);
  if constexpr (!I::kQ8) {
    __m256 corr[MR][NG];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
      for (int g = 0; g < NG; ++g) corr[i][g] = _mm256_setzero_ps();
    for (int64_t j = 0; j < nb; ++j)
#pragma GCC unroll 2
      for (int g = 0; g < NG; ++g) {
        const __m256 cw = _mm256_load_ps(gb[g][j].cw);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) corr[i][g] = _mm256_fmadd_ps(cw, _mm256_set1_ps(x[i * nb + j].s), corr[i][g]);
      }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
      for (int g = 0; g < NG; ++g)
        out[i][g] = _mm256_add_ps(out[i][g], _mm256_mul_ps(corr[i][g], _mm256_set1_ps(I::kCorr)));
  }
  const __m256i mask = TailMask(last);
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int g = 0; g < NG; ++g) {
      if (g == NG - 1 && last < 8) {
        _mm256_maskstore_ps(y + i * ldy + 8 * g, mask, out[i][g]);
      } else {
        _mm256_storeu_ps(y + i * ldy + 8 * g, out[i][g]);
      }
    }
}

constexpr int kMR = 4;         // x rows per tile
constexpr int kGroupRows = 16;  // two groups of 8 weight rows per pass over the x rows

template <DType T, int NG, int MR = kMR>
void Tiles(const Group8* const* gb, const BlockQ16X* x, int64_t m, int64_t nb, float* y, int64_t ldy, int last) {
  int64_t i0 = 0;
  for (; i0 + MR <= m; i0 += MR) Tile<T, MR, NG>(gb, x + i0 * nb, nb, y + i0 * ldy, ldy, last);
  if constexpr (MR > 1) {
    if (m > i0) Tiles<T, NG, MR - 1>(gb, x + i0 * nb, m - i0, nb, y + i0 * ldy, ldy, last);
  }
}

// Every int16 run's x rows over each pass of kGroupRows weight rows, unpacked once for all of them; the next
// pass's raw rows are prefetched while this one runs.
template <DType T>
void QGemm16T(const uint8_t* w, size_t rb, int64_t n_rows, const QRun* runs, int n_runs, int64_t K) {
  const int64_t nb = K / 32;
  static thread_local std::vector<Group8> blocks_buf;
  Group8* blocks = Scratch(blocks_buf, (size_t)(2 * nb));
  const Group8* gb[2] = {blocks, blocks + nb};
  for (int64_t r0 = 0; r0 < n_rows; r0 += kGroupRows) {
    const int nr = (int)std::min<int64_t>(kGroupRows, n_rows - r0);
    const int64_t next = r0 + kGroupRows;
    if (next < n_rows) {
      const char* pf = (const char*)(w + next * rb);
      const size_t bytes = (size_t)std::min<int64_t>(kGroupRows, n_rows - next) * rb;
      for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(pf + o, _MM_HINT_T1);
    }
    UnpackGroup<T>(w + r0 * rb, rb, std::min(nr, 8), nb, blocks);
    if (nr > 8) UnpackGroup<T>(w + (r0 + 8) * rb, rb, nr - 8, nb, blocks + nb);
    for (int r = 0; r < n_runs; ++r) {
      const QRun& q = runs[r];
      if (!q.x16) continue;
      if (nr > 8) {
        Tiles<T, 2>(gb, q.x16, q.m, nb, q.y + r0, q.ldy, nr - 8);
      } else {
        Tiles<T, 1>(gb, q.x16, q.m, nb, q.y + r0, q.ldy, nr);
      }
    }
  }
}

}  // namespace

template <bool kSplit>
void QGemmRuns(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const QRun* runs, int n_runs, int64_t K) {
  LATHE_CHECK(K % 32 == 0 && n_runs <= kMaxQRuns);
  bool any16 = false;
  for (int r = 0; r < n_runs; ++r) {
    if (runs[r].x16) {
      any16 = true;
    } else {  // int8 rows: the tier's int8 GEMM, a pass of its own
      LATHE_CHECK(n_rows % 4 == 0 && !IsKQuant(t));
      QGemm<kSplit>(t, w, rb, n_rows, runs[r].x8, runs[r].m, K, runs[r].y, runs[r].ldy);
    }
  }
  if (!any16) return;
  WithInt16Type(t, K, "QGemmRuns", [&](auto T) { QGemm16T<decltype(T)::value>(w, rb, n_rows, runs, n_runs, K); });
}

template void QGemmRuns<true>(DType, const uint8_t*, size_t, int64_t, const QRun*, int, int64_t);
template void QGemmRuns<false>(DType, const uint8_t*, size_t, int64_t, const QRun*, int, int64_t);

// MatMulKernels::quantize_x16: the AVX-512 quantizer's codes (d = amax / 32639, c = round-to-even(x * (32639 /
// amax)) clamped to +-32639), stored as int16.
void QuantizeX16(const float* x, int64_t K, BlockQ16X* out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i lim = _mm256_set1_epi32(kQ16Max), nlim = _mm256_set1_epi32(-kQ16Max);
  for (int64_t j = 0; j < K / 32; ++j) {
    __m256 v[4];
    for (int q = 0; q < 4; ++q) v[q] = _mm256_loadu_ps(x + 32 * j + 8 * q);
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                                   _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
    const float amax = HmaxPs(m);
    const float d = amax / (float)kQ16Max, id = amax > 0 ? (float)kQ16Max / amax : 0.0f;
    const __m256 mul = _mm256_set1_ps(id);
    __m256i c[4], sum = _mm256_setzero_si256();
    for (int q = 0; q < 4; ++q) {
      c[q] = _mm256_cvtps_epi32(_mm256_mul_ps(v[q], mul));  // MXCSR's round to nearest even
      c[q] = _mm256_max_epi32(_mm256_min_epi32(c[q], lim), nlim);
      sum = _mm256_add_epi32(sum, c[q]);
    }
    BlockQ16X& b = out[j];
    // packs interleaves 128-bit lanes ([a 0-3, b 0-3, a 4-7, b 4-7]); the permute puts them in element order.
    _mm256_storeu_si256((__m256i*)b.c, _mm256_permute4x64_epi64(_mm256_packs_epi32(c[0], c[1]), 0xd8));
    _mm256_storeu_si256((__m256i*)(b.c + 16), _mm256_permute4x64_epi64(_mm256_packs_epi32(c[2], c[3]), 0xd8));
    b.csum = HsumEpi32(sum);
    b.d = d;
    b.s = d * (float)b.csum;
    b.pad = 0;
  }
}

}  // namespace lathe::kernels::cpu::avx2
