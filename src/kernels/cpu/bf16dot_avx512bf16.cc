// bf16 weights times bf16-rounded x rows with vdpbf16ps (avx512_bf16: Cooper Lake, Sapphire Rapids,
// Zen 4 and later): MatMulKernels::bf16_strips of the AVX-512 table on CPUs that have the instruction,
// for BF16 weights packed in pair strips (kernels::StripWeight::bf16_pairs). Per output element the
// arithmetic is Bf16PairsReference's (dispatch.h): x rounded to bf16 (round to nearest even), then per
// inner chunk one chain over the inner pairs p, acc = (acc + x[2p+1] w[2p+1]) + x[2p] w[2p] (each
// product exact in f32, each add rounded: what vdpbf16ps does, measured bit-identical on Zen 4 and as
// Intel documents it), the chunks added in order. Every M (decode, batched decode, prefill) and
// thread count goes through the same tile kernel, so a row's result does not depend on what it is
// batched with. Against the f32 path on bf16 weights (convert, then FMA): half the instructions per
// product and no conversion of W.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/scratch.h"

namespace lathe::kernels::cpu::avx512bf16 {

namespace {

constexpr int kS = 3;     // strips (16 weight rows each) per register tile
constexpr int kR = 8;     // x rows per register tile
constexpr int64_t kMBlock = 64;  // x rows per task

// x rows (M, K) -> bf16 pairs (M, Kp) dwords, round to nearest even; an odd K's last pair gets a 0.
void ConvertX(const float* x, int64_t M, int64_t K, uint32_t* out, int64_t Kp) {
  for (int64_t i = 0; i < M; ++i) {
    const float* xi = x + i * K;
    uint16_t* o = (uint16_t*)(out + i * Kp);
    int64_t l = 0;
    for (; l + 16 <= K; l += 16)
      _mm256_storeu_si256((__m256i*)(o + l), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(xi + l)));
    if (l < K) {
      const __mmask16 m = (__mmask16)((1u << (K - l)) - 1);
      _mm256_mask_storeu_epi16(o + l, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, xi + l)));
    }
    if (K & 1) o[K] = 0;
  }
}

// c(R rows, S strips of 16 columns) = (first ? 0 : c) + sum over pairs p < np of the rows' pairs times
// the strips' pairs; strip s's pair p at b + s * sstride + p * 16 dwords; x row r's pair p at
// xb[r * ldx + p]. The last strip stores its first nc_last columns only.
template <int R, int S>
void Tile(const uint32_t* xb, int64_t ldx, const uint32_t* b, int64_t sstride, int64_t np, float* c, int64_t ldc,
          bool first, int nc_last) {
  __m512 acc[R][S];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) acc[r][s] = _mm512_setzero_ps();
  for (int64_t p = 0; p < np; ++p) {
    __m512bh bv[S];
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) bv[s] = (__m512bh)_mm512_loadu_si512(b + s * sstride + p * 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xb[r * ldx + p]);
#pragma GCC unroll 16
      for (int s = 0; s < S; ++s) acc[r][s] = _mm512_dpbf16_ps(acc[r][s], bv[s], xv);
    }
  }
  const __mmask16 last = (__mmask16)(nc_last >= 16 ? 0xffff : (1u << nc_last) - 1);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
#pragma GCC unroll 16
    for (int s = 0; s < S; ++s) {
      const __mmask16 m = s == S - 1 ? last : (__mmask16)0xffff;
      __m512 v = acc[r][s];
      if (!first) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, cr + 16 * s), v);
      _mm512_mask_storeu_ps(cr + 16 * s, m, v);
    }
  }
}

using TileFn = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, int64_t, float*, int64_t, bool, int);

template <int R>
TileFn TileFor(int s) {
  switch (s) {
    case 1: return Tile<R, 1>;
    case 2: return Tile<R, 2>;
    default: return Tile<R, 3>;
  }
}

TileFn TileFor(int r, int s) {
  switch (r) {
    case 1: return TileFor<1>(s);
    case 2: return TileFor<2>(s);
    case 3: return TileFor<3>(s);
    case 4: return TileFor<4>(s);
    case 5: return TileFor<5>(s);
    case 6: return TileFor<6>(s);
    case 7: return TileFor<7>(s);
    default: return TileFor<8>(s);
  }
}

}  // namespace

// MatMulKernels::bf16_strips: y(M, N) = bf16(x) . W^T from pair strips (strip s's pair p of row j at
// ((s * Kp + p) * 16 + j) dwords, Kp = (K + 1) / 2).
void StripsMatMul(ThreadPool& pool, const float* x, int64_t M, const uint32_t* strips, int64_t N, int64_t K,
                  float* y) {
  if (M <= 0 || N <= 0) return;
  const int64_t Kp = (K + 1) / 2, n_strips = (N + 15) / 16;
  const int64_t chunk = Bf16PairsChunk(Kp);
  static thread_local std::vector<uint32_t> xb_buf;
  uint32_t* xb = Scratch(xb_buf, (size_t)(M * Kp));
  ConvertX(x, M, K, xb, Kp);
  // Tasks: (x row block) x (a range of strip groups); groups of kS strips (48 weight rows).
  const int64_t n_groups = (n_strips + kS - 1) / kS, n_mb = (M + kMBlock - 1) / kMBlock;
  const int64_t th = pool.size();
  // At least 4 tasks per thread where there are groups to share (decode: M = 1, one row block).
  const int64_t want = th > 1 ? 4 * th : 1;
  const int64_t per = std::max<int64_t>(1, n_groups / std::max<int64_t>(1, want / n_mb));
  const int64_t n_gr = (n_groups + per - 1) / per;
  pool.ParallelFor(n_mb * n_gr, 1, [&](int64_t tb, int64_t te, int) {
    for (int64_t t = tb; t < te; ++t) {
      const int64_t mb = t / n_gr, gr = t % n_gr;
      const int64_t m0 = mb * kMBlock, m1 = std::min(M, m0 + kMBlock);
      const int64_t g0 = gr * per, g1 = std::min(n_groups, g0 + per);
      for (int64_t p0 = 0; p0 < Kp; p0 += chunk) {
        const int64_t np = std::min(chunk, Kp - p0);
        for (int64_t g = g0; g < g1; ++g) {
          const int64_t s0 = g * kS, ns = std::min<int64_t>(kS, n_strips - s0);
          const int nc_last = (int)std::min<int64_t>(16, N - 16 * (s0 + ns - 1));
          const uint32_t* b = strips + (s0 * Kp + p0) * 16;
          for (int64_t i = m0; i < m1; i += kR) {
            const int r = (int)std::min<int64_t>(kR, m1 - i);
            TileFor(r, (int)ns)(xb + i * Kp + p0, Kp, b, Kp * 16, np, y + i * N + 16 * s0, N, p0 == 0, nc_last);
          }
        }
      }
    }
  }, 2.0 * M * N * K);
}

}  // namespace lathe::kernels::cpu::avx512bf16
