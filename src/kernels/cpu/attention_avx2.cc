// AVX2 attention of one token's query heads over a paged KV cache (rows found through per-position
// offsets): four positions per q . k pass, the tier's Softmax, V accumulated in registers; and the
// same for a run of consecutive tokens with K/V walked in L1-sized position blocks (prefill). K / V
// elements are f32, f16 or bf16 (the cache's dtype): each load widens them to f32 exactly, so the
// arithmetic after the load, and every bit of it, is the f32 kernel's on the widened values.
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/kv_elem.h"

namespace lathe::kernels::cpu::avx2 {

namespace {

// 8 K / V elements widened to f32 (exact for every element type).
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Load8(const KvF16* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
inline __m256 Load8(const KvBf16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

// Scores of one head (head_dim = 8 * C) against positions [0, n): 4 positions per step, their 4
// sums reduced together by two rounds of hadd.
// Positions up to n_off of off exist (the prefetch stops there); v: the V rows prefetched alongside. prefetch =
// false where the positions are in cache already (a prompt's later queries over a block the first one read).
template <typename E, int C>
void Scores(const float* q, const E* k, const E* v, const int64_t* off, int64_t n_off, int64_t n, float scale,
            float* sc, bool prefetch = true) {
  __m256 qv[C];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) qv[c] = _mm256_loadu_ps(q + 8 * c);
  const __m128 sv = _mm_set1_ps(scale);
  int64_t p = 0;
  for (; p + 4 <= n; p += 4) {
    if (prefetch) {
      for (int64_t j = p + kKvAhead; j < std::min(n_off, p + kKvAhead + 4); ++j) {
        PrefetchKvSlice<E, 8 * C>(k + off[j], true);
        PrefetchKvSlice<E, 8 * C>(v + off[j], false);
      }
    }
    const E* k0 = k + off[p];
    const E* k1 = k + off[p + 1];
    const E* k2 = k + off[p + 2];
    const E* k3 = k + off[p + 3];
    __m256 a0 = _mm256_mul_ps(qv[0], Load8(k0)), a1 = _mm256_mul_ps(qv[0], Load8(k1));
    __m256 a2 = _mm256_mul_ps(qv[0], Load8(k2)), a3 = _mm256_mul_ps(qv[0], Load8(k3));
    if constexpr (C >= 2) {
      // Two accumulators per position (even / odd 8-float chunks): 8 independent FMA chains; an odd
      // last chunk goes to the even one.
      __m256 b0 = _mm256_mul_ps(qv[1], Load8(k0 + 8)),
             b1 = _mm256_mul_ps(qv[1], Load8(k1 + 8));
      __m256 b2 = _mm256_mul_ps(qv[1], Load8(k2 + 8)),
             b3 = _mm256_mul_ps(qv[1], Load8(k3 + 8));
#pragma GCC unroll 8
      for (int c = 2; c + 1 < C; c += 2) {
        a0 = _mm256_fmadd_ps(qv[c], Load8(k0 + 8 * c), a0);
        a1 = _mm256_fmadd_ps(qv[c], Load8(k1 + 8 * c), a1);
        a2 = _mm256_fmadd_ps(qv[c], Load8(k2 + 8 * c), a2);
        a3 = _mm256_fmadd_ps(qv[c], Load8(k3 + 8 * c), a3);
        b0 = _mm256_fmadd_ps(qv[c + 1], Load8(k0 + 8 * c + 8), b0);
        b1 = _mm256_fmadd_ps(qv[c + 1], Load8(k1 + 8 * c + 8), b1);
        b2 = _mm256_fmadd_ps(qv[c + 1], Load8(k2 + 8 * c + 8), b2);
        b3 = _mm256_fmadd_ps(qv[c + 1], Load8(k3 + 8 * c + 8), b3);
      }
      if constexpr (C % 2 == 1) {
        constexpr int c = C - 1;
        a0 = _mm256_fmadd_ps(qv[c], Load8(k0 + 8 * c), a0);
        a1 = _mm256_fmadd_ps(qv[c], Load8(k1 + 8 * c), a1);
        a2 = _mm256_fmadd_ps(qv[c], Load8(k2 + 8 * c), a2);
        a3 = _mm256_fmadd_ps(qv[c], Load8(k3 + 8 * c), a3);
      }
      a0 = _mm256_add_ps(a0, b0);
      a1 = _mm256_add_ps(a1, b1);
      a2 = _mm256_add_ps(a2, b2);
      a3 = _mm256_add_ps(a3, b3);
    }
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    _mm_storeu_ps(sc + p, _mm_mul_ps(s, sv));
  }
  for (; p < n; ++p) {
    const E* kr = k + off[p];
    __m256 a = _mm256_mul_ps(qv[0], Load8(kr));
#pragma GCC unroll 16
    for (int c = 1; c < C; ++c) a = _mm256_fmadd_ps(qv[c], Load8(kr + 8 * c), a);
    sc[p] = HsumPs(a) * scale;
  }
}

// Positions per block of GroupAttendRowsC: 64 K (or V) rows of a 64-float head = 16 KiB, which stay
// in L1 while every query of the run passes over them. A multiple of 4, so Scores groups the
// positions exactly as one call over all of them (bit-identical scores).
constexpr int64_t kPosBlock = 64;

// out = sum_p sc[p] * v[off[p]] over n <= kPosBlock positions (head_dim = 8 * C), accumulators in
// registers; with kAccumulate the sum continues from out (a later position block). Small heads
// would wait on one FMA chain per 8 floats (5 cycles a position on Zen 1 for head_dim 8), so
// positions go round-robin to U = 4 / C accumulator sets, summed ((a0 + a1) + (a2 + a3)) onto the
// first (which starts from out) at the block's end. From head_dim 32 on, U = 1: one chain per 8
// floats continuing from out, as one pass over all positions.
template <typename E, int C, bool kAccumulate = false>
void MixBlock(const E* v, const int64_t* off, int64_t n_off, int64_t n, const float* sc, float* out,
              bool prefetch = true) {
  constexpr int U = C >= 4 ? 1 : 4 / C;
  __m256 acc[U][C];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) {
    acc[0][c] = kAccumulate ? _mm256_loadu_ps(out + 8 * c) : _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int u = 1; u < U; ++u) acc[u][c] = _mm256_setzero_ps();
  }
  int64_t p = 0;
  for (; p + U <= n; p += U) {
    if (prefetch)
      for (int64_t j = p + kKvAhead; j < std::min(n_off, p + kKvAhead + U); ++j)
        PrefetchKvSlice<E, 8 * C>(v + off[j], true);
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const E* vr = v + off[p + u];
      const __m256 w = _mm256_broadcast_ss(sc + p + u);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[u][c] = _mm256_fmadd_ps(w, Load8(vr + 8 * c), acc[u][c]);
    }
  }
  for (int u = 0; p < n; ++p, ++u) {  // the last n % U positions, to sets 0, 1, ...
    const E* vr = v + off[p];
    const __m256 w = _mm256_broadcast_ss(sc + p);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[u][c] = _mm256_fmadd_ps(w, Load8(vr + 8 * c), acc[u][c]);
  }
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) {
    __m256 r = acc[0][c];
    if constexpr (U == 2) r = _mm256_add_ps(acc[0][c], acc[1][c]);
    if constexpr (U == 4)
      r = _mm256_add_ps(_mm256_add_ps(acc[0][c], acc[1][c]), _mm256_add_ps(acc[2][c], acc[3][c]));
    _mm256_storeu_ps(out + 8 * c, r);
  }
}

// MixBlock over any n: block by block, as GroupAttendRowsC walks the positions (same results).
template <typename E, int C>
void Mix(const E* v, const int64_t* off, int64_t n, const float* sc, float* out) {
  for (int64_t p0 = 0; p0 < n; p0 += kPosBlock) {
    const int64_t len = std::min(kPosBlock, n - p0);
    if (p0 == 0) {
      MixBlock<E, C>(v, off, n, len, sc, out);
    } else {
      MixBlock<E, C, true>(v, off + p0, n - p0, len, sc + p0, out);
    }
  }
}

template <typename E, int C>
void GroupAttendC(const float* q, int group, const E* k, const E* v, const int64_t* off, int64_t n,
                  float scale, float* out, float* sc) {
  for (int64_t j = 0; j < std::min(n, kKvAhead); ++j) PrefetchKvSlice<E, 8 * C>(k + off[j], true);
  for (int h = 0; h < group; ++h) {
    Scores<E, C>(q + h * 8 * C, k, v, off, n, n, scale, sc);
    Table().softmax(sc, n);
    if (h == 0)
      for (int64_t j = 0; j < std::min(n, kKvAhead); ++j) PrefetchKvSlice<E, 8 * C>(v + off[j], true);
    Mix<E, C>(v, off, n, sc, out + h * 8 * C);
  }
}

// n_tok consecutive tokens (token t sees positions [0, n_pos0 + t]), `group` heads each. Pass 1
// writes every query's scores block by block, then each row gets its softmax, then pass 2 mixes V
// block by block. Per query the arithmetic equals GroupAttendC's. Only the first query row of a block
// prefetches: the others find the block in L1 (stories260K's 8-float heads ran 2x slower prefetching for
// every row, three prefetches per position of 8 FMAs).
template <typename E, int C>
void GroupAttendRowsC(const float* q, int64_t q_stride, int64_t n_tok, int group, const E* k, const E* v,
                      const int64_t* off, int64_t n_pos0, float scale, float* out, int64_t out_stride, float* sc) {
  constexpr int64_t hd = 8 * C;
  const int64_t n_max = n_pos0 + n_tok;  // scores row stride
  for (int64_t j = 0; j < std::min(n_max, kKvAhead); ++j) PrefetchKvSlice<E, 8 * C>(k + off[j], true);
  for (int64_t p0 = 0; p0 < n_max; p0 += kPosBlock) {
    const int64_t t0 = std::max<int64_t>(0, p0 - n_pos0);
    for (int64_t t = t0; t < n_tok; ++t) {
      const int64_t len = std::min(kPosBlock, n_pos0 + t + 1 - p0);
      for (int h = 0; h < group; ++h)
        Scores<E, C>(q + t * q_stride + h * hd, k, v, off + p0, n_max - p0, len, scale,
                     sc + (t * group + h) * n_max + p0, t == t0 && h == 0);
    }
  }
  for (int64_t t = 0; t < n_tok; ++t)
    for (int h = 0; h < group; ++h) Table().softmax(sc + (t * group + h) * n_max, n_pos0 + t + 1);
  for (int64_t j = 0; j < std::min(n_max, kKvAhead); ++j) PrefetchKvSlice<E, 8 * C>(v + off[j], true);
  for (int64_t p0 = 0; p0 < n_max; p0 += kPosBlock) {
    const int64_t t0 = std::max<int64_t>(0, p0 - n_pos0);
    for (int64_t t = t0; t < n_tok; ++t) {
      const int64_t len = std::min(kPosBlock, n_pos0 + t + 1 - p0);
      for (int h = 0; h < group; ++h) {
        const float* s = sc + (t * group + h) * n_max + p0;
        float* o = out + t * out_stride + h * hd;
        const bool first = t == t0 && h == 0;
        if (p0 == 0) {
          MixBlock<E, C>(v, off, n_max, len, s, o, first);
        } else {
          MixBlock<E, C, true>(v, off + p0, n_max - p0, len, s, o, first);
        }
      }
    }
  }
}

// Calls f(std::integral_constant<int, C>) for the head sizes with a specialized kernel (head_dim =
// 8 * C: the multiples of 8 up to 128 that models use) and returns whether there was one.
template <typename F>
bool WithChunks(int head_dim, F&& f) {
  switch (head_dim) {
    case 8: f(std::integral_constant<int, 1>{}); return true;
    case 16: f(std::integral_constant<int, 2>{}); return true;
    case 24: f(std::integral_constant<int, 3>{}); return true;
    case 32: f(std::integral_constant<int, 4>{}); return true;
    case 48: f(std::integral_constant<int, 6>{}); return true;
    case 64: f(std::integral_constant<int, 8>{}); return true;
    case 80: f(std::integral_constant<int, 10>{}); return true;
    case 96: f(std::integral_constant<int, 12>{}); return true;
    case 128: f(std::integral_constant<int, 16>{}); return true;
    default: return false;  // other head sizes: the generic Dot/Softmax/Axpy form
  }
}

}  // namespace

bool GroupAttendRows(const float* q, int64_t q_stride, int64_t n_tok, int group, const void* k, const void* v,
                     DType kv, const int64_t* off, int64_t n_pos0, int head_dim, float scale, float* out,
                     int64_t out_stride, float* scores) {
  return WithKvElem(kv, k, v, [&](const auto* ke, const auto* ve) {
    return WithChunks(head_dim, [&](auto c) {
      GroupAttendRowsC<std::remove_cv_t<std::remove_pointer_t<decltype(ke)>>, decltype(c)::value>(
          q, q_stride, n_tok, group, ke, ve, off, n_pos0, scale, out, out_stride, scores);
    });
  });
}

bool GroupAttend(const float* q, int group, const void* k, const void* v, DType kv, const int64_t* off,
                 int64_t n_pos, int head_dim, float scale, float* out, float* scores) {
  return WithKvElem(kv, k, v, [&](const auto* ke, const auto* ve) {
    return WithChunks(head_dim, [&](auto c) {
      GroupAttendC<std::remove_cv_t<std::remove_pointer_t<decltype(ke)>>, decltype(c)::value>(
          q, group, ke, ve, off, n_pos, scale, out, scores);
    });
  });
}

}  // namespace lathe::kernels::cpu::avx2
