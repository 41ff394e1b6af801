// AVX-512 training kernels: the GEMM micro-kernels two 16-column strips wide (6 x 32, 12 zmm
// accumulators, enough independent FMA chains for two 512-bit FMA pipes) and an 8 x 48 tile over
// packed A micro-panels (24 accumulators); every other op is the AVX2 table's. Per C element the FMAs
// and their order are those of the AVX2 6 x 16 tile, so the results are bit-identical to the AVX2 tier's.
// GCC 12 warns on its own _mm512_undefined_* inside the intrinsics headers (a false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

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
// b + s * stride + l * ldb; then c (mr x nc, 16 (NS - 1) < nc <= 16 NS) (+)= acc.
template <int NS, typename AAt>
__attribute__((always_inline)) inline void PanelTileT(const AAt& a_at, const float* b, int64_t stride, int64_t ldb,
                                                      int64_t L, float* c, int64_t ldc, int mr, int nc,
                                                      bool overwrite) {
  __m512 acc[kPanelR][NS];
#pragma GCC unroll 8
  for (int i = 0; i < kPanelR; ++i)
#pragma GCC unroll 3
    for (int s = 0; s < NS; ++s) acc[i][s] = _mm512_setzero_ps();
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
               int nc, bool overwrite) {
  PanelTileT<NS>([a](int i, int64_t l) { return a[l * kPanelR + i]; }, b, stride, ldb, L, c, ldc, mr, nc, overwrite);
}

// A's rows read in place: row i at a + i * lda (rows past mr alias row mr - 1 and are not stored).
template <int NS>
void PanelRowsTile(const float* a, int64_t lda, const float* b, int64_t stride, int64_t ldb, int64_t L, float* c,
                   int64_t ldc, int mr, int nc, bool overwrite) {
  const float* ar[kPanelR];
  for (int i = 0; i < kPanelR; ++i) ar[i] = a + std::min(i, mr - 1) * lda;
  PanelTileT<NS>([&ar](int i, int64_t l) { return ar[i][l]; }, b, stride, ldb, L, c, ldc, mr, nc, overwrite);
}

void GemmPanelRows(const float* a, int64_t lda, const float* b, int64_t stride, int64_t ldb, int64_t L, float* c,
                   int64_t ldc, int mr, int nc, bool overwrite) {
  if (nc > 32)
    PanelRowsTile<3>(a, lda, b, stride, ldb, L, c, ldc, mr, nc, overwrite);
  else if (nc > 16)
    PanelRowsTile<2>(a, lda, b, stride, ldb, L, c, ldc, mr, nc, overwrite);
  else
    PanelRowsTile<1>(a, lda, b, stride, ldb, L, c, ldc, mr, nc, overwrite);
}

void GemmPanel(const float* a, const float* b, int64_t stride, int64_t ldb, int64_t L, float* c, int64_t ldc, int mr,
               int nc, bool overwrite) {
  if (nc > 32)
    PanelTile<3>(a, b, stride, ldb, L, c, ldc, mr, nc, overwrite);
  else if (nc > 16)
    PanelTile<2>(a, b, stride, ldb, L, c, ldc, mr, nc, overwrite);
  else
    PanelTile<1>(a, b, stride, ldb, L, c, ldc, mr, nc, overwrite);
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
    k.panel_rows = kPanelR;
    k.panel_cols = kPanelStrips * kGemmTileC;
    return k;
  }();
  return t;
}

}  // namespace lathe::kernels::cpu::avx512
