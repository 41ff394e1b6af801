// AVX-512 attention of a run of consecutive tokens over a paged KV cache (prefill): the AVX2 kernel's
// arithmetic (attention_avx2.cc), bit for bit, with every K and V row read once for up to four query
// rows (a token's query heads and the next token's) instead of once per query. Per query the operations
// and their order are those of avx2::GroupAttend, so a prompt token's output equals the one a decode
// step would give it (the batch invariance the engine relies on). K / V elements of any kv_elem.h type,
// widened to f32 exactly on load. Blocks that many rows see take their scores from K transposed 16
// positions at a time (ScoresBlockT): the same additions, without Scores4's horizontal sums.
#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/cpu/avx512_transpose.h"
#include "kernels/cpu/avx512_util.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/kv_elem.h"

namespace lathe::kernels::cpu::avx512 {

namespace {

// The AVX2 kernel's position blocks: scores group positions by 4 from each block's start.
constexpr int64_t kPosBlock = 64;
constexpr int kMaxRows = 4;
// Rows of a position block from which its scores take transposed K (ScoresBlockT: the same bits): the
// transposes of a 16-position sub-block cost about what Scores4's horizontal sums cost four rows.
constexpr int kMinRowsTransposed = 8;

// K / V elements widened to f32 (exact), 16 or 8 at a time.
inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 Load16(const KvF16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
inline __m512 Load16(const KvBf16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Load8(const KvF16* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
inline __m256 Load8(const KvBf16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

// Scores of R query rows (head_dim = 8 C, C even) for the position groups [g0, g1) (positions 4 g ..
// 4 g + 3 of the block). Per position the AVX2 kernel keeps two 8-lane chains, even and odd 8-float
// chunks, started by a multiply: here the low and high halves of one zmm chain over 16-float chunks,
// the same multiply and FMAs lane for lane; then a + b, two rounds of hadd over the 4 positions, the
// 128-bit halves added, times scale.
// Positions up to n_off of off exist (the prefetch stops there); v: the V rows to prefetch alongside.
template <typename E, int C, int R>
void Scores4(const float* const* q, const E* k, const E* v, const int64_t* off, int64_t n_off, int64_t g0,
             int64_t g1, float scale, float* const* sc, bool prefetch = true) {
  static_assert(C % 2 == 0);
  constexpr int Z = C / 2;
  const __m128 sv = _mm_set1_ps(scale);
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t p = 4 * g;
    if (prefetch) {
      for (int64_t j = p + kKvAhead; j < std::min(n_off, p + kKvAhead + 4); ++j) {
        PrefetchKvSlice<E, 8 * C>(k + off[j], true);
        PrefetchKvSlice<E, 8 * C>(v + off[j], false);
      }
    }
    const E* kr[4] = {k + off[p], k + off[p + 1], k + off[p + 2], k + off[p + 3]};
    __m512 acc[R][4];
#pragma GCC unroll 8
    for (int z = 0; z < Z; ++z) {
      __m512 kv[4];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) kv[j] = Load16(kr[j] + 16 * z);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 qv = _mm512_loadu_ps(q[r] + 16 * z);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) acc[r][j] = z == 0 ? _mm512_mul_ps(qv, kv[j]) : _mm512_fmadd_ps(qv, kv[j], acc[r][j]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      __m256 a[4];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j)
        a[j] = _mm256_add_ps(_mm512_castps512_ps256(acc[r][j]), _mm512_extractf32x8_ps(acc[r][j], 1));
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
      const __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
      _mm_storeu_ps(sc[r] + p, _mm_mul_ps(s, sv));
    }
  }
}

// The last n % 4 positions of a row's block, as the AVX2 kernel: one 8-lane chain over the chunks in
// order, Hsum256 (avx2_util.h's HsumPs, the same operations), times scale.
template <typename E, int C>
void ScoresTail(const float* q, const E* k, const int64_t* off, int64_t p0, int64_t p1, float scale, float* sc) {
  for (int64_t p = p0; p < p1; ++p) {
    const E* kr = k + off[p];
    __m256 a = _mm256_mul_ps(_mm256_loadu_ps(q), Load8(kr));
#pragma GCC unroll 16
    for (int c = 1; c < C; ++c) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c), Load8(kr + 8 * c), a);
    sc[p] = Hsum256(a) * scale;
  }
}

// o_r (+)= sum over positions [p0, p1) of sc_r[p] * v[off[p]] for R rows: per lane one FMA chain in
// position order (the AVX2 kernel's, from head_dim 32 on), 16 lanes per zmm, each V row read once.
template <typename E, int C, int R>
void MixRows(const E* v, const int64_t* off, int64_t n_off, int64_t p0, int64_t p1, const float* const* sc,
             __m512 (&acc)[R][C / 2], bool prefetch = true) {
  constexpr int Z = C / 2;
  for (int64_t p = p0; p < p1; ++p) {
    if (prefetch && p + kKvAhead < n_off) PrefetchKvSlice<E, 8 * C>(v + off[p + kKvAhead], true);
    const E* vr = v + off[p];
    __m512 vv[Z];
#pragma GCC unroll 8
    for (int z = 0; z < Z; ++z) vv[z] = Load16(vr + 16 * z);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 w = _mm512_set1_ps(sc[r][p]);
#pragma GCC unroll 8
      for (int z = 0; z < Z; ++z) acc[r][z] = _mm512_fmadd_ps(w, vv[z], acc[r][z]);
    }
  }
}

struct Row {
  const float* q;
  float* sc;   // the row's scores, indexed by position
  float* out;
  int64_t len;  // positions of the current block this row sees
};

// The same scores (Scores4's arithmetic, bit for bit) with K transposed: 16 positions in the lanes of one zmm,
// so nothing is summed across lanes. Scores4's lane l of a position's chain holds dims 16 z + l over z (a
// multiply, then FMAs); here c_l is that chain for 16 positions at once (q[16 z + l] broadcast times row 16 z + l
// of the transposed block), and its tree (a_i = c_i + c_(i+8), then ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 +
// a7)), times scale) is the hadd / 128-bit-halves tree of Scores4 done lane-wise: the same additions of the same
// values. Per row and 16 positions: 16 Z multiply-adds and 16 vertical ops, against Scores4's ~40 shuffles and
// horizontal adds (port 5, which Intel's cores share with the 512-bit FMAs). The transpose (Z 16 x 16 blocks per
// 16 positions) pays off over many rows: prompt runs.
//
// kt[d * 16 + j] = K(q0 + j, d) widened to f32 for the positions j < nj of the sub-block, 0 past them.
template <typename E, int C>
void TransposeK(const E* k, const int64_t* off, int64_t q0, int64_t nj, float* kt) {
  constexpr int Z = C / 2;
#pragma GCC unroll 1
  for (int z = 0; z < Z; ++z) {
    __m512 r[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) r[j] = j < nj ? Load16(k + off[q0 + j] + 16 * z) : _mm512_setzero_ps();
    Transpose16(r);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) _mm512_store_ps(kt + (16 * z + i) * 16, r[i]);
  }
}

// One zmm per row of a tile (M <= 4 rows: at most 5 live zmm a row).
template <int M>
struct Zmms {
  __m512 v[M];
};
template <int M>
__attribute__((always_inline)) inline Zmms<M> AddZ(const Zmms<M>& x, const Zmms<M>& y) {
  Zmms<M> o;
#pragma GCC unroll 4
  for (int r = 0; r < M; ++r) o.v[r] = _mm512_add_ps(x.v[r], y.v[r]);
  return o;
}
// The chain of lane l (dims l, l + 16, ..) for M rows q[0 .. M).
template <int C, int M>
__attribute__((always_inline)) inline Zmms<M> ChainT(const float* const* q, const float* kt, int l) {
  constexpr int Z = C / 2;
  Zmms<M> c;
#pragma GCC unroll 8
  for (int z = 0; z < Z; ++z) {
    const __m512 kv = _mm512_load_ps(kt + (16 * z + l) * 16);
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) {
      const __m512 qv = _mm512_set1_ps(q[r][16 * z + l]);
      c.v[r] = z == 0 ? _mm512_mul_ps(qv, kv) : _mm512_fmadd_ps(qv, kv, c.v[r]);
    }
  }
  return c;
}
template <int C, int M>
__attribute__((always_inline)) inline Zmms<M> PairT(const float* const* q, const float* kt, int i) {
  Zmms<M> a = AddZ<M>(ChainT<C, M>(q, kt, i), ChainT<C, M>(q, kt, i + 8));
  // Pins the pair's sums here: otherwise GCC runs chains of later pairs first and spills finished ones.
#pragma GCC unroll 4
  for (int r = 0; r < M; ++r) asm("" : "+v"(a.v[r]));
  return a;
}
template <int C, int M>
__attribute__((always_inline)) inline Zmms<M> QuadT(const float* const* q, const float* kt, int i0) {
  const Zmms<M> e0 = AddZ<M>(PairT<C, M>(q, kt, i0), PairT<C, M>(q, kt, i0 + 1));
  return AddZ<M>(e0, AddZ<M>(PairT<C, M>(q, kt, i0 + 2), PairT<C, M>(q, kt, i0 + 3)));
}
// The scores of rows[0 .. M) for the 16 positions q0 .. q0 + 15 of the block, stored below each row's len / 4 * 4.
// Out of line, one function per tile shape: inlined into ScoresBlockT, the four shapes' Z x 16 x M checked scalar
// broadcasts made one function that clang's ASan/UBSan build took 18 minutes to compile (9 of them allocating
// registers for the C = 16 tiles; 2 minutes out of line). Out of line also keeps GCC from hoisting the block's
// Z x 16 loads of kt out of the row loop and spilling them (what an asm barrier on kt did before).
template <int C, int M>
__attribute__((noinline)) void ScoreTileT(const Row* rows, const float* kt, int64_t q0, __m512 scale) {
  const float* q[M];
#pragma GCC unroll 4
  for (int r = 0; r < M; ++r) q[r] = rows[r].q;
  const Zmms<M> f0 = QuadT<C, M>(q, kt, 0);
  const Zmms<M> t = AddZ<M>(f0, QuadT<C, M>(q, kt, 4));
#pragma GCC unroll 4
  for (int r = 0; r < M; ++r) {
    const int64_t full = rows[r].len / 4 * 4 - q0;  // this row's positions of the sub-block, full groups
    _mm512_mask_storeu_ps(rows[r].sc + q0, MaskUpTo16(full), _mm512_mul_ps(t.v[r], scale));
  }
}

// ScoresBlock's stores (every row's positions below len / 4 * 4 of the block, then its tail) from transposed K.
template <typename E, int C>
void ScoresBlockT(const Row* rows, int n, const E* k, const int64_t* off, int64_t n_off, float scale) {
  constexpr int64_t hd = 8 * C;
  alignas(64) static thread_local float kt_buf[16 * 128];
  static_assert(hd <= 128);
  float* const kt = kt_buf;  // one TLS address, not one per access
  const __m512 sv = _mm512_set1_ps(scale);
  const int64_t n_pos = std::min(kPosBlock, n_off);
  int first = 0;  // rows are in token order: each len at least the one before
  for (int64_t q0 = 0; q0 < n_pos; q0 += 16) {
    while (first < n && rows[first].len / 4 * 4 <= q0) ++first;
    if (first == n) break;
    const int64_t nj = std::min<int64_t>(16, n_pos - q0);
    for (int64_t j = q0 + 16; j < std::min(n_pos, q0 + 32); ++j) PrefetchKvSlice<E, hd>(k + off[j], true);
    TransposeK<E, C>(k, off, q0, nj, kt);
    for (int i0 = first; i0 < n; i0 += kMaxRows) {
      switch (std::min(kMaxRows, n - i0)) {
        case 4: ScoreTileT<C, 4>(rows + i0, kt, q0, sv); break;
        case 3: ScoreTileT<C, 3>(rows + i0, kt, q0, sv); break;
        case 2: ScoreTileT<C, 2>(rows + i0, kt, q0, sv); break;
        default: ScoreTileT<C, 1>(rows + i0, kt, q0, sv); break;
      }
    }
  }
  for (int i = 0; i < n; ++i) ScoresTail<E, C>(rows[i].q, k, off, rows[i].len / 4 * 4, rows[i].len, scale, rows[i].sc);
}

// Rows of one position block in batches of up to R (kMaxRows, or 2 for 128-float heads in the mix):
// the part every row of a batch sees together, then each row's remainder alone. Only the first batch
// prefetches (the block is in L1 for the rest), as the AVX2 rows kernel.
template <typename E, int C>
void ScoresBlock(const Row* rows, int n, const E* k, const E* v, const int64_t* off, int64_t n_off, float scale) {
  for (int i0 = 0; i0 < n; i0 += kMaxRows) {
    const int m = std::min(kMaxRows, n - i0);
    int64_t common = rows[i0].len;
    for (int i = 1; i < m; ++i) common = std::min(common, rows[i0 + i].len);
    const float* qs[kMaxRows];
    float* scs[kMaxRows];
    for (int i = 0; i < m; ++i) qs[i] = rows[i0 + i].q, scs[i] = rows[i0 + i].sc;
    const int64_t g_common = common / 4;
    switch (m) {
      case 4: Scores4<E, C, 4>(qs, k, v, off, n_off, 0, g_common, scale, scs, i0 == 0); break;
      case 3: Scores4<E, C, 3>(qs, k, v, off, n_off, 0, g_common, scale, scs, i0 == 0); break;
      case 2: Scores4<E, C, 2>(qs, k, v, off, n_off, 0, g_common, scale, scs, i0 == 0); break;
      default: Scores4<E, C, 1>(qs, k, v, off, n_off, 0, g_common, scale, scs, i0 == 0); break;
    }
    for (int i = 0; i < m; ++i) {
      const Row& r = rows[i0 + i];
      Scores4<E, C, 1>(&qs[i], k, v, off, n_off, g_common, r.len / 4, scale, &scs[i], i0 == 0 && i == 0);
      ScoresTail<E, C>(r.q, k, off, r.len / 4 * 4, r.len, scale, r.sc);
    }
  }
}

// M rows mixed together over the positions they all see (each V row read once for the M), then each
// row's remainder alone. Per row one FMA chain per lane in position order, whatever M: the same bits.
template <typename E, int C, int M>
void MixGroup(const Row* rows, const E* v, const int64_t* off, int64_t n_off, bool accumulate, bool prefetch) {
  constexpr int Z = C / 2;
  __m512 acc[M][Z];
  const float* scs[M];
  int64_t common = rows[0].len;
  for (int i = 0; i < M; ++i) {
    const Row& r = rows[i];
    scs[i] = r.sc;
    common = std::min(common, r.len);
#pragma GCC unroll 8
    for (int z = 0; z < Z; ++z) acc[i][z] = accumulate ? _mm512_loadu_ps(r.out + 16 * z) : _mm512_setzero_ps();
  }
  MixRows<E, C, M>(v, off, n_off, 0, common, scs, acc, prefetch);
  for (int i = 0; i < M; ++i) {
    const Row& r = rows[i];
    __m512 one[1][Z];
#pragma GCC unroll 8
    for (int z = 0; z < Z; ++z) one[0][z] = acc[i][z];
    const float* s1[1] = {r.sc};
    MixRows<E, C, 1>(v, off, n_off, common, r.len, s1, one, prefetch && i == 0);
#pragma GCC unroll 8
    for (int z = 0; z < Z; ++z) _mm512_storeu_ps(r.out + 16 * z, one[0][z]);
  }
}

// Rows in groups of up to R (R x Z accumulators in at most 16 zmm); a last group of fewer rows (a
// decode token's 3 query heads of a GQA group: SmolLM2) runs with exactly that many, no idle lanes.
template <typename E, int C>
void MixBlock(const Row* rows, int n, const E* v, const int64_t* off, int64_t n_off, bool accumulate) {
  constexpr int Z = C / 2;
  constexpr int R = Z <= 4 ? 4 : 2;
  for (int i0 = 0; i0 < n; i0 += R) {
    switch (std::min(R, n - i0)) {
      case 4:
        if constexpr (R >= 4) MixGroup<E, C, 4>(rows + i0, v, off, n_off, accumulate, i0 == 0);
        break;
      case 3:
        if constexpr (R >= 3) MixGroup<E, C, 3>(rows + i0, v, off, n_off, accumulate, i0 == 0);
        break;
      case 2:
        MixGroup<E, C, 2>(rows + i0, v, off, n_off, accumulate, i0 == 0);
        break;
      default:
        MixGroup<E, C, 1>(rows + i0, v, off, n_off, accumulate, i0 == 0);
        break;
    }
  }
}

// avx2 GroupAttendRowsC's passes: every query's scores block by block, each row's softmax (this tier's:
// the AVX2 table's bits, as avx2::GroupAttend), then V mixed block by block.
template <typename E, int C>
void GroupAttendRowsC(const float* q, int64_t q_stride, int64_t n_tok, int group, const E* k, const E* v,
                      const int64_t* off, int64_t n_pos0, float scale, float* out, int64_t out_stride, float* sc) {
  constexpr int64_t hd = 8 * C;
  const int64_t n_max = n_pos0 + n_tok;  // scores row stride
  static thread_local std::vector<Row> rows;
  rows.resize((size_t)(n_tok * group));
  auto fill = [&](int64_t p0) {
    int n = 0;
    for (int64_t t = std::max<int64_t>(0, p0 - n_pos0); t < n_tok; ++t) {
      const int64_t len = std::min(kPosBlock, n_pos0 + t + 1 - p0);
      for (int h = 0; h < group; ++h)
        rows[n++] = {q + t * q_stride + h * hd, sc + (t * group + h) * n_max + p0, out + t * out_stride + h * hd, len};
    }
    return n;
  };
  for (int64_t j = 0; j < std::min(n_max, kKvAhead); ++j) PrefetchKvSlice<E, 8 * C>(k + off[j], true);
  for (int64_t p0 = 0; p0 < n_max; p0 += kPosBlock) {
    const int n = fill(p0);  // positions below relative to the block: off + p0, each row's sc + p0
    if (n >= kMinRowsTransposed)
      ScoresBlockT<E, C>(rows.data(), n, k, off + p0, n_max - p0, scale);
    else
      ScoresBlock<E, C>(rows.data(), n, k, v, off + p0, n_max - p0, scale);
  }
  // This tier's softmax: avx2::Softmax's bits (the decode kernel's) on 16 lanes.
  const KernelTable& t5 = Table();
  for (int64_t t = 0; t < n_tok; ++t)
    for (int h = 0; h < group; ++h) t5.softmax(sc + (t * group + h) * n_max, n_pos0 + t + 1);
  for (int64_t j = 0; j < std::min(n_max, kKvAhead); ++j) PrefetchKvSlice<E, 8 * C>(v + off[j], true);
  for (int64_t p0 = 0; p0 < n_max; p0 += kPosBlock) {
    const int n = fill(p0);
    if constexpr (!std::is_same_v<E, float>) {
      // 16-bit V that many rows read: widened (exactly) once into f32 rows, so the mix's FMAs do not share their
      // ports with a conversion per row group; the same products, the same bits.
      if (n >= kMinRowsTransposed) {
        alignas(64) static thread_local float vw_buf[kPosBlock * 128];
        alignas(64) static thread_local int64_t offw_buf[kPosBlock];
        static_assert(8 * C <= 128);
        float* const vw = vw_buf;
        int64_t* const offw = offw_buf;
        const int64_t nb = std::min(kPosBlock, n_max - p0);
        for (int64_t j = 0; j < nb; ++j) {
          offw[j] = j * 8 * C;
#pragma GCC unroll 8
          for (int z = 0; z < C / 2; ++z) _mm512_store_ps(vw + j * 8 * C + 16 * z, Load16(v + off[p0 + j] + 16 * z));
        }
        MixBlock<float, C>(rows.data(), n, vw, offw, nb, p0 > 0);
        continue;
      }
    }
    MixBlock<E, C>(rows.data(), n, v, off + p0, n_max - p0, p0 > 0);
  }
}

}  // namespace

bool GroupAttendRows(const float* q, int64_t q_stride, int64_t n_tok, int group, const void* k, const void* v,
                     DType kv, const int64_t* off, int64_t n_pos0, int head_dim, float scale, float* out,
                     int64_t out_stride, float* scores) {
  return WithKvElem(kv, k, v, [&](const auto* ke, const auto* ve) {
    using E = std::remove_cv_t<std::remove_pointer_t<decltype(ke)>>;
    auto run = [&](auto c) {
      GroupAttendRowsC<E, decltype(c)::value>(q, q_stride, n_tok, group, ke, ve, off, n_pos0, scale, out, out_stride,
                                              scores);
      return true;
    };
    switch (head_dim) {  // even chunk counts from head_dim 32 on (the AVX2 kernel's one-chain mix)
      case 32: return run(std::integral_constant<int, 4>{});
      case 48: return run(std::integral_constant<int, 6>{});
      case 64: return run(std::integral_constant<int, 8>{});
      case 80: return run(std::integral_constant<int, 10>{});
      case 96: return run(std::integral_constant<int, 12>{});
      case 128: return run(std::integral_constant<int, 16>{});
      default:
        return avx2::GroupAttendRows(q, q_stride, n_tok, group, k, v, kv, off, n_pos0, head_dim, scale, out,
                                     out_stride, scores);
    }
  });
}

}  // namespace lathe::kernels::cpu::avx512
