// Flash-style causal grouped-query attention for training: forward with a tiled online softmax
// (saves out and the per-row logsumexp only) and a backward that recomputes scores tile by tile.
// Every tile product (QK^T, PV, dO V^T, P^T dO, dS^T Q, dS K) runs on the tier's GEMM micro-kernel.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_set>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/train_dispatch.h"

namespace lathe::kernels::cpu {

namespace {

constexpr int64_t kQTile = 16 * kGemmTileR;  // 96 query rows per tile
constexpr int64_t kKTile = 128;              // key rows per tile (96 x 128 scores, 48 KiB: L2)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kBackwardRuns = 4;         // runs of key tiles per head in the backward (tasks)

struct Dims {
  int64_t T;
  int n_head, n_kv_head, D;
  int rep() const { return n_head / n_kv_head; }
  int64_t QRow(int64_t t, int h) const { return (t * n_head + h) * D; }
  int64_t KRow(int64_t s, int g) const { return (s * n_kv_head + g) * D; }
};

// Which keys s each query t may see: s <= t, with a sliding window also s > t - window, and with
// segment ids seg[s] == seg[t]. When every id forms one contiguous run (packed samples, the usual
// case) the allowed keys of t are the range [lo[t], t], lo = the later of t's run start and its
// window start, and lo never decreases with t: tiles then test in O(rows) and rows mask by two
// fills. Ids that come back after another id ("scattered") fall back to testing each pair.
class Mask {
 public:
  Mask(const int32_t* seg, int64_t T, int64_t window) : seg_(seg), window_(window) {
    if (!seg && window <= 0) return;
    lo_.resize(T);
    std::unordered_set<int32_t> seen;
    int64_t run = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (seg) {
        const bool cont = t > 0 && seg[t] == seg[t - 1];
        if (!cont) run = t;
        if (!cont && !seen.insert(seg[t]).second) scattered_ = true;
      }
      lo_[t] = std::max(run, WindowLo(t));
    }
  }
  bool Scattered() const { return scattered_; }
  bool Allowed(int64_t s, int64_t t) const {
    return s <= t && s >= WindowLo(t) && (!seg_ || seg_[s] == seg_[t]);
  }
  // Whether any query t in [q0, q1) may attend to any key s in [k0, k1).
  bool TileHasWork(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const {
    if (k0 >= q1) return false;
    if (lo_.empty()) return true;
    for (int64_t t = q0; t < q1; ++t) {
      if (scattered_) {
        for (int64_t s = std::max(k0, WindowLo(t)); s < std::min(k1, t + 1); ++s)
          if (seg_[s] == seg_[t]) return true;
      } else if (std::max(lo_[t], k0) <= std::min(t, k1 - 1)) {
        return true;
      }
    }
    return false;
  }
  // Whether every (t, s) pair of the tile is allowed (no mask work needed); lo only grows with t.
  bool TileFull(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const {
    if (k1 - 1 > q0) return false;
    return lo_.empty() || (!scattered_ && lo_[q1 - 1] <= k0);
  }
  // Keys [lo, hi) of the tile (keys k0 .. k0 + nk - 1) may be allowed for query t, none outside it;
  // when Scattered() some inside may still be disallowed (the caller tests them).
  void Range(bool full, int64_t t, int64_t k0, int64_t nk, int64_t* lo, int64_t* hi) const {
    if (full) {
      *lo = 0, *hi = nk;
      return;
    }
    *hi = std::clamp<int64_t>(t - k0 + 1, 0, nk);
    const int64_t first = lo_.empty() ? 0 : scattered_ ? WindowLo(t) : lo_[t];
    *lo = std::clamp<int64_t>(first - k0, 0, *hi);
  }

 private:
  int64_t WindowLo(int64_t t) const { return window_ > 0 ? t - window_ + 1 : 0; }
  const int32_t* seg_;
  int64_t window_;
  std::vector<int64_t> lo_;  // with segment ids or a window: the first key t may see (contiguous runs)
  bool scattered_ = false;
};

// Per-thread A packing buffer for KeyRowsProduct.
struct GemmScratch {
  std::vector<float> a;
};

inline int64_t RowTiles(int64_t R) { return (R + kGemmTileR - 1) / kGemmTileR; }

// B(L, N) as 16-column strips: element (l, j) at [(j / 16 * L + l) * 16 + j % 16], padding zero.
// kBRowsContiguous: b(l, j) is contiguous in l (a transposed row-major matrix), so pack l-inner.
template <bool kBRowsContiguous, typename FB>
float* PackB(float* out, int64_t L, int64_t N, const FB& b) {
  const int64_t n_strips = (N + kGemmTileC - 1) / kGemmTileC;
  for (int64_t s = 0; s < n_strips; ++s) {
    float* bs = out + s * L * kGemmTileC;
    const int64_t j0 = s * kGemmTileC, nj = std::min<int64_t>(kGemmTileC, N - j0);
    if (kBRowsContiguous) {
      for (int64_t j = 0; j < kGemmTileC; ++j)
        for (int64_t l = 0; l < L; ++l) bs[l * kGemmTileC + j] = j < nj ? b(l, j0 + j) : 0.0f;
    } else {
      for (int64_t l = 0; l < L; ++l) {
        for (int64_t j = 0; j < nj; ++j) bs[l * kGemmTileC + j] = b(l, j0 + j);
        for (int64_t j = nj; j < kGemmTileC; ++j) bs[l * kGemmTileC + j] = 0.0f;
      }
    }
  }
  return out;
}

// Which part of a (query tile q0 + [0, nq), key tile k0 + [0, nk)) pair can be nonzero, so the tile
// GEMMs skip 6 x 16 blocks (and inner runs) that the causal / segment mask zeroes: on the diagonal
// tiles about half the work. Row i may see keys [lo[i], hi[i]) of the tile (none when lo >= hi);
// query row tile rt (6 rows) needs key columns [clo[rt], chi[rt]); key row tile kt (6 keys) is seen by
// query rows [rlo[kt], rhi[kt]) only. Skipping only drops terms that are exact zeros.
struct TileRanges {
  std::vector<int64_t> lo, hi, clo, chi, rlo, rhi;
  bool full = false;
  void Set(const Mask& mask, int64_t q0, int64_t nq, int64_t k0, int64_t nk) {
    full = mask.TileFull(q0, q0 + nq, k0, k0 + nk);
    lo.resize(nq), hi.resize(nq);
    for (int64_t i = 0; i < nq; ++i) {
      mask.Range(full, q0 + i, k0, nk, &lo[i], &hi[i]);
      if (hi[i] <= lo[i]) lo[i] = hi[i] = 0;
    }
    const int64_t n_rt = RowTiles(nq), n_kt = RowTiles(nk);
    clo.assign(n_rt, nk), chi.assign(n_rt, 0);
    for (int64_t i = 0; i < nq; ++i) {
      if (hi[i] <= lo[i]) continue;
      const int64_t rt = i / kGemmTileR;
      clo[rt] = std::min(clo[rt], lo[i]), chi[rt] = std::max(chi[rt], hi[i]);
    }
    for (int64_t rt = 0; rt < n_rt; ++rt) {
      if (chi[rt] <= clo[rt]) clo[rt] = chi[rt] = 0;
      clo[rt] = clo[rt] / kGemmTileC * kGemmTileC;  // B strips start at multiples of 16 (k0 is one)
    }
    // Rows with keys form one run [i0, i1) (causal: rows before the tile see none; segment runs:
    // rows whose run starts after the tile see none), and over it lo and hi never decrease (run
    // starts and t grow with the row). So the rows seeing key row tile [a, b) are those of the run
    // with hi > a (a suffix) and lo < b (a prefix): two pointers.
    rlo.assign(n_kt, 0), rhi.assign(n_kt, 0);
    int64_t i0 = 0, i1 = nq;
    while (i0 < nq && hi[i0] <= lo[i0]) ++i0;
    while (i1 > i0 && hi[i1 - 1] <= lo[i1 - 1]) --i1;
    int64_t pa = i0, pb = i0;
    for (int64_t kt = 0; kt < n_kt; ++kt) {
      const int64_t a = kt * kGemmTileR, b = std::min(nk, a + kGemmTileR);
      while (pa < i1 && hi[pa] <= a) ++pa;
      while (pb < i1 && lo[pb] < b) ++pb;
      if (pb > pa) rlo[kt] = pa, rhi[kt] = pb;
    }
  }
};

// A B operand of the micro-kernels: 16-column strip s starts at p + s * stride, its row l is ldb
// floats further on (a packed strip: ldb 16; a row-major matrix read in place: its row stride, stride 16).
struct BOperand {
  const float* p;
  int64_t ldb, stride;
  BOperand Rows(int64_t l0) const { return {p + l0 * ldb, ldb, stride}; }
  const float* At(int64_t l, int64_t strip) const { return p + strip * stride + l * ldb; }
};

// c(R, N) (+)= A . B with A's rows read in place (row i at a + i * lda). With cols: row tile rt
// writes only the column strips that cover [cols->clo[rt], cols->chi[rt]). With inner: row tile rt
// sums only over [inner->clo[rt], inner->chi[rt]) of L (the rest of A's row is zero there).
void RowsTimesStrips(const TrainKernelTable& tk, float* c, int64_t ldc, int64_t R, int64_t N, int64_t L,
                     const float* a, int64_t lda, const BOperand& b, const TileRanges* cols,
                     const TileRanges* inner, bool overwrite) {
  for (int64_t r0 = 0, rt = 0; r0 < R; r0 += kGemmTileR, ++rt) {
    const int mr = (int)std::min<int64_t>(kGemmTileR, R - r0);
    int64_t j_lo = 0, j_hi = N, l_lo = 0, l_hi = L;
    if (cols) j_lo = cols->clo[rt], j_hi = cols->chi[rt];
    if (inner) l_lo = inner->clo[rt], l_hi = inner->chi[rt];
    if (l_hi <= l_lo) continue;
    if (j_hi <= j_lo) continue;
    // Whole strips from j_lo (a multiple of 16) on, as far as N.
    const int64_t nc = std::min(N - j_lo, (j_hi - j_lo + kGemmTileC - 1) / kGemmTileC * kGemmTileC);
    GemmStripsRows(tk, a + r0 * lda + l_lo, lda, b.At(l_lo, j_lo / kGemmTileC), b.stride, b.ldb, l_hi - l_lo,
                   c + r0 * ldc + j_lo, ldc, mr, nc, overwrite);
  }
}

// c(nk, N) += A^T . B for the key-major products dV += P^T dO and dK += dS^T Q: A (nq x nk, row
// stride ld) read transposed, packed here per 6-key row tile over the query rows that see those
// keys only (r.rlo / r.rhi), 6-float runs of each source row.
void KeyRowsProduct(const TrainKernelTable& tk, GemmScratch& gs, float* c, int64_t ldc, int64_t nk, int64_t N,
                    int64_t nq, const float* at, int64_t ld, const BOperand& b, const TileRanges& r) {
  float* ap = Scratch(gs.a, (size_t)(nq * kGemmTileR));
  for (int64_t rt = 0; rt < RowTiles(nk); ++rt) {
    const int64_t l0 = r.rlo[rt], l1 = r.rhi[rt];
    if (l1 <= l0) continue;
    const int64_t r0 = rt * kGemmTileR;
    const int mr = (int)std::min<int64_t>(kGemmTileR, nk - r0);
    if (mr == kGemmTileR) {
      for (int64_t l = l0; l < l1; ++l)
        std::memcpy(ap + (l - l0) * kGemmTileR, at + l * ld + r0, sizeof(float) * kGemmTileR);
    } else {
      for (int64_t l = l0; l < l1; ++l)
        for (int i = 0; i < kGemmTileR; ++i) ap[(l - l0) * kGemmTileR + i] = i < mr ? at[l * ld + r0 + i] : 0.0f;
    }
    GemmStrips(tk, ap, b.At(l0, 0), b.stride, b.ldb, l1 - l0, c + r0 * ldc, ldc, mr, N);
  }
}

// One call's operands packed once for the whole sequence (T rows) and every head, so no tile
// re-packs them. Per head h (n_head of them) or kv head g, each T x D:
//   cols(x, g):  x^T as B strips (PackB<true>, L = D): a key tile at k0 (a multiple of 16) is at + k0 * D
//                with the usual stride D * 16;
//   strips(x, h): x as B (PackB<false>, L = T): strip c of rows [k0, k0 + n) at + c * T * 16 + k0 * 16,
//                stride T * 16 (StripStride()).
// Q and dO, the A operands, are read in place (rows n_head * D floats apart).
struct SeqPack {
  int64_t T, D;
  int64_t ColsSize() const { return ((T + kGemmTileC - 1) / kGemmTileC) * kGemmTileC * D; }
  int64_t StripsSize() const { return ((D + kGemmTileC - 1) / kGemmTileC) * T * kGemmTileC; }
  int64_t StripStride() const { return T * kGemmTileC; }
};

// x(t, c) = src[(t * n + u) * D + c] of each of n units (heads) as a B operand with rows t: read in
// place when D is a multiple of 16 (the micro-kernels read whole 16-float rows), else packed as
// strips(x, u) (PackSeq below). Unit(u) is unit u's operand.
struct SeqStrips {
  const float* base;
  int64_t unit_stride, ldb, stride;
  BOperand Unit(int64_t u) const { return {base + u * unit_stride, ldb, stride}; }
};

// Packs, for each of n units (heads), x(t, c) = src[(t * n + u) * D + c] * mul into one of the layouts.
enum class Layout { kCols, kStrips };
float* PackSeq(ThreadPool& pool, std::vector<float>& buf, const SeqPack& sp, Layout layout, const float* src,
               int n, float mul) {
  const int64_t T = sp.T, D = sp.D;
  const int64_t per = layout == Layout::kCols ? sp.ColsSize() : sp.StripsSize();
  float* out = Scratch(buf, (size_t)(per * n));
  pool.ParallelFor(n, 1, [&](int64_t ub, int64_t ue, int) {
    for (int64_t u = ub; u < ue; ++u) {
      const float* x = src + u * D;
      const int64_t ld = n * D;
      float* o = out + u * per;
      if (layout == Layout::kCols)
        PackB<true>(o, D, T, [&](int64_t c, int64_t t) { return mul * x[t * ld + c]; });
      else
        PackB<false>(o, T, D, [&](int64_t t, int64_t c) { return mul * x[t * ld + c]; });
    }
  });
  return out;
}

SeqStrips Strips(ThreadPool& pool, std::vector<float>& buf, const SeqPack& sp, const float* src, int n) {
  if (sp.D % kGemmTileC == 0) return {src, sp.D, n * sp.D, kGemmTileC};
  return {PackSeq(pool, buf, sp, Layout::kStrips, src, n, 1.0f), sp.StripsSize(), kGemmTileC, sp.StripStride()};
}

}  // namespace

void FlashAttentionForwardWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* out,
                               float* lse, const float* q, const float* k, const float* v, const int32_t* seg,
                               int64_t T, int n_head, int n_kv_head, int head_dim, float scale, int64_t window) {
  (void)kt;
  LATHE_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0 && head_dim > 0 && window >= 0);
  const Dims d{T, n_head, n_kv_head, head_dim};
  const int D = head_dim;
  const int64_t n_qt = (T + kQTile - 1) / kQTile;
  const Mask mask(seg, T, window);
  // scale * K^T and V packed once per kv head for every query tile; Q rows are read in place.
  const SeqPack sp{T, D};
  static thread_local std::vector<float> kc_buf, vs_buf;
  const float* kc = PackSeq(pool, kc_buf, sp, Layout::kCols, k, n_kv_head, scale);
  const SeqStrips vs = Strips(pool, vs_buf, sp, v, n_kv_head);
  pool.ParallelFor(n_head * n_qt, 1, [&](int64_t tb, int64_t te, int) {
    static thread_local std::vector<float> o_buf, s_buf, m_buf, l_buf;
    static thread_local TileRanges tr;
    float* o = Scratch(o_buf, (size_t)(kQTile * D));
    float* S = Scratch(s_buf, (size_t)(kQTile * kKTile));
    float* m = Scratch(m_buf, (size_t)kQTile);
    float* l = Scratch(l_buf, (size_t)kQTile);
    for (int64_t task = tb; task < te; ++task) {
      // Last query tiles (the most keys) first, so the threads end together; each task's result
      // does not depend on the order.
      const int h = (int)(task % n_head), g = h / d.rep();
      const int64_t q0 = (n_qt - 1 - task / n_head) * kQTile, q1 = std::min(T, q0 + kQTile), nq = q1 - q0;
      std::fill(o, o + nq * D, 0.0f);
      std::fill(m, m + nq, kNegInf);
      std::fill(l, l + nq, 0.0f);
      for (int64_t k0 = 0; k0 < q1; k0 += kKTile) {
        const int64_t k1 = std::min(q1, k0 + kKTile), nk = k1 - k0;
        if (!mask.TileHasWork(q0, q1, k0, k1)) continue;
        tr.Set(mask, q0, nq, k0, nk);
        RowsTimesStrips(tk, S, nk, nq, nk, D, q + d.QRow(q0, h), (int64_t)n_head * D,
                        {kc + g * sp.ColsSize() + k0 * D, kGemmTileC, (int64_t)D * kGemmTileC}, &tr, nullptr,
                        /*overwrite=*/true);
        const bool scattered = mask.Scattered() && !tr.full;
        for (int64_t i = 0; i < nq; ++i) {
          float* row = S + i * nk;
          const int64_t t = q0 + i;
          const int64_t lo = tr.lo[i], hi = tr.hi[i];
          if (scattered)
            for (int64_t j = lo; j < hi; ++j)
              if (!mask.Allowed(k0 + j, t)) row[j] = kNegInf;
          const float tmax = hi > lo ? tk.row_max(row + lo, hi - lo) : kNegInf;
          if (tmax == kNegInf) {  // no key of this tile for this row
            std::fill(row, row + nk, 0.0f);
            continue;
          }
          const float m_new = std::max(m[i], tmax);
          const float corr = std::exp(m[i] - m_new);  // 0 on the row's first tile (m = -inf)
          if (corr != 1.0f) {
            float* oi = o + i * D;
            for (int c = 0; c < D; ++c) oi[c] *= corr;
            l[i] *= corr;
          }
          m[i] = m_new;
          float sum = tk.exp_shift_sum(row + lo, hi - lo, m_new);
          if (scattered) {  // the polynomial exp gives ~1e-38 for -inf, not 0
            sum = 0.0f;
            for (int64_t j = lo; j < hi; ++j) {
              if (!mask.Allowed(k0 + j, t)) row[j] = 0.0f;
              sum += row[j];
            }
          }
          std::fill(row, row + lo, 0.0f);
          std::fill(row + hi, row + nk, 0.0f);
          l[i] += sum;
        }
        // o += P V over each row tile's key range.
        RowsTimesStrips(tk, o, D, nq, D, nk, S, nk, vs.Unit(g).Rows(k0), nullptr, &tr, /*overwrite=*/false);
      }
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t t = q0 + i;
        const float inv = 1.0f / l[i];  // l >= 1: the row's own key is always allowed
        float* ot = out + d.QRow(t, h);
        for (int c = 0; c < D; ++c) ot[c] = o[i * D + c] * inv;
        lse[t * n_head + h] = m[i] + std::log(l[i]);
      }
    }
  });
}

// One pass per (run of key tiles, query head) task: no two tasks write the same dQ rows (run 0 writes
// dq, later runs their own partials, added in run order), and each head's dK / dV goes to its own
// rows, summed over the group's heads in a fixed order at the end, so the result does not depend on
// the number of threads. Per key tile (outer) and query tile: S = scale Q K^T
// and dP = dO V^T once, P = exp(S - lse), dS = P (dP - delta) scale, then dV += P^T dO,
// dK += dS^T Q and dQ += dS K.
void FlashAttentionBackwardWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dq,
                                float* dk, float* dv, const float* dout, const float* q, const float* k,
                                const float* v, const float* out, const float* lse, const int32_t* seg, int64_t T,
                                int n_head, int n_kv_head, int head_dim, float scale, int64_t window) {
  LATHE_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0 && head_dim > 0 && window >= 0);
  const Dims d{T, n_head, n_kv_head, head_dim};
  const int D = head_dim;
  const int rep = d.rep();
  const int64_t ldq = (int64_t)n_head * D;
  // delta[t, h] = dout . out = sum_s p_s (dout . v_s), the softmax-backward row term.
  static thread_local std::vector<float> delta_buf;
  float* delta = Scratch(delta_buf, (size_t)(T * n_head));
  pool.ParallelFor(T * n_head, 64, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) delta[r] = kt.dot(dout + r * D, out + r * D, D);
  });
  // Packed once for the whole sequence (SeqPack): scale * K^T and V^T as column strips for
  // S = Q (scale K)^T and dP = dO V^T (Q, dO read in place as A); K, Q, dO are the B operands of
  // dQ += dS K, dK += dS^T Q and dV += P^T dO (in place unless D % 16 != 0, see Strips).
  const Mask mask(seg, T, window);
  const SeqPack sp{T, D};
  static thread_local std::vector<float> kc_buf, vc_buf, ks_buf, qs_buf, dos_buf, dkp_buf, dvp_buf;
  const float* kc = PackSeq(pool, kc_buf, sp, Layout::kCols, k, n_kv_head, scale);
  const float* vc = PackSeq(pool, vc_buf, sp, Layout::kCols, v, n_kv_head, 1.0f);
  const SeqStrips ks = Strips(pool, ks_buf, sp, k, n_kv_head);
  const SeqStrips qs = Strips(pool, qs_buf, sp, q, n_head);
  const SeqStrips dos = Strips(pool, dos_buf, sp, dout, n_head);
  // With grouped heads each head's dK / dV (T x D) goes to its own buffer, summed per group below;
  // with one head per group straight into dk / dv.
  float* dkp = rep > 1 ? Scratch(dkp_buf, (size_t)(n_head * T * D)) : nullptr;
  float* dvp = rep > 1 ? Scratch(dvp_buf, (size_t)(n_head * T * D)) : nullptr;
  const int64_t n_kt = (T + kKTile - 1) / kKTile;
  // Tasks are (run of key tiles, head): the key tiles split into n_parts runs of about equal causal
  // work, so 9 heads still spread evenly over the threads. The split depends on T only (never on the
  // threads): run 0 adds its dQ straight into dq, run p > 0 into its own partial rows (from its first
  // query tile on), which are added to dq in run order at the end.
  const int64_t n_parts = std::min<int64_t>(n_kt, kBackwardRuns);
  std::vector<int64_t> run_begin(n_parts + 1, n_kt);
  {
    auto work = [&](int64_t kt_i) {
      const int64_t k0 = kt_i * kKTile, nk = std::min(kKTile, T - k0);
      return (double)(T - k0 - nk / 2) * nk;
    };
    double total = 0, cum = 0;
    for (int64_t kt_i = 0; kt_i < n_kt; ++kt_i) total += work(kt_i);
    run_begin[0] = 0;
    int64_t p = 1;
    for (int64_t kt_i = 0; kt_i < n_kt && p < n_parts; ++kt_i) {
      cum += work(kt_i);
      if (cum >= total * (double)p / (double)n_parts || n_kt - (kt_i + 1) == n_parts - p) run_begin[p++] = kt_i + 1;
    }
  }
  auto run_q0 = [&](int64_t p) { return std::min(T, run_begin[p] * kKTile / kQTile * kQTile); };
  static thread_local std::vector<float> dqp_buf;
  float* dqp = n_parts > 1 ? Scratch(dqp_buf, (size_t)((n_parts - 1) * n_head * T * D)) : nullptr;
  pool.ParallelFor(n_parts * n_head, 1, [&](int64_t tb, int64_t te, int) {
    static thread_local std::vector<float> dk_buf, dv_buf, p_buf, ds_buf;
    static thread_local GemmScratch gs;
    static thread_local TileRanges tr;
    float* dkt = Scratch(dk_buf, (size_t)(kKTile * D));
    float* dvt = Scratch(dv_buf, (size_t)(kKTile * D));
    float* P = Scratch(p_buf, (size_t)(kQTile * kKTile));
    float* dS = Scratch(ds_buf, (size_t)(kQTile * kKTile));
    for (int64_t task = tb; task < te; ++task) {
      const int64_t part = task / n_head, h = task % n_head;
      const int g = (int)h / rep;
      // This run's dQ rows: dq itself (run 0, every row zeroed) or its partial rows from run_q0 on.
      float* dqh = part == 0 ? dq + h * D : dqp + ((part - 1) * n_head + h) * T * D;
      const int64_t ld_dq = part == 0 ? ldq : D;
      for (int64_t t = part == 0 ? 0 : run_q0(part); t < T; ++t) std::memset(dqh + t * ld_dq, 0, sizeof(float) * D);
      const float* qh = q + h * D;
      const float* doh = dout + h * D;
      const float* kcg = kc + g * sp.ColsSize();
      const float* vcg = vc + g * sp.ColsSize();
      for (int64_t kt_i = run_begin[part]; kt_i < run_begin[part + 1]; ++kt_i) {
        const int64_t k0 = kt_i * kKTile, k1 = std::min(T, k0 + kKTile), nk = k1 - k0;
        std::fill(dkt, dkt + nk * D, 0.0f);
        std::fill(dvt, dvt + nk * D, 0.0f);
        for (int64_t q0 = k0 / kQTile * kQTile; q0 < T; q0 += kQTile) {
          const int64_t q1 = std::min(T, q0 + kQTile), nq = q1 - q0;
          if (!mask.TileHasWork(q0, q1, k0, k1)) continue;
          tr.Set(mask, q0, nq, k0, nk);
          RowsTimesStrips(tk, P, nk, nq, nk, D, qh + q0 * ldq, ldq, {kcg + k0 * D, kGemmTileC, D * kGemmTileC}, &tr,
                          nullptr, /*overwrite=*/true);
          RowsTimesStrips(tk, dS, nk, nq, nk, D, doh + q0 * ldq, ldq, {vcg + k0 * D, kGemmTileC, D * kGemmTileC}, &tr,
                          nullptr, /*overwrite=*/true);
          const bool scattered = mask.Scattered() && !tr.full;
          for (int64_t i = 0; i < nq; ++i) {
            float* row = P + i * nk;
            float* ds = dS + i * nk;
            const int64_t t = q0 + i;
            const int64_t lo = tr.lo[i], hi = tr.hi[i];
            if (hi > lo) tk.exp_shift_scale(row + lo, hi - lo, lse[t * n_head + h], 1.0f);
            if (scattered)
              for (int64_t j = lo; j < hi; ++j)
                if (!mask.Allowed(k0 + j, t)) row[j] = 0.0f;
            if (hi > lo) tk.softmax_grad(ds + lo, row + lo, hi - lo, delta[t * n_head + h], scale);
            std::fill(row, row + lo, 0.0f);
            std::fill(ds, ds + lo, 0.0f);
            std::fill(row + hi, row + nk, 0.0f);
            std::fill(ds + hi, ds + nk, 0.0f);
          }
          // dV += P^T dO, dK += dS^T Q, dQ += dS K.
          KeyRowsProduct(tk, gs, dvt, D, nk, D, nq, P, nk, dos.Unit(h).Rows(q0), tr);
          KeyRowsProduct(tk, gs, dkt, D, nk, D, nq, dS, nk, qs.Unit(h).Rows(q0), tr);
          RowsTimesStrips(tk, dqh + q0 * ld_dq, ld_dq, nq, D, nk, dS, nk, ks.Unit(g).Rows(k0), nullptr, &tr,
                          /*overwrite=*/false);
        }
        for (int64_t s = k0; s < k1; ++s) {
          float* dk_dst = rep > 1 ? dkp + (h * T + s) * D : dk + d.KRow(s, g);
          float* dv_dst = rep > 1 ? dvp + (h * T + s) * D : dv + d.KRow(s, g);
          std::memcpy(dk_dst, dkt + (s - k0) * D, sizeof(float) * D);
          std::memcpy(dv_dst, dvt + (s - k0) * D, sizeof(float) * D);
        }
      }
    }
  });
  if (n_parts > 1) {
    pool.ParallelFor(T * n_head, 64, [&](int64_t b, int64_t e, int) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t t = r / n_head, h = r % n_head;
        float* dqr = dq + r * D;
        for (int64_t p = 1; p < n_parts; ++p) {
          if (t < run_q0(p)) continue;
          const float* src = dqp + ((p - 1) * n_head + h) * T * D + t * D;
          for (int c = 0; c < D; ++c) dqr[c] += src[c];
        }
      }
    });
  }
  if (rep == 1) return;
  // dK / dV of each kv head: its query heads' parts summed in head order.
  pool.ParallelFor(T * n_kv_head, 64, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t s = r / n_kv_head;
      const int g = (int)(r % n_kv_head);
      float* dkr = dk + d.KRow(s, g);
      float* dvr = dv + d.KRow(s, g);
      const int64_t h0 = (int64_t)g * rep;
      for (int c = 0; c < D; ++c) dkr[c] = dkp[(h0 * T + s) * D + c], dvr[c] = dvp[(h0 * T + s) * D + c];
      for (int64_t h = h0 + 1; h < h0 + rep; ++h) {
        const float* dkh = dkp + (h * T + s) * D;
        const float* dvh = dvp + (h * T + s) * D;
        for (int c = 0; c < D; ++c) dkr[c] += dkh[c], dvr[c] += dvh[c];
      }
    }
  });
}

}  // namespace lathe::kernels::cpu
