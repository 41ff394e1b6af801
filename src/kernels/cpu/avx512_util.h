// Small AVX-512 helpers (tail masks, exp) shared by the *_avx512.cc and *_avx512bf16.cc files only: they
// are compiled with the AVX-512 F/BW/VL/DQ/VNNI flags (and BF16); never include this from another file.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/dispatch.h"

namespace lathe::kernels::cpu::avx512 {

MatMulKernels GetMatMulKernels();  // matmul_avx512.cc
// MatMulKernels::qgemm (qgemm_avx512.cc): the VNNI int8 GEMM, bit-identical to this tier's GEMV per row.
void QGemm(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t m, int64_t K, float* y,
           int64_t ldy);
// MatMulKernels::qgemm_runs / quantize_x16 (qgemm_avx512.cc): the same GEMM over runs of int8 and int16 x rows.
void QGemmRuns(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const QRun* runs, int n_runs, int64_t K);
void QuantizeX16(const float* x, int64_t K, BlockQ16X* out);
void XStarts(const BlockQ8X* x, int64_t n, int32_t* out);

// Lanes [0, n) of 16, n in [0, 16].
inline __mmask16 Mask16(int64_t n) { return (__mmask16)((1u << n) - 1); }
// Lanes [0, n) of 16 for any n: all 16 from n = 16 on, none for n <= 0.
inline __mmask16 MaskUpTo16(int64_t n) {
  return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

inline float Hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for 16 floats; the same Cephes-style reduction and polynomial as the AVX2 ExpPs, with
// the 2^n scaling done by vscalefps (exact, no exponent-field overflow).
inline __m512 ExpPs(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

}  // namespace lathe::kernels::cpu::avx512
