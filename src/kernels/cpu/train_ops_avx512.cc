// AVX-512 training kernels: the GEMM micro-kernels two 16-column strips wide (6 x 32, 12 zmm
// accumulators, enough independent FMA chains for two 512-bit FMA pipes) and an 8 x 48 tile over
// packed A micro-panels (24 accumulators), B strips packed by 16 x 16 transposes; every other op is the
// AVX2 table's. Per C element the FMAs and their order are those of the AVX2 6 x 16 tile, so the results
// are bit-identical to the AVX2 tier's.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/avx512_transpose.h"
#include "kernels/cpu/avx512_util.h"
#include "kernels/cpu/train_dispatch.h"

namespace lathe::kernels::cpu::avx512 {

namespace {

// acc[i][h] (row i, columns 16 h .. 16 h + 15) over l < L: A(i, l) from a_at(i, l), B row l from b
// (columns 0-15) and b2 (16-31).
template <typename AAt>
__attribute__((always_inline)) inline void Tile2(const AAt& a_at, const float* b, const float* b2, int64_t ldb,
                                                 int64_t L, __m512 (&acc)[kGemmTileR][2]) {
  for (int i = 0; i < kGemmTileR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t l = 0; l < L; ++l, b += ldb, b2 += ldb) {
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b2);
#pragma GCC unroll 6
    for (int i = 0; i < kGemmTileR; ++i) {
      const __m512 av = _mm512_set1_ps(a_at(i, l));
      acc[i][0] = _mm512_fmadd_ps(av, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(av, b1, acc[i][1]);
    }
  }
}

// c (mr x nc, 16 < nc <= 32) += acc, or = acc with overwrite.
inline void Store2(const __m512 (&acc)[kGemmTileR][2], float* c, int64_t ldc, int mr, int nc, bool overwrite) {
  const __mmask16 m1 = (__mmask16)((1u << (nc - 16)) - 1);
  for (int i = 0; i < mr; ++i) {
    float* ci = c + i * ldc;
    if (overwrite) {
      _mm512_storeu_ps(ci, acc[i][0]);
      _mm512_mask_storeu_ps(ci + 16, m1, acc[i][1]);
    } else {
      _mm512_storeu_ps(ci, _mm512_add_ps(_mm512_loadu_ps(ci), acc[i][0]));
      _mm512_mask_storeu_ps(ci + 16, m1, _mm512_add_ps(_mm512_maskz_loadu_ps(m1, ci + 16), acc[i][1]));
    }
  }
}

// A packed: a[l * 6 + i].
void GemmTile2(const float* a, const float* b, const float* b2, int64_t ldb, int64_t L, float* c, int64_t ldc, int mr,
               int nc) {
  __m512 acc[kGemmTileR][2];
  Tile2([a](int i, int64_t l) { return a[l * kGemmTileR + i]; }, b, b2, ldb, L, acc);
  Store2(acc, c, ldc, mr, nc, false);
}

// A read in place: row i at a + i * lda (rows past mr alias row mr - 1 and are not stored).
void GemmTileRows2(const float* a, int64_t lda, const float* b, const float* b2, int64_t ldb, int64_t L, float* c,
                   int64_t ldc, int mr, int nc, bool overwrite) {
  const float* ar[kGemmTileR];
  for (int i = 0; i < kGemmTileR; ++i) ar[i] = a + std::min(i, mr - 1) * lda;
  __m512 acc[kGemmTileR][2];
  Tile2([&ar](int i, int64_t l) { return ar[i][l]; }, b, b2, ldb, L, acc);
  Store2(acc, c, ldc, mr, nc, overwrite);
}

// The panel tile: kPanelR rows x NS strips (NS <= 3: 24 zmm accumulators, 3 B loads and 8 broadcasts
// per 24 FMAs, against 2 + 6 per 12 in the 6 x 32 tile), A from a packed micro-panel (one sequential
// stream; six in-place rows were six streams).
constexpr int kPanelR = 8;
constexpr int kPanelStrips = 3;

// acc[i][s] (row i, columns 16 s ..) over l < L: A(i, l) from a_at(i, l), B strip s's row l at
// b + s * stride + l * ldb, starting from zero or from the partial tile pin (a chain continued); then
// into the partial tile pout (the chain to be continued), or c (mr x nc, 16 (NS - 1) < nc <= 16 NS) (+)= acc.
// Partial tiles: acc[i][s] at [i * kPanelTileLd + 16 s], stored and reloaded as is (the same bits as one chain).
constexpr int kPanelTileLd = kPanelStrips * 16;
template <int NS, typename AAt>
__attribute__((always_inline)) inline void PanelTileT(const AAt& a_at, const float* b, int64_t stride, int64_t ldb,
                                                      int64_t L, float* c, int64_t ldc, int mr, int nc,
                                                      bool overwrite, const float* pin, float* pout) {
  __m512 acc[kPanelR][NS];
#pragma GCC unroll 8
  for (int i = 0; i < kPanelR; ++i)
#pragma GCC unroll 3
    for (int s = 0; s < NS; ++s)
      acc[i][s] = pin ? _mm512_loadu_ps(pin + i * kPanelTileLd + 16 * s) : _mm512_setzero_ps();
  for (int64_t l = 0; l < L; ++l, b += ldb) {
    __m512 bv[NS];
#pragma GCC unroll 3
    for (int s = 0; s < NS; ++s) bv[s] = _mm512_loadu_ps(b + s * stride);
#pragma GCC unroll 8
    for (int i = 0; i < kPanelR; ++i) {
      const __m512 av = _mm512_set1_ps(a_at(i, l));
#pragma GCC unroll 3
      for (int s = 0; s < NS; ++s) acc[i][s] = _mm512_fmadd_ps(av, bv[s], acc[i][s]);
    }
  }
  if (pout) {
#pragma GCC unroll 8
    for (int i = 0; i < kPanelR; ++i)
#pragma GCC unroll 3
      for (int s = 0; s < NS; ++s) _mm512_storeu_ps(pout + i * kPanelTileLd + 16 * s, acc[i][s]);
    return;
  }
  const __mmask16 last = (__mmask16)((1u << (nc - 16 * (NS - 1))) - 1);
#pragma GCC unroll 8
  for (int i = 0; i < kPanelR; ++i) {
    if (i >= mr) break;
    float* ci = c + i * ldc;
#pragma GCC unroll 3
    for (int s = 0; s < NS; ++s) {
      const __mmask16 m = s == NS - 1 ? last : (__mmask16)0xffff;
      const __m512 v = overwrite ? acc[i][s] : _mm512_add_ps(_mm512_maskz_loadu_ps(m, ci + 16 * s), acc[i][s]);
      _mm512_mask_storeu_ps(ci + 16 * s, m, v);
    }
  }
}

// A from a packed micro-panel: a[l * kPanelR + i].
template <int NS>
void PanelTile(const float* a, const float* b, int64_t stride, int64_t ldb, int64_t L, float* c, int64_t ldc, int mr,
               int nc, bool overwrite, const float* pin, float* pout) {
  PanelTileT<NS>([a](int i, int64_t l) { return a[l * kPanelR + i]; }, b, stride, ldb, L, c, ldc, mr, nc, overwrite,
                 pin, pout);
}

// A's rows read in place: row i at a + i * lda (rows past mr alias row mr - 1 and are not stored).
template <int NS>
void PanelRowsTile(const float* a, int64_t lda, const float* b, int64_t stride, int64_t ldb, int64_t L, float* c,
                   int64_t ldc, int mr, int nc, bool overwrite, const float* pin, float* pout) {
  const float* ar[kPanelR];
  for (int i = 0; i < kPanelR; ++i) ar[i] = a + std::min(i, mr - 1) * lda;
  PanelTileT<NS>([&ar](int i, int64_t l) { return ar[i][l]; }, b, stride, ldb, L, c, ldc, mr, nc, overwrite, pin,
                 pout);
}

void GemmPanelRows(const float* a, int64_t lda, const float* b, int64_t stride, int64_t ldb, int64_t L, float* c,
                   int64_t ldc, int mr, int nc, bool overwrite, const float* pin, float* pout) {
  if (nc > 32)
    PanelRowsTile<3>(a, lda, b, stride, ldb, L, c, ldc, mr, nc, overwrite, pin, pout);
  else if (nc > 16)
    PanelRowsTile<2>(a, lda, b, stride, ldb, L, c, ldc, mr, nc, overwrite, pin, pout);
  else
    PanelRowsTile<1>(a, lda, b, stride, ldb, L, c, ldc, mr, nc, overwrite, pin, pout);
}

void GemmPanel(const float* a, const float* b, int64_t stride, int64_t ldb, int64_t L, float* c, int64_t ldc, int mr,
               int nc, bool overwrite, const float* pin, float* pout) {
  if (nc > 32)
    PanelTile<3>(a, b, stride, ldb, L, c, ldc, mr, nc, overwrite, pin, pout);
  else if (nc > 16)
    PanelTile<2>(a, b, stride, ldb, L, c, ldc, mr, nc, overwrite, pin, pout);
  else
    PanelTile<1>(a, b, stride, ldb, L, c, ldc, mr, nc, overwrite, pin, pout);
}

// TrainKernelTable::pack_strip_t: rows j < nj of src (the strip's columns; zero past nj), 16 x 16
// blocks transposed in registers, the nl % 16 tail through masked loads (nothing read past nl).
void PackStripT(float* bs, int64_t ldo, const float* src, int64_t ld, int64_t nl, int nj) {
  static_assert(kGemmTileC == 16);
  for (int64_t l = 0; l < nl; l += 16) {
    const int n = (int)std::min<int64_t>(16, nl - l);
    const __mmask16 m = Mask16(n);
    __m512 r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = i < nj ? _mm512_maskz_loadu_ps(m, src + i * ld + l) : _mm512_setzero_ps();
    Transpose16(r);
    for (int k = 0; k < n; ++k) _mm512_storeu_ps(bs + (l + k) * ldo, r[k]);
  }
}

// n (<= 16) elements of a W row from element l as f32, zero past n.
template <DType T>
__attribute__((always_inline)) inline __m512 Load16(const uint8_t* row, int64_t l, int n) {
  const __mmask16 m = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
  if constexpr (T == DType::kF32) {
    return _mm512_maskz_loadu_ps(m, (const float*)row + l);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t*)row + l);
    if constexpr (T == DType::kBF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
  }
}

// acc[i] = fma(x_i[l + j], col[j], acc[i]) for j < n, in order.
// acc[i] = fma(x_i[l + j], col[j], acc[i]) for j < n, in order (N: n known at compile time, so col
// stays in registers; N = 0: n at run time).
template <int M, int N = 0>
__attribute__((always_inline)) inline void ChainCols(const __m512* col, int n, const float* const (&xr)[4], int64_t l,
                                                     __m512 (&acc)[4]) {
  if constexpr (N > 0) {
#pragma GCC unroll 32
    for (int j = 0; j < N; ++j)
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(xr[i][l + j]), col[j], acc[i]);
  } else {
    for (int j = 0; j < n; ++j)
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(xr[i][l + j]), col[j], acc[i]);
  }
}

// The next 16 W rows are prefetched into L2 in order, 1 KiB per block of the current ones (as much as a
// block reads): reading 16 rows a cache line at a time left the hardware prefetchers behind (f32 1536 x
// 576 from DRAM at 9 GB/s, 30 with W in L2).
__attribute__((always_inline)) inline void PrefetchNext(const char*& pf, const char* end) {
  if (pf >= end) return;
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) _mm_prefetch(pf + 64 * i, _MM_HINT_T1);
  pf += 1024;
}

// chain_gemv for 16 W rows at a time (the AVX2 kernel's arithmetic, bit for bit): 16 x 16 blocks
// transposed in registers (bf16: 16 x 32 blocks transposed as 32-bit pairs, then split into even and
// odd elements); the tail of a chunk through masked loads.
template <DType T, int M>
void ChainGemvT(const uint8_t* w, size_t rb, int64_t n_rows, const float* x, int64_t ldx, int64_t K, int64_t inner,
                float* y, int64_t ldy) {
  const float* xr[4];
  for (int i = 0; i < 4; ++i) xr[i] = x + std::min(i, M - 1) * ldx;
  for (int64_t r0 = 0; r0 < n_rows; r0 += 16) {
    const int nr = (int)std::min<int64_t>(16, n_rows - r0);
    const uint8_t* row[16];
    for (int i = 0; i < 16; ++i) row[i] = w + (r0 + std::min(i, nr - 1)) * rb;
    const char* pf = (const char*)(w + (r0 + 16) * rb);
    const char* pf_end = (const char*)(w + std::min(n_rows, r0 + 32) * rb);
    __m512 tot[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t l0 = 0; l0 < K; l0 += inner) {
      const int64_t le = std::min(K, l0 + inner);
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      int64_t l = l0;
      if constexpr (T == DType::kBF16) {
        const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
        for (; l + 32 <= le; l += 32) {
          __m512 c[16];
#pragma GCC unroll 16
          for (int i = 0; i < 16; ++i) c[i] = _mm512_loadu_ps((const uint16_t*)row[i] + l);
          PrefetchNext(pf, pf_end);
          Transpose16(c);  // c[k]: elements l + 2k, l + 2k + 1 of each row
#pragma GCC unroll 16
          for (int k = 0; k < 16; ++k) {
            const __m512i v = _mm512_castps_si512(c[k]);
            const __m512 col[2] = {_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)),
                                   _mm512_castsi512_ps(_mm512_and_si512(v, hi))};
            ChainCols<M, 2>(col, 2, xr, l + 2 * k, acc);
          }
        }
      }
      for (; l + 16 <= le; l += 16) {
        __m512 c[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) c[i] = Load16<T>(row[i], l, 16);
        PrefetchNext(pf, pf_end);
        Transpose16(c);
        ChainCols<M, 16>(c, 16, xr, l, acc);
      }
      if (l < le) {
        const int n = (int)(le - l);
        __m512 c[16];
        for (int i = 0; i < 16; ++i) c[i] = Load16<T>(row[i], l, n);
        Transpose16(c);
        ChainCols<M>(c, n, xr, l, acc);
      }
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) tot[i] = l0 == 0 ? acc[i] : _mm512_add_ps(tot[i], acc[i]);
    }
    const __mmask16 sm = (__mmask16)((1u << nr) - 1);
#pragma GCC unroll 4
    for (int i = 0; i < M; ++i) _mm512_mask_storeu_ps(y + i * ldy + r0, sm, tot[i]);
  }
}

constexpr int kStripAhead = 1024;

// strip_gemv for S strips side by side (S x M accumulators: S independent chains per x row), each
// strip row one 64-byte (f32) or 32-byte load: the AVX2 kernel's arithmetic, bit for bit.
// run: strip s of the group at strips + s * run strips (1: side by side), its results at y + 16 * s * run.
template <DType T, int M, int S>
__attribute__((always_inline)) inline void StripsT(const uint8_t* strips, int64_t K, int64_t inner,
                                                   const float* const (&xr)[4], float* y, int64_t ldy,
                                                   int64_t n_cols, int64_t run = 1) {
  constexpr size_t kRow = 16 * (T == DType::kF32 ? 4 : 2);  // bytes per strip row
  const size_t sk = (size_t)run * K;  // strip rows from one strip of the group to the next
  __m512 tot[S][4];
  for (int64_t l0 = 0; l0 < K; l0 += inner) {
    const int64_t le = std::min(K, l0 + inner);
    __m512 acc[S][4];
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) acc[s][i] = _mm512_setzero_ps();
    for (int64_t l = l0; l < le; ++l) {
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s) {
        if (T == DType::kF32 || (l & 1) == 0)
          _mm_prefetch((const char*)(strips + ((size_t)s * sk + l) * kRow) + kStripAhead, _MM_HINT_T0);
        const __m512 wv = Load16<T>(strips + ((size_t)s * sk + l) * kRow, 0, 16);
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i) acc[s][i] = _mm512_fmadd_ps(_mm512_set1_ps(xr[i][l]), wv, acc[s][i]);
      }
    }
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) tot[s][i] = l0 == 0 ? acc[s][i] : _mm512_add_ps(tot[s][i], acc[s][i]);
  }
#pragma GCC unroll 4
  for (int s = 0; s < S; ++s) {
    const int64_t nc = std::min<int64_t>(16, n_cols - 16 * s * run);
    const __mmask16 sm = (__mmask16)((1u << nc) - 1);
#pragma GCC unroll 4
    for (int i = 0; i < M; ++i) _mm512_mask_storeu_ps(y + i * ldy + 16 * s * run, sm, tot[s][i]);
  }
}

template <DType T, int M>
void StripGemvT(const uint8_t* strips, int64_t n_strips, int64_t K, int64_t inner, const float* x, int64_t ldx,
                float* y, int64_t ldy, int64_t n_cols) {
  const float* xr[4];
  for (int i = 0; i < 4; ++i) xr[i] = x + std::min(i, M - 1) * ldx;
  constexpr int S = M <= 2 ? 4 : 2;
  constexpr size_t kStrip = 16 * (T == DType::kF32 ? 4 : 2);
  int64_t s = 0;
  if (n_strips >= 2 * S) {
    // Up to 4 x rows (decode, small decode batches: the weights are read once): S runs of n consecutive
    // strips, the j-th of each run together, so the loads are S long sequential streams; S adjacent strips
    // are S streams of one strip each (K * kStrip bytes), which the hardware prefetcher picks up again at
    // every strip (SmolLM2 f32 decode ~21 -> ~24 GB/s). The last strip (maybe partial) stays for the loop
    // below. Each strip's chain is the same: the same bits.
    const int64_t n = (n_strips - 1) / S;
    for (int64_t j = 0; j < n; ++j)
      StripsT<T, M, S>(strips + j * K * kStrip, K, inner, xr, y + 16 * j, ldy, n_cols - 16 * j, n);
    s = S * n;
  }
  for (; s + S <= n_strips; s += S)
    StripsT<T, M, S>(strips + s * K * kStrip, K, inner, xr, y + 16 * s, ldy, n_cols - 16 * s);
  for (; s < n_strips; ++s) StripsT<T, M, 1>(strips + s * K * kStrip, K, inner, xr, y + 16 * s, ldy, n_cols - 16 * s);
}

template <DType T>
void StripGemvM(const uint8_t* strips, int64_t n_strips, int64_t K, int64_t inner, const float* x, int64_t ldx,
                int m, float* y, int64_t ldy, int64_t n_cols) {
  switch (m) {
    case 1: return StripGemvT<T, 1>(strips, n_strips, K, inner, x, ldx, y, ldy, n_cols);
    case 2: return StripGemvT<T, 2>(strips, n_strips, K, inner, x, ldx, y, ldy, n_cols);
    case 3: return StripGemvT<T, 3>(strips, n_strips, K, inner, x, ldx, y, ldy, n_cols);
    default: return StripGemvT<T, 4>(strips, n_strips, K, inner, x, ldx, y, ldy, n_cols);
  }
}

void StripGemv(DType t, const uint8_t* strips, int64_t n_strips, int64_t K, int64_t inner, const float* x,
               int64_t ldx, int m, float* y, int64_t ldy, int64_t n_cols) {
  if (t == DType::kF32) return StripGemvM<DType::kF32>(strips, n_strips, K, inner, x, ldx, m, y, ldy, n_cols);
  if (t == DType::kBF16) return StripGemvM<DType::kBF16>(strips, n_strips, K, inner, x, ldx, m, y, ldy, n_cols);
  return StripGemvM<DType::kF16>(strips, n_strips, K, inner, x, ldx, m, y, ldy, n_cols);
}

template <DType T>
void ChainGemvM(const uint8_t* w, size_t rb, int64_t n_rows, const float* x, int64_t ldx, int m, int64_t K,
                int64_t inner, float* y, int64_t ldy) {
  switch (m) {
    case 1: return ChainGemvT<T, 1>(w, rb, n_rows, x, ldx, K, inner, y, ldy);
    case 2: return ChainGemvT<T, 2>(w, rb, n_rows, x, ldx, K, inner, y, ldy);
    case 3: return ChainGemvT<T, 3>(w, rb, n_rows, x, ldx, K, inner, y, ldy);
    default: return ChainGemvT<T, 4>(w, rb, n_rows, x, ldx, K, inner, y, ldy);
  }
}

void ChainGemv(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const float* x, int64_t ldx, int m, int64_t K,
               int64_t inner, float* y, int64_t ldy) {
  if (t == DType::kF32) return ChainGemvM<DType::kF32>(w, rb, n_rows, x, ldx, m, K, inner, y, ldy);
  if (t == DType::kBF16) return ChainGemvM<DType::kBF16>(w, rb, n_rows, x, ldx, m, K, inner, y, ldy);
  return ChainGemvM<DType::kF16>(w, rb, n_rows, x, ldx, m, K, inner, y, ldy);
}

// SwiGLU and the bf16 -> f32 copy of the AVX2 table on 16 lanes: every lane runs the AVX2 kernel's operations
// (ExpPs's reduction and polynomial, the IEEE divide), so the results are its bits; the last n % 16 elements
// go to the AVX2 kernel itself (its 8-lane step and scalar tail).
void SwiGluForward(float* out, const float* gate, const float* up, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 sg = _mm512_div_ps(one, _mm512_add_ps(one, ExpPs(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(g, sg), _mm512_loadu_ps(up + i)));
  }
  if (i < n) avx2::TrainTable().swiglu_forward(out + i, gate + i, up + i, n - i);
}

void SwiGluBackward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i), d = _mm512_loadu_ps(dout + i), u = _mm512_loadu_ps(up + i);
    const __m512 sg = _mm512_div_ps(one, _mm512_add_ps(one, ExpPs(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    const __m512 t = _mm512_fmadd_ps(g, _mm512_sub_ps(one, sg), one);  // dgate = d * u * s * (1 + g * (1 - s))
    _mm512_storeu_ps(dup + i, _mm512_mul_ps(d, _mm512_mul_ps(g, sg)));
    _mm512_storeu_ps(dgate + i, _mm512_mul_ps(_mm512_mul_ps(d, u), _mm512_mul_ps(sg, t)));
  }
  if (i < n) avx2::TrainTable().swiglu_backward(dgate + i, dup + i, dout + i, gate + i, up + i, n - i);
}

void FromBf16(float* out, const uint16_t* h, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(h + i)));
    _mm512_storeu_si512(out + i, _mm512_slli_epi32(w, 16));
  }
  if (i < n) avx2::TrainTable().from_bf16(out + i, h + i, n - i);
}

// The softmax row and column helpers of the AVX2 table on 16 lanes, the same bits: the same polynomial exp per
// element (avx512::ExpPs equals avx2::ExpPs lane for lane), its 8-lane accumulators as the halves of one zmm (the
// AVX2 helpers sum 16 elements at a time into two), a last whole 8 on ymm where AVX2 takes one, and the tails
// (libm expf, added in order) exactly as the AVX2 helpers run them.
float RowMax(const float* x, int64_t n) {  // the max of the elements: any order gives it
  __m512 mv = _mm512_set1_ps(x[0]);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(x + i));
  float m = _mm512_reduce_max_ps(mv);
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// lo + hi halves, then avx2::HsumPs's order.
inline float SumHalves(__m512 s) {
  return avx2::HsumPs(_mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1)));
}

float ExpShiftSum(float* x, int64_t n, float shift) {
  const __m512 sh = _mm512_set1_ps(shift);
  __m512 s = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = ExpPs(_mm512_sub_ps(_mm512_loadu_ps(x + i), sh));
    _mm512_storeu_ps(x + i, e);
    s = _mm512_add_ps(s, e);
  }
  if (i + 8 <= n) {  // into the low half (AVX2's first accumulator)
    const __m512 e = ExpPs(_mm512_sub_ps(_mm512_zextps256_ps512(_mm256_loadu_ps(x + i)), sh));
    _mm256_storeu_ps(x + i, _mm512_castps512_ps256(e));
    s = _mm512_mask_add_ps(s, 0x00ff, s, e);
    i += 8;
  }
  float sum = SumHalves(s);
  for (; i < n; ++i) sum += (x[i] = std::exp(x[i] - shift));
  return sum;
}

float LogSumExp(const float* x, int64_t n) {
  const float m = RowMax(x, n);
  const __m512 mv = _mm512_set1_ps(m);
  __m512 s = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) s = _mm512_add_ps(s, ExpPs(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv)));
  float sum = SumHalves(s);
  for (; i < n; ++i) sum += std::exp(x[i] - m);
  return m + std::log(sum);
}

// Elementwise: 16, then 8 (as AVX2), then libm's expf for the last n % 8.
template <typename Op16, typename Tail>
inline void Lanes(int64_t n, const Op16& op, const Tail& tail) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) op(i, (__mmask16)0xffff);
  if (i + 8 <= n) op(i, (__mmask16)0x00ff), i += 8;
  for (; i < n; ++i) tail(i);
}

void ExpShiftScale(float* x, int64_t n, float shift, float scale) {
  const __m512 sh = _mm512_set1_ps(shift), sc = _mm512_set1_ps(scale);
  Lanes(
      n,
      [&](int64_t i, __mmask16 k) {
        _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(ExpPs(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), sh)), sc));
      },
      [&](int64_t i) { x[i] = std::exp(x[i] - shift) * scale; });
}

void SoftmaxGrad(float* ds, const float* p, int64_t n, float delta, float scale) {
  const __m512 dl = _mm512_set1_ps(delta), sc = _mm512_set1_ps(scale);
  Lanes(
      n,
      [&](int64_t i, __mmask16 k) {
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + i), _mm512_sub_ps(_mm512_maskz_loadu_ps(k, ds + i), dl));
        _mm512_mask_storeu_ps(ds + i, k, _mm512_mul_ps(v, sc));
      },
      [&](int64_t i) { ds[i] = p[i] * (ds[i] - delta) * scale; });
}

void ColMax(float* m, const float* row, int64_t n) {
  Lanes(
      n,
      [&](int64_t j, __mmask16 k) {
        _mm512_mask_storeu_ps(m + j, k, _mm512_max_ps(_mm512_maskz_loadu_ps(k, m + j), _mm512_maskz_loadu_ps(k, row + j)));
      },
      [&](int64_t j) { m[j] = std::max(m[j], row[j]); });
}

void ColExpSum(float* s, const float* row, const float* m, int64_t n) {
  Lanes(
      n,
      [&](int64_t j, __mmask16 k) {
        const __m512 e = ExpPs(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + j), _mm512_maskz_loadu_ps(k, m + j)));
        _mm512_mask_storeu_ps(s + j, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, s + j), e));
      },
      [&](int64_t j) { s[j] += std::exp(row[j] - m[j]); });
}

void ColExpScale(float* row, const float* shift, float scale, int64_t n) {
  const __m512 sc = _mm512_set1_ps(scale);
  Lanes(
      n,
      [&](int64_t j, __mmask16 k) {
        const __m512 e = ExpPs(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + j), _mm512_maskz_loadu_ps(k, shift + j)));
        _mm512_mask_storeu_ps(row + j, k, _mm512_mul_ps(e, sc));
      },
      [&](int64_t j) { row[j] = std::exp(row[j] - shift[j]) * scale; });
}

// lora_grad_pair for NT (1..8) tokens from n0: their smid rows in registers, dy's columns in groups of four (four
// independent dB chains beside the tokens' eight dmid chains), dB's chains in acc (row o at acc + 16 o).
template <int NT>
void LoraPairTile(float* dmid, const float* dy, const float* smid, const float* B, int64_t n0, int64_t out, int r,
                  int64_t out_chunk, float* acc_buf) {
  const __mmask16 mr = Mask16(r);
  __m512 S[NT];
  const float* dyr[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
    S[t] = _mm512_maskz_loadu_ps(mr, smid + (n0 + t) * r);
    dyr[t] = dy + (n0 + t) * out;
  }
  for (int64_t oc0 = 0; oc0 < out; oc0 += out_chunk) {
    const int64_t oc1 = std::min(out, oc0 + out_chunk);
    __m512 acc[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    int64_t o = oc0;
    for (; o + 4 <= oc1; o += 4) {
      __m512 bo[4], d[4];
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        bo[u] = _mm512_maskz_loadu_ps(mr, B + (o + u) * r);
        d[u] = _mm512_loadu_ps(acc_buf + (o + u) * 16);
      }
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t)
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
          const __m512 b = _mm512_set1_ps(dyr[t][o + u]);
          acc[t] = _mm512_fmadd_ps(b, bo[u], acc[t]);
          d[u] = _mm512_fmadd_ps(b, S[t], d[u]);
        }
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) _mm512_storeu_ps(acc_buf + (o + u) * 16, d[u]);
    }
    for (; o < oc1; ++o) {
      const __m512 bo = _mm512_maskz_loadu_ps(mr, B + o * r);
      __m512 d = _mm512_loadu_ps(acc_buf + o * 16);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        const __m512 b = _mm512_set1_ps(dyr[t][o]);
        acc[t] = _mm512_fmadd_ps(b, bo, acc[t]);
        d = _mm512_fmadd_ps(b, S[t], d);
      }
      _mm512_storeu_ps(acc_buf + o * 16, d);
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      float* dm = dmid + (n0 + t) * r;
      _mm512_mask_storeu_ps(dm, mr, oc0 == 0 ? acc[t] : _mm512_add_ps(_mm512_maskz_loadu_ps(mr, dm), acc[t]));
    }
  }
}

// lora_grad_a for R rank rows: a 16-column strip of x at a time, R chains (one per row of dA) over the chunk's tokens.
template <int R>
void LoraGradAT(float* dA, const float* dmid, const float* x, int64_t M, int64_t K, int64_t k0, int64_t k1,
                int64_t tok_chunk) {
  for (int64_t k = k0; k < k1; k += 16) {
    const __mmask16 mk = Mask16(std::min<int64_t>(16, k1 - k));
    for (int64_t c0 = 0; c0 < M; c0 += tok_chunk) {
      const int64_t c1 = std::min(M, c0 + tok_chunk);
      __m512 acc[R];
#pragma GCC unroll 16
      for (int j = 0; j < R; ++j) acc[j] = _mm512_setzero_ps();
      for (int64_t l = c0; l < c1; ++l) {
        const __m512 xv = _mm512_maskz_loadu_ps(mk, x + l * K + k);
        const float* d = dmid + l * R;
#pragma GCC unroll 16
        for (int j = 0; j < R; ++j) acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(d[j]), xv, acc[j]);
      }
#pragma GCC unroll 16
      for (int j = 0; j < R; ++j) {
        float* o = dA + j * K + k;
        _mm512_mask_storeu_ps(o, mk, _mm512_add_ps(_mm512_maskz_loadu_ps(mk, o), acc[j]));
      }
    }
  }
}

void LoraGradA(float* dA, const float* dmid, const float* x, int64_t M, int64_t K, int r, int64_t k0, int64_t k1,
               int64_t tok_chunk) {
  switch (r) {
#define LATHE_GRAD_A_CASE(R) \
  case R:                    \
    return LoraGradAT<R>(dA, dmid, x, M, K, k0, k1, tok_chunk);
    LATHE_GRAD_A_CASE(1) LATHE_GRAD_A_CASE(2) LATHE_GRAD_A_CASE(3) LATHE_GRAD_A_CASE(4) LATHE_GRAD_A_CASE(5)
    LATHE_GRAD_A_CASE(6) LATHE_GRAD_A_CASE(7) LATHE_GRAD_A_CASE(8) LATHE_GRAD_A_CASE(9) LATHE_GRAD_A_CASE(10)
    LATHE_GRAD_A_CASE(11) LATHE_GRAD_A_CASE(12) LATHE_GRAD_A_CASE(13) LATHE_GRAD_A_CASE(14) LATHE_GRAD_A_CASE(15)
    LATHE_GRAD_A_CASE(16)
#undef LATHE_GRAD_A_CASE
    default:
      LATHE_CHECK_MSG(false, "LoraGradA: rank %d over 16", r);
  }
}

void LoraGradPair(float* dmid, float* dB, const float* dy, const float* smid, const float* B, int64_t M, int64_t out,
                  int r, int64_t out_chunk, int64_t tok_chunk, float* acc_buf) {
  const __mmask16 mr = Mask16(r);
  for (int64_t c0 = 0; c0 < M; c0 += tok_chunk) {
    const int64_t c1 = std::min(M, c0 + tok_chunk);
    std::fill(acc_buf, acc_buf + out * 16, 0.0f);
    for (int64_t n0 = c0; n0 < c1; n0 += 8) {
      switch (std::min<int64_t>(8, c1 - n0)) {
        case 8: LoraPairTile<8>(dmid, dy, smid, B, n0, out, r, out_chunk, acc_buf); break;
        case 7: LoraPairTile<7>(dmid, dy, smid, B, n0, out, r, out_chunk, acc_buf); break;
        case 6: LoraPairTile<6>(dmid, dy, smid, B, n0, out, r, out_chunk, acc_buf); break;
        case 5: LoraPairTile<5>(dmid, dy, smid, B, n0, out, r, out_chunk, acc_buf); break;
        case 4: LoraPairTile<4>(dmid, dy, smid, B, n0, out, r, out_chunk, acc_buf); break;
        case 3: LoraPairTile<3>(dmid, dy, smid, B, n0, out, r, out_chunk, acc_buf); break;
        case 2: LoraPairTile<2>(dmid, dy, smid, B, n0, out, r, out_chunk, acc_buf); break;
        default: LoraPairTile<1>(dmid, dy, smid, B, n0, out, r, out_chunk, acc_buf); break;
      }
    }
    // dB += 0 + chain (the few-rows product's sums go through a zeroed buffer first: -0 chains add as +0).
    for (int64_t o = 0; o < out; ++o) {
      float* db = dB + o * r;
      const __m512 ch = _mm512_add_ps(_mm512_setzero_ps(), _mm512_loadu_ps(acc_buf + o * 16));
      _mm512_mask_storeu_ps(db, mr, _mm512_add_ps(_mm512_maskz_loadu_ps(mr, db), ch));
    }
  }
}

}  // namespace

const TrainKernelTable& TrainTable() {
  static const TrainKernelTable t = [] {
    TrainKernelTable k = avx2::TrainTable();
    k.tier = IsaTier::kAvx512;
    k.gemm_tile2 = GemmTile2;
    k.gemm_tile_rows2 = GemmTileRows2;
    k.gemm_panel = GemmPanel;
    k.gemm_panel_rows = GemmPanelRows;
    k.pack_panel_rows = avx2::PackPanelRows8;  // 256-bit transposes: nothing to gain from zmm
    k.swiglu_forward = SwiGluForward;
    k.swiglu_backward = SwiGluBackward;
    k.logsumexp = LogSumExp;
    k.exp_shift_scale = ExpShiftScale;
    k.row_max = RowMax;
    k.exp_shift_sum = ExpShiftSum;
    k.softmax_grad = SoftmaxGrad;
    k.col_max = ColMax;
    k.col_exp_sum = ColExpSum;
    k.col_exp_scale = ColExpScale;
    // to_bf16 stays the AVX2 one: on zmm (vpmovdw) it measured slower on Zen 5 (60 -> 71 ms a step).
    k.from_bf16 = FromBf16;
    k.panel_rows = kPanelR;
    k.panel_cols = kPanelStrips * kGemmTileC;
    k.pack_strip_t = PackStripT;
    k.chain_gemv = ChainGemv;
    k.strip_gemv = StripGemv;
    k.lora_grad_pair = LoraGradPair;
    k.lora_grad_a = LoraGradA;
    return k;
  }();
  return t;
}

}  // namespace lathe::kernels::cpu::avx512
