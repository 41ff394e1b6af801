// The 16 x 16 in-register transpose of 32-bit lanes and a strided matrix transpose built on it, for the files
// compiled with AVX-512 flags (train_ops_avx512.cc, bf16dot_avx512bf16.cc, train_attention_avx512bf16.cc). Internal linkage (static): each file gets its own copy
// compiled with its own flags, so no one definition can leak into a file built for another ISA.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace lathe::kernels::cpu {

// In-register transpose of the 16 x 16 block r (row i = r[i]): afterwards r[k] = column k.
__attribute__((always_inline)) static inline void Transpose16(__m512 (&r)[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // r[4 g + k], 128-bit lane q: column 4 q + k of rows 4 g .. 4 g + 3.
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    r[4 * g + 0] = _mm512_shuffle_ps(t[4 * g + 0], t[4 * g + 2], 0x44);
    r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g + 0], t[4 * g + 2], 0xee);
    r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88);
    t[4 + k] = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xdd);
    t[8 + k] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88);
    t[12 + k] = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xdd);
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0xdd);
    r[4 + k] = _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0x88);
    r[12 + k] = _mm512_shuffle_f32x4(t[4 + k], t[12 + k], 0xdd);
  }
}

// d (cols, rows) = s^T for s (rows, cols), row strides lds / ldd, in 16 x 16 register blocks (edges masked).
static inline void TransposeF32(const float* s, int64_t rows, int64_t cols, int64_t lds, float* d, int64_t ldd) {
  for (int64_t i0 = 0; i0 < rows; i0 += 16) {
    const int64_t ni = std::min<int64_t>(16, rows - i0);
    const __mmask16 im = (__mmask16)(ni >= 16 ? 0xffff : (1u << ni) - 1);
    for (int64_t j0 = 0; j0 < cols; j0 += 16) {
      const int64_t nj = std::min<int64_t>(16, cols - j0);
      const __mmask16 jm = (__mmask16)(nj >= 16 ? 0xffff : (1u << nj) - 1);
      __m512 r[16];
#pragma GCC unroll 16
      for (int64_t i = 0; i < 16; ++i)
        r[i] = i < ni ? _mm512_maskz_loadu_ps(jm, s + (i0 + i) * lds + j0) : _mm512_setzero_ps();
      Transpose16(r);
      for (int64_t j = 0; j < nj; ++j) _mm512_mask_storeu_ps(d + (j0 + j) * ldd + i0, im, r[j]);
    }
  }
}

}  // namespace lathe::kernels::cpu
