// bf16 pairs on vdpbf16ps (avx512_bf16): the register tile and the operand conversions shared by the
// files built for it (bf16dot_avx512bf16.cc, train_attention_avx512bf16.cc). Internal linkage: include
// only from *_avx512bf16.cc files. A operands are row-major pairs (element pair (2p, 2p + 1) of row i at
// a[i * lda + p], lower element in the low half); B operands are 16-column pair strips (strip s's pair p at
// b + s * sstride + p * 16, one dword per column).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/avx512_transpose.h"
#include "kernels/cpu/scratch.h"

namespace lathe::kernels::cpu::avx512bf16 {
namespace {

constexpr int kS = 3;            // strips per register tile
constexpr int kR = 8;            // A rows per register tile

// R A rows against S strips, np pairs: per (row, strip) 16 chains from zero, stored (store) or added to C; the
// last strip's columns past nc_last left alone.
// - kFma = false (TileFor): A as pairs (uint32_t, lda dwords), one vdpbf16ps per pair.
// - kFma = true (TileFmaFor): the same chains on f32 FMAs, for CPUs where one vdpbf16ps (32 multiply-adds) takes
//   longer than two FMAs (Bf16PairsOnFma: Intel's cores run it at half the FMA rate). A as floats holding its
//   bf16 values in element order (pair p of row r at a[r * lda + 2p], a[r * lda + 2p + 1]: WidenPairs), each B
//   pair dword split into its two bf16 values (the high half masked, the low half shifted up); per lane
//   acc = fma(a_odd, b_odd, acc), then fma(a_even, b_even, acc). The products are exact in f32, so each step
//   rounds as vdpbf16ps's adds do (odd element first, as Intel documents it): the vdpbf16ps form's bits, except where a
//   product or partial sum is an f32 denormal, which vdpbf16ps flushes to zero.
template <int R, int S, bool kFma, typename A>
void TileT(const A* a, int64_t lda, const uint32_t* b, int64_t sstride, int64_t np, float* c, int64_t ldc, bool store,
           int nc_last) {
  __m512 acc[R][S];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) acc[r][s] = _mm512_setzero_ps();
  // C's lines are fetched while the products run: an accumulated C (a weight gradient) is usually in DRAM.
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) _mm_prefetch((const char*)(c + r * ldc + 16 * s), _MM_HINT_T0);
    _mm_prefetch((const char*)(c + r * ldc + 16 * S - 1), _MM_HINT_T0);
  }
  [[maybe_unused]] const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
  for (int64_t p = 0; p < np; ++p) {
    if constexpr (kFma) {
      __m512 bo[S], be[S];
#pragma GCC unroll 16
      for (int s = 0; s < S; ++s) {
        const __m512i bv = _mm512_loadu_si512(b + s * sstride + p * 16);
        bo[s] = _mm512_castsi512_ps(_mm512_and_si512(bv, hi));
        be[s] = _mm512_castsi512_ps(_mm512_slli_epi32(bv, 16));
      }
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512 ao = _mm512_set1_ps(a[r * lda + 2 * p + 1]), ae = _mm512_set1_ps(a[r * lda + 2 * p]);
#pragma GCC unroll 16
        for (int s = 0; s < S; ++s) acc[r][s] = _mm512_fmadd_ps(ae, be[s], _mm512_fmadd_ps(ao, bo[s], acc[r][s]));
      }
    } else {
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
using TileFmaFn = void (*)(const float*, int64_t, const uint32_t*, int64_t, int64_t, float*, int64_t, bool, int);

// TileT for r rows (1..8) and s strips (1..3).
template <bool kFma, int R>
auto TileTFor(int s) {
  using A = std::conditional_t<kFma, float, uint32_t>;
  switch (s) {
    case 1: return &TileT<R, 1, kFma, A>;
    case 2: return &TileT<R, 2, kFma, A>;
    default: return &TileT<R, 3, kFma, A>;
  }
}

template <bool kFma>
auto TileTFor(int r, int s) {
  switch (r) {
    case 1: return TileTFor<kFma, 1>(s);
    case 2: return TileTFor<kFma, 2>(s);
    case 3: return TileTFor<kFma, 3>(s);
    case 4: return TileTFor<kFma, 4>(s);
    case 5: return TileTFor<kFma, 5>(s);
    case 6: return TileTFor<kFma, 6>(s);
    case 7: return TileTFor<kFma, 7>(s);
    default: return TileTFor<kFma, 8>(s);
  }
}

inline TileFn TileFor(int r, int s) { return TileTFor<false>(r, s); }
inline TileFmaFn TileFmaFor(int r, int s) { return TileTFor<true>(r, s); }

// Rows of pairs (R rows, lda dwords apart, Lp pairs each) -> the FMA tile's A: each bf16 value as a float, 2 Lp per
// row (ldo floats apart), in element order. Exact.
inline void WidenPairs(const uint32_t* a, int64_t lda, int64_t R, int64_t Lp, float* out, int64_t ldo) {
  for (int64_t i = 0; i < R; ++i) {
    const uint16_t* src = (const uint16_t*)(a + i * lda);
    float* o = out + i * ldo;
    const int64_t n = 2 * Lp;
    int64_t l = 0;
    for (; l + 16 <= n; l += 16) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)(src + l));
      _mm512_storeu_si512(o + l, _mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
    }
    if (l < n) {
      const __mmask16 m = (__mmask16)((1u << (n - l)) - 1);
      const __m256i v = _mm256_maskz_loadu_epi16(m, src + l);
      _mm512_mask_storeu_ps(o + l, m, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)));
    }
  }
}

// 16 f32 (bf16 values) -> 16 bf16, exact.
inline __m256i Bf16Of(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

// One row of L floats -> L bf16 (cvtneps, the tail masked), plus a 0 after an odd L: the row as (L + 1) / 2
// pairs. Every f32 -> bf16 conversion of this file is vcvtneps2bf16 (Bf16Of) or vcvtne2ps2bf16 (PairOf,
// StripOfRowsT): the same RNE.
// pf (optional): the next row to be converted, fetched line by line alongside (a W read from DRAM).
inline void RowToPairs(const float* a, int64_t L, uint16_t* o, const float* pf = nullptr) {
  int64_t l = 0;
  for (; l + 16 <= L; l += 16) {
    if (pf) _mm_prefetch((const char*)(pf + l), _MM_HINT_T0);
    _mm256_storeu_si256((__m256i*)(o + l), Bf16Of(_mm512_loadu_ps(a + l)));
  }
  if (l < L) {
    const __mmask16 m = (__mmask16)((1u << (L - l)) - 1);
    _mm256_mask_storeu_epi16(o + l, m, Bf16Of(_mm512_maskz_loadu_ps(m, a + l)));
  }
  if (L & 1) o[L] = 0;
}

// A's rows l-contiguous (x, dy: a[i * lda + l]) -> out[i * Lp + p] = pair (2p, 2p + 1) of row i.
// ldo: the output's row stride in dwords (0: (L + 1) / 2, the rows packed back to back).
inline void PairRows(ThreadPool& pool, const float* a, int64_t lda, int64_t R, int64_t L, uint32_t* out,
                     int64_t ldo = 0) {
  const int64_t Lp = ldo > 0 ? ldo : (L + 1) / 2;
  pool.ParallelFor(R, 16, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) RowToPairs(a + i * lda, L, (uint16_t*)(out + i * Lp));
  }, 2.0 * R * L);
}

// The AMX A operand's tile order (bf16_amx.h, TileRows), written by the packers below where the products run on AMX
// (no per-task copy): row i's pairs 16 s .. 16 s + 15 at TiledRow(out, qs, i, s), qs dwords between row pairs
// (TiledStride(Lp): ceil(Lp / 16) steps of 512 dwords), each step's pairs past the row's last one zero.
inline int64_t TiledStride(int64_t Lp) { return (Lp + 15) / 16 * 512; }
inline uint32_t* TiledRow(uint32_t* out, int64_t qs, int64_t i, int64_t s) {
  return out + i / 32 * qs + s * 512 + (i % 32) * 16;
}

// RowToPairs into tile order: row i's (L + 1) / 2 pairs from step s0 on (the same conversion, RNE).
inline void RowToTiledPairs(const float* a, int64_t L, uint32_t* out, int64_t qs, int64_t i, int64_t s0) {
  for (int64_t l = 0, st = s0; l < L; l += 32, ++st) {
    const int64_t n = std::min<int64_t>(32, L - l);
    const __mmask16 m0 = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
    const __mmask16 m1 = (__mmask16)(n >= 32 ? 0xffff : n > 16 ? (1u << (n - 16)) - 1 : 0);
    const __m512 lo = _mm512_maskz_loadu_ps(m0, a + l), hi = _mm512_maskz_loadu_ps(m1, a + l + 16);
    _mm512_storeu_si512(TiledRow(out, qs, i, st), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
}

// PairRows into tile order (R rows from step s0 on, row pairs qs dwords apart).
inline void PairRowsTiled(ThreadPool& pool, const float* a, int64_t lda, int64_t R, int64_t L, uint32_t* out,
                          int64_t qs, int64_t s0 = 0) {
  pool.ParallelFor(R, 16, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) RowToTiledPairs(a + i * lda, L, out, qs, i, s0);
  }, 2.0 * R * L);
}

// 16 dwords of pairs (a[k], b[k]) from two 16-lane rows: one vcvtne2ps2bf16 (a's bf16 in words 0-15, b's in
// 16-31; the same RNE as Bf16Of's vcvtneps2bf16) and one word permutation interleaving the halves.
inline __m512i PairIdx() {
  return _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19,
                          3, 18, 2, 17, 1, 16, 0);
}
inline __m512i PairOf(__m512 a, __m512 b, __m512i idx) {
  return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}
inline __m512i PairOf(__m256i a, __m256i b, __m512i idx) {  // two rows of 16 bf16
  return _mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
}

// Pairs of two rows (f32 holding bf16 values, or bf16): (r0[k], r1[k]) for k < n, 0 past n (up to the next
// multiple of 16), columns k .. k + 15 at out + (k / 16) * ostride (one pair of each of 16 strips); r1 null (the
// missing row of an odd count) gives 0. pf0 / pf1 (optional): the next rows to be paired, fetched column by
// column alongside (W comes from DRAM, where the hardware's prefetch alone leaves the loop waiting on it).
template <typename T>
void PairTwoRows(const T* r0, const T* r1, int64_t n, uint32_t* out, int64_t ostride, const T* pf0 = nullptr,
                 const T* pf1 = nullptr) {
  const __m512i idx = PairIdx();
  for (int64_t k = 0; k < n; k += 16) {
    if (pf0) _mm_prefetch((const char*)(pf0 + k), _MM_HINT_T0);
    if (pf1) _mm_prefetch((const char*)(pf1 + k), _MM_HINT_T0);
    const __mmask16 m = (__mmask16)(n - k >= 16 ? 0xffff : (1u << (n - k)) - 1);
    __m512i d;
    if constexpr (sizeof(T) == 4) {
      const __m512 lo = _mm512_maskz_loadu_ps(m, (const float*)r0 + k);
      const __m512 hi = r1 ? _mm512_maskz_loadu_ps(m, (const float*)r1 + k) : _mm512_setzero_ps();
      d = PairOf(lo, hi, idx);
    } else {
      const __m256i lo = _mm256_maskz_loadu_epi16(m, r0 + k);
      const __m256i hi = r1 ? _mm256_maskz_loadu_epi16(m, r1 + k) : _mm256_setzero_si256();
      d = PairOf(lo, hi, idx);
    }
    _mm512_storeu_si512(out + (k / 16) * ostride, d);
  }
}

// A = M^T for a row-major M (L rows of R: dy in the weight gradient) -> out[i * Lp + p] = (M[2p][i],
// M[2p + 1][i]): per block of 16 pairs and 16 columns, pairs of two rows of M (16 dwords each), then the
// 16 x 16 dword block transposed in registers.
// store(i, pb, v, pm): row i's pairs 16 pb .. (v's lanes pm; the lanes past the last pair zero).
template <typename Store>
inline void PairRowsTWith(ThreadPool& pool, const float* m, int64_t ldm, int64_t L, int64_t R, Store store) {
  const int64_t Lp = (L + 1) / 2;
  constexpr int64_t kB = 16;
  pool.ParallelFor((Lp + kB - 1) / kB, 1, [&](int64_t b, int64_t e, int) {
    const __m512i idx = PairIdx();
    for (int64_t pb = b; pb < e; ++pb) {
      const int64_t p0 = pb * kB, np = std::min(kB, Lp - p0);
      const __mmask16 pm = (__mmask16)(np >= 16 ? 0xffff : (1u << np) - 1);
      for (int64_t i0 = 0; i0 < R; i0 += 16) {
        const int64_t ni = std::min<int64_t>(16, R - i0);
        const __mmask16 im = (__mmask16)(ni >= 16 ? 0xffff : (1u << ni) - 1);
        __m512 r[16];  // dwords (bf16 pairs) moved as floats: the transpose only shuffles lanes
#pragma GCC unroll 16
        for (int64_t p = 0; p < 16; ++p) {
          const int64_t l = 2 * (p0 + p);
          if (p >= np) {
            r[p] = _mm512_setzero_ps();
            continue;
          }
          const __m512 lo = _mm512_maskz_loadu_ps(im, m + l * ldm + i0);
          const __m512 hi = l + 1 < L ? _mm512_maskz_loadu_ps(im, m + (l + 1) * ldm + i0) : _mm512_setzero_ps();
          r[p] = _mm512_castsi512_ps(PairOf(lo, hi, idx));
        }
        Transpose16(r);
        for (int64_t i = 0; i < ni; ++i) store(i0 + i, pb, r[i], pm);
      }
    }
  }, 2.0 * L * R);
}
inline void PairRowsT(ThreadPool& pool, const float* m, int64_t ldm, int64_t L, int64_t R, uint32_t* out) {
  const int64_t Lp = (L + 1) / 2;
  PairRowsTWith(pool, m, ldm, L, R, [out, Lp](int64_t i, int64_t pb, __m512 v, __mmask16 pm) {
    _mm512_mask_storeu_ps((float*)(out + i * Lp + 16 * pb), pm, v);
  });
}
// PairRowsT into tile order (row pairs TiledStride((L + 1) / 2) dwords apart).
inline void PairRowsTTiled(ThreadPool& pool, const float* m, int64_t ldm, int64_t L, int64_t R, uint32_t* out) {
  const int64_t qs = TiledStride((L + 1) / 2);
  PairRowsTWith(pool, m, ldm, L, R, [out, qs](int64_t i, int64_t pb, __m512 v, __mmask16) {
    _mm512_storeu_ps((float*)TiledRow(out, qs, i, pb), v);
  });
}

// B(l, k) = m[l * ldm + k] (row-major, L x Kd) -> pair strips: strip s's pair p at out + (s * Lp + p) * 16,
// columns past Kd zero.
// sstride: dwords from one strip to the next (0: Lp * 16, the strips back to back).
// Blocks of 8 row pairs: each pair of rows read in order (the next pair prefetched alongside) into a per-thread
// block of strips, then copied out strip by strip (8 consecutive lines each) rather than scattered over every
// strip at once. A 1536 x 576 f32 W on Zen 5, 1 thread: from cache 275 -> 97 us, from DRAM 385-560 -> 220 us.
template <typename T>
void PairStripsRows(ThreadPool& pool, const T* m, int64_t ldm, int64_t L, int64_t Kd, uint32_t* out,
                    int64_t sstride = 0) {
  constexpr int64_t kP = 8;
  const int64_t Lp = (L + 1) / 2, ss = sstride > 0 ? sstride : Lp * 16, n_strips = (Kd + 15) / 16;
  pool.ParallelFor((Lp + kP - 1) / kP, 1, [&](int64_t b, int64_t e, int) {
    static thread_local std::vector<uint32_t> block;  // the memory plan's per-thread packing scratch
    uint32_t* buf = Scratch(block, (size_t)(kP * n_strips * 16));
    for (int64_t blk = b; blk < e; ++blk) {
      const int64_t p0 = blk * kP, np = std::min(kP, Lp - p0);
      for (int64_t p = 0; p < np; ++p) {
        const int64_t r = 2 * (p0 + p);
        const T* r0 = m + r * ldm;
        PairTwoRows<T>(r0, r + 1 < L ? r0 + ldm : nullptr, Kd, buf + p * n_strips * 16, 16,
                       r + 2 < L ? r0 + 2 * ldm : nullptr, r + 3 < L ? r0 + 3 * ldm : nullptr);
      }
      for (int64_t s = 0; s < n_strips; ++s)
        for (int64_t p = 0; p < np; ++p)
          _mm512_storeu_si512(out + s * ss + (p0 + p) * 16, _mm512_loadu_si512(buf + (p * n_strips + s) * 16));
    }
  }, 2.0 * L * Kd);
}

// One pair strip (Lp x 16 dwords, Lp = (L + 1) / 2) from 16 rows of L values (f32, rounded to bf16 by Bf16Of's
// RNE, or bf16 as stored), ld apart, rows from nj on zero: per 16 pairs, each row's 32 values as 16 pair dwords
// (zero past L), then the 16 x 16 dword block transposed in registers.
template <typename T>
void StripOfRowsT(const T* rows, int64_t ld, int nj, int64_t L, uint32_t* st) {
  const int64_t Lp = (L + 1) / 2;
  for (int64_t p = 0; p < Lp; p += 16) {
    const int64_t l = 2 * p, n = std::min<int64_t>(32, L - l);
    __m512 r[16];  // dwords (bf16 pairs) moved as floats: the transpose only shuffles lanes
    if constexpr (sizeof(T) == 4) {
      const __mmask16 m0 = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
      const __mmask16 m1 = (__mmask16)(n >= 32 ? 0xffff : n <= 16 ? 0 : (1u << (n - 16)) - 1);
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) {
        if (j < nj) {
          const float* row = (const float*)rows + j * ld + l;
          r[j] = (__m512)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, row + 16), _mm512_maskz_loadu_ps(m0, row));
        } else {
          r[j] = _mm512_setzero_ps();
        }
      }
    } else {
      const __mmask32 m = (__mmask32)(n >= 32 ? 0xffffffffu : (1u << n) - 1);
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j)
        r[j] = j < nj ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, (const uint16_t*)rows + j * ld + l))
                      : _mm512_setzero_ps();
    }
    Transpose16(r);
    const int64_t np = std::min<int64_t>(16, Lp - p);
    for (int64_t k = 0; k < np; ++k) _mm512_storeu_ps((float*)(st + (p + k) * 16), r[k]);
  }
}
inline void StripOfRows(const float* rows, int64_t ld, int nj, int64_t L, uint32_t* st) {
  StripOfRowsT<float>(rows, ld, nj, L, st);
}

// B(l, k) = W(k, l) for W (Kd, L) row-major (the forward's W^T) -> pair strips as above: per strip, its 16 W
// rows as pairs into a per-thread buffer, each row read in order with the row two ahead prefetched alongside,
// then the buffer's 16 x 16 dword blocks transposed in registers (StripOfRowsT over the pairs as bf16 rows).
// A 1536 x 576 f32 W on Zen 5, 1 thread: from cache 255 -> 101-114 us, from DRAM 264 -> 197-206 us.
template <typename T>
void PairStripsT(ThreadPool& pool, const T* w, int64_t ldw, int64_t Kd, int64_t L, uint32_t* out,
                 int64_t sstride = 0) {
  const int64_t Lp = (L + 1) / 2, n_strips = (Kd + 15) / 16, ss = sstride > 0 ? sstride : Lp * 16;
  pool.ParallelFor(n_strips, 1, [&](int64_t b, int64_t e, int) {
    static thread_local std::vector<uint16_t> rows;  // the memory plan's per-thread packing scratch
    uint16_t* buf = Scratch(rows, (size_t)(32 * Lp));
    for (int64_t s = b; s < e; ++s) {
      const int nj = (int)std::min<int64_t>(16, Kd - 16 * s);
      for (int j = 0; j < nj; ++j) {
        const T* r = w + (16 * s + j) * ldw;
        const T* pf = 16 * s + j + 2 < Kd ? r + 2 * ldw : nullptr;
        uint16_t* o = buf + j * 2 * Lp;
        if constexpr (sizeof(T) == 4) {
          RowToPairs((const float*)r, L, o, (const float*)pf);
        } else {
          for (int64_t l = 0; l < L; l += 32) {
            if (pf) _mm_prefetch((const char*)(pf + l), _MM_HINT_T0);
            const __mmask32 m = (__mmask32)(L - l >= 32 ? 0xffffffffu : (1u << (L - l)) - 1);
            _mm512_mask_storeu_epi16(o + l, m, _mm512_maskz_loadu_epi16(m, r + l));
          }
          if (L & 1) o[L] = 0;
        }
      }
      StripOfRowsT<uint16_t>(buf, 2 * Lp, nj, 2 * Lp, out + s * ss);
    }
  }, 2.0 * Kd * L);
}

}  // namespace
}  // namespace lathe::kernels::cpu::avx512bf16
