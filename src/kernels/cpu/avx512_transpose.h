// The 16 x 16 in-register transpose of 32-bit lanes, for the files compiled with AVX-512 flags
// (train_ops_avx512.cc, bf16dot_avx512bf16.cc). Internal linkage (static): each file gets its own copy
// compiled with its own flags, so no one definition can leak into a file built for another ISA.
#pragma once

#include <immintrin.h>

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

}  // namespace lathe::kernels::cpu
