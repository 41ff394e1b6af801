// Small AVX2 helpers (horizontal sums, tail masks, exp) shared by the *_avx2.cc files only: they
// are compiled with -mavx2 -mfma -mf16c; never include this from a baseline file.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/check.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/reference.h"

namespace lathe::kernels::cpu::avx2 {

// matmul_avx2.cc: the int8 kernels in the split (128-bit) or the full-width form (see Dot4Q4).
MatMulKernels GetMatMulKernels(bool split);
// MatMulKernels::qgemm (qgemm_avx2.cc), in the split or the full-width form.
template <bool kSplit>
void QGemm(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t m, int64_t K,
           float* y, int64_t ldy);
// MatMulKernels::qgemm_runs / quantize_x16 (qgemm16_avx2.cc): int16 prompt rows on vpmaddwd (int8 runs through
// QGemm<kSplit>).
template <bool kSplit>
void QGemmRuns(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const QRun* runs, int n_runs, int64_t K);
void QuantizeX16(const float* x, int64_t K, BlockQ16X* out);

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

// The 4- and 5-bit 32-element block types the int8 kernels share (Q4_0, Q4_1, Q5_0, Q5_1): block
// bytes, where the 16 nibble bytes start, whether a 5th bit (4 bytes of qh just before the nibbles)
// and a min (f16 after d) are present, and the factor of the x-sum term (-offset, or 1 for the min).
template <DType T>
struct Q4Block {
  static constexpr bool k5 = T == DType::kQ5_0 || T == DType::kQ5_1;
  static constexpr bool kMin = T == DType::kQ4_1 || T == DType::kQ5_1;
  static constexpr size_t kBytes = T == DType::kQ4_0   ? sizeof(BlockQ4_0)
                                   : T == DType::kQ4_1 ? sizeof(BlockQ4_1)
                                   : T == DType::kQ5_0 ? sizeof(BlockQ5_0)
                                                       : sizeof(BlockQ5_1);
  static constexpr size_t kQsOff = (kMin ? 4 : 2) + (k5 ? 4 : 0);
  static constexpr float kCorr = kMin ? 1.0f : k5 ? -16.0f : -8.0f;
};

// Any 32-element block type of the int8 kernels, Q8_0 included (signed codes at offset 2, no min, no
// x-sum term): the AVX-512 tier's GEMV and int8 GEMM read every type through this.
template <DType T>
struct Block32 {
  static constexpr bool kQ8 = T == DType::kQ8_0;
  static constexpr bool k5 = !kQ8 && Q4Block<T>::k5;
  static constexpr bool kMin = !kQ8 && Q4Block<T>::kMin;
  static constexpr size_t kBytes = kQ8 ? sizeof(BlockQ8_0) : Q4Block<T>::kBytes;
  static constexpr size_t kQsOff = kQ8 ? 2 : Q4Block<T>::kQsOff;
  static constexpr float kCorr = kQ8 ? 0.0f : Q4Block<T>::kCorr;
};

// Sub-block s (0-7) of a Q4_K / Q5_K block b: its 32 codes (0-15, Q5_K 0-31) in element order, as bytes.
template <DType T>
inline __m256i KCodes(const uint8_t* b, int s) {
  static_assert(T == DType::kQ4_K || T == DType::kQ5_K);
  constexpr size_t kQs = T == DType::kQ4_K ? offsetof(BlockQ4_K, qs) : offsetof(BlockQ5_K, qs);
  __m256i q = _mm256_loadu_si256((const __m256i*)(b + kQs + 32 * (s / 2)));
  if (s & 1) q = _mm256_srli_epi16(q, 4);
  q = _mm256_and_si256(q, _mm256_set1_epi8(0x0f));
  if constexpr (T == DType::kQ5_K) {  // bit s of qh[e] is element e's fifth bit (16-bit shift, then each byte's bit 0)
    const __m256i h = _mm256_loadu_si256((const __m256i*)(b + offsetof(BlockQ5_K, qh)));
    const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(h, s), _mm256_set1_epi8(1));
    q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
  }
  return q;
}

// The 8 sub-blocks' factors of a Q4_K / Q5_K block b (both start with d, dmin and the 12 packed scale bytes):
// w = dw[e] * q - cw[e], dw[e] = d * sc_e, cw[e] = dmin * m_e.
inline void KSubScales(const uint8_t* b, float* dw, float* cw) {
  static_assert(offsetof(BlockQ4_K, scales) == 4 && offsetof(BlockQ5_K, scales) == 4);
  uint16_t h[2];
  std::memcpy(h, b, 4);
  uint8_t sc[8], mn[8];
  ref::KScaleMin(b + 4, sc, mn);
  const float d = F16ToF32(h[0]), dmin = F16ToF32(h[1]);
  for (int e = 0; e < 8; ++e) {
    dw[e] = d * (float)sc[e];
    cw[e] = dmin * (float)mn[e];
  }
}

// The int16 prompt rows' block traits per weight type (qgemm_avx512.cc, qgemm16_avx2.cc): Q8_0 / Q4_* / Q5_* from
// Block32; Q4_K / Q5_K (int16 prompt rows only: their decode rows keep the K-quant GEMV's arithmetic) per 32-element
// sub-block j of a 256-block, codes q (nibble, + the fifth bit for Q5_K) with dw = d * sc_j and cw = dmin * m_j
// (w = dw q - cw: kCorr = -1). Both K blocks start with d, dmin and the 12 packed scale bytes.
template <DType T>
struct Int16Block : Block32<T> {
  static constexpr bool kK = false;
};
template <DType T, class B>
struct Int16KBlock {
  static constexpr bool kQ8 = false, k5 = T == DType::kQ5_K, kMin = true, kK = true;
  static constexpr float kCorr = -1.0f;
  static constexpr size_t kBytes = sizeof(B);
  static constexpr size_t kQsOff = offsetof(B, qs);
};
template <>
struct Int16Block<DType::kQ4_K> : Int16KBlock<DType::kQ4_K, BlockQ4_K> {};
template <>
struct Int16Block<DType::kQ5_K> : Int16KBlock<DType::kQ5_K, BlockQ5_K> {};

// f(std::integral_constant<DType, T>{}) for an int16-row weight type t (Q8_0 / Q4_* / Q5_*, and Q4_K / Q5_K whose
// K must be a multiple of 256): the type switch of both tiers' int16 GEMMs. `what` names the caller in the error.
template <class F>
void WithInt16Type(DType t, int64_t K, const char* what, F&& f) {
  using D = DType;
  switch (t) {
    case D::kQ8_0: return f(std::integral_constant<D, D::kQ8_0>{});
    case D::kQ4_0: return f(std::integral_constant<D, D::kQ4_0>{});
    case D::kQ4_1: return f(std::integral_constant<D, D::kQ4_1>{});
    case D::kQ5_0: return f(std::integral_constant<D, D::kQ5_0>{});
    case D::kQ5_1: return f(std::integral_constant<D, D::kQ5_1>{});
    case D::kQ4_K:
    case D::kQ5_K:
      LATHE_CHECK_MSG(K % 256 == 0, "%s: %s needs K %% 256 == 0, got %lld", what, DTypeName(t), (long long)K);
      if (t == D::kQ4_K) return f(std::integral_constant<D, D::kQ4_K>{});
      return f(std::integral_constant<D, D::kQ5_K>{});
    default:
      LATHE_CHECK_MSG(false, "%s: unsupported weight dtype %s", what, DTypeName(t));
  }
}

// Q5: the 32 fifth bits (u32 at qh, bit e = element e) as 0x10 bytes: h0 = elements 0-15, h1 = 16-31.
// Through a 256 x 8-byte table (byte k = 0x10 if bit k is set): two 8-byte loads per half keep the
// work on the load ports, where broadcast + shuffle + compare + mask took ~9 vector ops per block
// on the SIMD pipes the dot products need (Zen 1, one row per vector). The full-width 4-row GEMV
// takes two rows per vector instead (quant_rows.h, FifthBitsPair).
struct FifthBitTable {
  uint64_t v[256];
  constexpr FifthBitTable() : v() {
    for (int b = 0; b < 256; ++b) {
      uint64_t x = 0;
      for (int k = 0; k < 8; ++k)
        if (b >> k & 1) x |= (uint64_t)0x10 << (8 * k);
      v[b] = x;
    }
  }
};
inline constexpr FifthBitTable kFifthBits{};
inline void FifthBits(const uint8_t* qh, __m128i* h0, __m128i* h1) {
  const uint64_t* t = kFifthBits.v;
  *h0 = _mm_set_epi64x((long long)t[qh[1]], (long long)t[qh[0]]);
  *h1 = _mm_set_epi64x((long long)t[qh[3]], (long long)t[qh[2]]);
}

// ---- int8 block dot products: the arithmetic of every AVX2 int8 kernel (GEMV and GEMM) ----------
// One 32-element weight block times an int8 x block gives 4 int32 lanes: lane l sums the products
// of elements 4l..4l+3 and 16+4l..16+4l+3 (exact). Each block adds fma(float(lanes), dw * dx, acc)
// to a 4-lane accumulator per (x row, weight row); the result is Hsum4(acc) (+ the Q4 offset term).
// Two implementations of this one arithmetic, bit-identical to each other:
//  * split: 128-bit vectors, one weight row each, for CPUs that execute 256-bit operations as two
//    128-bit halves (Zen 1: half the multiplies, converts and FMAs of a 256-bit form per block);
//  * full width: two weight rows per 256-bit vector, [row a's 4 lanes | row b's 4 lanes].
// Inputs: the element halves (0-15, 16-31) of the block as unsigned bytes u0, u1 and the x halves
// x0, x1 (for full width: [row a | row b] of u, x broadcast to both lanes).
// Q4 (u <= 15, |x| <= 127): the two halves' maddubs pairs are summed in int16 (|.| <= 7620), then
// one madd (Q5 too: u <= 31, |.| <= 15748). Q8_0 (u = |q| <= 128, x signed by q): pairs may reach 32512, so each half gets its madd.
inline __m128i Dot4Q4(__m128i u0, __m128i u1, __m128i x0, __m128i x1) {
  return _mm_madd_epi16(_mm_add_epi16(_mm_maddubs_epi16(u0, x0), _mm_maddubs_epi16(u1, x1)),
                        _mm_set1_epi16(1));
}
inline __m256i Dot4Q4(__m256i u0, __m256i u1, __m256i x0, __m256i x1) {
  return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u0, x0), _mm256_maddubs_epi16(u1, x1)),
                           _mm256_set1_epi16(1));
}
inline __m128i Dot4Q8(__m128i a0, __m128i a1, __m128i s0, __m128i s1) {
  const __m128i one = _mm_set1_epi16(1);
  return _mm_add_epi32(_mm_madd_epi16(_mm_maddubs_epi16(a0, s0), one),
                       _mm_madd_epi16(_mm_maddubs_epi16(a1, s1), one));
}
inline __m256i Dot4Q8(__m256i a0, __m256i a1, __m256i s0, __m256i s1) {
  const __m256i one = _mm256_set1_epi16(1);
  return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(a0, s0), one),
                          _mm256_madd_epi16(_mm256_maddubs_epi16(a1, s1), one));
}

// The accumulator's final sum, (l0 + l2) + (l1 + l3).
inline float Hsum4(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// [v[i] x 4 | v[i + 1] x 4] from the first floats of v (the full-width form's per-row-pair scales).
inline __m256 PairScales(__m128 v, int i) {
  const __m256i idx = _mm256_setr_epi32(i, i, i, i, i + 1, i + 1, i + 1, i + 1);
  return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(v), idx);
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
