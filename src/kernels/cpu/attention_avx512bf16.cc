// Grouped attention over a paged bf16 KV cache on vdpbf16ps (avx512_bf16), for prompt runs and decode steps
// alike: the products take bf16 operands with f32 accumulation, as a bf16 model's attention runs in PyTorch
// (SDPA on bf16 q / k / v, the probabilities rounded to bf16 before the product with V).
//
// Per query row (one query head of one token, n keys):
// - q is rounded to bf16 (round to nearest even) as pairs (q[2i], q[2i + 1]);
// - score[p] = scale * (one f32 chain from +0 over the head's pairs in order, a vdpbf16ps step per pair);
// - the tier's softmax (avx512::Table().softmax) over the n scores, the probabilities rounded to bf16;
// - out[d] = one f32 chain from +0 over the position pairs (2j, 2j + 1) in order, a vdpbf16ps step per pair;
//   an odd n's last pair is (P[n - 1], 0) x (V[n - 1][d], 0).
// Every row's result depends on its own q, its n keys and values only: not on which other rows share the call,
// nor on how many positions the call holds past the row's own (a prompt token's output equals the one a
// decode step gives it: the batch invariance the engine relies on). The AVX2 / AVX-512 f32 kernels
// (attention_avx2.cc, attention_avx512.cc) keep the f32 arithmetic for f32 / f16 caches and where this
// one does not run.
//
// Layout work: K blocks of 16 positions are transposed (16 x 16 dwords at a time) so a score tile holds 16
// positions in the lanes of one zmm, no horizontal sums; V rows are interleaved by position pairs
// (vpunpck{l,h}wd) so a lane holds one head dimension, in an order undone when the rows are stored.
//
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/avx512_transpose.h"
#include "kernels/cpu/avx512_util.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/kv_elem.h"
#include "kernels/cpu/scratch.h"

namespace lathe::kernels::cpu::avx512bf16 {

namespace {

constexpr int64_t kScoreBlock = 16;  // positions per transposed K block (one zmm of scores)
constexpr int64_t kMixBlock = 64;    // positions per block of interleaved V pairs
constexpr int kScoreRows = 8;        // query rows per score tile

struct Row {
  const uint32_t* qb;  // the query as bf16 pairs (head_dim / 2 dwords)
  float* sc;           // scores, then probabilities (n floats)
  uint32_t* pb;        // probabilities as bf16 pairs ((n + 1) / 2 dwords, room for a zmm past them)
  float* acc;          // the output's chains between V blocks (head_dim floats, interleaved order)
  float* out;          // the output (head_dim floats)
  int64_t n;           // keys the row sees: positions [0, n)
};

// f32 values rounded to bf16 (nearest even), 32 at a time: n of them from x (0 past n), as 16 pair dwords.
inline __m512i RoundPairs(const float* x, int64_t n) {
  const __m512 lo = _mm512_maskz_loadu_ps(avx512::MaskUpTo16(n), x);
  const __m512 hi = n > 16 ? _mm512_maskz_loadu_ps(avx512::MaskUpTo16(n - 16), x + 16) : _mm512_setzero_ps();
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

template <int HD>
struct Kernel {
  static constexpr int D = HD / 2;   // pair dwords per K / Q row
  static constexpr int ZV = HD / 32;  // zmm per bf16 row
  static constexpr int Z = HD / 16;   // f32 zmm per output row
  static constexpr int kMixRows = Z <= 4 ? 16 / Z : 2;

  // Scores of M rows for the positions [b0, b0 + 16) from the transposed block kt (D x 16 dwords).
  template <int M>
  static void ScoreTile(const Row* rows, const uint32_t* kt, int64_t b0, float scale) {
    __m512 acc[M];
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r) acc[r] = _mm512_setzero_ps();
    for (int dp = 0; dp < D; ++dp) {
      const __m512bh kv = (__m512bh)_mm512_load_si512(kt + dp * 16);
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r)
        acc[r] = _mm512_dpbf16_ps(acc[r], kv, (__m512bh)_mm512_set1_epi32((int)rows[r].qb[dp]));
    }
    const __m512 sv = _mm512_set1_ps(scale);
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
      _mm512_mask_storeu_ps(rows[r].sc + b0, avx512::MaskUpTo16(rows[r].n - b0), _mm512_mul_ps(acc[r], sv));
  }

  // The K rows of positions [b0, b0 + nb) (nb <= 16; zero past nb), pair dwords [16 c, 16 c + 16) of each,
  // transposed: t[i] holds pair 16 c + i of the 16 positions. And the prefetch of the block 16 positions ahead.
  __attribute__((always_inline)) static inline void TransposedChunk(const KvBf16* k, const int64_t* off, int64_t b0,
                                                                    int64_t nb, int c, __m512 (&t)[16]) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j)
      t[j] = j < nb ? _mm512_loadu_ps((const float*)(k + off[b0 + j]) + 16 * c) : _mm512_setzero_ps();
    Transpose16(t);
  }
  static void PrefetchAhead(const KvBf16* k, const int64_t* off, int64_t b0, int64_t n_max) {
    for (int64_t j = b0 + kKvAhead; j < std::min(n_max, b0 + kKvAhead + kScoreBlock); ++j)
      PrefetchKvSlice<KvBf16, HD>(k + off[j], true);
  }

  // The scores of M rows (a decode step's group) block by block, each transposed block consumed from the
  // registers it was transposed in (no staging): the same chains as ScoreTile's, pair by pair in order.
  template <int M>
  static void ScoresFew(const Row* rows, const KvBf16* k, const int64_t* off, int64_t n_max, float scale) {
    for (int64_t j = 0; j < std::min(n_max, kKvAhead); ++j) PrefetchKvSlice<KvBf16, HD>(k + off[j], true);
    const __m512 sv = _mm512_set1_ps(scale);
    for (int64_t b0 = 0; b0 < n_max; b0 += kScoreBlock) {
      const int64_t nb = std::min(kScoreBlock, n_max - b0);
      PrefetchAhead(k, off, b0, n_max);
      __m512 acc[M];
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r) acc[r] = _mm512_setzero_ps();
#pragma GCC unroll 1
      for (int c = 0; c < D / 16; ++c) {
        __m512 t[16];
        TransposedChunk(k, off, b0, nb, c, t);
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) {
#pragma GCC unroll 8
          for (int r = 0; r < M; ++r)
            acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)t[i], (__m512bh)_mm512_set1_epi32((int)rows[r].qb[16 * c + i]));
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r)
        _mm512_mask_storeu_ps(rows[r].sc + b0, avx512::MaskUpTo16(rows[r].n - b0), _mm512_mul_ps(acc[r], sv));
    }
  }

  static void Scores(const Row* rows, int n_rows, const KvBf16* k, const int64_t* off, int64_t n_max, float scale) {
    switch (n_rows) {
      case 1: return ScoresFew<1>(rows, k, off, n_max, scale);
      case 2: return ScoresFew<2>(rows, k, off, n_max, scale);
      case 3: return ScoresFew<3>(rows, k, off, n_max, scale);
      case 4: return ScoresFew<4>(rows, k, off, n_max, scale);
      default: break;
    }
    alignas(64) uint32_t kt[D * 16];
    for (int64_t j = 0; j < std::min(n_max, kKvAhead); ++j) PrefetchKvSlice<KvBf16, HD>(k + off[j], true);
    int i0 = 0;  // rows are in order of n: the first one that sees the block
    for (int64_t b0 = 0; b0 < n_max; b0 += kScoreBlock) {
      const int64_t nb = std::min(kScoreBlock, n_max - b0);
      PrefetchAhead(k, off, b0, n_max);
      for (int c = 0; c < D / 16; ++c) {
        __m512 r[16];
        TransposedChunk(k, off, b0, nb, c, r);
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) _mm512_store_ps((float*)kt + (16 * c + i) * 16, r[i]);
      }
      while (i0 < n_rows && rows[i0].n <= b0) ++i0;
      for (int i = i0; i < n_rows; i += kScoreRows) {
        switch (std::min(kScoreRows, n_rows - i)) {
          case 8: ScoreTile<8>(rows + i, kt, b0, scale); break;
          case 7: ScoreTile<7>(rows + i, kt, b0, scale); break;
          case 6: ScoreTile<6>(rows + i, kt, b0, scale); break;
          case 5: ScoreTile<5>(rows + i, kt, b0, scale); break;
          case 4: ScoreTile<4>(rows + i, kt, b0, scale); break;
          case 3: ScoreTile<3>(rows + i, kt, b0, scale); break;
          case 2: ScoreTile<2>(rows + i, kt, b0, scale); break;
          default: ScoreTile<1>(rows + i, kt, b0, scale); break;
        }
      }
    }
  }

  // One position pair's V rows interleaved: dword 4 L + i of vp[2 z] holds dimension 32 z + 8 L + i of both
  // positions (lower one in the low half), of vp[2 z + 1] dimension 32 z + 8 L + 4 + i (L the 128-bit lane).
  static void Interleave(const KvBf16* v0, const KvBf16* v1, __m512i* vp) {
#pragma GCC unroll 4
    for (int z = 0; z < ZV; ++z) {
      const __m512i a = _mm512_loadu_si512(v0 + 32 * z);
      const __m512i b = v1 ? _mm512_loadu_si512(v1 + 32 * z) : _mm512_setzero_si512();
      vp[2 * z] = _mm512_unpacklo_epi16(a, b);
      vp[2 * z + 1] = _mm512_unpackhi_epi16(a, b);
    }
  }

  // acc[z] (+)= the pairs [j0, j1) of the block (pair j at vp + j * HD) times the row's probability pairs pb
  // (indexed from the block's first pair).
  template <int M>
  static void MixPairs(const uint32_t* vp, const uint32_t* const* pb, int64_t j0, int64_t j1, __m512 (&acc)[M][Z]) {
    for (int64_t j = j0; j < j1; ++j) {
      __m512bh w[Z];
#pragma GCC unroll 8
      for (int z = 0; z < Z; ++z) w[z] = (__m512bh)_mm512_load_si512(vp + j * HD + 16 * z);
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r) {
        const __m512bh p = (__m512bh)_mm512_set1_epi32((int)pb[r][j]);
#pragma GCC unroll 8
        for (int z = 0; z < Z; ++z) acc[r][z] = _mm512_dpbf16_ps(acc[r][z], w[z], p);
      }
    }
  }

  // M rows over the block of pairs from position b0 (np full pairs interleaved at vp; v, off: the cache, for an
  // odd row's last pair): the pairs every row holds whole together, then each row's rest alone.
  template <int M>
  static void MixTile(const Row* rows, const uint32_t* vp, int64_t b0, int64_t np, const KvBf16* v,
                      const int64_t* off) {
    __m512 acc[M][Z];
    const uint32_t* pb[M];
    int64_t common = np;
    for (int r = 0; r < M; ++r) {
      pb[r] = rows[r].pb + b0 / 2;
      common = std::min(common, (rows[r].n - b0) / 2);
#pragma GCC unroll 8
      for (int z = 0; z < Z; ++z) acc[r][z] = b0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(rows[r].acc + 16 * z);
    }
    common = std::max<int64_t>(common, 0);
    MixPairs<M>(vp, pb, 0, common, acc);
    for (int r = 0; r < M; ++r) {
      const Row& row = rows[r];
      const int64_t len = std::min(row.n - b0, kMixBlock);  // positions of the block the row sees
      __m512 one[1][Z];
#pragma GCC unroll 8
      for (int z = 0; z < Z; ++z) one[0][z] = acc[r][z];
      const uint32_t* p1[1] = {pb[r]};
      MixPairs<1>(vp, p1, common, len / 2, one);
      if (len % 2) {  // the row's last position, alone: (P[n - 1], 0) x (V[n - 1], 0)
        __m512i last[Z];
        Interleave(v + off[row.n - 1], nullptr, last);
        const __m512bh p = (__m512bh)_mm512_set1_epi32((int)pb[r][len / 2]);
#pragma GCC unroll 8
        for (int z = 0; z < Z; ++z) one[0][z] = _mm512_dpbf16_ps(one[0][z], (__m512bh)last[z], p);
      }
#pragma GCC unroll 8
      for (int z = 0; z < Z; ++z) _mm512_storeu_ps(row.acc + 16 * z, one[0][z]);
    }
  }

  // M rows (a decode step's group, or a short run) over every position with their chains in registers and each
  // pair's V rows interleaved in registers (no staging): the pairs every row holds whole together, then each
  // row's rest alone, as MixTile; the chains left in each row's acc (interleaved order, for Store).
  template <int M>
  static void MixFew(const Row* rows, const KvBf16* v, const int64_t* off) {
    __m512 acc[M][Z];
    const uint32_t* pb[M];
    int64_t common = rows[0].n / 2;
    for (int r = 0; r < M; ++r) {
      pb[r] = rows[r].pb;
      common = std::min(common, rows[r].n / 2);
#pragma GCC unroll 8
      for (int z = 0; z < Z; ++z) acc[r][z] = _mm512_setzero_ps();
    }
    for (int64_t j = 0; j < std::min<int64_t>(2 * common, kKvAhead); ++j) PrefetchKvSlice<KvBf16, HD>(v + off[j], true);
    for (int64_t j = 0; j < common; ++j) {
      const int64_t p = 2 * j;
      if (p + kKvAhead + 1 < 2 * common) {
        PrefetchKvSlice<KvBf16, HD>(v + off[p + kKvAhead], true);
        PrefetchKvSlice<KvBf16, HD>(v + off[p + kKvAhead + 1], true);
      }
      __m512i w[Z];
      Interleave(v + off[p], v + off[p + 1], w);
#pragma GCC unroll 8
      for (int r = 0; r < M; ++r) {
        const __m512bh pr = (__m512bh)_mm512_set1_epi32((int)pb[r][j]);
#pragma GCC unroll 8
        for (int z = 0; z < Z; ++z) acc[r][z] = _mm512_dpbf16_ps(acc[r][z], (__m512bh)w[z], pr);
      }
    }
    for (int r = 0; r < M; ++r) {
      const Row& row = rows[r];
      for (int64_t j = common; j < (row.n + 1) / 2; ++j) {
        const int64_t p = 2 * j;
        __m512i w[Z];
        Interleave(v + off[p], p + 1 < row.n ? v + off[p + 1] : nullptr, w);
        const __m512bh pr = (__m512bh)_mm512_set1_epi32((int)pb[r][j]);
#pragma GCC unroll 8
        for (int z = 0; z < Z; ++z) acc[r][z] = _mm512_dpbf16_ps(acc[r][z], (__m512bh)w[z], pr);
      }
#pragma GCC unroll 8
      for (int z = 0; z < Z; ++z) _mm512_storeu_ps(row.acc + 16 * z, acc[r][z]);
    }
  }

  static void Mix(const Row* rows, int n_rows, const KvBf16* v, const int64_t* off, int64_t n_max) {
    if (n_rows <= kMixRows) {
      switch (n_rows) {
        case 8: if constexpr (kMixRows >= 8) return MixFew<8>(rows, v, off); break;
        case 7: if constexpr (kMixRows >= 7) return MixFew<7>(rows, v, off); break;
        case 6: if constexpr (kMixRows >= 6) return MixFew<6>(rows, v, off); break;
        case 5: if constexpr (kMixRows >= 5) return MixFew<5>(rows, v, off); break;
        case 4: if constexpr (kMixRows >= 4) return MixFew<4>(rows, v, off); break;
        case 3: if constexpr (kMixRows >= 3) return MixFew<3>(rows, v, off); break;
        case 2: return MixFew<2>(rows, v, off);
        default: return MixFew<1>(rows, v, off);
      }
    }
    alignas(64) uint32_t vp[kMixBlock / 2 * HD];
    for (int64_t j = 0; j < std::min(n_max, kKvAhead); ++j) PrefetchKvSlice<KvBf16, HD>(v + off[j], true);
    int i0 = 0;
    for (int64_t b0 = 0; b0 < n_max; b0 += kMixBlock) {
      const int64_t nb = std::min(kMixBlock, n_max - b0), np = nb / 2;
      for (int64_t j = 0; j < np; ++j) {
        const int64_t p = b0 + 2 * j;
        if (p + kKvAhead + 1 < n_max) {
          PrefetchKvSlice<KvBf16, HD>(v + off[p + kKvAhead], true);
          PrefetchKvSlice<KvBf16, HD>(v + off[p + kKvAhead + 1], true);
        }
        Interleave(v + off[p], v + off[p + 1], (__m512i*)(vp + j * HD));
      }
      while (i0 < n_rows && rows[i0].n <= b0) ++i0;
      for (int i = i0; i < n_rows; i += kMixRows) {
        switch (std::min(kMixRows, n_rows - i)) {
          case 8: if constexpr (kMixRows >= 8) MixTile<8>(rows + i, vp, b0, np, v, off); break;
          case 7: if constexpr (kMixRows >= 7) MixTile<7>(rows + i, vp, b0, np, v, off); break;
          case 6: if constexpr (kMixRows >= 6) MixTile<6>(rows + i, vp, b0, np, v, off); break;
          case 5: if constexpr (kMixRows >= 5) MixTile<5>(rows + i, vp, b0, np, v, off); break;
          case 4: if constexpr (kMixRows >= 4) MixTile<4>(rows + i, vp, b0, np, v, off); break;
          case 3: if constexpr (kMixRows >= 3) MixTile<3>(rows + i, vp, b0, np, v, off); break;
          case 2: MixTile<2>(rows + i, vp, b0, np, v, off); break;
          default: MixTile<1>(rows + i, vp, b0, np, v, off); break;
        }
      }
    }
  }

  // The interleaved chains stored in dimension order (Interleave's layout undone).
  static void Store(const Row& row) {
    const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
#pragma GCC unroll 4
    for (int z = 0; z < ZV; ++z) {
      const __m512 lo = _mm512_loadu_ps(row.acc + 32 * z), hi = _mm512_loadu_ps(row.acc + 32 * z + 16);
      _mm512_storeu_ps(row.out + 32 * z, _mm512_permutex2var_ps(lo, i0, hi));
      _mm512_storeu_ps(row.out + 32 * z + 16, _mm512_permutex2var_ps(lo, i1, hi));
    }
  }

  static void Run(const float* q, int64_t q_stride, int64_t n_tok, int group, const KvBf16* k, const KvBf16* v,
                  const int64_t* off, int64_t n_pos0, float scale, float* out, int64_t out_stride, float* sc) {
    const int64_t n_max = n_pos0 + n_tok, n_rows = n_tok * group;
    const int64_t pb_stride = ((n_max + 1) / 2 + 15) / 16 * 16;
    static thread_local std::vector<Row> rows_buf;
    static thread_local std::vector<uint32_t> qb_buf, pb_buf;
    static thread_local std::vector<float> acc_buf;
    rows_buf.resize((size_t)n_rows);
    uint32_t* qb = Scratch(qb_buf, (size_t)(n_rows * D));
    uint32_t* pb = Scratch(pb_buf, (size_t)(n_rows * pb_stride));
    float* acc = Scratch(acc_buf, (size_t)(n_rows * HD));
    Row* rows = rows_buf.data();
    for (int64_t t = 0; t < n_tok; ++t)
      for (int h = 0; h < group; ++h) {
        const int64_t i = t * group + h;
        const float* qr = q + t * q_stride + h * HD;
        for (int c = 0; c < D / 16; ++c) _mm512_storeu_si512(qb + i * D + 16 * c, RoundPairs(qr + 32 * c, 32));
        rows[i] = {qb + i * D, sc + i * n_max, pb + i * pb_stride, acc + i * HD, out + t * out_stride + h * HD,
                   n_pos0 + t + 1};
      }
    Scores(rows, (int)n_rows, k, off, n_max, scale);
    const KernelTable& t5 = avx512::Table();
    for (int64_t i = 0; i < n_rows; ++i) {
      const Row& r = rows[i];
      t5.softmax(r.sc, r.n);
      for (int64_t p = 0; p < r.n; p += 32) _mm512_storeu_si512(r.pb + p / 2, RoundPairs(r.sc + p, r.n - p));
    }
    Mix(rows, (int)n_rows, v, off, n_max);
    for (int64_t i = 0; i < n_rows; ++i) Store(rows[i]);
  }
};

// head_dim in {32, 64, 96, 128}: f(Kernel<head_dim>) and true; false for the others.
template <typename F>
bool WithHeadDim(int head_dim, F&& f) {
  switch (head_dim) {
    case 32: f(Kernel<32>{}); return true;
    case 64: f(Kernel<64>{}); return true;
    case 96: f(Kernel<96>{}); return true;
    case 128: f(Kernel<128>{}); return true;
    default: return false;
  }
}

}  // namespace

bool GroupAttendRows(const float* q, int64_t q_stride, int64_t n_tok, int group, const void* k, const void* v,
                     DType kv, const int64_t* off, int64_t n_pos0, int head_dim, float scale, float* out,
                     int64_t out_stride, float* scores) {
  if (kv == DType::kBF16 && !Bf16PairsOnFma() && WithHeadDim(head_dim, [&](auto kern) {
        kern.Run(q, q_stride, n_tok, group, (const KvBf16*)k, (const KvBf16*)v, off, n_pos0, scale, out, out_stride,
                 scores);
      })) {
    return true;
  }
  return avx512::GroupAttendRows(q, q_stride, n_tok, group, k, v, kv, off, n_pos0, head_dim, scale, out, out_stride,
                                 scores);
}

bool GroupAttend(const float* q, int group, const void* k, const void* v, DType kv, const int64_t* off,
                 int64_t n_pos, int head_dim, float scale, float* out, float* scores) {
  if (kv == DType::kBF16 && !Bf16PairsOnFma() && WithHeadDim(head_dim, [&](auto kern) {
        // The caller's scores hold n_pos floats (one head's at a time); the rows kernel keeps every head's.
        static thread_local std::vector<float> sc_buf;
        float* sc = Scratch(sc_buf, (size_t)(group * n_pos));
        kern.Run(q, 0, 1, group, (const KvBf16*)k, (const KvBf16*)v, off, n_pos - 1, scale, out, 0, sc);
      })) {
    return true;
  }
  return avx2::GroupAttend(q, group, k, v, kv, off, n_pos, head_dim, scale, out, scores);
}

}  // namespace lathe::kernels::cpu::avx512bf16
