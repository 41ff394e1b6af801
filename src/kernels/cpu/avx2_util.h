// Small AVX2 helpers (horizontal sums, tail masks, exp) shared by the *_avx2.cc files only: they
// are compiled with -mavx2 -mfma -mf16c; never include this from a baseline file.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/dispatch.h"

namespace lathe::kernels::cpu::avx2 {

MatMulKernels GetMatMulKernels();  // matmul_avx2.cc
// MatMulKernels::qgemm (qgemm_avx2.cc).
void QGemm(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t m, int64_t K,
           float* y, int64_t ldy);

inline float HsumPs(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 32 4-bit values of a Q4 block (16 bytes at qs) as unsigned bytes in element order: the low nibbles
// (elements 0-15) in the low lane, the high nibbles (16-31) in the high lane. A 128-bit shift and a
// lane insert: on Zen 1 a broadcast load + vpsrlvq (one op fewer) made the Q4 GEMV ~8% slower
// (3.48 vs 3.21 ns per 32-weight block and row, 1536x576 in cache).
inline __m256i UnpackNibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128((const __m128i*)qs);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
}

inline float HmaxPs(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int HsumEpi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// Lanes [0, n) set, for masked loads/stores of a tail of n < 8 floats.
inline __m256i TailMask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// exp(x) for 8 floats, relative error ~2e-7 over the clamped range [-87.3, 88.7] (inputs below
// give ~1e-38 instead of 0, which no caller can tell apart). Cody-Waite range reduction plus a
// degree-6 polynomial, as in Cephes expf.
inline __m256 ExpPs(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n: n in [-126, 128]; 2^128 would overflow the exponent field, so scale in two steps.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256 s1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

}  // namespace lathe::kernels::cpu::avx2
