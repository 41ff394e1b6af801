// Flash-style causal grouped-query attention for training: forward with a tiled online softmax
// (saves out and the per-row logsumexp only) and a backward that recomputes scores tile by tile.
// Dot products and row updates go through a tier's Dot / Axpy / exp kernels.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/train_dispatch.h"

namespace lathe::kernels::cpu {

namespace {

constexpr int64_t kQTile = 32;  // query rows per task
constexpr int64_t kKTile = 64;  // key rows per score tile (K and V tiles: 2 x 16 KiB at D = 64)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <typename T>
T* Scratch(std::vector<T>& buf, size_t n) {
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

struct Dims {
  int64_t T;
  int n_head, n_kv_head, D;
  int rep() const { return n_head / n_kv_head; }
  int64_t QRow(int64_t t, int h) const { return (t * n_head + h) * D; }
  int64_t KRow(int64_t s, int g) const { return (s * n_kv_head + g) * D; }
};

inline bool Allowed(int64_t s, int64_t t, const int32_t* seg) { return s <= t && (!seg || seg[s] == seg[t]); }

// p[j] = exp(scale * q . k[s0 + j] - shift) for allowed keys (ok[j]), 0 for masked ones; j < n.
// Without do_exp p holds the raw scaled scores (masked: -inf), for the forward's running max.
// Returns the number of allowed keys.
int64_t ScoreRow(const TrainKernelTable& tk, const KernelTable& kt, const Dims& d, const float* qt, const float* k,
                 int g, int64_t s0, int64_t n, int64_t t, const int32_t* seg, float scale, float shift, bool do_exp,
                 float* p, bool* ok) {
  int64_t n_ok = 0;
  for (int64_t j = 0; j < n; ++j) {
    ok[j] = Allowed(s0 + j, t, seg);
    p[j] = ok[j] ? scale * kt.dot(qt, k + d.KRow(s0 + j, g), d.D) : kNegInf;
    n_ok += ok[j];
  }
  if (do_exp && n_ok > 0) {
    tk.exp_shift_scale(p, n, shift, 1.0f);
    for (int64_t j = 0; j < n; ++j)
      if (!ok[j]) p[j] = 0.0f;
  }
  return n_ok;
}

}  // namespace

void FlashAttentionForwardWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* out,
                               float* lse, const float* q, const float* k, const float* v, const int32_t* seg,
                               int64_t T, int n_head, int n_kv_head, int head_dim, float scale) {
  LATHE_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0 && head_dim > 0);
  const Dims d{T, n_head, n_kv_head, head_dim};
  const int64_t n_qt = (T + kQTile - 1) / kQTile;
  pool.ParallelFor(n_head * n_qt, 1, [&](int64_t tb, int64_t te, int) {
    static thread_local std::vector<float> o_buf, p_buf, m_buf, l_buf;
    static thread_local std::vector<char> ok_buf;
    float* o = Scratch(o_buf, (size_t)(kQTile * head_dim));
    float* p = Scratch(p_buf, (size_t)kKTile);
    float* m = Scratch(m_buf, (size_t)kQTile);
    float* l = Scratch(l_buf, (size_t)kQTile);
    bool* ok = (bool*)Scratch(ok_buf, (size_t)kKTile);
    for (int64_t task = tb; task < te; ++task) {
      const int h = (int)(task / n_qt), g = h / d.rep();
      const int64_t q0 = task % n_qt * kQTile, q1 = std::min(T, q0 + kQTile);
      std::fill(o, o + (q1 - q0) * head_dim, 0.0f);
      std::fill(m, m + (q1 - q0), kNegInf);
      std::fill(l, l + (q1 - q0), 0.0f);
      for (int64_t k0 = 0; k0 < q1; k0 += kKTile) {
        const int64_t k1 = std::min(q1, k0 + kKTile);
        for (int64_t t = std::max(q0, k0); t < q1; ++t) {
          const int64_t i = t - q0, n = std::min(k1, t + 1) - k0;
          if (ScoreRow(tk, kt, d, q + d.QRow(t, h), k, g, k0, n, t, seg, scale, 0.0f, false, p, ok) == 0) continue;
          float tmax = kNegInf;
          for (int64_t j = 0; j < n; ++j) tmax = std::max(tmax, p[j]);
          const float m_new = std::max(m[i], tmax);
          const float corr = std::exp(m[i] - m_new);  // 0 on the first tile (m = -inf)
          float* oi = o + i * head_dim;
          if (corr != 1.0f) {
            for (int c = 0; c < head_dim; ++c) oi[c] *= corr;
            l[i] *= corr;
          }
          m[i] = m_new;
          tk.exp_shift_scale(p, n, m_new, 1.0f);
          for (int64_t j = 0; j < n; ++j) {
            if (!ok[j]) continue;
            l[i] += p[j];
            kt.axpy(oi, p[j], v + d.KRow(k0 + j, g), head_dim);
          }
        }
      }
      for (int64_t t = q0; t < q1; ++t) {
        const int64_t i = t - q0;
        const float inv = 1.0f / l[i];  // l >= 1: the row's own key is always allowed
        float* ot = out + d.QRow(t, h);
        for (int c = 0; c < head_dim; ++c) ot[c] = o[i * head_dim + c] * inv;
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
  // Pass 1: dK, dV per (kv head, key tile), over every query head of the group and row t >= k0.
  const int64_t n_kt = (T + kKTile - 1) / kKTile;
  pool.ParallelFor(n_kv_head * n_kt, 1, [&](int64_t tb, int64_t te, int) {
    static thread_local std::vector<float> dk_buf, dv_buf, p_buf;
    static thread_local std::vector<char> ok_buf;
    float* dkt = Scratch(dk_buf, (size_t)(kKTile * D));
    float* dvt = Scratch(dv_buf, (size_t)(kKTile * D));
    float* p = Scratch(p_buf, (size_t)kKTile);
    bool* ok = (bool*)Scratch(ok_buf, (size_t)kKTile);
    for (int64_t task = tb; task < te; ++task) {
      const int g = (int)(task / n_kt);
      const int64_t k0 = task % n_kt * kKTile, k1 = std::min(T, k0 + kKTile);
      std::fill(dkt, dkt + (k1 - k0) * D, 0.0f);
      std::fill(dvt, dvt + (k1 - k0) * D, 0.0f);
      for (int h = g * d.rep(); h < (g + 1) * d.rep(); ++h) {
        for (int64_t t = k0; t < T; ++t) {
          const int64_t n = std::min(k1, t + 1) - k0;
          const float* qt = q + d.QRow(t, h);
          const float* dot_ = dout + d.QRow(t, h);
          if (ScoreRow(tk, kt, d, qt, k, g, k0, n, t, seg, scale, lse[t * n_head + h], true, p, ok) == 0) continue;
          const float dl = delta[t * n_head + h];
          for (int64_t j = 0; j < n; ++j) {
            if (p[j] == 0.0f) continue;
            kt.axpy(dvt + j * D, p[j], dot_, D);
            const float ds = p[j] * (kt.dot(dot_, v + d.KRow(k0 + j, g), D) - dl);
            kt.axpy(dkt + j * D, scale * ds, qt, D);
          }
        }
      }
      for (int64_t s = k0; s < k1; ++s) {
        std::memcpy(dk + d.KRow(s, g), dkt + (s - k0) * D, sizeof(float) * D);
        std::memcpy(dv + d.KRow(s, g), dvt + (s - k0) * D, sizeof(float) * D);
      }
    }
  });
  // Pass 2: dQ per (head, query tile) row by row over the allowed keys.
  const int64_t n_qt = (T + kQTile - 1) / kQTile;
  pool.ParallelFor(n_head * n_qt, 1, [&](int64_t tb, int64_t te, int) {
    static thread_local std::vector<float> p_buf;
    static thread_local std::vector<char> ok_buf;
    float* p = Scratch(p_buf, (size_t)kKTile);
    bool* ok = (bool*)Scratch(ok_buf, (size_t)kKTile);
    for (int64_t task = tb; task < te; ++task) {
      const int h = (int)(task / n_qt), g = h / d.rep();
      const int64_t q0 = task % n_qt * kQTile, q1 = std::min(T, q0 + kQTile);
      for (int64_t t = q0; t < q1; ++t) {
        float* dqt = dq + d.QRow(t, h);
        std::fill(dqt, dqt + D, 0.0f);
        const float* qt = q + d.QRow(t, h);
        const float* dot_ = dout + d.QRow(t, h);
        const float dl = delta[t * n_head + h];
        for (int64_t k0 = 0; k0 <= t; k0 += kKTile) {
          const int64_t n = std::min(t + 1, k0 + kKTile) - k0;
          if (ScoreRow(tk, kt, d, qt, k, g, k0, n, t, seg, scale, lse[t * n_head + h], true, p, ok) == 0) continue;
          for (int64_t j = 0; j < n; ++j) {
            if (p[j] == 0.0f) continue;
            const float ds = p[j] * (kt.dot(dot_, v + d.KRow(k0 + j, g), D) - dl);
            kt.axpy(dqt, scale * ds, k + d.KRow(k0 + j, g), D);
          }
        }
      }
    }
  });
}

}  // namespace lathe::kernels::cpu
