// AVX2 register-blocked int8 GEMM for block-quantized weights (Q8_0/Q4_0/Q4_1/Q5_0/Q5_1) times int8-quantized
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

// Tile: kMR x rows times kNR weight rows; the per-block scale products of a tile fill one 8-lane
// vector (lane i * kNR + r).
constexpr int kMR = 4, kNR = 2, kLanes = kMR * kNR;
static_assert(kLanes == 8 && kNR == 2);  // the full-width form holds the kNR rows in one vector

// One weight row group (kNR rows) of the unpacked panel, per 32-block j, in the full-width form's
// layout: u[h] = [row 0's element half h | row 1's element half h] (half 0 = elements 0-15, 1 =
// 16-31) as the unsigned operand of maddubs (|q| for Q8_0, the nibbles for Q4); for Q8_0, q itself
// in the same layout (its signs).
struct alignas(32) GroupBlock {
  uint8_t u[2][32];
  int8_t q[2][32];
};

// Unpacks n_rows (multiple of kNR) weight rows: blocks[g * nb + j], and per (g, j) the kNR f16
// scales (dw) and Q4 offset/min factors (cw) as floats.
template <DType T>
void UnpackPanel(const uint8_t* w, size_t rb, int64_t n_rows, int64_t nb, GroupBlock* blocks, float* dw,
                 float* cw) {
  constexpr bool kQ8 = T == DType::kQ8_0, kMin = !kQ8 && Q4Block<T>::kMin;
  constexpr size_t kBB = kQ8 ? sizeof(BlockQ8_0) : Q4Block<T>::kBytes;
  constexpr size_t kQsOff = kQ8 ? 2 : Q4Block<T>::kQsOff;
  const __m128i m = _mm_set1_epi8(0x0f);
  for (int64_t g = 0; g < n_rows / kNR; ++g) {
    for (int64_t j = 0; j < nb; ++j) {
      GroupBlock& gb = blocks[g * nb + j];
      float d[kNR], c[kNR];
      for (int r = 0; r < kNR; ++r) {
        const uint8_t* b = w + (g * kNR + r) * rb + j * kBB;
        const uint16_t* h = (const uint16_t*)b;
        d[r] = _cvtsh_ss(h[0]);
        c[r] = kMin ? _cvtsh_ss(h[1]) : d[r];
        if constexpr (kQ8) {
          for (int half = 0; half < 2; ++half) {
            const __m128i q = _mm_loadu_si128((const __m128i*)(b + kQsOff + 16 * half));
            _mm_store_si128((__m128i*)(gb.q[half] + 16 * r), q);
            _mm_store_si128((__m128i*)(gb.u[half] + 16 * r), _mm_sign_epi8(q, q));
          }
        } else {
          const __m128i q = _mm_loadu_si128((const __m128i*)(b + kQsOff));
          __m128i u0 = _mm_and_si128(q, m), u1 = _mm_and_si128(_mm_srli_epi16(q, 4), m);
          if constexpr (Q4Block<T>::k5) {
            __m128i h0, h1;
            FifthBits(b + kQsOff - 4, &h0, &h1);
            u0 = _mm_or_si128(u0, h0);
            u1 = _mm_or_si128(u1, h1);
          }
          _mm_store_si128((__m128i*)(gb.u[0] + 16 * r), u0);
          _mm_store_si128((__m128i*)(gb.u[1] + 16 * r), u1);
        }
      }
      for (int r = 0; r < kNR; ++r) {
        dw[(g * nb + j) * kNR + r] = d[r];
        cw[(g * nb + j) * kNR + r] = c[r];
      }
    }
  }
}

// acc over all nb blocks for kMR (or fewer, MR) x rows and the kNR weight rows of one group, then
// y = Hsum4(acc) + offset term: per (i, r) the ops and their order of matmul_avx2.cc's QuantRows4
// (ds = dw * dx, acc = fma(float(Dot4), ds, acc), corr = fma(cw, s, corr)), in the split or the
// full-width form.
template <DType T, int MR, bool kSplit>
void Tile(const GroupBlock* gb, const float* dw, const float* cw, const BlockQ8X* x, int64_t nb,
          const float* xd, const float* xs, float* ds, float* y, int64_t ldy) {
  constexpr bool kQ8 = T == DType::kQ8_0;
  constexpr float kCorr = kQ8 ? 0.0f : Q4Block<T>::kCorr;
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
  alignas(32) float c[kLanes];
  _mm256_store_ps(c, _mm256_mul_ps(corr, _mm256_set1_ps(kCorr)));
  if constexpr (kSplit) {
    __m128 acc[MR][kNR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
      for (int r = 0; r < kNR; ++r) acc[i][r] = _mm_setzero_ps();
    for (int64_t j = 0; j < nb; ++j) {
      __m128i u0[kNR], u1[kNR], q0[kNR], q1[kNR];
#pragma GCC unroll 2
      for (int r = 0; r < kNR; ++r) {
        q0[r] = u0[r] = _mm_load_si128((const __m128i*)(gb[j].u[0] + 16 * r));
        q1[r] = u1[r] = _mm_load_si128((const __m128i*)(gb[j].u[1] + 16 * r));
        if constexpr (kQ8) {
          q0[r] = _mm_load_si128((const __m128i*)(gb[j].q[0] + 16 * r));
          q1[r] = _mm_load_si128((const __m128i*)(gb[j].q[1] + 16 * r));
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const int8_t* xq = x[i * nb + j].qs;
        const __m128i x0 = _mm_loadu_si128((const __m128i*)xq), x1 = _mm_loadu_si128((const __m128i*)(xq + 16));
#pragma GCC unroll 2
        for (int r = 0; r < kNR; ++r) {
          const __m128i dot = kQ8 ? Dot4Q8(u0[r], u1[r], _mm_sign_epi8(x0, q0[r]), _mm_sign_epi8(x1, q1[r]))
                                  : Dot4Q4(u0[r], u1[r], x0, x1);
          acc[i][r] = _mm_fmadd_ps(_mm_cvtepi32_ps(dot), _mm_broadcast_ss(ds + j * kLanes + i * kNR + r), acc[i][r]);
        }
      }
    }
    // Fully unrolled, so acc stays in registers (a loop here kept a memory copy updated every block).
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
      for (int r = 0; r < kNR; ++r) y[i * ldy + r] = Hsum4(acc[i][r]) + c[i * kNR + r];
  } else {
    __m256 acc[MR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t j = 0; j < nb; ++j) {
      const __m256i u0 = _mm256_load_si256((const __m256i*)gb[j].u[0]);
      const __m256i u1 = _mm256_load_si256((const __m256i*)gb[j].u[1]);
      __m256i q0 = u0, q1 = u1;
      if constexpr (kQ8) {
        q0 = _mm256_load_si256((const __m256i*)gb[j].q[0]);
        q1 = _mm256_load_si256((const __m256i*)gb[j].q[1]);
      }
      const __m128 dsj0 = _mm_load_ps(ds + j * kLanes), dsj1 = _mm_load_ps(ds + j * kLanes + 4);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const int8_t* xq = x[i * nb + j].qs;
        const __m256i x0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)xq));
        const __m256i x1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(xq + 16)));
        const __m256i dot =
            kQ8 ? Dot4Q8(u0, u1, _mm256_sign_epi8(x0, q0), _mm256_sign_epi8(x1, q1)) : Dot4Q4(u0, u1, x0, x1);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), PairScales(i < 2 ? dsj0 : dsj1, (i % 2) * kNR), acc[i]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      y[i * ldy] = Hsum4(_mm256_castps256_ps128(acc[i])) + c[i * kNR];
      y[i * ldy + 1] = Hsum4(_mm256_extractf128_ps(acc[i], 1)) + c[i * kNR + 1];
    }
  }
}

// Group-major: each kNR-row weight group is unpacked right before every x tile runs over it (the x
// rows, ~M x K bytes, stay in L1/L2), and the raw rows kPrefetchGroups groups ahead are prefetched, so
// the weight stream from DRAM overlaps the tiles instead of forming a separate unpack pass. The Tile
// arithmetic per (x row, weight row) is unchanged, so rows stay bit-identical to the GEMV.
constexpr int64_t kPrefetchGroups = 2;

template <DType T, bool kSplit>
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
          Tile<T, 4, kSplit>(blocks, dw, cw, xt, nb, txd, txs, ds, yt, ldy);
          break;
        case 3:
          Tile<T, 3, kSplit>(blocks, dw, cw, xt, nb, txd, txs, ds, yt, ldy);
          break;
        case 2:
          Tile<T, 2, kSplit>(blocks, dw, cw, xt, nb, txd, txs, ds, yt, ldy);
          break;
        default:
          Tile<T, 1, kSplit>(blocks, dw, cw, xt, nb, txd, txs, ds, yt, ldy);
          break;
      }
    }
  }
}

}  // namespace

template <bool kSplit>
void QGemm(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t m, int64_t K,
           float* y, int64_t ldy) {
  LATHE_CHECK(n_rows % 4 == 0 && K % 32 == 0);
  switch (t) {
    case DType::kQ8_0:
      return QGemmT<DType::kQ8_0, kSplit>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ4_0:
      return QGemmT<DType::kQ4_0, kSplit>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ4_1:
      return QGemmT<DType::kQ4_1, kSplit>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ5_0:
      return QGemmT<DType::kQ5_0, kSplit>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ5_1:
      return QGemmT<DType::kQ5_1, kSplit>(w, rb, n_rows, x, m, K, y, ldy);
    default:
      LATHE_CHECK_MSG(false, "QGemm: unsupported weight dtype %s", DTypeName(t));
  }
}

template void QGemm<true>(DType, const uint8_t*, size_t, int64_t, const BlockQ8X*, int64_t, int64_t, float*, int64_t);
template void QGemm<false>(DType, const uint8_t*, size_t, int64_t, const BlockQ8X*, int64_t, int64_t, float*,
                           int64_t);

}  // namespace lathe::kernels::cpu::avx2
