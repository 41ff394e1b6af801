// The flash-attention drivers for training (causal grouped-query, segment ids, sliding window), shared by
// the f32 products (train_attention.cc) and bf16 mixed precision's products on vdpbf16ps
// (train_attention_avx512bf16.cc): the mask and its tile ranges, the tiled online-softmax forward and the
// one-pass backward with its tasks, written once over a product set `Ops`:
//   RowTile() / KeyTile(): the query / key rows of the product set's register tiles (TileRanges' granularity);
//   Scores(S, h, g, q0, nq, k0, nk, tr): S (nq x nk) = scale Q K^T over the columns tr needs of each row tile;
//   AddPV(o, g, q0, nq, k0, nk, P, tr): o (nq x D) += P V (forward);
//   DoVt(dP, h, g, q0, nq, k0, nk, tr): dP = dO V^T (backward; as Scores, unscaled);
//   AddPtDo(dvt, h, q0, nq, nk, P, tr) / AddDsTQ(dkt, h, q0, nq, nk, dS, tr): a key tile's dV += P^T dO and
//   dK += dS^T Q, in the product set's own tile layout; AddDsK(dq, ld, g, q0, nq, k0, nk, dS, tr): dQ += dS K;
//   KeyRows(tile, n, dst, ld): rows 0 .. n - 1 of such a key tile (D floats each) to dst + i * ld;
//   kPacksSoftmax: whether the set forms the forward's probabilities in the layout AddPV takes itself: row i
//   of a tile as ExpRowPacked(row, i, lo, hi, nk, shift) (exp(row - shift) over keys [lo, hi), 0 elsewhere;
//   returns the f32 sum; the f32 row is left as it was) or PackRow(row, i, nk) (a row the driver formed).
// Each file including this gets its own copy (internal linkage): they are built with different ISA flags.
#pragma once

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

constexpr int64_t kQTile = 96;        // query rows per tile
constexpr int64_t kKTile = kAttentionKeyTile;  // key rows per tile (96 x 128 scores, 48 KiB: L2)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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

inline int64_t RowTiles(int64_t R, int64_t tile) { return (R + tile - 1) / tile; }

// y = a x and x *= a over n floats, in blocks of 16 that -O2 vectorizes (a known trip count) and a scalar tail.
inline void ScaleRowTo(float* __restrict y, const float* __restrict x, int64_t n, float a) {
  int64_t c = 0;
  for (; c + 16 <= n; c += 16)
    for (int k = 0; k < 16; ++k) y[c + k] = x[c + k] * a;
  for (; c < n; ++c) y[c] = x[c] * a;
}
inline void ScaleRow(float* x, int64_t n, float a) {
  int64_t c = 0;
  for (; c + 16 <= n; c += 16)
    for (int k = 0; k < 16; ++k) x[c + k] *= a;
  for (; c < n; ++c) x[c] *= a;
}

// Which part of a (query tile q0 + [0, nq), key tile k0 + [0, nk)) pair can be nonzero, so the tile
// products skip register tiles (and inner runs) that the causal / segment mask zeroes: on the diagonal
// tiles about half the work. Row i may see keys [lo[i], hi[i]) of the tile (none when lo >= hi); query
// row tile rt (row_tile rows) needs key columns [clo[rt], chi[rt]) (clo a multiple of 16, the B strips'
// width); key tile kt (key_tile keys) is seen by query rows [rlo[kt], rhi[kt]) only. Skipping only drops
// terms that are exact zeros.
struct TileRanges {
  std::vector<int64_t> lo, hi, clo, chi, rlo, rhi;
  bool full = false;
  void Set(const Mask& mask, int64_t q0, int64_t nq, int64_t k0, int64_t nk, int64_t row_tile, int64_t key_tile) {
    full = mask.TileFull(q0, q0 + nq, k0, k0 + nk);
    lo.resize(nq), hi.resize(nq);
    for (int64_t i = 0; i < nq; ++i) {
      mask.Range(full, q0 + i, k0, nk, &lo[i], &hi[i]);
      if (hi[i] <= lo[i]) lo[i] = hi[i] = 0;
    }
    const int64_t n_rt = RowTiles(nq, row_tile), n_kt = RowTiles(nk, key_tile);
    clo.assign(n_rt, nk), chi.assign(n_rt, 0);
    for (int64_t i = 0; i < nq; ++i) {
      if (hi[i] <= lo[i]) continue;
      const int64_t rt = i / row_tile;
      clo[rt] = std::min(clo[rt], lo[i]), chi[rt] = std::max(chi[rt], hi[i]);
    }
    for (int64_t rt = 0; rt < n_rt; ++rt) {
      if (chi[rt] <= clo[rt]) clo[rt] = chi[rt] = 0;
      clo[rt] = clo[rt] / kGemmTileC * kGemmTileC;  // B strips start at multiples of 16 (k0 is one)
    }
    // Rows with keys form one run [i0, i1) (causal: rows before the tile see none; segment runs:
    // rows whose run starts after the tile see none), and over it lo and hi never decrease (run
    // starts and t grow with the row). So the rows seeing key tile [a, b) are those of the run
    // with hi > a (a suffix) and lo < b (a prefix): two pointers.
    rlo.assign(n_kt, 0), rhi.assign(n_kt, 0);
    int64_t i0 = 0, i1 = nq;
    while (i0 < nq && hi[i0] <= lo[i0]) ++i0;
    while (i1 > i0 && hi[i1 - 1] <= lo[i1 - 1]) --i1;
    int64_t pa = i0, pb = i0;
    for (int64_t kt = 0; kt < n_kt; ++kt) {
      const int64_t a = kt * key_tile, b = std::min(nk, a + key_tile);
      while (pa < i1 && hi[pa] <= a) ++pa;
      while (pb < i1 && lo[pb] < b) ++pb;
      if (pb > pa) rlo[kt] = pa, rhi[kt] = pb;
    }
  }
};

// Forward over prepared products (ops): tasks of (query tile, head), last query tiles first.
template <class Ops>
void AttentionForward(const TrainKernelTable& tk, ThreadPool& pool, const Ops& ops, float* out, float* lse,
                      const int32_t* seg, int64_t T, int n_head, int n_kv_head, int head_dim, int64_t window) {
  const Dims d{T, n_head, n_kv_head, head_dim};
  const int D = head_dim;
  const int64_t n_qt = (T + kQTile - 1) / kQTile;
  const Mask mask(seg, T, window);
  pool.ParallelFor(n_head * n_qt, 1, [&](int64_t tb, int64_t te, int) {
    static thread_local std::vector<float> o_buf, s_buf, m_buf, l_buf;
    static thread_local TileRanges tr;
    float* o = Scratch(o_buf, (size_t)(kQTile * D));
    float* S = Scratch(s_buf, (size_t)(kQTile * kKTile));
    float* m = Scratch(m_buf, (size_t)kQTile);
    float* l = Scratch(l_buf, (size_t)kQTile);
    const int64_t D = head_dim;  // locals, not the captures: the row loops below then vectorize
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
        tr.Set(mask, q0, nq, k0, nk, ops.RowTile(), ops.KeyTile());
        ops.Scores(S, h, g, q0, nq, k0, nk, tr);
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
            if constexpr (Ops::kPacksSoftmax) ops.PackRow(row, i, nk);
            continue;
          }
          const float m_new = std::max(m[i], tmax);
          const float corr = std::exp(m[i] - m_new);  // 0 on the row's first tile (m = -inf)
          if (corr != 1.0f) {
            ScaleRow(o + i * D, D, corr);
            l[i] *= corr;
          }
          m[i] = m_new;
          if constexpr (Ops::kPacksSoftmax) {
            if (!scattered) {
              l[i] += ops.ExpRowPacked(row, i, lo, hi, nk, m_new);
              continue;
            }
          }
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
          if constexpr (Ops::kPacksSoftmax) ops.PackRow(row, i, nk);
          l[i] += sum;
        }
        ops.AddPV(o, g, q0, nq, k0, nk, S, tr);
      }
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t t = q0 + i;
        const float inv = 1.0f / l[i];  // l >= 1: the row's own key is always allowed
        ScaleRowTo(out + d.QRow(t, h), o + i * D, D, inv);
        lse[t * n_head + h] = m[i] + std::log(l[i]);
      }
    }
  });
}

// The softmax-backward row term delta[t, h] = dout . out = sum_s p_s (dout . v_s), f32 dots.
inline float* AttentionDelta(const KernelTable& kt, ThreadPool& pool, const float* dout, const float* out, int64_t T,
                             int n_head, int D) {
  static thread_local std::vector<float> delta_buf;
  float* delta = Scratch(delta_buf, (size_t)(T * n_head));
  pool.ParallelFor(T * n_head, 64, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) delta[r] = kt.dot(dout + r * D, out + r * D, D);
  });
  return delta;
}

// One pass per (run of key tiles, query head) task: no two tasks write the same dQ rows (run 0 writes
// dq, later runs their own partials, added in run order), and each head's dK / dV goes to its own
// rows, summed over the group's heads in a fixed order at the end, so the result does not depend on
// the number of threads. Per key tile (outer) and query tile: S = scale Q K^T and dP = dO V^T once,
// P = exp(S - lse), dS = P (dP - delta) scale, then dV += P^T dO, dK += dS^T Q and dQ += dS K.
template <class Ops>
void AttentionBackward(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, const Ops& ops,
                       const float* delta, float* dq,
                       float* dk, float* dv, const float* lse, const int32_t* seg, int64_t T, int n_head,
                       int n_kv_head, int head_dim, float scale, int64_t window) {
  const Dims d{T, n_head, n_kv_head, head_dim};
  const int D = head_dim;
  const int rep = d.rep();
  const int64_t ldq = (int64_t)n_head * D;
  const Mask mask(seg, T, window);
  // With grouped heads each head's dK / dV (T x D) goes to its own buffer, summed per group below;
  // with one head per group straight into dk / dv.
  const int64_t n_kt = (T + kKTile - 1) / kKTile;
  // Tasks are (run of key tiles, head): the key tiles split into n_parts runs of about equal causal
  // work, so 9 heads still spread evenly over the threads. The split depends on T only (never on the
  // threads): run 0 adds its dQ straight into dq, run p > 0 into its own partial rows (from its first
  // query tile on), which are added to dq in run order at the end.
  const int64_t n_parts = AttentionBackwardRuns(T);
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
  // One head's pass over key tile kt_i of run `part`: its tile's dK^T / dV^T into dkt / dvt (zeroed here),
  // its dQ into the run's rows (dqh, zeroed by the caller before the run's first tile).
  auto key_tile = [&](int64_t part, int h, int64_t kt_i, float* dkt, float* dvt, float* P, float* dS,
                      TileRanges& tr) {
    const int g = h / rep;
    float* dqh = part == 0 ? dq + h * D : dqp + ((part - 1) * n_head + h) * T * D;
    const int64_t ld_dq = part == 0 ? ldq : D;
    const int64_t k0 = kt_i * kKTile, k1 = std::min(T, k0 + kKTile), nk = k1 - k0;
    std::fill(dkt, dkt + kKTile * D, 0.0f);
    std::fill(dvt, dvt + kKTile * D, 0.0f);
    for (int64_t q0 = k0 / kQTile * kQTile; q0 < T; q0 += kQTile) {
      const int64_t q1 = std::min(T, q0 + kQTile), nq = q1 - q0;
      if (!mask.TileHasWork(q0, q1, k0, k1)) continue;
      tr.Set(mask, q0, nq, k0, nk, ops.RowTile(), ops.KeyTile());
      ops.Scores(P, h, g, q0, nq, k0, nk, tr);
      ops.DoVt(dS, h, g, q0, nq, k0, nk, tr);
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
      ops.AddPtDo(dvt, h, q0, nq, nk, P, tr);
      ops.AddDsTQ(dkt, h, q0, nq, nk, dS, tr);
      ops.AddDsK(dqh + q0 * ld_dq, ld_dq, g, q0, nq, k0, nk, dS, tr);
    }
  };
  auto zero_dq_rows = [&](int64_t part, int h) {
    float* dqh = part == 0 ? dq + h * D : dqp + ((part - 1) * n_head + h) * T * D;
    const int64_t ld_dq = part == 0 ? ldq : D;
    for (int64_t t = part == 0 ? 0 : run_q0(part); t < T; ++t) std::memset(dqh + t * ld_dq, 0, sizeof(float) * D);
  };
  // Grouped heads: tasks of (run, kv head) whose heads' key tiles are summed in head order as each tile ends
  // (the same additions as summing per-head buffers afterwards, so the same bits, without the T x D buffer
  // per head and its pass) where there are tasks enough for the threads; else (run, head) tasks into per-head
  // buffers. Either gives the same result.
  const bool by_group = AttentionBackwardByGroup(T, n_head, n_kv_head, pool.size());
  static thread_local std::vector<float> dkp_buf, dvp_buf;
  float* dkp = rep > 1 && !by_group ? Scratch(dkp_buf, (size_t)(n_head * T * D)) : nullptr;
  float* dvp = rep > 1 && !by_group ? Scratch(dvp_buf, (size_t)(n_head * T * D)) : nullptr;
  if (by_group) {
    pool.ParallelFor(n_parts * n_kv_head, 1, [&](int64_t tb, int64_t te, int) {
      static thread_local std::vector<float> dk_buf, dv_buf, p_buf, ds_buf;
      static thread_local TileRanges tr;
      float* dkts = Scratch(dk_buf, (size_t)(rep * kKTile * D));
      float* dvts = Scratch(dv_buf, (size_t)(rep * kKTile * D));
      float* P = Scratch(p_buf, (size_t)(kQTile * kKTile));
      float* dS = Scratch(ds_buf, (size_t)(kQTile * kKTile));
      for (int64_t task = tb; task < te; ++task) {
        const int64_t part = task / n_kv_head;
        const int g = (int)(task % n_kv_head);
        for (int r = 0; r < rep; ++r) zero_dq_rows(part, g * rep + r);
        for (int64_t kt_i = run_begin[part]; kt_i < run_begin[part + 1]; ++kt_i) {
          for (int r = 0; r < rep; ++r)
            key_tile(part, g * rep + r, kt_i, dkts + r * kKTile * D, dvts + r * kKTile * D, P, dS, tr);
          for (int r = 1; r < rep; ++r) {  // += (1 x is exact): the head order of the per-head sums below
            kt.axpy(dkts, 1.0f, dkts + r * kKTile * D, kKTile * D);
            kt.axpy(dvts, 1.0f, dvts + r * kKTile * D, kKTile * D);
          }
          const int64_t k0 = kt_i * kKTile, nk = std::min(T, k0 + kKTile) - k0;
          ops.KeyRows(dkts, nk, dk + d.KRow(k0, g), (int64_t)n_kv_head * D);
          ops.KeyRows(dvts, nk, dv + d.KRow(k0, g), (int64_t)n_kv_head * D);
        }
      }
    });
  } else {
    pool.ParallelFor(n_parts * n_head, 1, [&](int64_t tb, int64_t te, int) {
      static thread_local std::vector<float> dk_buf, dv_buf, p_buf, ds_buf;
      static thread_local TileRanges tr;
      float* dkt = Scratch(dk_buf, (size_t)(kKTile * D));
      float* dvt = Scratch(dv_buf, (size_t)(kKTile * D));
      float* P = Scratch(p_buf, (size_t)(kQTile * kKTile));
      float* dS = Scratch(ds_buf, (size_t)(kQTile * kKTile));
      for (int64_t task = tb; task < te; ++task) {
        const int64_t part = task / n_head;
        const int h = (int)(task % n_head), g = h / rep;
        zero_dq_rows(part, h);
        for (int64_t kt_i = run_begin[part]; kt_i < run_begin[part + 1]; ++kt_i) {
          key_tile(part, h, kt_i, dkt, dvt, P, dS, tr);
          const int64_t k0 = kt_i * kKTile, nk = std::min(T, k0 + kKTile) - k0;
          if (rep > 1) {
            ops.KeyRows(dkt, nk, dkp + (h * T + k0) * D, D);
            ops.KeyRows(dvt, nk, dvp + (h * T + k0) * D, D);
          } else {
            ops.KeyRows(dkt, nk, dk + d.KRow(k0, g), (int64_t)n_kv_head * D);
            ops.KeyRows(dvt, nk, dv + d.KRow(k0, g), (int64_t)n_kv_head * D);
          }
        }
      }
    });
  }
  if (n_parts > 1) {
    pool.ParallelFor(T * n_head, 64, [&](int64_t b, int64_t e, int) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t t = r / n_head, h = r % n_head;
        float* dqr = dq + r * D;
        for (int64_t p = 1; p < n_parts; ++p) {
          if (t < run_q0(p)) continue;
          kt.axpy(dqr, 1.0f, dqp + ((p - 1) * n_head + h) * T * D + t * D, D);  // += (1 x is exact)
        }
      }
    });
  }
  if (rep == 1 || by_group) return;
  // dK / dV of each kv head: its query heads' parts summed in head order.
  pool.ParallelFor(T * n_kv_head, 64, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t s = r / n_kv_head;
      const int g = (int)(r % n_kv_head);
      float* dkr = dk + d.KRow(s, g);
      float* dvr = dv + d.KRow(s, g);
      const int64_t h0 = (int64_t)g * rep;
      std::memcpy(dkr, dkp + (h0 * T + s) * D, sizeof(float) * D);
      std::memcpy(dvr, dvp + (h0 * T + s) * D, sizeof(float) * D);
      for (int64_t h = h0 + 1; h < h0 + rep; ++h) {
        kt.axpy(dkr, 1.0f, dkp + (h * T + s) * D, D);
        kt.axpy(dvr, 1.0f, dvp + (h * T + s) * D, D);
      }
    }
  });
}

}  // namespace
}  // namespace lathe::kernels::cpu
