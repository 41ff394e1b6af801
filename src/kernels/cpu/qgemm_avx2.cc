// AVX2 register-blocked int8 GEMM for block-quantized weights (Q8_0/Q4_0/Q4_1) times int8-quantized
// x rows (batched decode, prefill): every (x row, weight row) pair gets the M = 1 GEMV arithmetic.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/scratch.h"

namespace lathe::kernels::cpu::avx2 {

namespace {

// Tile: kMR x rows times kNR weight rows = 8 accumulators; the per-block scale products of a tile
// fill one 8-lane vector (lane i * kNR + r).
constexpr int kMR = 4, kNR = 2, kLanes = kMR * kNR;
static_assert(kLanes == 8 && kNR == 2);  // Tile broadcasts the kNR scales as one double

// One weight row group (kNR rows) of the unpacked panel, per 32-block j: the unsigned operand of
// maddubs (|q| for Q8_0, the nibbles in element order for Q4) and, for Q8_0, q itself (its signs).
struct alignas(32) GroupBlock {
  uint8_t u[kNR][32];
  int8_t q[kNR][32];
};

// Unpacks n_rows (multiple of kNR) weight rows: blocks[g * nb + j], and per (g, j) the kNR f16
// scales (dw) and Q4 offset/min factors (cw) as floats.
template <DType T>
void UnpackPanel(const uint8_t* w, size_t rb, int64_t n_rows, int64_t nb, GroupBlock* blocks, float* dw,
                 float* cw) {
  constexpr bool kQ8 = T == DType::kQ8_0, kQ41 = T == DType::kQ4_1;
  constexpr size_t kBB = kQ8 ? sizeof(BlockQ8_0) : kQ41 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  constexpr size_t kQsOff = kQ41 ? 4 : 2;
  for (int64_t g = 0; g < n_rows / kNR; ++g) {
    for (int64_t j = 0; j < nb; ++j) {
      GroupBlock& gb = blocks[g * nb + j];
      float d[kNR], c[kNR];
      for (int r = 0; r < kNR; ++r) {
        const uint8_t* b = w + (g * kNR + r) * rb + j * kBB;
        const uint16_t* h = (const uint16_t*)b;
        d[r] = _cvtsh_ss(h[0]);
        c[r] = kQ41 ? _cvtsh_ss(h[1]) : d[r];
        if constexpr (kQ8) {
          const __m256i q = _mm256_loadu_si256((const __m256i*)(b + kQsOff));
          _mm256_store_si256((__m256i*)gb.q[r], q);
          _mm256_store_si256((__m256i*)gb.u[r], _mm256_sign_epi8(q, q));
        } else {
          _mm256_store_si256((__m256i*)gb.u[r], UnpackNibbles(b + kQsOff));
        }
      }
      for (int r = 0; r < kNR; ++r) {
        dw[(g * nb + j) * kNR + r] = d[r];
        cw[(g * nb + j) * kNR + r] = c[r];
      }
    }
  }
}

// acc[i][r] over all nb blocks for kMR (or fewer, MR) x rows and the kNR weight rows of one group,
// then y = HsumPs(acc) + offset term: the ops and their order per (i, r) are those of
// matmul_avx2.cc's Gemv1Rows4 (ds = dw * dx, acc = fma(dot, ds, acc), corr = fma(cw, s, corr)).
template <DType T, int MR>
void Tile(const GroupBlock* gb, const float* dw, const float* cw, const BlockQ8X* x, int64_t nb,
          const float* xd, const float* xs, float* ds, float* y, int64_t ldy) {
  constexpr bool kQ8 = T == DType::kQ8_0, kQ41 = T == DType::kQ4_1;
  // Scale products of the tile, one vector multiply per block (lanes past MR rows unused).
  __m256 corr = _mm256_setzero_ps();
  for (int64_t j = 0; j < nb; ++j) {
    // [w0, w1] repeated over the lanes: lane l holds weight row l % kNR.
    const __m256 dwv = _mm256_castpd_ps(_mm256_broadcast_sd((const double*)(dw + j * kNR)));
    _mm256_store_ps(ds + j * kLanes, _mm256_mul_ps(dwv, _mm256_load_ps(xd + j * kLanes)));
    if constexpr (!kQ8) {
      const __m256 cwv = _mm256_castpd_ps(_mm256_broadcast_sd((const double*)(cw + j * kNR)));
      corr = _mm256_fmadd_ps(cwv, _mm256_load_ps(xs + j * kLanes), corr);
    }
  }
  __m256 acc[MR][kNR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int r = 0; r < kNR; ++r) acc[i][r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t j = 0; j < nb; ++j) {
    __m256i u[kNR];
    for (int r = 0; r < kNR; ++r) u[r] = _mm256_load_si256((const __m256i*)gb[j].u[r]);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m256i xq = _mm256_loadu_si256((const __m256i*)x[i * nb + j].qs);
#pragma GCC unroll 2
      for (int r = 0; r < kNR; ++r) {
        __m256i s = xq;
        if constexpr (kQ8) s = _mm256_sign_epi8(xq, _mm256_load_si256((const __m256i*)gb[j].q[r]));
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u[r], s), ones));
        acc[i][r] = _mm256_fmadd_ps(dot, _mm256_broadcast_ss(ds + j * kLanes + i * kNR + r), acc[i][r]);
      }
    }
  }
  alignas(32) float c[kLanes];
  _mm256_store_ps(c, _mm256_mul_ps(corr, _mm256_set1_ps(kQ41 ? 1.0f : -8.0f)));
  // Fully unrolled, so acc stays in registers (a loop here kept a memory copy updated every block).
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int r = 0; r < kNR; ++r) y[i * ldy + r] = HsumPs(acc[i][r]) + c[i * kNR + r];
}

// Group-major: each kNR-row weight group is unpacked right before every x tile runs over it (the x
// rows, ~M x K bytes, stay in L1/L2), and the raw rows kPrefetchGroups groups ahead are prefetched, so
// the weight stream from DRAM overlaps the tiles instead of forming a separate unpack pass. The Tile
// arithmetic per (x row, weight row) is unchanged, so rows stay bit-identical to the GEMV.
constexpr int64_t kPrefetchGroups = 2;

template <DType T>
void QGemmT(const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t m, int64_t K, float* y,
            int64_t ldy) {
  const int64_t nb = K / 32, n_groups = n_rows / kNR, n_tiles = (m + kMR - 1) / kMR;
  static thread_local std::vector<GroupBlock> blocks_buf;
  static thread_local std::vector<float> f_buf;
  GroupBlock* blocks = Scratch(blocks_buf, (size_t)nb);
  // xd, xs (per x tile and block), ds (one tile): 8 floats each; dw, cw (one group): kNR per block.
  float* f = Scratch(f_buf, (size_t)((2 * n_tiles * nb + nb) * kLanes + 2 * nb * kNR + 8));
  f = (float*)(((uintptr_t)f + 31) & ~(uintptr_t)31);
  float* xd = f;
  float* xs = xd + n_tiles * nb * kLanes;
  float* ds = xs + n_tiles * nb * kLanes;
  float* dw = ds + nb * kLanes;
  float* cw = dw + nb * kNR;
  for (int64_t t = 0; t < n_tiles; ++t)
    for (int64_t j = 0; j < nb; ++j)
      for (int l = 0; l < kLanes; ++l) {
        const int64_t i = t * kMR + l / kNR;
        xd[(t * nb + j) * kLanes + l] = i < m ? x[i * nb + j].d : 0.0f;
        xs[(t * nb + j) * kLanes + l] = i < m ? x[i * nb + j].s : 0.0f;
      }
  const size_t group_bytes = kNR * rb;
  for (int64_t g = 0; g < n_groups; ++g) {
    if (g + kPrefetchGroups < n_groups) {
      const char* p = (const char*)(w + (g + kPrefetchGroups) * group_bytes);
      for (size_t o = 0; o < group_bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
    }
    UnpackPanel<T>(w + g * group_bytes, rb, kNR, nb, blocks, dw, cw);
    for (int64_t t = 0; t < n_tiles; ++t) {
      const int64_t i0 = t * kMR, mr = std::min<int64_t>(kMR, m - i0);
      const float* txd = xd + t * nb * kLanes;
      const float* txs = xs + t * nb * kLanes;
      float* yt = y + i0 * ldy + g * kNR;
      const BlockQ8X* xt = x + i0 * nb;
      switch (mr) {
        case 4:
          Tile<T, 4>(blocks, dw, cw, xt, nb, txd, txs, ds, yt, ldy);
          break;
        case 3:
          Tile<T, 3>(blocks, dw, cw, xt, nb, txd, txs, ds, yt, ldy);
          break;
        case 2:
          Tile<T, 2>(blocks, dw, cw, xt, nb, txd, txs, ds, yt, ldy);
          break;
        default:
          Tile<T, 1>(blocks, dw, cw, xt, nb, txd, txs, ds, yt, ldy);
          break;
      }
    }
  }
}

}  // namespace

void QGemm(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t m, int64_t K,
           float* y, int64_t ldy) {
  LATHE_CHECK(n_rows % 4 == 0 && K % 32 == 0);
  switch (t) {
    case DType::kQ8_0:
      return QGemmT<DType::kQ8_0>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ4_0:
      return QGemmT<DType::kQ4_0>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ4_1:
      return QGemmT<DType::kQ4_1>(w, rb, n_rows, x, m, K, y, ldy);
    default:
      LATHE_CHECK_MSG(false, "QGemm: unsupported weight dtype %s", DTypeName(t));
  }
}

}  // namespace lathe::kernels::cpu::avx2
