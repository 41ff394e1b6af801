// The 4-row int8 GEMV of the 32-element block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) for M = 1-4 x
// rows, shared by two translation units: matmul_avx2.cc (the AVX2 tier) and matmul_avx512.cc (the
// AVX-512 tier, for Q5_0 / Q5_1, whose fifth bits it expands from k-masks). Everything here is in an
// anonymous namespace, so each includer gets its own copy compiled with its own ISA flags (no
// inline function with two bodies across the link). The arithmetic is integer up to the block's
// int32 lanes and the same float ops after it: both copies give the same bits.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/dispatch.h"

namespace lathe::kernels::cpu {
namespace {

using avx2::Dot4Q4;
using avx2::Dot4Q8;
using avx2::FifthBits;
using avx2::Hsum4;
using avx2::PairScales;
using avx2::Q4Block;

// Q5: the fifth bits of two rows' blocks (the u32 qh at qa and at qb) as 0x10 bytes, [row a | row b]
// per vector: h0 = elements 0-15, h1 = 16-31. With AVX-512 BW + VL one k-mask per vector (the GEMV
// at ~Q4_1's speed); in AVX2 each lane byte takes the qh byte that holds its bit, keeps that bit and
// compares (as fast as the 8-byte table per row on an AVX-512 Xeon, with no table loads).
__attribute__((always_inline)) inline void FifthBitsPair(const uint8_t* qa, const uint8_t* qb, __m256i* h0,
                                                         __m256i* h1) {
  uint32_t a, b;
  std::memcpy(&a, qa, 4);
  std::memcpy(&b, qb, 4);
  const __m256i x10 = _mm256_set1_epi8(0x10);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  *h0 = _mm256_maskz_mov_epi8((a & 0xffffu) | (b << 16), x10);
  *h1 = _mm256_maskz_mov_epi8((a >> 16) | (b & 0xffff0000u), x10);
#else
  const __m256i v = _mm256_set_m128i(_mm_cvtsi32_si128((int)b), _mm_cvtsi32_si128((int)a));
  const __m256i sel = _mm256_set1_epi64x(0x8040201008040201ll);
  const __m256i i0 = _mm256_setr_epi64x(0, 0x0101010101010101ll, 0, 0x0101010101010101ll);
  const __m256i i1 = _mm256_setr_epi64x(0x0202020202020202ll, 0x0303030303030303ll, 0x0202020202020202ll,
                                        0x0303030303030303ll);
  *h0 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, i0), sel), sel), x10);
  *h1 = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, i1), sel), sel), x10);
#endif
}

// Batched decode (M = 1-4 x rows), four weight rows per pass: their four f16 scales are converted
// by one vcvtph2ps and multiplied by each x scale together, the Q4 offset/min terms of the four rows
// share one FMA, and each x block is loaded once for the four rows. Every (x row, weight row) gets
// the 4-lane block arithmetic of avx2_util.h (Dot4Q4 / Dot4Q8), whatever M and whichever form.
__attribute__((always_inline)) inline __m128i Load4Halves(const uint8_t* p0, size_t stride) {
  __m128i h = _mm_cvtsi32_si128(*(const uint16_t*)p0);
  h = _mm_insert_epi16(h, *(const uint16_t*)(p0 + stride), 1);
  h = _mm_insert_epi16(h, *(const uint16_t*)(p0 + 2 * stride), 2);
  return _mm_insert_epi16(h, *(const uint16_t*)(p0 + 3 * stride), 3);
}

// One block of one weight row (quants at qs; Q5's fifth bits the 4 bytes before) times x halves
// x0, x1: 4 int32 lanes.
template <DType T>
__attribute__((always_inline)) inline __m128i RowDot4(const uint8_t* qs, __m128i x0, __m128i x1) {
  if constexpr (T == DType::kQ8_0) {
    const __m128i q0 = _mm_loadu_si128((const __m128i*)qs), q1 = _mm_loadu_si128((const __m128i*)(qs + 16));
    return Dot4Q8(_mm_sign_epi8(q0, q0), _mm_sign_epi8(q1, q1), _mm_sign_epi8(x0, q0), _mm_sign_epi8(x1, q1));
  } else {
    const __m128i q = _mm_loadu_si128((const __m128i*)qs), m = _mm_set1_epi8(0x0f);
    __m128i u0 = _mm_and_si128(q, m), u1 = _mm_and_si128(_mm_srli_epi16(q, 4), m);
    if constexpr (Q4Block<T>::k5) {
      __m128i h0, h1;
      FifthBits(qs - 4, &h0, &h1);
      u0 = _mm_or_si128(u0, h0);
      u1 = _mm_or_si128(u1, h1);
    }
    return Dot4Q4(u0, u1, x0, x1);
  }
}

// The same for two weight rows (quants at qa, qb): [row a | row b], x halves broadcast to both lanes.
template <DType T>
__attribute__((always_inline)) inline __m256i RowPairDot4(const uint8_t* qa, const uint8_t* qb, __m256i x0, __m256i x1) {
  if constexpr (T == DType::kQ8_0) {
    const __m256i q0 = _mm256_set_m128i(_mm_loadu_si128((const __m128i*)qb), _mm_loadu_si128((const __m128i*)qa));
    const __m256i q1 = _mm256_set_m128i(_mm_loadu_si128((const __m128i*)(qb + 16)),
                                        _mm_loadu_si128((const __m128i*)(qa + 16)));
    return Dot4Q8(_mm256_sign_epi8(q0, q0), _mm256_sign_epi8(q1, q1), _mm256_sign_epi8(x0, q0),
                  _mm256_sign_epi8(x1, q1));
  } else {
    const __m256i q = _mm256_set_m128i(_mm_loadu_si128((const __m128i*)qb), _mm_loadu_si128((const __m128i*)qa));
    const __m256i m = _mm256_set1_epi8(0x0f);
    __m256i u0 = _mm256_and_si256(q, m), u1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), m);
    if constexpr (Q4Block<T>::k5) {
      __m256i h0, h1;
      FifthBitsPair(qa - 4, qb - 4, &h0, &h1);
      u0 = _mm256_or_si256(u0, h0);
      u1 = _mm256_or_si256(u1, h1);
    }
    return Dot4Q4(u0, u1, x0, x1);
  }
}

// Four weight rows' accumulators for one x row, in the split or the full-width form.
template <bool kSplit>
struct Quad;

template <>
struct Quad<true> {
  __m128 a[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
  // Adds block j of the rows at qs, qs + rb, ... times x block xb; ds = the rows' dw * xb.d.
  template <DType T>
  __attribute__((always_inline)) void Add(const uint8_t* qs, size_t rb, const BlockQ8X& xb, __m128 ds) {
    const __m128i x0 = _mm_loadu_si128((const __m128i*)xb.qs), x1 = _mm_loadu_si128((const __m128i*)(xb.qs + 16));
    a[0] = _mm_fmadd_ps(_mm_cvtepi32_ps(RowDot4<T>(qs, x0, x1)), _mm_shuffle_ps(ds, ds, 0x00), a[0]);
    a[1] = _mm_fmadd_ps(_mm_cvtepi32_ps(RowDot4<T>(qs + rb, x0, x1)), _mm_shuffle_ps(ds, ds, 0x55), a[1]);
    a[2] = _mm_fmadd_ps(_mm_cvtepi32_ps(RowDot4<T>(qs + 2 * rb, x0, x1)), _mm_shuffle_ps(ds, ds, 0xaa), a[2]);
    a[3] = _mm_fmadd_ps(_mm_cvtepi32_ps(RowDot4<T>(qs + 3 * rb, x0, x1)), _mm_shuffle_ps(ds, ds, 0xff), a[3]);
  }
  float Sum(int q) const { return Hsum4(a[q]); }
};

template <>
struct Quad<false> {
  __m256 a01 = _mm256_setzero_ps(), a23 = _mm256_setzero_ps();
  template <DType T>
  __attribute__((always_inline)) void Add(const uint8_t* qs, size_t rb, const BlockQ8X& xb, __m128 ds) {
    const __m256i x0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)xb.qs));
    const __m256i x1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(xb.qs + 16)));
    a01 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(RowPairDot4<T>(qs, qs + rb, x0, x1)), PairScales(ds, 0), a01);
    a23 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(RowPairDot4<T>(qs + 2 * rb, qs + 3 * rb, x0, x1)), PairScales(ds, 2),
                          a23);
  }
  float Sum(int q) const {
    const __m256 v = q < 2 ? a01 : a23;
    return Hsum4(q % 2 ? _mm256_extractf128_ps(v, 1) : _mm256_castps256_ps128(v));
  }
};

template <DType T, int M, bool kSplit>
void QuantRows4(const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t nb, float* y,
                int64_t ldy) {
  constexpr bool kQ8 = T == DType::kQ8_0, kMin = !kQ8 && Q4Block<T>::kMin;
  constexpr size_t kBB = kQ8 ? sizeof(BlockQ8_0) : Q4Block<T>::kBytes;
  constexpr size_t kQsOff = kQ8 ? 2 : Q4Block<T>::kQsOff;
  constexpr float kCorr = kQ8 ? 0.0f : Q4Block<T>::kCorr;
  // The rows in 4 runs of n_rows / 4, row i of every run together: 4 long sequential streams for
  // the hardware prefetcher (4 adjacent rows interleaved hid the stream from it: cold Q8_0 ran at
  // half speed; a software prefetch of the next 4 rows got most of it back, long runs more).
  const int64_t run = n_rows / 4;
  const size_t rs = run * rb;  // bytes between the 4 rows of a step
  for (int64_t r = 0; r < run; ++r) {
    const uint8_t* row = w + r * rb;
    Quad<kSplit> acc[M];
    __m128 corr[M];
    for (int i = 0; i < M; ++i) corr[i] = _mm_setzero_ps();
    for (int64_t j = 0; j < nb; ++j) {
      const uint8_t* b0 = row + j * kBB;
      const __m128 dw = _mm_cvtph_ps(Load4Halves(b0, rs));
      __m128 cw = dw;
      if constexpr (kMin) cw = _mm_cvtph_ps(Load4Halves(b0 + 2, rs));
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) {
        const BlockQ8X& xb = x[i * nb + j];
        if constexpr (!kQ8) corr[i] = _mm_fmadd_ps(cw, _mm_set1_ps(xb.s), corr[i]);
        acc[i].template Add<T>(b0 + kQsOff, rs, xb, _mm_mul_ps(dw, _mm_set1_ps(xb.d)));
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < M; ++i) {
      alignas(16) float c[4];
      _mm_store_ps(c, _mm_mul_ps(corr[i], _mm_set1_ps(kCorr)));
      for (int q = 0; q < 4; ++q) y[i * ldy + r + q * run] = acc[i].Sum(q) + c[q];
    }
  }
}

}  // namespace
}  // namespace lathe::kernels::cpu
