// AVX2 kernels for the extended GGML block types (Q5_0, Q5_1 and the K-quants Q2_K .. Q6_K): a
// 256-bit block decoder (ref::DecodeBlock's form: int8 values, int16 scales, f32 mins) behind the
// vectorized dequantization and the Q5 tail rows, and the K-quants' int8 GEMV (one 256-bit vector
// per 32-element block).
// The GEMVs take one weight row at a time (rows are read in order: one long stream), all x rows
// (m <= 4) against each block, so every row's arithmetic is the same for any m.
#include <immintrin.h>

#include <cstring>
#include <utility>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/scratch.h"

namespace lathe::kernels::cpu::avx2 {

namespace {

// A decoded block: per 32-element x block j the values q[j]; the int16 scale of each 16-element
// half; d; mins as f32 dmin * mn: per 32 elements in mn[0] (Q4_K, Q5_K), per 16 in mn[0..1] (Q2_K),
// Q5_1's in mn32.
struct Decoded {
  __m256i q[8];
  int16_t sc[16];
  __m256 mn[2];
  float d, mn32;  // mn32: Q5_1's dmin * mn of its one 32-element block
};

// Q4_K / Q5_K: the 8 scales and 8 mins (6 bits each) from 12 packed bytes, as 8 bytes each
// (ref::KScaleMin, four at a time in 32-bit words).
inline void KScaleMin8(const uint8_t* p, uint64_t* sc, uint64_t* mn) {
  uint32_t w0, w1, w2;
  std::memcpy(&w0, p, 4);
  std::memcpy(&w1, p + 4, 4);
  std::memcpy(&w2, p + 8, 4);
  const uint32_t sc_lo = w0 & 0x3f3f3f3f, mn_lo = w1 & 0x3f3f3f3f;
  const uint32_t sc_hi = (w2 & 0x0f0f0f0f) | ((w0 >> 2) & 0x30303030);
  const uint32_t mn_hi = ((w2 >> 4) & 0x0f0f0f0f) | ((w1 >> 2) & 0x30303030);
  *sc = sc_lo | ((uint64_t)sc_hi << 32);
  *mn = mn_lo | ((uint64_t)mn_hi << 32);
}

// Element bits: byte k of v shifted so that its bit `from` lands on bit `to`, masked to that bit
// (16-bit shifts; the mask keeps only bits that came from the same byte).
inline __m256i BitTo(__m256i v, int from, int to, int mask) {
  const __m256i m = _mm256_set1_epi8((char)mask);
  if (from == to) return _mm256_and_si256(v, m);
  return _mm256_and_si256(from < to ? _mm256_sll_epi16(v, _mm_cvtsi32_si128(to - from))
                                    : _mm256_srl_epi16(v, _mm_cvtsi32_si128(from - to)),
                          m);
}

template <DType T>
inline void Decode(const uint8_t* blk, Decoded* o) {
  const __m256i lo4 = _mm256_set1_epi8(0x0f);
  if constexpr (T == DType::kQ5_0 || T == DType::kQ5_1) {
    constexpr bool kQ51 = T == DType::kQ5_1;
    const uint16_t* h = (const uint16_t*)blk;
    __m128i h0, h1;
    FifthBits(blk + (kQ51 ? 4 : 2), &h0, &h1);
    const __m256i v = _mm256_or_si256(UnpackNibbles(blk + (kQ51 ? 8 : 6)), _mm256_set_m128i(h1, h0));
    o->q[0] = kQ51 ? v : _mm256_sub_epi8(v, _mm256_set1_epi8(16));
    o->sc[0] = o->sc[1] = 1;
    o->d = _cvtsh_ss(h[0]);
    o->mn32 = kQ51 ? -_cvtsh_ss(h[1]) : 0.0f;  // dmin * mn with dmin = m, mn = -1
  } else if constexpr (T == DType::kQ4_K || T == DType::kQ5_K) {
    constexpr bool kQ5 = T == DType::kQ5_K;
    const uint16_t* h = (const uint16_t*)blk;
    const uint8_t* qs = blk + (kQ5 ? 48 : 16);
    uint64_t sc, mn;
    KScaleMin8(blk + 4, &sc, &mn);
    for (int i = 0; i < 16; ++i) o->sc[i] = (int16_t)((sc >> (8 * (i / 2))) & 0xff);
    o->mn[0] = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(h[1])),
                             _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn))));
    o->d = _cvtsh_ss(h[0]);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kQ5) qh = _mm256_loadu_si256((const __m256i*)(blk + 16));
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)(qs + 32 * c));
      __m256i a = _mm256_and_si256(v, lo4), b = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
      if constexpr (kQ5) {
        a = _mm256_or_si256(a, BitTo(qh, 2 * c, 4, 0x10));
        b = _mm256_or_si256(b, BitTo(qh, 2 * c + 1, 4, 0x10));
      }
      o->q[2 * c] = a;
      o->q[2 * c + 1] = b;
    }
  } else if constexpr (T == DType::kQ6_K) {
    const BlockQ6_K* b = (const BlockQ6_K*)blk;
    for (int i = 0; i < 16; ++i) o->sc[i] = b->scales[i];
    o->d = _cvtsh_ss(b->d);
    const __m256i off = _mm256_set1_epi8(32);
    for (int hf = 0; hf < 2; ++hf) {
      const __m256i l0 = _mm256_loadu_si256((const __m256i*)(b->ql + 64 * hf));
      const __m256i l1 = _mm256_loadu_si256((const __m256i*)(b->ql + 64 * hf + 32));
      const __m256i qh = _mm256_loadu_si256((const __m256i*)(b->qh + 32 * hf));
      const __m256i lo[4] = {_mm256_and_si256(l0, lo4), _mm256_and_si256(l1, lo4),
                             _mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4),
                             _mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4)};
      for (int s = 0; s < 4; ++s)
        o->q[4 * hf + s] = _mm256_sub_epi8(_mm256_or_si256(lo[s], BitTo(qh, 2 * s, 4, 0x30)), off);
    }
  } else if constexpr (T == DType::kQ3_K) {
    const BlockQ3_K* b = (const BlockQ3_K*)blk;
    uint8_t sc[16];
    ref::Q3KScales(b->scales, sc);
    for (int i = 0; i < 16; ++i) o->sc[i] = (int16_t)(sc[i] - 32);
    o->d = _cvtsh_ss(b->d);
    const __m256i hm = _mm256_loadu_si256((const __m256i*)b->hmask);
    const __m256i four = _mm256_set1_epi8(4);
    for (int hf = 0; hf < 2; ++hf) {
      const __m256i qv = _mm256_loadu_si256((const __m256i*)(b->qs + 32 * hf));
      for (int s = 0; s < 4; ++s) {
        const int j = 4 * hf + s;
        const __m256i lo = BitTo(qv, 2 * s, 0, 0x03);
        o->q[j] = _mm256_sub_epi8(_mm256_or_si256(lo, BitTo(hm, j, 2, 0x04)), four);
      }
    }
  } else {  // Q2_K
    static_assert(T == DType::kQ2_K);
    const BlockQ2_K* b = (const BlockQ2_K*)blk;
    const __m128i sv = _mm_loadu_si128((const __m128i*)b->scales);
    const __m128i lo = _mm_set1_epi8(0x0f);
    for (int i = 0; i < 16; ++i) o->sc[i] = b->scales[i] & 15;
    const __m128i mn = _mm_and_si128(_mm_srli_epi16(sv, 4), lo);
    const __m256 dmin = _mm256_set1_ps(_cvtsh_ss(b->dmin));
    o->mn[0] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)));
    o->mn[1] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(mn, 8))));
    o->d = _cvtsh_ss(b->d);
    for (int hf = 0; hf < 2; ++hf) {
      const __m256i qv = _mm256_loadu_si256((const __m256i*)(b->qs + 32 * hf));
      for (int s = 0; s < 4; ++s) o->q[4 * hf + s] = BitTo(qv, 2 * s, 0, 0x03);
    }
  }
}

// Q5_0 / Q5_1 rows one at a time: the N % 4 tail rows of a weight (the 4-row kernels in
// matmul_avx2.cc take the rest; a given row always takes the same one). Per block: the 256-bit
// decode above, maddubs against x (Q5_0 through |q| and x signed by q), madd with ones, one f32 FMA
// with d * x.d; Q5_1's min times x.s kept apart and added at the end.
template <DType T>
void Q5RowsT(const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t m, int64_t K, float* y,
             int64_t ldy) {
  static_assert(T == DType::kQ5_0 || T == DType::kQ5_1);
  constexpr bool kSigned = T == DType::kQ5_0;
  const size_t bb = (size_t)GetDTypeInfo(T).block_bytes;
  const int64_t nb = K / 32;
  Decoded db;
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = w + r * rb;
    __m256 acc[4];
    float accm[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      Decode<T>(row + b * bb, &db);
      const __m256i u = kSigned ? _mm256_sign_epi8(db.q[0], db.q[0]) : db.q[0];
      for (int64_t i = 0; i < m; ++i) {
        const BlockQ8X& xb = x[i * nb + b];
        __m256i xv = _mm256_loadu_si256((const __m256i*)xb.qs);
        if constexpr (kSigned) xv = _mm256_sign_epi8(xv, db.q[0]);
        const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), _mm256_set1_epi16(1));
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(db.d * xb.d), acc[i]);
        if constexpr (!kSigned) accm[i] += db.mn32 * xb.s;
      }
    }
    for (int64_t i = 0; i < m; ++i) y[i * ldy + r] = HsumPs(acc[i]) - accm[i];
  }
}

// ---- K-quant GEMV ------------------------------------------------------------------------------
// Every K-quant value is d * sc * u - MN with u unsigned (<= 63) per 16-element half: Q2_K u = q,
// MN = dmin * min; Q3_K u = q + 4, MN = 4 d sc; Q4_K / Q5_K u = q, MN = dmin * min (per 32);
// Q6_K u = q + 32, MN = 32 d sc. Per x block j (32 elements, one 256-bit vector of u): int16 pair
// sums of u against x (maddubs), madd with the halves' scales (lanes 0-7: elements 0-15), one f32
// FMA with d * x.d; the MN terms per super-block against the x sums (per 32 for Q4_K / Q5_K:
// BlockQ8X::s; per half otherwise: x.d * the half's sum).

template <DType T>
constexpr bool kPer32 = T == DType::kQ4_K || T == DType::kQ5_K;

struct KSuper {
  // int16 scales, the same 8 in both 128-bit lanes: per-32 types the 8 blocks' (lo); per-16 types
  // halves 0-7 (lo) and 8-15 (hi). One in-lane shuffle then gives any block's lanes.
  __m256i lo, hi;
  __m128 mn[4];  // MN of halves 4k .. 4k + 3 (per-32 types: mn[0], mn[1] = blocks 0-3, 4-7)
  float d;
};

// 8 int16 (from 8 bytes, signed or not) in both lanes.
inline __m256i Int16Twice(__m128i eight_bytes, bool is_signed) {
  const __m128i w = is_signed ? _mm_cvtepi8_epi16(eight_bytes) : _mm_cvtepu8_epi16(eight_bytes);
  return _mm256_broadcastsi128_si256(w);
}

// v >> From << To, masked to `mask` (From, To compile-time: one shift and one and). 16-bit shifts:
// the mask keeps only bits that came from the same byte.
template <int From, int To>
inline __m256i Bits(__m256i v, int mask) {
  const __m256i m = _mm256_set1_epi8((char)mask);
  if constexpr (From == To) return _mm256_and_si256(v, m);
  else if constexpr (From < To) return _mm256_and_si256(_mm256_slli_epi16(v, To - From), m);
  else return _mm256_and_si256(_mm256_srli_epi16(v, From - To), m);
}

inline __m256i Load256(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }

inline __m128 CvtI8x4(int32_t four_bytes, bool is_signed) {
  const __m128i v = _mm_cvtsi32_si128(four_bytes);
  return _mm_cvtepi32_ps(is_signed ? _mm_cvtepi8_epi32(v) : _mm_cvtepu8_epi32(v));
}

// Q3_K's 16 scales (6 bits, ref::Q3KScales) minus their offset 32, as int8: low nibbles from bytes
// 0-7, top 2 bits from bytes 8-11, eight at a time in 64-bit words.
inline __m128i Q3KScales16(const uint8_t* p) {
  uint64_t lo;
  uint32_t h;
  std::memcpy(&lo, p, 8);
  std::memcpy(&h, p + 8, 4);
  const uint64_t m2 = 0x03030303;
  const uint64_t top0 = (h & m2) | (((h >> 2) & m2) << 32), top1 = ((h >> 4) & m2) | (((h >> 6) & m2) << 32);
  const uint64_t s0 = (lo & 0x0f0f0f0f0f0f0f0full) | (top0 << 4);
  const uint64_t s1 = ((lo >> 4) & 0x0f0f0f0f0f0f0f0full) | (top1 << 4);
  return _mm_sub_epi8(_mm_set_epi64x((long long)s1, (long long)s0), _mm_set1_epi8(32));
}

template <DType T>
inline void Prepare(const uint8_t* blk, KSuper* k) {
  if constexpr (kPer32<T>) {
    uint64_t sc, mn;
    KScaleMin8(blk + 4, &sc, &mn);
    const uint16_t* h = (const uint16_t*)blk;
    k->d = _cvtsh_ss(h[0]);
    k->lo = Int16Twice(_mm_cvtsi64_si128((long long)sc), false);
    const __m128 dmin = _mm_set1_ps(_cvtsh_ss(h[1]));
    k->mn[0] = _mm_mul_ps(dmin, CvtI8x4((int32_t)mn, false));
    k->mn[1] = _mm_mul_ps(dmin, CvtI8x4((int32_t)(mn >> 32), false));
  } else {
    __m128 f;
    __m128i sc8;  // the 16 int8 scales (Q3_K's offset removed)
    if constexpr (T == DType::kQ6_K) {
      const BlockQ6_K* b = (const BlockQ6_K*)blk;
      sc8 = _mm_loadu_si128((const __m128i*)b->scales);
      k->d = _cvtsh_ss(b->d);
      f = _mm_set1_ps(32.0f * k->d);
    } else if constexpr (T == DType::kQ3_K) {
      const BlockQ3_K* b = (const BlockQ3_K*)blk;
      sc8 = Q3KScales16(b->scales);
      k->d = _cvtsh_ss(b->d);
      f = _mm_set1_ps(4.0f * k->d);
    } else {
      static_assert(T == DType::kQ2_K);
      const BlockQ2_K* b = (const BlockQ2_K*)blk;
      const __m128i v = _mm_loadu_si128((const __m128i*)b->scales);
      sc8 = _mm_and_si128(v, _mm_set1_epi8(15));
      k->d = _cvtsh_ss(b->d);
      f = _mm_set1_ps(_cvtsh_ss(b->dmin));
    }
    k->lo = Int16Twice(sc8, true);
    k->hi = Int16Twice(_mm_srli_si128(sc8, 8), true);
    alignas(16) int8_t sc[16];
    _mm_store_si128((__m128i*)sc, sc8);
    for (int q = 0; q < 4; ++q) {
      int32_t four;
      if constexpr (T == DType::kQ2_K) {
        const BlockQ2_K* b = (const BlockQ2_K*)blk;
        uint32_t w;
        std::memcpy(&w, b->scales + 4 * q, 4);
        four = (int32_t)((w >> 4) & 0x0f0f0f0f);
        k->mn[q] = _mm_mul_ps(f, CvtI8x4(four, false));
      } else {
        std::memcpy(&four, sc + 4 * q, 4);
        k->mn[q] = _mm_mul_ps(f, CvtI8x4(four, true));
      }
    }
  }
}

// The 32 unsigned values of x block J (each type stores a block's bits in 32 consecutive bytes).
template <DType T, int J>
inline __m256i Values(const uint8_t* blk) {
  if constexpr (kPer32<T>) {
    constexpr bool kQ5 = T == DType::kQ5_K;
    __m256i u = Bits<4 * (J % 2), 0>(Load256(blk + (kQ5 ? 48 : 16) + 32 * (J / 2)), 0x0f);
    if constexpr (kQ5) u = _mm256_or_si256(u, Bits<J, 4>(Load256(blk + 16), 0x10));
    return u;
  } else if constexpr (T == DType::kQ6_K) {
    const BlockQ6_K* b = (const BlockQ6_K*)blk;
    constexpr int hf = J / 4, s = J % 4;
    return _mm256_or_si256(Bits<4 * (s / 2), 0>(Load256(b->ql + 64 * hf + 32 * (s % 2)), 0x0f),
                           Bits<2 * s, 4>(Load256(b->qh + 32 * hf), 0x30));
  } else {  // Q2_K, Q3_K: 2 low bits of qs[32 hf + l] at 2 s; Q3_K's third bit from hmask[l] bit J
    constexpr int hf = J / 4, s = J % 4;
    __m256i u = Bits<2 * s, 0>(Load256(blk + (T == DType::kQ3_K ? 32 : 16) + 32 * hf), 0x03);
    if constexpr (T == DType::kQ3_K) u = _mm256_or_si256(u, Bits<J, 2>(Load256(blk), 0x04));
    return u;
  }
}

// x block J's scales as 16 int16 lanes: lanes 0-7 for elements 0-15, lanes 8-15 for 16-31.
template <DType T, int J>
inline __m256i Scales(const KSuper& k) {
  // pshufb index that repeats int16 word a in the low lane and word b in the high lane.
  constexpr auto word = [](int w) { return (long long)(0x0100010001000100ull + 0x0202020202020202ull * w); };
  if constexpr (kPer32<T>) {
    return _mm256_shuffle_epi8(k.lo, _mm256_set1_epi64x(word(J)));
  } else {
    constexpr long long a = word((2 * J) % 8), b = word((2 * J + 1) % 8);
    return _mm256_shuffle_epi8(J < 4 ? k.lo : k.hi, _mm256_setr_epi64x(a, a, b, b));
  }
}

// dx[8 i + J]: d * x.d of x row i's block J of this super-block.
template <DType T, int M, int J>
inline void KBlock(const uint8_t* blk, const KSuper& k, const BlockQ8X* const* xb, const float* dx, __m256* acc) {
  const __m256i u = Values<T, J>(blk);
  const __m256i sc = Scales<T, J>(k);
#pragma GCC unroll 4
  for (int i = 0; i < M; ++i) {
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i*)xb[i][J].qs)), sc);
    // Two accumulators per x row (even / odd blocks): one FMA chain would bound a row at 4-5 cycles
    // per block.
    const __m256 d = _mm256_broadcast_ss(dx + 8 * i + J);  // a load, not a lane permute
    acc[2 * i + J % 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), d, acc[2 * i + J % 2]);
  }
}

template <DType T, int M, int... J>
inline void KBlocks(const uint8_t* blk, const KSuper& k, const BlockQ8X* const* xb, const float* dx, __m256* acc,
                    std::integer_sequence<int, J...>) {
  (KBlock<T, M, J>(blk, k, xb, dx, acc), ...);
}

// M x rows (1..4, a template parameter so the accumulators stay in registers).
// Rows run one at a time, each a short stream (a few super-blocks): every super-block prefetches its
// bytes kPfRows rows ahead. Q6_K 576 x 1536 from DRAM, 1 thread: 90 -> 69 us (hot: equal); Q4_K_M
// decode +6-11% (paired).
constexpr int64_t kPfRows = 2;
template <DType T, int M>
void KGemvM(const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t K, float* y, int64_t ldy) {
  constexpr int64_t m = M;
  constexpr size_t kBB = (size_t)(T == DType::kQ2_K   ? sizeof(BlockQ2_K)
                                  : T == DType::kQ3_K ? sizeof(BlockQ3_K)
                                  : T == DType::kQ4_K ? sizeof(BlockQ4_K)
                                  : T == DType::kQ5_K ? sizeof(BlockQ5_K)
                                                      : sizeof(BlockQ6_K));
  const int64_t nsb = K / 256, nxb = K / 32;
  // The x side of the MN terms: per x block its s (per-32 types) or per half d * sum.
  static thread_local std::vector<float> xs_buf;
  const int64_t per_row = kPer32<T> ? nxb : 2 * nxb;
  float* xs = Scratch(xs_buf, (size_t)(m * (per_row + nxb)));
  float* xd = xs + m * per_row;  // x.d of every block, contiguous
  for (int64_t i = 0; i < m * nxb; ++i) {
    xd[i] = x[i].d;
    if constexpr (kPer32<T>) {
      xs[i] = x[i].s;
    } else {
      const __m128i a = _mm_loadu_si128((const __m128i*)x[i].qs), b = _mm_loadu_si128((const __m128i*)(x[i].qs + 16));
      const __m128i one8 = _mm_set1_epi8(1), one16 = _mm_set1_epi16(1);
      __m128i sa = _mm_madd_epi16(_mm_maddubs_epi16(one8, a), one16);
      __m128i sb = _mm_madd_epi16(_mm_maddubs_epi16(one8, b), one16);
      sa = _mm_hadd_epi32(sa, sb);
      sa = _mm_hadd_epi32(sa, sa);  // [sum a, sum b, ..]
      xs[2 * i] = x[i].d * (float)_mm_cvtsi128_si32(sa);
      xs[2 * i + 1] = x[i].d * (float)_mm_extract_epi32(sa, 1);
    }
  }
  KSuper k;
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = w + r * rb;
    __m256 acc[8];
    __m128 accm[4];
    for (int i = 0; i < 4; ++i) {
      acc[2 * i] = acc[2 * i + 1] = _mm256_setzero_ps();
      accm[i] = _mm_setzero_ps();
    }
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* blk = row + sb * kBB;
      for (size_t off = 0; off < kBB; off += 64) _mm_prefetch((const char*)(blk + kPfRows * rb + off), _MM_HINT_T0);
      Prepare<T>(blk, &k);
      const BlockQ8X* xb[4];
      alignas(32) float dx[4 * 8];
      for (int64_t i = 0; i < m; ++i) {
        xb[i] = x + i * nxb + sb * 8;
        _mm256_store_ps(dx + 8 * i, _mm256_mul_ps(_mm256_set1_ps(k.d), _mm256_loadu_ps(xd + i * nxb + sb * 8)));
      }
      KBlocks<T, M>(blk, k, xb, dx, acc, std::make_integer_sequence<int, 8>{});
      for (int64_t i = 0; i < m; ++i) {
        const float* xm = xs + i * per_row + sb * (kPer32<T> ? 8 : 16);
        accm[i] = _mm_fmadd_ps(k.mn[0], _mm_loadu_ps(xm), accm[i]);
        accm[i] = _mm_fmadd_ps(k.mn[1], _mm_loadu_ps(xm + 4), accm[i]);
        if constexpr (!kPer32<T>) {
          accm[i] = _mm_fmadd_ps(k.mn[2], _mm_loadu_ps(xm + 8), accm[i]);
          accm[i] = _mm_fmadd_ps(k.mn[3], _mm_loadu_ps(xm + 12), accm[i]);
        }
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      const __m256 a8 = _mm256_add_ps(acc[2 * i], acc[2 * i + 1]);
      const __m128 a = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
      y[i * ldy + r] = Hsum4(_mm_sub_ps(a, accm[i]));
    }
  }
}

template <DType T>
void KGemvT(const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t m, int64_t K, float* y,
            int64_t ldy) {
  switch (m) {
    case 1: return KGemvM<T, 1>(w, rb, n_rows, x, K, y, ldy);
    case 2: return KGemvM<T, 2>(w, rb, n_rows, x, K, y, ldy);
    case 3: return KGemvM<T, 3>(w, rb, n_rows, x, K, y, ldy);
    default: return KGemvM<T, 4>(w, rb, n_rows, x, K, y, ldy);
  }
}

// ---- dequantization (prefill panels, training) -----------------------------------------------
// ref::DequantizeRow's values bit for bit: (d * sc) * q - (dmin * mn) in f32, two roundings (this
// file is compiled without FMA contraction).
template <DType T>
void DequantRowT(const uint8_t* row, int64_t K, float* out) {
  constexpr int kBS = T == DType::kQ5_0 || T == DType::kQ5_1 ? 32 : 256;
  constexpr bool kMin16 = T == DType::kQ2_K, kMin32 = T == DType::kQ4_K || T == DType::kQ5_K;
  const size_t bb = (size_t)GetDTypeInfo(T).block_bytes;
  Decoded db;
  alignas(32) float mn[16] = {};
  for (int64_t b = 0; b < K / kBS; ++b) {
    Decode<T>(row + b * bb, &db);
    if constexpr (kMin16) {
      _mm256_store_ps(mn, db.mn[0]);
      _mm256_store_ps(mn + 8, db.mn[1]);
    } else if constexpr (kMin32) {
      _mm256_store_ps(mn, db.mn[0]);
    }
    float* o = out + b * kBS;
    for (int j = 0; j < kBS / 32; ++j) {
      const __m128i lo = _mm256_castsi256_si128(db.q[j]), hi = _mm256_extracti128_si256(db.q[j], 1);
      const __m128i q8[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
      const int sc[2] = {db.sc[2 * j], db.sc[2 * j + 1]};
      for (int g = 0; g < 4; ++g) {
        const int h = g / 2;  // 16-element half
        float minv = 0.0f;
        if constexpr (kMin16) minv = mn[2 * j + h];
        if constexpr (kMin32) minv = mn[j];
        if constexpr (T == DType::kQ5_1) minv = db.mn32;  // dmin * mn with mn = -1: -m
        const __m256 scale = _mm256_set1_ps(db.d * (float)sc[h]);
        const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8[g]));
        _mm256_storeu_ps(o + 32 * j + 8 * g, _mm256_sub_ps(_mm256_mul_ps(scale, q), _mm256_set1_ps(minv)));
      }
    }
  }
}

}  // namespace

void ExtQuantGemv(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t m, int64_t K,
                  float* y, int64_t ldy) {
  switch (t) {
    case DType::kQ5_0: return Q5RowsT<DType::kQ5_0>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ5_1: return Q5RowsT<DType::kQ5_1>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ2_K: return KGemvT<DType::kQ2_K>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ3_K: return KGemvT<DType::kQ3_K>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ4_K: return KGemvT<DType::kQ4_K>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ5_K: return KGemvT<DType::kQ5_K>(w, rb, n_rows, x, m, K, y, ldy);
    case DType::kQ6_K: return KGemvT<DType::kQ6_K>(w, rb, n_rows, x, m, K, y, ldy);
    default: LATHE_CHECK_MSG(false, "ExtQuantGemv: %s is not an extended block type", DTypeName(t));
  }
}

}  // namespace lathe::kernels::cpu::avx2

namespace lathe::kernels::cpu::avx2 {

void ExtQuantDequantRow(DType t, const uint8_t* row, int64_t K, float* out) {
  switch (t) {
    case DType::kQ5_0: return DequantRowT<DType::kQ5_0>(row, K, out);
    case DType::kQ5_1: return DequantRowT<DType::kQ5_1>(row, K, out);
    case DType::kQ2_K: return DequantRowT<DType::kQ2_K>(row, K, out);
    case DType::kQ3_K: return DequantRowT<DType::kQ3_K>(row, K, out);
    case DType::kQ4_K: return DequantRowT<DType::kQ4_K>(row, K, out);
    case DType::kQ5_K: return DequantRowT<DType::kQ5_K>(row, K, out);
    case DType::kQ6_K: return DequantRowT<DType::kQ6_K>(row, K, out);
    default: LATHE_CHECK_MSG(false, "ExtQuantDequantRow: %s is not an extended block type", DTypeName(t));
  }
}

}  // namespace lathe::kernels::cpu::avx2
