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

struct Dims {
  int64_t T;
  int n_head, n_kv_head, D;
  int rep() const { return n_head / n_kv_head; }
  int64_t QRow(int64_t t, int h) const { return (t * n_head + h) * D; }
  int64_t KRow(int64_t s, int g) const { return (s * n_kv_head + g) * D; }
};

// Which keys s each query t may see: s <= t and, with segment ids, seg[s] == seg[t]. When every
// id forms one contiguous run (packed samples, the usual case) the allowed keys of t are the range
// [start of t's run, t]: tiles then test in O(rows) and rows mask by two fills. Ids that come back
// after another id ("scattered") fall back to testing each pair.
class Mask {
 public:
  Mask(const int32_t* seg, int64_t T) : seg_(seg) {
    if (!seg) return;
    run_start_.resize(T);
    std::unordered_set<int32_t> seen;
    for (int64_t t = 0; t < T; ++t) {
      const bool cont = t > 0 && seg[t] == seg[t - 1];
      run_start_[t] = cont ? run_start_[t - 1] : t;
      if (!cont && !seen.insert(seg[t]).second) scattered_ = true;
    }
  }
  bool Scattered() const { return scattered_; }
  bool Allowed(int64_t s, int64_t t) const { return s <= t && (!seg_ || seg_[s] == seg_[t]); }
  // Whether any query t in [q0, q1) may attend to any key s in [k0, k1).
  bool TileHasWork(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const {
    if (k0 >= q1) return false;
    if (!seg_) return true;
    for (int64_t t = q0; t < q1; ++t) {
      if (scattered_) {
        for (int64_t s = k0; s < std::min(k1, t + 1); ++s)
          if (seg_[s] == seg_[t]) return true;
      } else if (std::max(run_start_[t], k0) <= std::min(t, k1 - 1)) {
        return true;
      }
    }
    return false;
  }
  // Whether every (t, s) pair of the tile is allowed (no mask work needed); run starts only grow with t.
  bool TileFull(int64_t q0, int64_t q1, int64_t k0, int64_t k1) const {
    if (k1 - 1 > q0) return false;
    return !seg_ || (!scattered_ && run_start_[q1 - 1] <= k0);
  }
  // Keys [lo, hi) of the tile (keys k0 .. k0 + nk - 1) may be allowed for query t, none outside it;
  // when Scattered() some inside may still be disallowed (the caller tests them).
  void Range(bool full, int64_t t, int64_t k0, int64_t nk, int64_t* lo, int64_t* hi) const {
    if (full) {
      *lo = 0, *hi = nk;
      return;
    }
    *hi = std::clamp<int64_t>(t - k0 + 1, 0, nk);
    *lo = seg_ && !scattered_ ? std::clamp<int64_t>(run_start_[t] - k0, 0, *hi) : 0;
  }

 private:
  const int32_t* seg_;
  std::vector<int64_t> run_start_;
  bool scattered_ = false;
};

// Per-thread A packing buffer for SmallGemmTransposedA.
struct GemmScratch {
  std::vector<float> a;
};

inline int64_t RowTiles(int64_t R) { return (R + kGemmTileR - 1) / kGemmTileR; }

// A(R, L) as the micro-kernel's row panels: element (i, l) at [(i / 6 * L + l) * 6 + i % 6],
// rows past R zero. Returns out.
template <typename FA>
float* PackA(float* out, int64_t R, int64_t L, const FA& a) {
  for (int64_t rt = 0; rt < RowTiles(R); ++rt) {
    float* at = out + rt * L * kGemmTileR;
    const int64_t r0 = rt * kGemmTileR;
    const int mr = (int)std::min<int64_t>(kGemmTileR, R - r0);
    for (int64_t l = 0; l < L; ++l)
      for (int i = 0; i < kGemmTileR; ++i) at[l * kGemmTileR + i] = i < mr ? a(r0 + i, l) : 0.0f;
  }
  return out;
}

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

// c(R, N) (row stride ldc) += A . B from PackA / PackB panels with inner dimension L. B's 16-column
// strips lie b_stride floats apart (L * 16 for a PackB of this product; more for a window of rows
// of a whole-sequence PackB, see SeqPack).
void RunPacked(const TrainKernelTable& tk, const float* ap, const float* bp, float* c, int64_t ldc, int64_t R,
               int64_t N, int64_t L, int64_t b_stride = 0) {
  if (b_stride == 0) b_stride = L * kGemmTileC;
  for (int64_t rt = 0; rt < RowTiles(R); ++rt) {
    const int64_t r0 = rt * kGemmTileR;
    const int mr = (int)std::min<int64_t>(kGemmTileR, R - r0);
    for (int64_t j0 = 0; j0 < N; j0 += kGemmTileC)
      tk.gemm_tile(ap + rt * L * kGemmTileR, bp + j0 / kGemmTileC * b_stride, L, c + r0 * ldc + j0, ldc, mr,
                   (int)std::min<int64_t>(kGemmTileC, N - j0));
  }
}

// c(R, N) += A(R, L) . B with A(i, l) = at[l * ld + i] (a row-major L x R matrix read transposed:
// P^T, dS^T) packed here, 6-float runs of each source row per panel row, and B already packed
// (strips b_stride apart).
void SmallGemmTransposedA(const TrainKernelTable& tk, GemmScratch& gs, float* c, int64_t ldc, int64_t R,
                          int64_t N, int64_t L, const float* at, int64_t ld, const float* bp,
                          int64_t b_stride) {
  float* ap = Scratch(gs.a, (size_t)(RowTiles(R) * L * kGemmTileR));
  for (int64_t rt = 0; rt < RowTiles(R); ++rt) {
    float* dst = ap + rt * L * kGemmTileR;
    const int64_t r0 = rt * kGemmTileR;
    const int mr = (int)std::min<int64_t>(kGemmTileR, R - r0);
    if (mr == kGemmTileR) {
      for (int64_t l = 0; l < L; ++l)
        std::memcpy(dst + l * kGemmTileR, at + l * ld + r0, sizeof(float) * kGemmTileR);
    } else {
      for (int64_t l = 0; l < L; ++l)
        for (int i = 0; i < kGemmTileR; ++i) dst[l * kGemmTileR + i] = i < mr ? at[l * ld + r0 + i] : 0.0f;
    }
  }
  RunPacked(tk, ap, bp, c, ldc, R, N, L, b_stride);
}

// c(R, N) += A(R, L) . B with A read in place from rows lda floats apart and B already packed.
void RowsAPackedB(const TrainKernelTable& tk, float* c, int64_t ldc, int64_t R, int64_t N, int64_t L,
                  const float* a, int64_t lda, const float* bp, int64_t b_stride) {
  for (int64_t r0 = 0; r0 < R; r0 += kGemmTileR) {
    const int mr = (int)std::min<int64_t>(kGemmTileR, R - r0);
    for (int64_t j0 = 0; j0 < N; j0 += kGemmTileC)
      tk.gemm_tile_rows(a + r0 * lda, lda, bp + j0 / kGemmTileC * b_stride, L, c + r0 * ldc + j0, ldc, mr,
                        (int)std::min<int64_t>(kGemmTileC, N - j0), /*overwrite=*/false);
  }
}

// One call's operands packed once for the whole sequence (T rows) and every head, so no tile
// re-packs them. Per head h (n_head of them) or kv head g, each T x D:
//   rows(x, h):  x as the micro-kernel's A row panels (PackA, L = D): a query tile starting at row
//                q0 (a multiple of 6) is the panel run at + q0 * D;
//   cols(x, g):  x^T as B strips (PackB<true>, L = D): a key tile at k0 (a multiple of 16) is at + k0 * D
//                with the usual stride D * 16;
//   strips(x, h): x as B (PackB<false>, L = T): strip c of rows [k0, k0 + n) at + c * T * 16 + k0 * 16,
//                stride T * 16 (StripStride()).
struct SeqPack {
  int64_t T, D;
  int64_t RowsSize() const { return RowTiles(T) * kGemmTileR * D; }
  int64_t ColsSize() const { return ((T + kGemmTileC - 1) / kGemmTileC) * kGemmTileC * D; }
  int64_t StripsSize() const { return ((D + kGemmTileC - 1) / kGemmTileC) * T * kGemmTileC; }
  int64_t StripStride() const { return T * kGemmTileC; }
};

// Packs, for each of n units (heads), x(t, c) = src[(t * n + u) * D + c] * mul into one of the layouts.
enum class Layout { kRows, kCols, kStrips };
float* PackSeq(ThreadPool& pool, std::vector<float>& buf, const SeqPack& sp, Layout layout, const float* src,
               int n, float mul) {
  const int64_t T = sp.T, D = sp.D;
  const int64_t per = layout == Layout::kRows   ? sp.RowsSize()
                      : layout == Layout::kCols ? sp.ColsSize()
                                                : sp.StripsSize();
  float* out = Scratch(buf, (size_t)(per * n));
  pool.ParallelFor(n, 1, [&](int64_t ub, int64_t ue, int) {
    for (int64_t u = ub; u < ue; ++u) {
      const float* x = src + u * D;
      const int64_t ld = n * D;
      float* o = out + u * per;
      if (layout == Layout::kRows)
        PackA(o, T, D, [&](int64_t t, int64_t c) { return mul * x[t * ld + c]; });
      else if (layout == Layout::kCols)
        PackB<true>(o, D, T, [&](int64_t c, int64_t t) { return mul * x[t * ld + c]; });
      else
        PackB<false>(o, T, D, [&](int64_t t, int64_t c) { return mul * x[t * ld + c]; });
    }
  });
  return out;
}

// Pointers of one (query head, query tile) / (kv head, key tile) into the packed operands:
// qa = scale * Q and da = dO as row panels, kb = K^T and vb = V^T as column strips (stride D * 16).
struct Panels {
  const float *qa, *da, *kb, *vb;
};

// P(nq, nk) = exp(scale * Q K^T - lse) on allowed pairs (0 elsewhere) and
// dS = P * (dO V^T - delta) * scale, from packed panels.
void ProbsAndScoreGrads(const TrainKernelTable& tk, const Dims& d, const Panels& p, int h, int64_t q0,
                        int64_t nq, int64_t k0, int64_t nk, const float* lse, const float* delta,
                        const Mask& mask, float scale, float* P, float* dS) {
  std::fill(P, P + nq * nk, 0.0f);
  std::fill(dS, dS + nq * nk, 0.0f);
  RunPacked(tk, p.qa, p.kb, P, nk, nq, nk, d.D);
  RunPacked(tk, p.da, p.vb, dS, nk, nq, nk, d.D);
  const bool full = mask.TileFull(q0, q0 + nq, k0, k0 + nk);
  const bool scattered = mask.Scattered() && !full;
  for (int64_t i = 0; i < nq; ++i) {
    float* row = P + i * nk;
    float* ds = dS + i * nk;
    const int64_t t = q0 + i;
    int64_t lo, hi;
    mask.Range(full, t, k0, nk, &lo, &hi);
    if (hi > lo) tk.exp_shift_scale(row + lo, hi - lo, lse[t * d.n_head + h], 1.0f);
    if (scattered)
      for (int64_t j = lo; j < hi; ++j)
        if (!mask.Allowed(k0 + j, t)) row[j] = 0.0f;
    if (hi > lo) tk.softmax_grad(ds + lo, row + lo, hi - lo, delta[t * d.n_head + h], scale);
    std::fill(row, row + lo, 0.0f);
    std::fill(ds, ds + lo, 0.0f);
    std::fill(row + std::max(lo, hi), row + nk, 0.0f);
    std::fill(ds + std::max(lo, hi), ds + nk, 0.0f);
  }
}

}  // namespace

void FlashAttentionForwardWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* out,
                               float* lse, const float* q, const float* k, const float* v, const int32_t* seg,
                               int64_t T, int n_head, int n_kv_head, int head_dim, float scale) {
  (void)kt;
  LATHE_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0 && head_dim > 0);
  const Dims d{T, n_head, n_kv_head, head_dim};
  const int D = head_dim;
  const int64_t n_qt = (T + kQTile - 1) / kQTile;
  const Mask mask(seg, T);
  // K^T and V packed once per kv head for every query tile.
  const SeqPack sp{T, D};
  static thread_local std::vector<float> kc_buf, vs_buf;
  const float* kc = PackSeq(pool, kc_buf, sp, Layout::kCols, k, n_kv_head, 1.0f);
  const float* vs = PackSeq(pool, vs_buf, sp, Layout::kStrips, v, n_kv_head, 1.0f);
  pool.ParallelFor(n_head * n_qt, 1, [&](int64_t tb, int64_t te, int) {
    static thread_local std::vector<float> o_buf, s_buf, m_buf, l_buf, qa_buf;
    float* o = Scratch(o_buf, (size_t)(kQTile * D));
    float* qa = Scratch(qa_buf, (size_t)(kQTile * D));
    float* S = Scratch(s_buf, (size_t)(kQTile * kKTile));
    float* m = Scratch(m_buf, (size_t)kQTile);
    float* l = Scratch(l_buf, (size_t)kQTile);
    for (int64_t task = tb; task < te; ++task) {
      const int h = (int)(task / n_qt), g = h / d.rep();
      const int64_t q0 = task % n_qt * kQTile, q1 = std::min(T, q0 + kQTile), nq = q1 - q0;
      std::fill(o, o + nq * D, 0.0f);
      std::fill(m, m + nq, kNegInf);
      std::fill(l, l + nq, 0.0f);
      // scale * Q tile, packed once for all its key tiles.
      PackA(qa, nq, D, [&](int64_t i, int64_t c) { return scale * q[d.QRow(q0 + i, h) + c]; });
      for (int64_t k0 = 0; k0 < q1; k0 += kKTile) {
        const int64_t k1 = std::min(q1, k0 + kKTile), nk = k1 - k0;
        if (!mask.TileHasWork(q0, q1, k0, k1)) continue;
        std::fill(S, S + nq * nk, 0.0f);
        RunPacked(tk, qa, kc + g * sp.ColsSize() + k0 * D, S, nk, nq, nk, D);
        const bool full = mask.TileFull(q0, q1, k0, k1);
        const bool scattered = mask.Scattered() && !full;
        for (int64_t i = 0; i < nq; ++i) {
          float* row = S + i * nk;
          const int64_t t = q0 + i;
          int64_t lo, hi;
          mask.Range(full, t, k0, nk, &lo, &hi);
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
            for (int c = 0; c < D; ++c) o[i * D + c] *= corr;
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
        RowsAPackedB(tk, o, D, nq, D, nk, S, nk, vs + g * sp.StripsSize() + k0 * kGemmTileC,
                     sp.StripStride());
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

void FlashAttentionBackwardWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dq,
                                float* dk, float* dv, const float* dout, const float* q, const float* k,
                                const float* v, const float* out, const float* lse, const int32_t* seg, int64_t T,
                                int n_head, int n_kv_head, int head_dim, float scale) {
  LATHE_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0 && head_dim > 0);
  const Dims d{T, n_head, n_kv_head, head_dim};
  const int D = head_dim;
  // delta[t, h] = dout . out = sum_s p_s (dout . v_s), the softmax-backward row term.
  std::vector<float> delta(T * n_head);
  pool.ParallelFor(T * n_head, 64, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) delta[r] = kt.dot(dout + r * D, out + r * D, D);
  });
  // Every operand packed once for the whole sequence (SeqPack): Q (scaled) and dO as row panels,
  // K^T and V^T as column strips, and K, Q, dO as B strips for dQ += dS K, dK += dS^T Q and
  // dV += P^T dO.
  const Mask mask(seg, T);
  const SeqPack sp{T, D};
  static thread_local std::vector<float> qa_buf, da_buf, kc_buf, vc_buf, ks_buf, qs_buf, dos_buf;
  const float* qa = PackSeq(pool, qa_buf, sp, Layout::kRows, q, n_head, scale);
  const float* da = PackSeq(pool, da_buf, sp, Layout::kRows, dout, n_head, 1.0f);
  const float* kc = PackSeq(pool, kc_buf, sp, Layout::kCols, k, n_kv_head, 1.0f);
  const float* vc = PackSeq(pool, vc_buf, sp, Layout::kCols, v, n_kv_head, 1.0f);
  const float* ks = PackSeq(pool, ks_buf, sp, Layout::kStrips, k, n_kv_head, 1.0f);
  const float* qs = PackSeq(pool, qs_buf, sp, Layout::kStrips, q, n_head, 1.0f);
  const float* dos = PackSeq(pool, dos_buf, sp, Layout::kStrips, dout, n_head, 1.0f);
  const int64_t strip_stride = sp.StripStride();
  auto query_panels = [&](Panels& p, int h, int64_t q0) {
    p.qa = qa + h * sp.RowsSize() + q0 * D;
    p.da = da + h * sp.RowsSize() + q0 * D;
  };
  auto key_panels = [&](Panels& p, int g, int64_t k0) {
    p.kb = kc + g * sp.ColsSize() + k0 * D;
    p.vb = vc + g * sp.ColsSize() + k0 * D;
  };
  // Pass 1: dK, dV per (kv head, key tile), over every query head of the group and every query
  // tile at or after the key tile; each task owns its dK / dV rows.
  const int64_t n_kt = (T + kKTile - 1) / kKTile;
  pool.ParallelFor(n_kv_head * n_kt, 1, [&](int64_t tb, int64_t te, int) {
    static thread_local std::vector<float> dk_buf, dv_buf, p_buf, ds_buf;
    static thread_local GemmScratch gs;
    Panels panels{};
    float* dkt = Scratch(dk_buf, (size_t)(kKTile * D));
    float* dvt = Scratch(dv_buf, (size_t)(kKTile * D));
    float* P = Scratch(p_buf, (size_t)(kQTile * kKTile));
    float* dS = Scratch(ds_buf, (size_t)(kQTile * kKTile));
    for (int64_t task = tb; task < te; ++task) {
      const int g = (int)(task / n_kt);
      const int64_t k0 = task % n_kt * kKTile, k1 = std::min(T, k0 + kKTile), nk = k1 - k0;
      std::fill(dkt, dkt + nk * D, 0.0f);
      std::fill(dvt, dvt + nk * D, 0.0f);
      key_panels(panels, g, k0);
      for (int h = g * d.rep(); h < (g + 1) * d.rep(); ++h) {
        for (int64_t q0 = k0 / kQTile * kQTile; q0 < T; q0 += kQTile) {
          const int64_t q1 = std::min(T, q0 + kQTile), nq = q1 - q0;
          if (!mask.TileHasWork(q0, q1, k0, k1)) continue;
          query_panels(panels, h, q0);
          ProbsAndScoreGrads(tk, d, panels, h, q0, nq, k0, nk, lse, delta.data(), mask, scale, P, dS);
          // dV += P^T dO, dK += dS^T Q.
          SmallGemmTransposedA(tk, gs, dvt, D, nk, D, nq, P, nk, dos + h * sp.StripsSize() + q0 * kGemmTileC,
                               strip_stride);
          SmallGemmTransposedA(tk, gs, dkt, D, nk, D, nq, dS, nk, qs + h * sp.StripsSize() + q0 * kGemmTileC,
                               strip_stride);
        }
      }
      for (int64_t s = k0; s < k1; ++s) {
        std::memcpy(dk + d.KRow(s, g), dkt + (s - k0) * D, sizeof(float) * D);
        std::memcpy(dv + d.KRow(s, g), dvt + (s - k0) * D, sizeof(float) * D);
      }
    }
  });
  // Pass 2: dQ per (head, query tile) over the key tiles it sees: dQ += dS K.
  const int64_t n_qt = (T + kQTile - 1) / kQTile;
  pool.ParallelFor(n_head * n_qt, 1, [&](int64_t tb, int64_t te, int) {
    static thread_local std::vector<float> dq_buf, p_buf, ds_buf;
    Panels panels{};
    float* dqt = Scratch(dq_buf, (size_t)(kQTile * D));
    float* P = Scratch(p_buf, (size_t)(kQTile * kKTile));
    float* dS = Scratch(ds_buf, (size_t)(kQTile * kKTile));
    for (int64_t task = tb; task < te; ++task) {
      const int h = (int)(task / n_qt), g = h / d.rep();
      const int64_t q0 = task % n_qt * kQTile, q1 = std::min(T, q0 + kQTile), nq = q1 - q0;
      std::fill(dqt, dqt + nq * D, 0.0f);
      query_panels(panels, h, q0);
      for (int64_t k0 = 0; k0 < q1; k0 += kKTile) {
        const int64_t k1 = std::min(q1, k0 + kKTile), nk = k1 - k0;
        if (!mask.TileHasWork(q0, q1, k0, k1)) continue;
        key_panels(panels, g, k0);
        ProbsAndScoreGrads(tk, d, panels, h, q0, nq, k0, nk, lse, delta.data(), mask, scale, P, dS);
        RowsAPackedB(tk, dqt, D, nq, D, nk, dS, nk, ks + g * sp.StripsSize() + k0 * kGemmTileC, strip_stride);
      }
      for (int64_t t = q0; t < q1; ++t) std::memcpy(dq + d.QRow(t, h), dqt + (t - q0) * D, sizeof(float) * D);
    }
  });
}

}  // namespace lathe::kernels::cpu
