// AVX-512 decode kernels for packed 4-bit weights: the 16-entry codebook sits in one zmm register and
// vpermps looks up 16 codes at once, in natural element order. The int8 dot is the AVX2 one.
// Exercised by the QuantMatMulTier tests on AVX-512 machines (skipped elsewhere).
#include <immintrin.h>

#include "kernels/cpu/quant.h"

namespace lathe::kernels::quant::avx512 {

namespace {

// 8 packed bytes -> 16 code indices in element order (2i from the high nibble of byte i, 2i + 1 from
// the low); vpermps reads only bits 3:0 of each index, so the low nibble needs no mask.
inline __m512i Indices16(const uint8_t* p) {
  const __m128i bytes = _mm_loadl_epi64((const __m128i*)p);
  const __m128i dup = _mm_shuffle_epi8(bytes, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
  const __m512i shifts = _mm512_setr_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
  return _mm512_srlv_epi32(_mm512_cvtepu8_epi32(dup), shifts);
}

void Dequant4(const uint8_t* codes, const float* code16, const float* absmax, int64_t nb, float* out) {
  const __m512 lut = _mm512_loadu_ps(code16);
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 a = _mm512_set1_ps(absmax[b]);
    for (int q = 0; q < 4; ++q) {
      const __m512 v = _mm512_permutexvar_ps(Indices16(codes + b * 32 + q * 8), lut);
      _mm512_storeu_ps(out + b * 64 + q * 16, _mm512_mul_ps(v, a));
    }
  }
}

template <int M>
void Gemv4M(const uint8_t* codes, __m512 lut, const float* absmax, int64_t n_rows, int64_t K, const float* x,
            float* y, int64_t ldy) {
  const int64_t nb = K / 64;
  for (int64_t r = 0; r < n_rows; ++r) {
    __m512 acc[M];
    for (int i = 0; i < M; ++i) acc[i] = _mm512_setzero_ps();
    const uint8_t* cr = codes + r * nb * 32;
    for (int64_t b = 0; b < nb; ++b) {
      __m512 blk[M];
      for (int i = 0; i < M; ++i) blk[i] = _mm512_setzero_ps();
      for (int q = 0; q < 4; ++q) {
        const __m512 v = _mm512_permutexvar_ps(Indices16(cr + b * 32 + q * 8), lut);
        for (int i = 0; i < M; ++i)
          blk[i] = _mm512_fmadd_ps(v, _mm512_loadu_ps(x + i * K + b * 64 + q * 16), blk[i]);
      }
      const __m512 a = _mm512_set1_ps(absmax[r * nb + b]);
      for (int i = 0; i < M; ++i) acc[i] = _mm512_fmadd_ps(blk[i], a, acc[i]);
    }
    for (int i = 0; i < M; ++i) y[i * ldy + r] = _mm512_reduce_add_ps(acc[i]);
  }
}

void Gemv4(const uint8_t* codes, const float* code16, const float* absmax, int64_t n_rows, int64_t K,
           const float* x, int64_t m, float* y, int64_t ldy) {
  const __m512 lut = _mm512_loadu_ps(code16);
  switch (m) {
    case 1:
      return Gemv4M<1>(codes, lut, absmax, n_rows, K, x, y, ldy);
    case 2:
      return Gemv4M<2>(codes, lut, absmax, n_rows, K, x, y, ldy);
    case 3:
      return Gemv4M<3>(codes, lut, absmax, n_rows, K, x, y, ldy);
    default:
      return Gemv4M<4>(codes, lut, absmax, n_rows, K, x, y, ldy);
  }
}

}  // namespace

const QuantKernels& Table() {
  static const QuantKernels t{IsaTier::kAvx512, Dequant4, Gemv4, avx2::Table().dot_i8};
  return t;
}

}  // namespace lathe::kernels::quant::avx512
