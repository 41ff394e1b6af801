// AVX2 decode kernels for packed quantized weights: 4-bit codes -> f32 through in-register tables
// (vpermps + blend for dequantization, byte-plane pshufb for the GEMV); int8 dot via vpmaddubsw.
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/quant.h"

namespace lathe::kernels::quant::avx2 {

namespace {

struct Lut {
  __m256 lo, hi;
  explicit Lut(const float* code16) : lo(_mm256_loadu_ps(code16)), hi(_mm256_loadu_ps(code16 + 8)) {}
};

// 16 packed bytes -> 32 code values (4 vectors of 8), element 2i from the high nibble of byte i.
inline void Decode32(const uint8_t* p, const Lut& t, __m256 out[4]) {
  const __m128i bytes = _mm_loadu_si128((const __m128i*)p);
  const __m256i shifts = _mm256_setr_epi32(4, 0, 4, 0, 4, 0, 4, 0);
  const __m256i mask = _mm256_set1_epi32(15);
  const __m128i sh[4] = {
      _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1, -1, -1),
      _mm_setr_epi8(4, 4, 5, 5, 6, 6, 7, 7, -1, -1, -1, -1, -1, -1, -1, -1),
      _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, -1, -1, -1, -1, -1, -1, -1, -1),
      _mm_setr_epi8(12, 12, 13, 13, 14, 14, 15, 15, -1, -1, -1, -1, -1, -1, -1, -1),
  };
  for (int g = 0; g < 4; ++g) {
    __m256i idx = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(bytes, sh[g]));
    idx = _mm256_and_si256(_mm256_srlv_epi32(idx, shifts), mask);
    const __m256 lo = _mm256_permutevar8x32_ps(t.lo, idx);
    const __m256 hi = _mm256_permutevar8x32_ps(t.hi, idx);
    out[g] = _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
  }
}

void Dequant4(const uint8_t* codes, const float* code16, const float* absmax, int64_t nb, float* out) {
  const Lut t(code16);
  __m256 v[4];
  for (int64_t b = 0; b < nb; ++b) {
    const __m256 a = _mm256_set1_ps(absmax[b]);
    for (int h = 0; h < 2; ++h) {
      Decode32(codes + b * 32 + h * 16, t, v);
      for (int g = 0; g < 4; ++g) _mm256_storeu_ps(out + b * 64 + h * 32 + g * 8, _mm256_mul_ps(v[g], a));
    }
  }
}

// Decode GEMV: each 64-block's codes become f32 through four byte-plane pshufb lookups (exact
// code values) and two rounds of unpacks, which leave the elements in a lane-interleaved order;
// x is permuted into that order once per call (XPerm) so the FMAs need no further shuffles.
struct Planes {
  __m256i p[4];
  explicit Planes(const float* code16) {
    alignas(16) uint8_t b[4][16];
    for (int c = 0; c < 16; ++c) {
      uint32_t u;
      std::memcpy(&u, code16 + c, 4);
      for (int k = 0; k < 4; ++k) b[k][c] = (uint8_t)(u >> (8 * k));
    }
    for (int k = 0; k < 4; ++k) p[k] = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)b[k]));
  }
};

// Position of block element e in the decoded order: part (0 = high nibbles = even elements, 1 =
// low = odd), group g (0..3), lane l, slot s -> byte i = 16 l + 4 g + s, element 2 i + part.
inline void XPermBlock(const float* x, float* out) {
  int o = 0;
  for (int part = 0; part < 2; ++part)
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 2; ++l)
        for (int sl = 0; sl < 4; ++sl) out[o++] = x[2 * (16 * l + 4 * g + sl) + part];
}

// 32 code indices (one per byte) -> 4 vectors of 8 floats in the order XPermBlock describes.
inline void Lookup32(__m256i idx, const Planes& t, __m256 out[4]) {
  const __m256i b0 = _mm256_shuffle_epi8(t.p[0], idx), b1 = _mm256_shuffle_epi8(t.p[1], idx);
  const __m256i b2 = _mm256_shuffle_epi8(t.p[2], idx), b3 = _mm256_shuffle_epi8(t.p[3], idx);
  const __m256i w01l = _mm256_unpacklo_epi8(b0, b1), w01h = _mm256_unpackhi_epi8(b0, b1);
  const __m256i w23l = _mm256_unpacklo_epi8(b2, b3), w23h = _mm256_unpackhi_epi8(b2, b3);
  out[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(w01l, w23l));
  out[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(w01l, w23l));
  out[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(w01h, w23h));
  out[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(w01h, w23h));
}

template <int M>
void Gemv4M(const uint8_t* codes, const Planes& t, const float* absmax, int64_t n_rows, int64_t K,
            const float* xp, float* y, int64_t ldy) {
  const int64_t nb = K / 64;
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  __m256 v[4];
  for (int64_t r = 0; r < n_rows; ++r) {
    __m256 acc[M];
    for (int i = 0; i < M; ++i) acc[i] = _mm256_setzero_ps();
    const uint8_t* cr = codes + r * nb * 32;
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i bytes = _mm256_loadu_si256((const __m256i*)(cr + b * 32));
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
      const __m256i lo = _mm256_and_si256(bytes, low4);
      __m256 blk[M];
      for (int i = 0; i < M; ++i) blk[i] = _mm256_setzero_ps();
      const float* xb = xp + b * 64;
      Lookup32(hi, t, v);
      for (int g = 0; g < 4; ++g)
        for (int i = 0; i < M; ++i)
          blk[i] = _mm256_fmadd_ps(v[g], _mm256_loadu_ps(xb + i * K + g * 8), blk[i]);
      Lookup32(lo, t, v);
      for (int g = 0; g < 4; ++g)
        for (int i = 0; i < M; ++i)
          blk[i] = _mm256_fmadd_ps(v[g], _mm256_loadu_ps(xb + i * K + 32 + g * 8), blk[i]);
      const __m256 a = _mm256_set1_ps(absmax[r * nb + b]);
      for (int i = 0; i < M; ++i) acc[i] = _mm256_fmadd_ps(blk[i], a, acc[i]);
    }
    for (int i = 0; i < M; ++i) y[i * ldy + r] = cpu::avx2::HsumPs(acc[i]);
  }
}

void Gemv4(const uint8_t* codes, const float* code16, const float* absmax, int64_t n_rows, int64_t K,
           const float* x, int64_t m, float* y, int64_t ldy) {
  const Planes t(code16);
  // x in decoded order (m rows of K); rebuilt per call, cheap next to n_rows * K weight elements.
  static thread_local std::vector<float> xp_buf;
  if (xp_buf.size() < (size_t)(m * K)) xp_buf.resize((size_t)(m * K));
  float* xp = xp_buf.data();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t b = 0; b < K / 64; ++b) XPermBlock(x + i * K + b * 64, xp + i * K + b * 64);
  switch (m) {
    case 1:
      return Gemv4M<1>(codes, t, absmax, n_rows, K, xp, y, ldy);
    case 2:
      return Gemv4M<2>(codes, t, absmax, n_rows, K, xp, y, ldy);
    case 3:
      return Gemv4M<3>(codes, t, absmax, n_rows, K, xp, y, ldy);
    default:
      return Gemv4M<4>(codes, t, absmax, n_rows, K, xp, y, ldy);
  }
}

int32_t DotI8(const int8_t* a, const int8_t* b, int64_t K) {
  __m256i acc = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t k = 0; k < K; k += 32) {
    const __m256i va = _mm256_loadu_si256((const __m256i*)(a + k));
    const __m256i vb = _mm256_loadu_si256((const __m256i*)(b + k));
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(va, va), _mm256_sign_epi8(vb, va));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p16, ones));
  }
  return cpu::avx2::HsumEpi32(acc);
}

}  // namespace

const QuantKernels& Table() {
  static const QuantKernels t{IsaTier::kAvx2, Dequant4, Gemv4, DotI8};
  return t;
}

}  // namespace lathe::kernels::quant::avx2
