// AVX-512 VNNI int8 GEMM for block-quantized weights (Q8_0/Q4_0/Q4_1/Q5_0/Q5_1) times int8-quantized x
// rows (batched decode from 8 rows, qgemm_min_m): the AVX-512 tier's MatMulKernels::qgemm. Every
// (x row, weight row) pair gets the M = 1 GEMV arithmetic of the AVX2 kernels (avx2_util.h, Dot4Q4 /
// Dot4Q8): per 32-element block 4 exact int32 lanes (lane l = elements 4l..4l+3 of both halves),
// acc = fma(float(lanes), dw * dx, acc) in block order, then Hsum4(acc) + the offset term. vpdpbusd
// forms the same exact lane sums as maddubs + madd, so rows stay bit-identical to the GEMV.
// Against the batched GEMV (1 thread, 1536 x 576 from DRAM, AVX-512 Xeon): M = 6 equal, M = 8 Q8_0
// 267 -> 231 us, Q4_1 211 -> 155, Q5_0 196 -> 179, M = 16 1.5-1.7x faster; M = 5-6 about equal (Q5_0
// 0.9x): hence qgemm_min_m = 8 on this tier.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/avx512_util.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/scratch.h"

namespace lathe::kernels::cpu::avx512 {

namespace {

using avx2::Hsum4;
using avx2::Q4Block;

// A tile: kMR x rows times kNG groups of 4 weight rows; a group's 4 rows fill one zmm, row r in
// 128-bit lane r (its 4 int32 lanes are the AVX2 kernels' 4 lanes of that row).
constexpr int kMR = 4, kNG = 2, kRows = 4 * kNG;

// One group's block j: u[h] = the 4 rows' element halves h (16 bytes each, row r at 16 r) as the
// unsigned operand of vpdpbusd: the nibbles for Q4 / Q5, q + 128 for Q8_0 (whose x side then
// subtracts 128 * its lane sums); sc / cw: each row's dw and offset factor repeated over its 4 lanes.
struct alignas(64) GroupBlock {
  uint8_t u[2][64];
  float dw[16];
  float cw[16];
};

template <DType T>
void UnpackGroup(const uint8_t* w, size_t rb, int64_t nb, GroupBlock* blocks) {
  constexpr bool kQ8 = T == DType::kQ8_0, kMin = !kQ8 && Q4Block<T>::kMin;
  constexpr size_t kBB = kQ8 ? sizeof(BlockQ8_0) : Q4Block<T>::kBytes;
  constexpr size_t kQsOff = kQ8 ? 2 : Q4Block<T>::kQsOff;
  const __m128i m = _mm_set1_epi8(0x0f), x80 = _mm_set1_epi8((char)0x80);
  for (int64_t j = 0; j < nb; ++j) {
    GroupBlock& gb = blocks[j];
    for (int r = 0; r < 4; ++r) {
      const uint8_t* b = w + r * rb + j * kBB;
      const uint16_t* h = (const uint16_t*)b;
      const float d = _cvtsh_ss(h[0]), c = kMin ? _cvtsh_ss(h[1]) : d;
      _mm_store_ps(gb.dw + 4 * r, _mm_set1_ps(d));
      _mm_store_ps(gb.cw + 4 * r, _mm_set1_ps(c));
      if constexpr (kQ8) {
        for (int half = 0; half < 2; ++half) {
          const __m128i q = _mm_loadu_si128((const __m128i*)(b + kQsOff + 16 * half));
          _mm_store_si128((__m128i*)(gb.u[half] + 16 * r), _mm_xor_si128(q, x80));
        }
      } else {
        const __m128i q = _mm_loadu_si128((const __m128i*)(b + kQsOff));
        __m128i u0 = _mm_and_si128(q, m), u1 = _mm_and_si128(_mm_srli_epi16(q, 4), m);
        if constexpr (Q4Block<T>::k5) {  // the fifth bits (u32 before the nibbles) as two byte masks
          uint32_t qh;
          std::memcpy(&qh, b + kQsOff - 4, 4);
          const __m128i x10 = _mm_set1_epi8(0x10);
          u0 = _mm_or_si128(u0, _mm_maskz_mov_epi8((__mmask16)(qh & 0xffff), x10));
          u1 = _mm_or_si128(u1, _mm_maskz_mov_epi8((__mmask16)(qh >> 16), x10));
        }
        _mm_store_si128((__m128i*)(gb.u[0] + 16 * r), u0);
        _mm_store_si128((__m128i*)(gb.u[1] + 16 * r), u1);
      }
    }
  }
}

// Per x row and block, the 4-lane start of the dot products: -128 * (lane sums of x) for Q8_0 (the
// weights enter as q + 128), zero otherwise.
inline __m128i XBias(const int8_t* xq) {
  const __m128i x80 = _mm_set1_epi8((char)0x80);
  __m128i s = _mm_dpbusd_epi32(_mm_setzero_si128(), x80, _mm_loadu_si128((const __m128i*)xq));
  s = _mm_dpbusd_epi32(s, x80, _mm_loadu_si128((const __m128i*)(xq + 16)));
  return _mm_sub_epi32(_mm_setzero_si128(), s);
}

// y for MR x rows and NG groups (4 NG weight rows) over all nb blocks: per (x row, weight row) the
// AVX2 GEMV's ops in its order (ds = dw * dx; acc = fma(float(dot), ds, acc); corr = fma(cw, s,
// corr); y = Hsum4(acc) + corr * kCorr).
template <DType T, int MR, int NG>
void Tile(const GroupBlock* const* gb, const BlockQ8X* x, const __m128i* xbias, int64_t nb, float* y, int64_t ldy) {
  constexpr bool kQ8 = T == DType::kQ8_0;
  constexpr float kCorr = kQ8 ? 0.0f : Q4Block<T>::kCorr;
  __m512 acc[MR][NG], corr[MR][NG];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int g = 0; g < NG; ++g) acc[i][g] = corr[i][g] = _mm512_setzero_ps();
  for (int64_t j = 0; j < nb; ++j) {
    __m512i u0[NG], u1[NG];
    __m512 dw[NG], cw[NG];
#pragma GCC unroll 2
    for (int g = 0; g < NG; ++g) {
      u0[g] = _mm512_load_si512(gb[g][j].u[0]);
      u1[g] = _mm512_load_si512(gb[g][j].u[1]);
      dw[g] = _mm512_load_ps(gb[g][j].dw);
      if constexpr (!kQ8) cw[g] = _mm512_load_ps(gb[g][j].cw);
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const BlockQ8X& xb = x[i * nb + j];
      const __m512i x0 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)xb.qs));
      const __m512i x1 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)(xb.qs + 16)));
      const __m512i start = kQ8 ? _mm512_broadcast_i32x4(xbias[i * nb + j]) : _mm512_setzero_si512();
      const __m512 dx = _mm512_set1_ps(xb.d);
#pragma GCC unroll 2
      for (int g = 0; g < NG; ++g) {
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start, u0[g], x0), u1[g], x1);
        acc[i][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw[g], dx), acc[i][g]);
        if constexpr (!kQ8) corr[i][g] = _mm512_fmadd_ps(cw[g], _mm512_set1_ps(xb.s), corr[i][g]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int g = 0; g < NG; ++g) {
      alignas(64) float a[16], c[16];
      _mm512_store_ps(a, acc[i][g]);
      _mm512_store_ps(c, _mm512_mul_ps(corr[i][g], _mm512_set1_ps(kCorr)));
      for (int r = 0; r < 4; ++r) y[i * ldy + 4 * g + r] = Hsum4(_mm_load_ps(a + 4 * r)) + c[4 * r];
    }
}

template <DType T, int NG>
void Tiles(const GroupBlock* const* gb, const BlockQ8X* x, const __m128i* xbias, int64_t m, int64_t nb, float* y,
           int64_t ldy) {
  // xbias exists for Q8_0 only (null otherwise: no offset is applied to it then).
  const auto bias = [&](int64_t i0) { return T == DType::kQ8_0 ? xbias + i0 * nb : nullptr; };
  int64_t i0 = 0;
  for (; i0 + kMR <= m; i0 += kMR) Tile<T, kMR, NG>(gb, x + i0 * nb, bias(i0), nb, y + i0 * ldy, ldy);
  switch (m - i0) {
    case 3:
      return Tile<T, 3, NG>(gb, x + i0 * nb, bias(i0), nb, y + i0 * ldy, ldy);
    case 2:
      return Tile<T, 2, NG>(gb, x + i0 * nb, bias(i0), nb, y + i0 * ldy, ldy);
    case 1:
      return Tile<T, 1, NG>(gb, x + i0 * nb, bias(i0), nb, y + i0 * ldy, ldy);
    default:
      return;
  }
}

// Weight-row-group major, as the AVX2 kernel: kRows rows unpacked right before every x tile runs over
// them (x stays in L1 / L2), the raw rows kPrefetchRows ahead prefetched meanwhile.
constexpr int64_t kPrefetchRows = 2 * kRows;

template <DType T>
void QGemmT(const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t m, int64_t K, float* y,
            int64_t ldy) {
  const int64_t nb = K / 32;
  static thread_local std::vector<GroupBlock> blocks_buf;
  static thread_local std::vector<__m128i> bias_buf;
  GroupBlock* blocks = Scratch(blocks_buf, (size_t)(kNG * nb));
  __m128i* xbias = nullptr;
  if constexpr (T == DType::kQ8_0) {
    xbias = Scratch(bias_buf, (size_t)(m * nb));
    for (int64_t i = 0; i < m * nb; ++i) xbias[i] = XBias(x[i].qs);
  }
  const GroupBlock* gb[kNG] = {blocks, blocks + nb};
  for (int64_t r0 = 0; r0 < n_rows; r0 += kRows) {
    const int64_t nr = std::min<int64_t>(kRows, n_rows - r0);
    if (r0 + kRows + kPrefetchRows <= n_rows) {
      const char* p = (const char*)(w + (r0 + kPrefetchRows) * rb);
      for (size_t o = 0; o < kRows * rb; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
    }
    for (int64_t g = 0; g < nr / 4; ++g) UnpackGroup<T>(w + (r0 + 4 * g) * rb, rb, nb, blocks + g * nb);
    if (nr == kRows) {
      Tiles<T, kNG>(gb, x, xbias, m, nb, y + r0, ldy);
    } else {
      Tiles<T, 1>(gb, x, xbias, m, nb, y + r0, ldy);
    }
  }
}

}  // namespace

void QGemm(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t m, int64_t K, float* y,
           int64_t ldy) {
  LATHE_CHECK(n_rows % 4 == 0 && K % 32 == 0);
  switch (t) {
    case DType::kQ8_0:
      return QGemmT<DType::kQ8_0>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ4_0:
      return QGemmT<DType::kQ4_0>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ4_1:
      return QGemmT<DType::kQ4_1>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ5_0:
      return QGemmT<DType::kQ5_0>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ5_1:
      return QGemmT<DType::kQ5_1>(w, rb, n_rows, x, m, K, y, ldy);
    default:
      LATHE_CHECK_MSG(false, "QGemm: unsupported weight dtype %s", DTypeName(t));
  }
}

}  // namespace lathe::kernels::cpu::avx512
