// Training attention in bf16 mixed precision on vdpbf16ps (avx512_bf16; AMX tiles where UsesAmxBf16), as autocast runs SDPA on bf16
// q / k / v: the drivers of train_attention_driver.h (mask, tile ranges, online softmax and its backward
// in f32) over products whose operands are rounded to bf16 and multiplied in pairs with f32 sums: Q, K, V
// and dO as packed once per call, the probabilities P and the score gradient dS per tile. Scores are
// scaled in f32 after the product (S = scale * (Q . K)), not folded into K's rounding.
//
// Layouts (pairs and pair strips as bf16_pairs.h; Dp = (D + 1) / 2, Tp = (T + 1) / 2):
//   qp / dop: Q / dO rows as pairs along D (row t * H + h);                     A of Scores / DoVt
//   kt / vt:  per kv head, K / V as strips of 16 keys with pairs along D;        B of Scores / DoVt
//   vs / ks:  per kv head, V / K as strips of 16 of D with pairs along the keys; B of AddPV / AddDsK
//   qT / doT: per head, Q^T / dO^T: rows d, pairs along the queries;            A of AddDsTQ / AddPtDo
// The key-major gradients are formed transposed: a key tile's dV^T (D x kKTile) += dO^T P and
// dK^T += Q^T dS, with P and dS converted to strips of 16 keys paired along the tile's queries, so no
// tile is transposed before its product.
//
#include "core/cpu.h"
#include "kernels/cpu/avx512_transpose.h"
#include "kernels/cpu/avx512_util.h"
#include "kernels/cpu/bf16_amx.h"
#include "kernels/cpu/bf16_pairs.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/train_attention_driver.h"

namespace lathe::kernels::cpu::avx512bf16 {

namespace {

constexpr int kStripsPerTile = 3;  // the register tile's width in 16-column strips (bf16_pairs.h's kS)

// c(mr, nc) (= or +=) A . B: mr <= kR rows of A (np pairs each, lda apart), B's strips sstride apart,
// in register tiles of up to 3 strips; never a lone 1-strip tile after others (4 strips: 2 + 2, 7: 3 + 2 +
// 2), which would broadcast A's pairs for 8 products each.
// Where Bf16PairsOnFma, A's rows are widened once (WidenPairs) and the tiles take the FMA form (TileFmaFor):
// the same bits.
// Where UsesAmxBf16, the product runs on AMX tiles instead (bf16_amx.h: AMX's arithmetic, mr of a tile's 16 rows).
void MulTile(const uint32_t* a, int64_t lda, const uint32_t* b, int64_t sstride, int64_t np, float* c, int64_t ldc,
             int mr, int64_t nc, bool store) {
  const int64_t n_strips = (nc + 15) / 16;
  if (UsesAmxBf16()) return amx::PairGemmBlock(c, ldc, 0, mr, 0, n_strips, nc, np, a, lda, b, sstride, !store);
  const bool fma = Bf16PairsOnFma();
  float* af = nullptr;
  if (fma) {
    static thread_local std::vector<float> wide;
    af = Scratch(wide, (size_t)(mr * 2 * np));
    WidenPairs(a, lda, mr, np, af, 2 * np);
  }
  for (int64_t s0 = 0; s0 < n_strips;) {
    const int64_t left = n_strips - s0;
    const int ns = left == 4 ? 2 : (int)std::min<int64_t>(kStripsPerTile, left);
    const int64_t j0 = 16 * s0, ncg = std::min<int64_t>(16 * ns, nc - j0);
    const int nc_last = (int)(ncg - 16 * (ns - 1));
    if (fma) {
      TileFmaFor(mr, ns)(af, 2 * np, b + s0 * sstride, sstride, np, c + j0, ldc, store, nc_last);
    } else {
      TileFor(mr, ns)(a, lda, b + s0 * sstride, sstride, np, c + j0, ldc, store, nc_last);
    }
    s0 += ns;
  }
}

// rows (nr x n floats, ld apart) -> row-major pairs, (n + 1) / 2 per row (a zero after an odd n).
void TilePairRows(const float* m, int64_t ld, int64_t nr, int64_t n, uint32_t* out) {
  const int64_t np = (n + 1) / 2;
  for (int64_t i = 0; i < nr; ++i) RowToPairs(m + i * ld, n, (uint16_t*)(out + i * np));
}

// B(l, j) = m[l * ld + j] (nr rows of n) -> strips of 16 columns paired along the rows: strip s's pair p
// at out + (s * (nr + 1) / 2 + p) * 16; padding rows and columns zero.
void TilePairStrips(const float* m, int64_t ld, int64_t nr, int64_t n, uint32_t* out) {
  const int64_t np = (nr + 1) / 2, n_strips = (n + 15) / 16;
  for (int64_t p = 0; p < np; ++p) {
    const float* r0 = m + 2 * p * ld;
    const float* r1 = 2 * p + 1 < nr ? r0 + ld : nullptr;
    for (int64_t s = 0; s < n_strips; ++s) {
      const int64_t j = 16 * s;
      const __mmask16 mk = (__mmask16)(n - j >= 16 ? 0xffff : (1u << (n - j)) - 1);
      const __m256i lo = Bf16Of(_mm512_maskz_loadu_ps(mk, r0 + j));
      const __m256i hi = r1 ? Bf16Of(_mm512_maskz_loadu_ps(mk, r1 + j)) : _mm256_setzero_si256();
      const __m512i d = _mm512_or_si512(_mm512_cvtepu16_epi32(lo), _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
      _mm512_storeu_si512(out + (s * np + p) * 16, d);
    }
  }
}

// The softmax's row helpers on 16 lanes with masked tails (TrainKernelTable's contracts; the f32 tiers keep
// theirs, whose bits the AVX2 and AVX-512 tables share): the polynomial exp of avx512_util.h throughout.
float RowMax(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = avx512::Mask16(std::min<int64_t>(16, n - i));
    m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, x + i));
  }
  return _mm512_reduce_max_ps(m);
}

float ExpShiftSum(float* x, int64_t n, float shift) {
  const __m512 sh = _mm512_set1_ps(shift);
  __m512 s = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = avx512::Mask16(std::min<int64_t>(16, n - i));
    const __m512 e = avx512::ExpPs(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), sh));
    _mm512_mask_storeu_ps(x + i, k, e);
    s = _mm512_mask_add_ps(s, k, s, e);
  }
  return _mm512_reduce_add_ps(s);
}

void ExpShiftScale(float* x, int64_t n, float shift, float scale) {
  const __m512 sh = _mm512_set1_ps(shift), sc = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = avx512::Mask16(std::min<int64_t>(16, n - i));
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(avx512::ExpPs(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), sh)), sc));
  }
}

void SoftmaxGrad(float* ds, const float* p, int64_t n, float delta, float scale) {
  const __m512 dl = _mm512_set1_ps(delta), sc = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = avx512::Mask16(std::min<int64_t>(16, n - i));
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + i), _mm512_sub_ps(_mm512_maskz_loadu_ps(k, ds + i), dl));
    _mm512_mask_storeu_ps(ds + i, k, _mm512_mul_ps(v, sc));
  }
}

// tk with the row helpers above.
const TrainKernelTable& WithRowHelpers(const TrainKernelTable& tk) {
  static thread_local const TrainKernelTable* from = nullptr;
  static thread_local TrainKernelTable t;
  if (from != &tk) {
    t = tk;
    t.row_max = RowMax, t.exp_shift_sum = ExpShiftSum, t.exp_shift_scale = ExpShiftScale, t.softmax_grad = SoftmaxGrad;
    from = &tk;
  }
  return t;
}

uint32_t* TileBuf(std::vector<uint32_t>& buf) { return Scratch(buf, (size_t)(kKTile * ((kQTile + 1) / 2 + 16))); }

// The forward tile's P as row-major pairs along the keys (AddPV's A), the calling thread's: each task forms a
// tile's rows and then runs AddPV on one thread.
uint32_t* ThreadPRows() {
  static thread_local std::vector<uint32_t> buf;
  return TileBuf(buf);
}

// Lanes [lo - j, hi - j) of a 16-key chunk starting at key j, clamped to the chunk.
inline __mmask16 RangeMask(int64_t lo, int64_t hi, int64_t j) {
  const int64_t a = std::clamp<int64_t>(lo - j, 0, 16), b = std::clamp<int64_t>(hi - j, 0, 16);
  return b > a ? (__mmask16)((((uint32_t)1 << b) - 1) & ~(((uint32_t)1 << a) - 1)) : (__mmask16)0;
}

// kRows: the query rows of one product (TileRanges' row granularity): the pair tiles' 8, or 32 on AMX tiles
// (two of their row tiles, so each small product keeps them busy longer per configuration and C load).
template <int64_t kRows>
struct Bf16AttentionT {
  static constexpr int64_t kRowTile = kRows;
  static constexpr int64_t kKeyTile = 16;
  int64_t RowTile() const { return kRowTile; }
  int64_t KeyTile() const { return kKeyTile; }
  Dims d;
  float scale;
  int64_t Dp, Tp;
  const uint32_t *qp = nullptr, *dop = nullptr, *kt = nullptr, *vt = nullptr, *vs = nullptr, *ks = nullptr,
                 *qT = nullptr, *doT = nullptr;

  Bf16AttentionT(const Dims& d_, float scale_) : d(d_), scale(scale_), Dp((d_.D + 1) / 2), Tp((d_.T + 1) / 2) {}
  int64_t KeyStrips() const { return (d.T + 15) / 16; }
  int64_t ColStripsDwords() const { return KeyStrips() * Dp * 16; }       // kt / vt per kv head
  int64_t RowStripsDwords() const { return (d.D + 15) / 16 * Tp * 16; }   // vs / ks per kv head
  int64_t TransposedDwords() const { return d.D * Tp; }                   // qT / doT per head

  // Q (or dO) rows times K^T (or V^T) strips over each row tile's columns [clo, chi).
  void RowsTimesKeyStrips(float* S, const uint32_t* ap, const uint32_t* bt, int h, int g, int64_t q0, int64_t nq,
                          int64_t k0, int64_t nk, const TileRanges& tr, bool scaled) const {
    const int64_t lda = (int64_t)d.n_head * Dp;
    const uint32_t* btg = bt + g * ColStripsDwords();
    for (int64_t r0 = 0, rt = 0; r0 < nq; r0 += kRows, ++rt) {
      const int64_t j_lo = tr.clo[rt], j_hi = tr.chi[rt];
      if (j_hi <= j_lo) continue;
      const int mr = (int)std::min<int64_t>(kRows, nq - r0);
      const int64_t nc = std::min(nk - j_lo, (j_hi - j_lo + 15) / 16 * 16);
      float* c = S + r0 * nk + j_lo;
      MulTile(ap + ((q0 + r0) * d.n_head + h) * Dp, lda, btg + (k0 + j_lo) / 16 * Dp * 16, Dp * 16, Dp, c, nk, mr,
              nc, /*store=*/true);
      if (scaled) {
        const __m512 sc = _mm512_set1_ps(scale);
        for (int i = 0; i < mr; ++i)
          for (int64_t j = 0; j < nc; j += 16) {
            const __mmask16 k = avx512::Mask16(std::min<int64_t>(16, nc - j));
            _mm512_mask_storeu_ps(c + i * nk + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, c + i * nk + j), sc));
          }
      }
    }
  }
  // o (nq x D, ldo) += M . X over each row tile's keys, M (nq x nk) as pairs, X's strips along the keys.
  void RowsTimesRowStrips(float* o, int64_t ldo, const uint32_t* xs, int g, int64_t nq, int64_t k0, int64_t nk,
                          const float* m, const TileRanges& tr) const {
    static thread_local std::vector<uint32_t> buf;
    uint32_t* mp = TileBuf(buf);
    TilePairRows(m, nk, nq, nk, mp);
    RowPairsTimesRowStrips(o, ldo, xs, g, nq, k0, nk, mp, tr);
  }
  // The same with M already as pairs ((nk + 1) / 2 per row).
  void RowPairsTimesRowStrips(float* o, int64_t ldo, const uint32_t* xs, int g, int64_t nq, int64_t k0, int64_t nk,
                              const uint32_t* mp, const TileRanges& tr) const {
    const int64_t nkp = (nk + 1) / 2;
    const uint32_t* xg = xs + g * RowStripsDwords();
    for (int64_t r0 = 0, rt = 0; r0 < nq; r0 += kRows, ++rt) {
      const int64_t pl = tr.clo[rt] / 2, ph = (tr.chi[rt] + 1) / 2;
      if (ph <= pl) continue;
      MulTile(mp + r0 * nkp + pl, nkp, xg + (k0 / 2 + pl) * 16, Tp * 16, ph - pl, o + r0 * ldo, ldo,
              (int)std::min<int64_t>(kRows, nq - r0), d.D, /*store=*/false);
    }
  }
  // A key tile's (D x kKTile) Y^T += X^T . M, M (nq x nk) as strips of 16 keys paired along the queries,
  // X^T (per head, rows d, pairs along all T queries); per group of strips over the queries that see them.
  void TransposedTimesStrips(float* yt, const uint32_t* xT, int h, int64_t q0, int64_t nq, int64_t nk,
                             const float* m, const TileRanges& tr) const {
    static thread_local std::vector<uint32_t> buf;
    uint32_t* ms = TileBuf(buf);
    const int64_t nqp = (nq + 1) / 2;
    TilePairStrips(m, nk, nq, nk, ms);
    const uint32_t* xh = xT + h * TransposedDwords();
    const int64_t n_strips = (nk + 15) / 16;
    for (int64_t s0 = 0; s0 < n_strips; s0 += kStripsPerTile) {
      const int64_t s1 = std::min(n_strips, s0 + kStripsPerTile);
      int64_t lo = nq, hi = 0;
      for (int64_t s = s0; s < s1; ++s)
        if (tr.rhi[s] > tr.rlo[s]) lo = std::min(lo, tr.rlo[s]), hi = std::max(hi, tr.rhi[s]);
      if (hi <= lo) continue;
      const int64_t pl = lo / 2, ph = (hi + 1) / 2;
      const int64_t nc = std::min<int64_t>(nk, 16 * s1) - 16 * s0;
      for (int64_t r0 = 0; r0 < d.D; r0 += kRows)
        MulTile(xh + r0 * Tp + q0 / 2 + pl, Tp, ms + (s0 * nqp + pl) * 16, nqp * 16, ph - pl, yt + r0 * kKTile + 16 * s0,
                kKTile, (int)std::min<int64_t>(kRows, d.D - r0), nc, /*store=*/false);
    }
  }

  void Scores(float* S, int h, int g, int64_t q0, int64_t nq, int64_t k0, int64_t nk, const TileRanges& tr) const {
    RowsTimesKeyStrips(S, qp, kt, h, g, q0, nq, k0, nk, tr, /*scaled=*/true);
  }
  // P as ExpRowPacked / PackRow left it.
  static constexpr bool kPacksSoftmax = true;
  void AddPV(float* o, int g, int64_t, int64_t nq, int64_t k0, int64_t nk, const float*, const TileRanges& tr) const {
    RowPairsTimesRowStrips(o, d.D, vs, g, nq, k0, nk, ThreadPRows(), tr);
  }
  // Row i of the forward tile's P as pairs: exp(row - shift) over keys [lo, hi) (the row helpers' exp), zero
  // elsewhere, 32 keys (16 pairs) a step, never written back as f32; returns the sum of the f32 exps.
  float ExpRowPacked(const float* row, int64_t i, int64_t lo, int64_t hi, int64_t nk, float shift) const {
    const int64_t nkp = (nk + 1) / 2;
    uint32_t* out = ThreadPRows() + i * nkp;
    const __m512 sh = _mm512_set1_ps(shift);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < nk; j += 32) {
      const __mmask16 ma = RangeMask(lo, hi, j), mb = RangeMask(lo, hi, j + 16);
      __m512 ea = _mm512_setzero_ps(), eb = _mm512_setzero_ps();
      if (ma) ea = _mm512_maskz_mov_ps(ma, avx512::ExpPs(_mm512_sub_ps(_mm512_maskz_loadu_ps(ma, row + j), sh)));
      if (mb) eb = _mm512_maskz_mov_ps(mb, avx512::ExpPs(_mm512_sub_ps(_mm512_maskz_loadu_ps(mb, row + j + 16), sh)));
      sum = _mm512_add_ps(sum, _mm512_add_ps(ea, eb));
      const int64_t np = std::min<int64_t>(16, nkp - j / 2);  // the pad after an odd nk: eb's lane 0, zero
      _mm512_mask_storeu_epi32(out + j / 2, avx512::MaskUpTo16(np),
                               (__m512i)_mm512_cvtne2ps_pbh(eb, ea));
    }
    return _mm512_reduce_add_ps(sum);
  }
  // A row the driver formed (no keys in this tile, or a scattered mask) into the same pairs.
  void PackRow(const float* row, int64_t i, int64_t nk) const {
    RowToPairs(row, nk, (uint16_t*)(ThreadPRows() + i * ((nk + 1) / 2)));
  }
  void DoVt(float* dP, int h, int g, int64_t q0, int64_t nq, int64_t k0, int64_t nk, const TileRanges& tr) const {
    RowsTimesKeyStrips(dP, dop, vt, h, g, q0, nq, k0, nk, tr, /*scaled=*/false);
  }
  void AddPtDo(float* dvt, int h, int64_t q0, int64_t nq, int64_t nk, const float* P, const TileRanges& tr) const {
    TransposedTimesStrips(dvt, doT, h, q0, nq, nk, P, tr);
  }
  void AddDsTQ(float* dkt, int h, int64_t q0, int64_t nq, int64_t nk, const float* dS, const TileRanges& tr) const {
    TransposedTimesStrips(dkt, qT, h, q0, nq, nk, dS, tr);
  }
  void AddDsK(float* dq, int64_t ld_dq, int g, int64_t, int64_t nq, int64_t k0, int64_t nk, const float* dS,
              const TileRanges& tr) const {
    RowsTimesRowStrips(dq, ld_dq, ks, g, nq, k0, nk, dS, tr);
  }
  // The tile is D x kKTile (key i of row c at c * kKTile + i): 16 x 16 blocks transposed in registers.
  void KeyRows(const float* tile, int64_t n, float* dst, int64_t ld) const {
    TransposeF32(tile, d.D, n, kKTile, dst, ld);
  }
};

// The packs, each into its own per-thread buffer of the calling thread.
template <typename A>
const uint32_t* RowPairs(ThreadPool& pool, std::vector<uint32_t>& buf, const A& a, const float* x) {
  uint32_t* out = Scratch(buf, (size_t)(a.d.T * a.d.n_head * a.Dp));
  PairRows(pool, x, a.d.D, a.d.T * a.d.n_head, a.d.D, out);
  return out;
}
template <typename A>
const uint32_t* KeyStrips(ThreadPool& pool, std::vector<uint32_t>& buf, const A& a, const float* x) {
  const int64_t per = a.ColStripsDwords(), ld = (int64_t)a.d.n_kv_head * a.d.D;
  uint32_t* out = Scratch(buf, (size_t)(per * a.d.n_kv_head));
  for (int g = 0; g < a.d.n_kv_head; ++g) PairStripsT<float>(pool, x + g * a.d.D, ld, a.d.T, a.d.D, out + g * per);
  return out;
}
template <typename A>
const uint32_t* SeqStrips(ThreadPool& pool, std::vector<uint32_t>& buf, const A& a, const float* x) {
  const int64_t per = a.RowStripsDwords(), ld = (int64_t)a.d.n_kv_head * a.d.D;
  uint32_t* out = Scratch(buf, (size_t)(per * a.d.n_kv_head));
  for (int g = 0; g < a.d.n_kv_head; ++g) PairStripsRows<float>(pool, x + g * a.d.D, ld, a.d.T, a.d.D, out + g * per);
  return out;
}
template <typename A>
const uint32_t* Transposed(ThreadPool& pool, std::vector<uint32_t>& buf, const A& a, const float* x) {
  const int64_t per = a.TransposedDwords(), ld = (int64_t)a.d.n_head * a.d.D;
  uint32_t* out = Scratch(buf, (size_t)(per * a.d.n_head));
  for (int h = 0; h < a.d.n_head; ++h) PairRowsT(pool, x + h * a.d.D, ld, a.d.T, a.d.D, out + h * per);
  return out;
}

// delta[t, h] = bf16(dout) . out: the dO the products take (dop, as pairs), so the score gradients of a row
// sum to zero as the softmax's do; f32 sums, 16 lanes then reduced.
template <typename A>
const float* RoundedDelta(ThreadPool& pool, const A& a, const uint32_t* dop, const float* out) {
  static thread_local std::vector<float> buf;
  const int64_t R = a.d.T * a.d.n_head, D = a.d.D, Dp = a.Dp;
  float* delta = Scratch(buf, (size_t)R);
  pool.ParallelFor(R, 64, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      const uint16_t* x = (const uint16_t*)(dop + r * Dp);
      const float* o = out + r * D;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t c = 0; c < D; c += 16) {
        const __mmask16 m = (__mmask16)(D - c >= 16 ? 0xffff : (1u << (D - c)) - 1);
        const __m512 xv = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x + c)), 16));
        acc = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(m, o + c), acc);
      }
      delta[r] = _mm512_reduce_add_ps(acc);
    }
  });
  return delta;
}

template <typename Ops>
void Forward(const TrainKernelTable& tk, ThreadPool& pool, float* out, float* lse, const float* q, const float* k,
             const float* v, const int32_t* seg, int64_t T, int n_head, int n_kv_head, int head_dim, float scale,
             int64_t window) {
  Ops ops(Dims{T, n_head, n_kv_head, head_dim}, scale);
  static thread_local std::vector<uint32_t> qp_buf, kt_buf, vs_buf;
  ops.qp = RowPairs(pool, qp_buf, ops, q);
  ops.kt = KeyStrips(pool, kt_buf, ops, k);
  ops.vs = SeqStrips(pool, vs_buf, ops, v);
  AttentionForward(WithRowHelpers(tk), pool, ops, out, lse, seg, T, n_head, n_kv_head, head_dim, window);
}

template <typename Ops>
void Backward(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dq, float* dk, float* dv,
              const float* dout, const float* q, const float* k, const float* v, const float* out, const float* lse,
              const int32_t* seg, int64_t T, int n_head, int n_kv_head, int head_dim, float scale, int64_t window) {
  Ops ops(Dims{T, n_head, n_kv_head, head_dim}, scale);
  static thread_local std::vector<uint32_t> qp_buf, dop_buf, kt_buf, vt_buf, ks_buf, qT_buf, doT_buf;
  ops.qp = RowPairs(pool, qp_buf, ops, q);
  ops.dop = RowPairs(pool, dop_buf, ops, dout);
  const float* delta = RoundedDelta(pool, ops, ops.dop, out);
  ops.kt = KeyStrips(pool, kt_buf, ops, k);
  ops.vt = KeyStrips(pool, vt_buf, ops, v);
  ops.ks = SeqStrips(pool, ks_buf, ops, k);
  ops.qT = Transposed(pool, qT_buf, ops, q);
  ops.doT = Transposed(pool, doT_buf, ops, dout);
  AttentionBackward(WithRowHelpers(tk), kt, pool, ops, delta, dq, dk, dv, lse, seg, T, n_head, n_kv_head, head_dim, scale, window);
}

using PairAttention = Bf16AttentionT<kR>;
using AmxAttention = Bf16AttentionT<32>;

}  // namespace

void FlashAttentionForward(const TrainKernelTable& tk, ThreadPool& pool, float* out, float* lse, const float* q,
                           const float* k, const float* v, const int32_t* seg, int64_t T, int n_head, int n_kv_head,
                           int head_dim, float scale, int64_t window) {
  LATHE_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0 && head_dim > 0 && window >= 0);
  (UsesAmxBf16() ? Forward<AmxAttention> : Forward<PairAttention>)(tk, pool, out, lse, q, k, v, seg, T, n_head,
                                                                    n_kv_head, head_dim, scale, window);
}

void FlashAttentionBackward(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dq, float* dk,
                            float* dv, const float* dout, const float* q, const float* k, const float* v,
                            const float* out, const float* lse, const int32_t* seg, int64_t T, int n_head,
                            int n_kv_head, int head_dim, float scale, int64_t window) {
  LATHE_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0 && head_dim > 0 && window >= 0);
  (UsesAmxBf16() ? Backward<AmxAttention> : Backward<PairAttention>)(tk, kt, pool, dq, dk, dv, dout, q, k, v, out, lse,
                                                                     seg, T, n_head, n_kv_head, head_dim, scale, window);
}

int64_t FlashAttentionPairsBytes(int64_t T, int n_head, int n_kv_head, int head_dim) {
  const PairAttention a(Dims{T, n_head, n_kv_head, head_dim}, 1.0f);
  // Backward: qp, dop, qT, doT per query head; kt, vt, ks per kv head (the forward's are fewer).
  return 4 * (2 * T * n_head * a.Dp + 2 * n_head * a.TransposedDwords() +
              n_kv_head * (2 * a.ColStripsDwords() + a.RowStripsDwords()));
}

}  // namespace lathe::kernels::cpu::avx512bf16
