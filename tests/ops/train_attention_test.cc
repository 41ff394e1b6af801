// FlashAttentionForward/Backward (causal, grouped-query, optional segment ids and sliding window) on the scalar,
// AVX2 and AVX-512 tiers with 1 and 2 threads: against a naive double reference that builds the full T x T
// softmax, and the backward against double finite differences of that reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/train_ops.h"
#include "kernels/cpu/train_dispatch.h"
#include "ops_test_util.h"
#include "train_test_util.h"

namespace lathe::kernels {
namespace {

using testing::FiniteDiffGrad;
using testing::RandomVec;
using testing::RelErr;
using testing::ToDouble;

// Float dots over head_dim and polynomial exp vs double, online rescaling: ~1e-7 typical.
constexpr double kAttnRefLimit = 5e-6;
constexpr double kAttnFdLimit = 5e-6;

struct Cfg {
  int64_t T;
  int n_head, n_kv_head, D;
};

// Naive attention in double with the full (T, T) probabilities; backward by the softmax rule.
struct TrainRefAttention {
  Cfg c;
  const int32_t* seg;
  double scale;
  int64_t window = 0;
  bool Allowed(int64_t s, int64_t t) const {
    return s <= t && (!seg || seg[s] == seg[t]) && (window == 0 || s > t - window);
  }
  // P[h][t][s].
  std::vector<double> Probs(const std::vector<double>& q, const std::vector<double>& k) const {
    const int rep = c.n_head / c.n_kv_head;
    std::vector<double> P(c.n_head * c.T * c.T, 0.0);
    for (int h = 0; h < c.n_head; ++h)
      for (int64_t t = 0; t < c.T; ++t) {
        double* row = &P[(h * c.T + t) * c.T];
        double m = -1e300;
        for (int64_t s = 0; s <= t; ++s) {
          if (!Allowed(s, t)) continue;
          double dot = 0;
          for (int d = 0; d < c.D; ++d)
            dot += q[(t * c.n_head + h) * c.D + d] * k[(s * c.n_kv_head + h / rep) * c.D + d];
          row[s] = dot * scale;
          m = std::max(m, row[s]);
        }
        double sum = 0;
        for (int64_t s = 0; s <= t; ++s) {
          row[s] = Allowed(s, t) ? std::exp(row[s] - m) : 0.0;  // masked entries were never written
          sum += row[s];
        }
        for (int64_t s = 0; s <= t; ++s) row[s] /= sum;
      }
    return P;
  }
  std::vector<double> Forward(const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v) const {
    const int rep = c.n_head / c.n_kv_head;
    const std::vector<double> P = Probs(q, k);
    std::vector<double> out(c.T * c.n_head * c.D, 0.0);
    for (int h = 0; h < c.n_head; ++h)
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t s = 0; s <= t; ++s)
          for (int d = 0; d < c.D; ++d)
            out[(t * c.n_head + h) * c.D + d] += P[(h * c.T + t) * c.T + s] * v[(s * c.n_kv_head + h / rep) * c.D + d];
    return out;
  }
  void Backward(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                const std::vector<double>& dout, std::vector<double>* dq, std::vector<double>* dk,
                std::vector<double>* dv) const {
    const int rep = c.n_head / c.n_kv_head;
    const std::vector<double> P = Probs(q, k);
    dq->assign(q.size(), 0.0);
    dk->assign(k.size(), 0.0);
    dv->assign(v.size(), 0.0);
    for (int h = 0; h < c.n_head; ++h)
      for (int64_t t = 0; t < c.T; ++t) {
        const double* pr = &P[(h * c.T + t) * c.T];
        const double* go = &dout[(t * c.n_head + h) * c.D];
        std::vector<double> dp(t + 1);
        double rowdot = 0;
        for (int64_t s = 0; s <= t; ++s) {
          const double* vs = &v[(s * c.n_kv_head + h / rep) * c.D];
          double x = 0;
          for (int d = 0; d < c.D; ++d) x += go[d] * vs[d];
          dp[s] = x;
          rowdot += pr[s] * x;
        }
        for (int64_t s = 0; s <= t; ++s) {
          const double ds = pr[s] * (dp[s] - rowdot) * scale;
          const int64_t kr = (s * c.n_kv_head + h / rep) * c.D, qr = (t * c.n_head + h) * c.D;
          for (int d = 0; d < c.D; ++d) {
            (*dv)[kr + d] += pr[s] * go[d];
            (*dq)[qr + d] += ds * k[kr + d];
            (*dk)[kr + d] += ds * q[qr + d];
          }
        }
      }
  }
};

class TrainAttention : public ::testing::TestWithParam<std::tuple<IsaTier, int>> {};

TEST_P(TrainAttention, MatchesReference) {
  const auto [tier, threads] = GetParam();
  LATHE_REQUIRE_TIER(tier);
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(tier);
  const cpu::KernelTable& kt = cpu::KernelsFor(tier);
  ThreadPool pool(threads);
  // T crosses the 96-row query and 128-row key tiles; odd head_dim exercises vector tails; T = 301
  // gives several query and key tiles (offsets into the whole-sequence packs) and a partial last strip.
  for (const Cfg& c :
       {Cfg{1, 1, 1, 8}, Cfg{100, 4, 2, 20}, Cfg{150, 3, 1, 64}, Cfg{70, 2, 2, 7}, Cfg{301, 4, 2, 17}}) {
    // 0: no segment ids; 1: packed samples (contiguous runs: the range mask); 2: ids that come back
    // after others (each pair tested). Windows: none, and 37 keys (starts inside the query and key
    // tiles, and shorter than some segment runs but not others).
    for (int64_t window : {0, 37})
    for (int seg_mode : {0, 1, 2}) {
      const bool packed = seg_mode != 0;
      std::vector<int32_t> seg(c.T);
      for (int64_t t = 0; t < c.T; ++t)
        seg[t] = seg_mode == 2 ? (int32_t)(t / 7 % 3) : (int32_t)(t < 23 ? 0 : t < 90 ? 1 : 2);
      const int32_t* segp = packed ? seg.data() : nullptr;
      const int64_t nq = c.T * c.n_head * c.D, nk = c.T * c.n_kv_head * c.D;
      const std::vector<float> q = RandomVec(nq, 50, 1.5f), k = RandomVec(nk, 51, 1.5f), v = RandomVec(nk, 52),
                               g = RandomVec(nq, 53);
      const float scale = 1.0f / std::sqrt((float)c.D);
      const TrainRefAttention ref{c, segp, scale, window};
      const std::vector<double> qd = ToDouble(q), kd = ToDouble(k), vd = ToDouble(v), gd = ToDouble(g);
      const std::string where = "T=" + std::to_string(c.T) + " H=" + std::to_string(c.n_head) + "/" +
                                std::to_string(c.n_kv_head) + " D=" + std::to_string(c.D) +
                                (seg_mode == 1   ? " packed"
                                 : seg_mode == 2 ? " scattered"
                                                 : "") +
                                " window=" + std::to_string(window);
      std::vector<float> out(nq), lse(c.T * c.n_head);
      cpu::FlashAttentionForwardWith(tk, kt, pool, out.data(), lse.data(), q.data(), k.data(), v.data(), segp, c.T,
                                     c.n_head, c.n_kv_head, c.D, scale, window);
      EXPECT_LE(RelErr(out, ref.Forward(qd, kd, vd)), kAttnRefLimit) << where;
      std::vector<double> rdq, rdk, rdv;
      ref.Backward(qd, kd, vd, gd, &rdq, &rdk, &rdv);
      std::vector<float> dq(nq, 7.0f), dk(nk, 7.0f), dv(nk, 7.0f);
      cpu::FlashAttentionBackwardWith(tk, kt, pool, dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(),
                                      v.data(), out.data(), lse.data(), segp, c.T, c.n_head, c.n_kv_head, c.D,
                                      scale, window);
      EXPECT_LE(RelErr(dq, rdq), kAttnRefLimit) << where;
      EXPECT_LE(RelErr(dk, rdk), kAttnRefLimit) << where;
      EXPECT_LE(RelErr(dv, rdv), kAttnRefLimit) << where;
    }
  }
}

TEST_P(TrainAttention, BackwardMatchesFiniteDifferences) {
  const auto [tier, threads] = GetParam();
  LATHE_REQUIRE_TIER(tier);
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(tier);
  const cpu::KernelTable& kt = cpu::KernelsFor(tier);
  ThreadPool pool(threads);
  const Cfg c{9, 4, 2, 5};
  const std::vector<int32_t> seg = {0, 0, 0, 0, 1, 1, 1, 2, 2};
  for (int64_t window : {0, 3})
  for (const int32_t* segp : {(const int32_t*)nullptr, seg.data()}) {
    const int64_t nq = c.T * c.n_head * c.D, nk = c.T * c.n_kv_head * c.D;
    const std::vector<float> q = RandomVec(nq, 54, 1.5f), k = RandomVec(nk, 55, 1.5f), v = RandomVec(nk, 56),
                             g = RandomVec(nq, 57);
    const float scale = 0.4f;
    const TrainRefAttention ref{c, segp, scale, window};
    const std::vector<double> qd = ToDouble(q), kd = ToDouble(k), vd = ToDouble(v), gd = ToDouble(g);
    const auto fd_q = FiniteDiffGrad(qd, [&](const std::vector<double>& x) { return testing::Dot(ref.Forward(x, kd, vd), gd); });
    const auto fd_k = FiniteDiffGrad(kd, [&](const std::vector<double>& x) { return testing::Dot(ref.Forward(qd, x, vd), gd); });
    const auto fd_v = FiniteDiffGrad(vd, [&](const std::vector<double>& x) { return testing::Dot(ref.Forward(qd, kd, x), gd); });
    std::vector<float> out(nq), lse(c.T * c.n_head), dq(nq), dk(nk), dv(nk);
    cpu::FlashAttentionForwardWith(tk, kt, pool, out.data(), lse.data(), q.data(), k.data(), v.data(), segp, c.T,
                                   c.n_head, c.n_kv_head, c.D, scale, window);
    cpu::FlashAttentionBackwardWith(tk, kt, pool, dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(),
                                    v.data(), out.data(), lse.data(), segp, c.T, c.n_head, c.n_kv_head, c.D, scale,
                                    window);
    const std::string where = std::string(segp ? "packed" : "") + " window=" + std::to_string(window);
    EXPECT_LE(RelErr(dq, fd_q), kAttnFdLimit) << where;
    EXPECT_LE(RelErr(dk, fd_k), kAttnFdLimit) << where;
    EXPECT_LE(RelErr(dv, fd_v), kAttnFdLimit) << where;
  }
}

// The backward's tasks (a run of key tiles of one query head each, runs fixed by T: 3 at T = 301)
// own their dQ rows or dQ partials (summed in run order) and per-head dK / dV parts (summed in head
// order): 1, 2 and 3 threads give the same bits (TrainModelDeterminism relies on it). One thread runs
// the grouped tasks (a run of one kv head's query heads, their key tiles summed in head order as each
// ends: 6 tasks >= 4 x threads), 2 and 3 the per-head ones: the comparison covers both forms. The AVX-512
// train table (the AVX2 arithmetic, two strips per micro-kernel call) gives the AVX2 tier's bits.
TEST(TrainAttentionThreads, BackwardBitsDoNotDependOnThreads) {
  std::vector<std::vector<float>> avx2_grads[2];
  for (IsaTier tier : {IsaTier::kScalar, IsaTier::kAvx2, IsaTier::kAvx512}) {
    if (!testing::CpuHasTier(tier)) continue;
    const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(tier);
    // The AVX-512 train table with the AVX2 inference kernels (the row dot products), so the
    // comparison with the AVX2 tier isolates the train table's GEMM tiles.
    const cpu::KernelTable& kt = cpu::KernelsFor(tier == IsaTier::kAvx512 ? IsaTier::kAvx2 : tier);
    int ci = 0;
    for (const Cfg& c : {Cfg{301, 6, 2, 64}, Cfg{230, 3, 1, 17}}) {
      std::vector<int32_t> seg(c.T);
      for (int64_t t = 0; t < c.T; ++t) seg[t] = (int32_t)(t < 40 ? 0 : t < 200 ? 1 : 2);
      const int64_t nq = c.T * c.n_head * c.D, nk = c.T * c.n_kv_head * c.D;
      const std::vector<float> q = RandomVec(nq, 60, 1.5f), k = RandomVec(nk, 61, 1.5f), v = RandomVec(nk, 62),
                               g = RandomVec(nq, 63);
      const float scale = 1.0f / std::sqrt((float)c.D);
      std::vector<float> out(nq), lse(c.T * c.n_head);
      std::vector<std::vector<float>> grads[3];
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        cpu::FlashAttentionForwardWith(tk, kt, pool, out.data(), lse.data(), q.data(), k.data(), v.data(),
                                       seg.data(), c.T, c.n_head, c.n_kv_head, c.D, scale);
        std::vector<float> dq(nq), dk(nk), dv(nk);
        cpu::FlashAttentionBackwardWith(tk, kt, pool, dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(),
                                        v.data(), out.data(), lse.data(), seg.data(), c.T, c.n_head, c.n_kv_head,
                                        c.D, scale);
        grads[threads - 1] = {dq, dk, dv};
      }
      for (int threads : {2, 3})
        for (int i = 0; i < 3; ++i)
          EXPECT_EQ(0, std::memcmp(grads[0][i].data(), grads[threads - 1][i].data(),
                                   sizeof(float) * grads[0][i].size()))
              << IsaTierName(tier) << " D=" << c.D << " threads=" << threads << " grad " << i;
      if (tier == IsaTier::kAvx2) avx2_grads[ci] = grads[0];
      if (tier == IsaTier::kAvx512) {
        for (int i = 0; i < 3; ++i) EXPECT_EQ(grads[0][i], avx2_grads[ci][i]) << "avx512 vs avx2 D=" << c.D << " grad " << i;
      }
      ++ci;
    }
  }
}

// bf16 mixed precision's attention on vdpbf16ps (CPUs with avx512_bf16) against a double reference that
// rounds what the kernel rounds: q, k, v and dout to bf16, the forward's probabilities to bf16 relative to
// the running max of each 128-key tile (the online softmax: exp(S - m_tile) rounded, rescaled by
// exp(m_tile - m_row) in f32), the backward's P = exp(S - lse) and dS = P (dP - delta) scale to bf16 before
// their products, delta = bf16(dout) . out. What is left: f32 sums and exp, and a bf16 rounding of P or dS
// that falls the other way now and then (that element off by 2^-8): measured up to 3.8e-4 per tensor and
// 4.4e-3 in the worst row (a few such flips in a row of few keys). A key or pair the kernel dropped moves
// its row by a few percent or more (rows see at most 37 keys with the window; 1 / 301 of a row's weight
// against a row norm ~ |v| / sqrt(301) without it), which the row check catches.
constexpr double kBf16Limit = 1e-3;
constexpr double kBf16RowLimit = 1e-2;
constexpr int64_t kRefKeyTile = 128;  // the kernel's key tile (train_attention_driver.h kKTile)

double RoundBf16(double x) { return BF16ToF32(F32ToBF16((float)x)); }

// The worst row (n values each) of y against ref: ||y_row - ref_row|| / ||ref_row||, rows whose reference
// is below a thousandth of the rms row norm measured against that floor instead. A key dropped from a row
// of at most ~40 allowed keys moves it by a few percent, which the whole-tensor norm would average away.
double WorstRowErr(const std::vector<float>& y, const std::vector<double>& ref, int64_t n) {
  const int64_t rows = (int64_t)ref.size() / n;
  double total = 0;
  for (double r : ref) total += r * r;
  const double floor = 1e-3 * std::sqrt(total / std::max<int64_t>(rows, 1));
  double worst = 0;
  for (int64_t i = 0; i < rows; ++i) {
    double num = 0, den = 0;
    for (int64_t j = i * n; j < (i + 1) * n; ++j) {
      num += ((double)y[j] - ref[j]) * ((double)y[j] - ref[j]);
      den += ref[j] * ref[j];
    }
    worst = std::max(worst, std::sqrt(num) / std::max(std::sqrt(den), floor));
  }
  return worst;
}
std::vector<double> RoundedBf16(const std::vector<float>& x) {
  std::vector<double> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = RoundBf16(x[i]);
  return r;
}

struct RefBf16Attention {
  TrainRefAttention base;
  // Per (h, t): scaled scores of the allowed keys (NaN elsewhere).
  std::vector<double> Scores(const std::vector<double>& q, const std::vector<double>& k) const {
    const Cfg& c = base.c;
    const int rep = c.n_head / c.n_kv_head;
    std::vector<double> S(c.n_head * c.T * c.T, std::nan(""));
    for (int h = 0; h < c.n_head; ++h)
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t s = 0; s <= t; ++s) {
          if (!base.Allowed(s, t)) continue;
          double dot = 0;
          for (int d = 0; d < c.D; ++d)
            dot += q[(t * c.n_head + h) * c.D + d] * k[(s * c.n_kv_head + h / rep) * c.D + d];
          S[(h * c.T + t) * c.T + s] = base.scale * dot;
        }
    return S;
  }
  void Forward(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
               std::vector<double>* out, std::vector<double>* lse) const {
    const Cfg& c = base.c;
    const int rep = c.n_head / c.n_kv_head;
    const std::vector<double> S = Scores(q, k);
    out->assign(c.T * c.n_head * c.D, 0.0);
    lse->assign(c.T * c.n_head, 0.0);
    for (int h = 0; h < c.n_head; ++h)
      for (int64_t t = 0; t < c.T; ++t) {
        const double* row = &S[(h * c.T + t) * c.T];
        // Running max at the end of each key tile, over the allowed keys so far.
        std::vector<double> m_tile((t / kRefKeyTile) + 1, -1e300);
        double m = -1e300;
        for (int64_t s = 0; s <= t; ++s) {
          if (!std::isnan(row[s])) m = std::max(m, row[s]);
          m_tile[s / kRefKeyTile] = m;
        }
        double l = 0;
        for (int64_t s = 0; s <= t; ++s)
          if (!std::isnan(row[s])) l += std::exp(row[s] - m);
        double* o = &(*out)[(t * c.n_head + h) * c.D];
        for (int64_t s = 0; s <= t; ++s) {
          if (std::isnan(row[s])) continue;
          const double mt = m_tile[s / kRefKeyTile];
          const double p = RoundBf16(std::exp(row[s] - mt)) * std::exp(mt - m);
          for (int d = 0; d < c.D; ++d) o[d] += p * v[(s * c.n_kv_head + h / rep) * c.D + d] / l;
        }
        (*lse)[t * c.n_head + h] = m + std::log(l);
      }
  }
  void Backward(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                const std::vector<double>& dout, const std::vector<double>& out, const std::vector<double>& lse,
                std::vector<double>* dq, std::vector<double>* dk, std::vector<double>* dv) const {
    const Cfg& c = base.c;
    const int rep = c.n_head / c.n_kv_head;
    const std::vector<double> S = Scores(q, k);
    dq->assign(q.size(), 0.0);
    dk->assign(k.size(), 0.0);
    dv->assign(v.size(), 0.0);
    for (int h = 0; h < c.n_head; ++h)
      for (int64_t t = 0; t < c.T; ++t) {
        const double* row = &S[(h * c.T + t) * c.T];
        const int64_t qr = (t * c.n_head + h) * c.D;
        double delta = 0;
        for (int d = 0; d < c.D; ++d) delta += dout[qr + d] * out[qr + d];
        for (int64_t s = 0; s <= t; ++s) {
          if (std::isnan(row[s])) continue;
          const int64_t kr = (s * c.n_kv_head + h / rep) * c.D;
          const double p = std::exp(row[s] - lse[t * c.n_head + h]);
          double dp = 0;
          for (int d = 0; d < c.D; ++d) dp += dout[qr + d] * v[kr + d];
          const double ds = p * (dp - delta) * base.scale;
          const double pr = RoundBf16(p), dsr = RoundBf16(ds);
          for (int d = 0; d < c.D; ++d) {
            (*dv)[kr + d] += pr * dout[qr + d];
            (*dq)[qr + d] += dsr * k[kr + d];
            (*dk)[kr + d] += dsr * q[qr + d];
          }
        }
      }
  }
};

TEST(TrainAttentionBf16, MatchesReferenceRoundingAsTheKernel) {
  if (!UsesBf16Dot()) GTEST_SKIP() << "no avx512_bf16 (or LATHE_BF16_DOT=0)";
  const cpu::TrainKernelTable& tk = cpu::TrainBest();
  const cpu::KernelTable& kt = cpu::Best();
  double worst = 0, worst_row = 0;
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    // Odd T (a last key pair with one key, odd query pairs), odd D (a zero pair after each row), D not a
    // multiple of 16 (a partial strip), T crossing the 96-query and 128-key tiles, GQA.
    for (const Cfg& c : {Cfg{1, 1, 1, 8}, Cfg{5, 2, 1, 3}, Cfg{100, 4, 2, 20}, Cfg{150, 3, 1, 64}, Cfg{70, 2, 2, 7},
                         Cfg{301, 4, 2, 17}})
      for (int64_t window : {0, 37})
        for (int seg_mode : {0, 1, 2}) {
          std::vector<int32_t> seg(c.T);
          for (int64_t t = 0; t < c.T; ++t)
            seg[t] = seg_mode == 2 ? (int32_t)(t / 7 % 3) : (int32_t)(t < 23 ? 0 : t < 90 ? 1 : 2);
          const int32_t* segp = seg_mode ? seg.data() : nullptr;
          const int64_t nq = c.T * c.n_head * c.D, nk = c.T * c.n_kv_head * c.D;
          const std::vector<float> q = RandomVec(nq, 70, 1.5f), k = RandomVec(nk, 71, 1.5f), v = RandomVec(nk, 72),
                                   g = RandomVec(nq, 73);
          const float scale = 1.0f / std::sqrt((float)c.D);
          RefBf16Attention ref{TrainRefAttention{c, segp, scale, window}};
          const std::vector<double> qd = RoundedBf16(q), kd = RoundedBf16(k), vd = RoundedBf16(v),
                                    gd = RoundedBf16(g);
          const std::string where = "T=" + std::to_string(c.T) + " H=" + std::to_string(c.n_head) + "/" +
                                    std::to_string(c.n_kv_head) + " D=" + std::to_string(c.D) + " seg " +
                                    std::to_string(seg_mode) + " window=" + std::to_string(window) + " threads " +
                                    std::to_string(threads);
          std::vector<float> out(nq), lse(c.T * c.n_head);
          cpu::avx512bf16::FlashAttentionForward(tk, pool, out.data(), lse.data(), q.data(), k.data(), v.data(), segp,
                                                 c.T, c.n_head, c.n_kv_head, c.D, scale, window);
          std::vector<double> rout, rlse;
          ref.Forward(qd, kd, vd, &rout, &rlse);
          std::vector<double> rdq, rdk, rdv;
          ref.Backward(qd, kd, vd, gd, rout, rlse, &rdq, &rdk, &rdv);
          std::vector<float> dq(nq, 7.0f), dk(nk, 7.0f), dv(nk, 7.0f);
          cpu::avx512bf16::FlashAttentionBackward(tk, kt, pool, dq.data(), dk.data(), dv.data(), g.data(), q.data(),
                                                  k.data(), v.data(), out.data(), lse.data(), segp, c.T, c.n_head,
                                                  c.n_kv_head, c.D, scale, window);
          const double e[] = {RelErr(out, rout), RelErr(lse, rlse), RelErr(dq, rdq), RelErr(dk, rdk), RelErr(dv, rdv)};
          const double re[] = {WorstRowErr(out, rout, c.D), WorstRowErr(lse, rlse, 1), WorstRowErr(dq, rdq, c.D),
                               WorstRowErr(dk, rdk, c.D), WorstRowErr(dv, rdv, c.D)};
          const char* names[] = {"out", "lse", "dq", "dk", "dv"};
          for (int i = 0; i < 5; ++i) {
            EXPECT_LE(e[i], kBf16Limit) << names[i] << " " << where;
            EXPECT_LE(re[i], kBf16RowLimit) << names[i] << " worst row, " << where;
            worst = std::max(worst, e[i]);
            worst_row = std::max(worst_row, re[i]);
          }
        }
  }
  std::printf("bf16 attention: worst error vs the reference %.2e, worst row %.2e\n", worst, worst_row);
}

// The bf16 backward's tasks are the f32 one's (train_attention_driver.h): 1, 2 and 3 threads give the same
// bits, forward and backward (1 thread: the grouped tasks, their KeyRows transposing 16 x 16 blocks).
TEST(TrainAttentionBf16, BitsDoNotDependOnThreads) {
  if (!UsesBf16Dot()) GTEST_SKIP() << "no avx512_bf16 (or LATHE_BF16_DOT=0)";
  const Cfg c{301, 6, 2, 64};
  std::vector<int32_t> seg(c.T);
  for (int64_t t = 0; t < c.T; ++t) seg[t] = (int32_t)(t < 40 ? 0 : t < 200 ? 1 : 2);
  const int64_t nq = c.T * c.n_head * c.D, nk = c.T * c.n_kv_head * c.D;
  const std::vector<float> q = RandomVec(nq, 80, 1.5f), k = RandomVec(nk, 81, 1.5f), v = RandomVec(nk, 82),
                           g = RandomVec(nq, 83);
  std::vector<std::vector<float>> res[3];
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<float> out(nq), lse(c.T * c.n_head), dq(nq), dk(nk), dv(nk);
    FlashAttentionForwardBf16(pool, out.data(), lse.data(), q.data(), k.data(), v.data(), seg.data(), c.T, c.n_head,
                              c.n_kv_head, c.D, 0.125f);
    FlashAttentionBackwardBf16(pool, dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(), v.data(),
                               out.data(), lse.data(), seg.data(), c.T, c.n_head, c.n_kv_head, c.D, 0.125f);
    res[threads - 1] = {out, lse, dq, dk, dv};
  }
  for (int threads : {2, 3})
    for (int i = 0; i < 5; ++i)
      EXPECT_EQ(res[0][i], res[threads - 1][i]) << "threads=" << threads << " tensor " << i;
}

INSTANTIATE_TEST_SUITE_P(TiersThreads, TrainAttention,
                         ::testing::Combine(::testing::Values(IsaTier::kScalar, IsaTier::kAvx2, IsaTier::kAvx512),
                                            ::testing::Values(1, 2)),
                         [](const ::testing::TestParamInfo<std::tuple<IsaTier, int>>& info) {
                           return std::string(IsaTierName(std::get<0>(info.param))) + "_t" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace lathe::kernels
