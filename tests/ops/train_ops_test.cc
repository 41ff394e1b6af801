// RMSNorm, SwiGLU, RoPE and embedding forward/backward (train_ops.h): every tier against the
// scalar reference in float, and every backward against central finite differences in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/train_dispatch.h"
#include "kernels/cpu/train_reference.h"
#include "kernels/train_ops.h"
#include "ops_test_util.h"
#include "train_test_util.h"

namespace lathe::kernels {
namespace {

using testing::FiniteDiffGrad;
using testing::RandomVec;
using testing::RelErr;
using testing::ToDouble;

// Fast path vs float reference: summation order and the polynomial exp (~2e-7) differ.
constexpr double kRefLimit = 2e-6;
// Float backward vs double finite differences: float rounding of the backward (~1e-7 per op,
// growing with C) plus the O(h^2) and cancellation error of the difference (~1e-9 here).
constexpr double kFdLimit = 2e-6;

class TrainOpsTier : public ::testing::TestWithParam<IsaTier> {};

TEST_P(TrainOpsTier, RmsNormMatchesReference) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(GetParam());
  // C = 1 is left out: there dx is ~eps / x^3, pure cancellation, so no relative limit fits.
  for (int64_t C : {3, 7, 8, 15, 16, 17, 33, 100, 576}) {
    const int64_t T = 3;
    const std::vector<float> x = RandomVec(T * C, 1, 3.0f), w = RandomVec(C, 2), dout = RandomVec(T * C, 3);
    std::vector<float> out(T * C), rstd(T), ref_out(T * C), ref_rstd(T);
    train_ref::RmsNormForward<float>(ref_out.data(), ref_rstd.data(), x.data(), w.data(), T, C, 1e-5f);
    tk.rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), T, C, 1e-5f);
    EXPECT_LE(RelErr(out, ref_out), kRefLimit) << C;
    EXPECT_LE(RelErr(rstd, ref_rstd), kRefLimit) << C;
    std::vector<float> dx(T * C), dw = RandomVec(C, 4), ref_dx(T * C), ref_dw = dw;
    train_ref::RmsNormBackward<float>(ref_dx.data(), ref_dw.data(), dout.data(), x.data(), w.data(),
                                      ref_rstd.data(), T, C);
    tk.rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), T, C);
    EXPECT_LE(RelErr(dx, ref_dx), kRefLimit) << C;
    EXPECT_LE(RelErr(dw, ref_dw), kRefLimit) << C;
  }
}

TEST_P(TrainOpsTier, RmsNormBackwardMatchesFiniteDifferences) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(GetParam());
  for (int64_t C : {3, 9, 20}) {
    const int64_t T = 3;
    const double eps = 1e-5;
    const std::vector<float> x = RandomVec(T * C, 5, 2.0f), w = RandomVec(C, 6), g = RandomVec(T * C, 7);
    const std::vector<double> xd = ToDouble(x), wd = ToDouble(w), gd = ToDouble(g);
    auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
      std::vector<double> out(T * C), rstd(T);
      train_ref::RmsNormForward<double>(out.data(), rstd.data(), xx.data(), ww.data(), T, C, eps);
      return testing::Dot(out, gd);
    };
    const std::vector<double> fd_dx = FiniteDiffGrad(xd, [&](const std::vector<double>& v) { return loss(v, wd); });
    const std::vector<double> fd_dw = FiniteDiffGrad(wd, [&](const std::vector<double>& v) { return loss(xd, v); });
    std::vector<float> out(T * C), rstd(T), dx(T * C), dw(C, 0.0f);
    tk.rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), T, C, (float)eps);
    tk.rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), T, C);
    EXPECT_LE(RelErr(dx, fd_dx), kFdLimit) << C;
    EXPECT_LE(RelErr(dw, fd_dw), kFdLimit) << C;
  }
}

TEST_P(TrainOpsTier, SwiGluMatchesReference) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(GetParam());
  for (int64_t n : {1, 3, 7, 8, 9, 16, 17, 100, 1536}) {
    std::vector<float> gate = RandomVec(n, 8, 4.0f);
    if (n > 4) {
      gate[0] = 95.0f;   // exp(-g) underflows
      gate[1] = -95.0f;  // exp(-g) overflows
      gate[2] = 0.0f;
    }
    const std::vector<float> up = RandomVec(n, 9), dout = RandomVec(n, 10);
    std::vector<float> out(n), ref(n);
    train_ref::SwiGluForward<float>(ref.data(), gate.data(), up.data(), n);
    tk.swiglu_forward(out.data(), gate.data(), up.data(), n);
    EXPECT_LE(RelErr(out, ref), kRefLimit) << n;
    std::vector<float> dg(n), du(n), ref_dg(n), ref_du(n);
    train_ref::SwiGluBackward<float>(ref_dg.data(), ref_du.data(), dout.data(), gate.data(), up.data(), n);
    tk.swiglu_backward(dg.data(), du.data(), dout.data(), gate.data(), up.data(), n);
    EXPECT_LE(RelErr(dg, ref_dg), kRefLimit) << n;
    EXPECT_LE(RelErr(du, ref_du), kRefLimit) << n;
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(dg[i]) && std::isfinite(out[i])) << i;
  }
}

// The AVX-512 tier's SwiGLU runs the AVX2 one's operations on 16 lanes (the AVX2 kernel takes the last
// n % 16): the same bits, tails and the exp's clamps included, so a run's bits do not depend on the tier.
TEST_P(TrainOpsTier, SwiGluBitsMatchAvx2) {
  LATHE_REQUIRE_TIER(GetParam());
  LATHE_REQUIRE_TIER(IsaTier::kAvx2);
  if (GetParam() == IsaTier::kScalar) GTEST_SKIP() << "the scalar reference uses std::exp";
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(GetParam());
  const cpu::TrainKernelTable& t2 = cpu::TrainKernelsFor(IsaTier::kAvx2);
  for (int64_t n = 1; n <= 1600; n += n < 70 ? 1 : 511) {
    std::vector<float> gate = RandomVec(n, 30 + (uint32_t)n, 6.0f);
    if (n > 20) gate[3] = 95.0f, gate[5] = -95.0f, gate[18] = 0.0f, gate[19] = -87.5f;
    const std::vector<float> up = RandomVec(n, 31, 2.0f), dout = RandomVec(n, 32);
    std::vector<float> out(n), want(n), dg(n), du(n), want_dg(n), want_du(n);
    tk.swiglu_forward(out.data(), gate.data(), up.data(), n);
    t2.swiglu_forward(want.data(), gate.data(), up.data(), n);
    tk.swiglu_backward(dg.data(), du.data(), dout.data(), gate.data(), up.data(), n);
    t2.swiglu_backward(want_dg.data(), want_du.data(), dout.data(), gate.data(), up.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], want[i]) << IsaTierName(GetParam()) << " n=" << n << " at " << i;
      ASSERT_EQ(dg[i], want_dg[i]) << IsaTierName(GetParam()) << " n=" << n << " at " << i;
      ASSERT_EQ(du[i], want_du[i]) << IsaTierName(GetParam()) << " n=" << n << " at " << i;
    }
  }
}

// The softmax helpers (the attention's row ones, the loss's logsumexp and column ones) on the AVX-512 tier are the
// AVX2 ones on 16 lanes: the same bits for every length (16- and 8-lane blocks, libm tails), shifts that drive exp
// into its clamps and subnormals, and -inf scores (masked keys), so a run's bits do not depend on the tier.
TEST_P(TrainOpsTier, SoftmaxHelpersBitsMatchAvx2) {
  LATHE_REQUIRE_TIER(GetParam());
  LATHE_REQUIRE_TIER(IsaTier::kAvx2);
  if (GetParam() == IsaTier::kScalar) GTEST_SKIP() << "the scalar reference uses std::exp";
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(GetParam());
  const cpu::TrainKernelTable& t2 = cpu::TrainKernelsFor(IsaTier::kAvx2);
  const float inf = std::numeric_limits<float>::infinity();
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (int64_t n = 1; n <= 300; n += n < 70 ? 1 : 37) {
    std::vector<float> x = RandomVec(n, 40 + (uint32_t)n, 8.0f);
    if (n > 20 && n % 3 == 0) x[2] = -inf, x[7] = 90.0f, x[17] = -100.0f;  // (one huge term hides the order of the rest)
    const std::vector<float> p = RandomVec(n, 41), m = RandomVec(n, 42, 8.0f), s0 = RandomVec(n, 43);
    SCOPED_TRACE(n);
    EXPECT_EQ(tk.row_max(x.data(), n), t2.row_max(x.data(), n));
    EXPECT_EQ(tk.logsumexp(x.data(), n), t2.logsumexp(x.data(), n));
    for (float shift : {1.5f, 95.0f, -3.0f}) {
      std::vector<float> a = x, b = x;
      EXPECT_EQ(tk.exp_shift_sum(a.data(), n, shift), t2.exp_shift_sum(b.data(), n, shift)) << shift;
      EXPECT_TRUE(same(a, b)) << "exp_shift_sum " << shift;
      a = x, b = x;
      tk.exp_shift_scale(a.data(), n, shift, 0.37f);
      t2.exp_shift_scale(b.data(), n, shift, 0.37f);
      EXPECT_TRUE(same(a, b)) << "exp_shift_scale " << shift;
    }
    std::vector<float> a = x, b = x;
    tk.softmax_grad(a.data(), p.data(), n, 0.3f, 0.125f);
    t2.softmax_grad(b.data(), p.data(), n, 0.3f, 0.125f);
    EXPECT_TRUE(same(a, b)) << "softmax_grad";
    a = m, b = m;
    tk.col_max(a.data(), x.data(), n);
    t2.col_max(b.data(), x.data(), n);
    EXPECT_TRUE(same(a, b)) << "col_max";
    a = s0, b = s0;
    tk.col_exp_sum(a.data(), x.data(), m.data(), n);
    t2.col_exp_sum(b.data(), x.data(), m.data(), n);
    EXPECT_TRUE(same(a, b)) << "col_exp_sum";
    a = x, b = x;
    tk.col_exp_scale(a.data(), m.data(), 0.5f, n);
    t2.col_exp_scale(b.data(), m.data(), 0.5f, n);
    EXPECT_TRUE(same(a, b)) << "col_exp_scale";
  }
}

TEST_P(TrainOpsTier, SwiGluBackwardMatchesFiniteDifferences) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(GetParam());
  const int64_t n = 37;
  const std::vector<float> gate = RandomVec(n, 11, 3.0f), up = RandomVec(n, 12), g = RandomVec(n, 13);
  const std::vector<double> gd = ToDouble(gate), ud = ToDouble(up), wd = ToDouble(g);
  auto loss = [&](const std::vector<double>& gg, const std::vector<double>& uu) {
    std::vector<double> out(n);
    train_ref::SwiGluForward<double>(out.data(), gg.data(), uu.data(), n);
    return testing::Dot(out, wd);
  };
  const auto fd_dg = FiniteDiffGrad(gd, [&](const std::vector<double>& v) { return loss(v, ud); });
  const auto fd_du = FiniteDiffGrad(ud, [&](const std::vector<double>& v) { return loss(gd, v); });
  std::vector<float> dg(n), du(n);
  tk.swiglu_backward(dg.data(), du.data(), g.data(), gate.data(), up.data(), n);
  EXPECT_LE(RelErr(dg, fd_dg), kFdLimit);
  EXPECT_LE(RelErr(du, fd_du), kFdLimit);
}

INSTANTIATE_TEST_SUITE_P(Tiers, TrainOpsTier, ::testing::Values(IsaTier::kScalar, IsaTier::kAvx2, IsaTier::kAvx512),
                         testing::TierParamName);

// The flash-attention row helpers against double: odd lengths cover the 16- and 8-lane loops and
// the scalar tails; a -inf score must give exactly 0 after exp only through the callers' masking,
// so here inputs stay finite. exp is the ~2e-7 polynomial on AVX2.
TEST_P(TrainOpsTier, AttentionRowHelpersMatchDouble) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(GetParam());
  for (int64_t n : {1, 5, 8, 15, 16, 23, 33, 128}) {
    const std::vector<float> x = RandomVec(n, 70 + (uint64_t)n, 4.0f), p = RandomVec(n, 90 + (uint64_t)n);
    double want_max = x[0];
    for (float v : x) want_max = std::max(want_max, (double)v);
    EXPECT_EQ(tk.row_max(x.data(), n), (float)want_max) << "n=" << n;
    const float shift = 1.25f;
    std::vector<float> e = x;
    const float sum = tk.exp_shift_sum(e.data(), n, shift);
    double want_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double w = std::exp((double)x[i] - shift);
      want_sum += w;
      EXPECT_NEAR(e[i], w, 1e-6 * w) << "n=" << n << " i=" << i;
    }
    EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum) << "n=" << n;
    std::vector<float> ds = x;
    tk.softmax_grad(ds.data(), p.data(), n, 0.3f, 0.125f);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_NEAR(ds[i], (double)p[i] * ((double)x[i] - 0.3) * 0.125, 1e-6) << "n=" << n << " i=" << i;
  }
  // n = 0 is a no-op for the sum and the gradient (a row with no allowed key in the tile).
  float z = 3.0f;
  EXPECT_EQ(tk.exp_shift_sum(&z, 0, 0.0f), 0.0f);
  tk.softmax_grad(&z, &z, 0, 1.0f, 1.0f);
  EXPECT_EQ(z, 3.0f);
}

// The forward's W^T strip packing: every element from its transposed source position, zero
// padding past nj, for nl and nj across the 8 x 8 block edges and a source row stride > nl; as a plain
// strip (rows 16 floats apart) and as one strip of a 48-column interleaved micro-panel (rows 48 apart,
// the other 32 floats of each row untouched).
TEST_P(TrainOpsTier, PackStripTransposedMatchesDefinition) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(GetParam());
  const int64_t ld = 43;
  const std::vector<float> src = testing::RandomVec(16 * ld, 61);
  for (int64_t ldo : {(int64_t)cpu::kGemmTileC, (int64_t)48})
    for (int64_t nl : {1, 7, 8, 9, 16, 17, 40})
      for (int nj = 1; nj <= cpu::kGemmTileC; ++nj) {
        std::vector<float> bs(nl * ldo, 99.0f);
        tk.pack_strip_t(bs.data(), ldo, src.data(), ld, nl, nj);
        for (int64_t l = 0; l < nl; ++l)
          for (int64_t j = 0; j < ldo; ++j)
            ASSERT_EQ(bs[l * ldo + j], j >= cpu::kGemmTileC ? 99.0f : j < nj ? src[j * ld + l] : 0.0f)
                << "ldo " << ldo << " nl " << nl << " nj " << nj << " l " << l << " j " << j;
      }
}

// AdamW: every tier gives the bits of torch.optim.AdamW's f32 arithmetic written out here (this
// file is built without FMA, so nothing below is contracted), over several steps so that m and v
// carry state, with and without weight decay, for lengths around the 8-lane width.
TEST_P(TrainOpsTier, AdamWUpdateMatchesTorchArithmeticBitForBit) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(GetParam());
  for (int64_t n : {1, 7, 8, 9, 17, 1000}) {
    for (float decay : {1.0f, 0.9999f}) {
      std::vector<float> p = RandomVec(n, 5), m(n, 0.0f), v(n, 0.0f);
      std::vector<float> rp = p, rm = m, rv = v;
      for (int step = 1; step <= 4; ++step) {
        std::vector<float> g = RandomVec(n, 10 + step, step == 3 ? 1e-4f : 1.0f);
        const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
        const AdamWCoefs k{decay, b1, b2, (float)(1e-3 / (1.0 - std::pow(0.9, step))),
                           (float)std::sqrt(1.0 - std::pow(0.999, step)), eps};
        tk.adamw_update(p.data(), m.data(), v.data(), g.data(), n, k);
        for (int64_t j = 0; j < n; ++j) {
          rp[j] *= k.decay;
          rm[j] += (g[j] - rm[j]) * (1.0f - b1);
          const float gg = (1.0f - b2) * g[j];
          const float vb = rv[j] * b2;
          rv[j] = vb + gg * g[j];
          const float denom = std::sqrt(rv[j]) / k.bc2_sqrt + k.eps;
          const float upd = k.step_size * (rm[j] / denom);
          rp[j] -= upd;
        }
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(std::memcmp(&p[j], &rp[j], 4), 0) << "n " << n << " step " << step << " p[" << j << "] " << p[j]
                                                      << " vs " << rp[j];
          ASSERT_EQ(std::memcmp(&m[j], &rm[j], 4), 0) << "n " << n << " step " << step << " m[" << j << "]";
          ASSERT_EQ(std::memcmp(&v[j], &rv[j], 4), 0) << "n " << n << " step " << step << " v[" << j << "]";
        }
      }
    }
  }
}

// RoPE and the embedding have one implementation for all tiers.
TEST_P(TrainOpsTier, Bf16RoundingAndCopiesMatchScalarBitForBit) {
  LATHE_REQUIRE_TIER(GetParam());
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(GetParam());
  // Random values over many exponents, exact ties (both parities of the kept lsb), values that
  // round up into the next exponent / to infinity, zeros, denormals, infinities and NaNs.
  std::vector<float> x;
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x3f808000u, 0x3f818000u,
                                0x3f807fffu, 0x3f7fffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,
                                0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x00008000u, 0x00018000u};
  uint32_t s = 12345;
  for (int i = 0; i < 1000; ++i) {
    s = s * 1664525u + 1013904223u;
    bits.push_back(s);
    bits.push_back((s & 0xffff0000u) | 0x8000u);  // a tie
  }
  for (uint32_t b : bits) {
    float f;
    std::memcpy(&f, &b, 4);
    x.push_back(f);
  }
  for (int64_t n : {(int64_t)x.size(), (int64_t)7, (int64_t)9, (int64_t)17}) {
    std::vector<float> out(n, 1.0f);
    tk.round_bf16(out.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t want = (uint32_t)F32ToBF16(x[i]) << 16;
      uint32_t got;
      std::memcpy(&got, &out[i], 4);
      ASSERT_EQ(got, want) << "input bits 0x" << std::hex << bits[i];
    }
    // The bf16 copies of saved activations: the same rounding kept as 16 bits, and back exactly.
    std::vector<uint16_t> h(n, 0x1234);
    std::vector<float> back(n, 1.0f);
    tk.to_bf16(h.data(), x.data(), n);
    tk.from_bf16(back.data(), h.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(h[i], F32ToBF16(x[i])) << "input bits 0x" << std::hex << bits[i];
      uint32_t got;
      std::memcpy(&got, &back[i], 4);
      ASSERT_EQ(got, (uint32_t)h[i] << 16) << "bf16 0x" << std::hex << h[i];
    }
  }
  // In place.
  std::vector<float> y = x;
  RoundToBf16(y.data(), y.data(), (int64_t)y.size());
  for (size_t i = 0; i < y.size(); ++i) {
    uint32_t got;
    std::memcpy(&got, &y[i], 4);
    ASSERT_EQ(got, (uint32_t)F32ToBF16(x[i]) << 16) << i;
  }
}

TEST(TrainOps, RopeMatchesReferenceAndFiniteDifferences) {
  const int64_t T = 3;
  const int n_head = 2;
  for (int head_dim : {2, 8, 14}) {
    const int half = head_dim / 2;
    std::vector<float> cos(T * half), sin(T * half);
    for (int64_t t = 0; t < T; ++t)
      for (int i = 0; i < half; ++i) {
        const double ang = (t + 5) * std::pow(10000.0, -2.0 * i / head_dim);
        cos[t * half + i] = (float)std::cos(ang);
        sin[t * half + i] = (float)std::sin(ang);
      }
    for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalfSplit}) {
      const int64_t n = T * n_head * head_dim;
      const std::vector<float> x = RandomVec(n, 14), g = RandomVec(n, 15);
      std::vector<float> out(n), ref(n), inplace = x;
      train_ref::Rope<float>(ref.data(), x.data(), cos.data(), sin.data(), T, n_head, head_dim, layout, 1);
      RopeForward(out.data(), x.data(), cos.data(), sin.data(), T, n_head, head_dim, layout);
      EXPECT_LE(RelErr(out, ref), kRefLimit) << head_dim;
      RopeForward(inplace.data(), inplace.data(), cos.data(), sin.data(), T, n_head, head_dim, layout);
      EXPECT_LE(RelErr(inplace, ref), kRefLimit) << head_dim;
      const std::vector<double> gd = ToDouble(g);
      const auto fd = FiniteDiffGrad(ToDouble(x), [&](const std::vector<double>& v) {
        std::vector<double> o(n);
        train_ref::Rope<double>(o.data(), v.data(), cos.data(), sin.data(), T, n_head, head_dim, layout, 1);
        return testing::Dot(o, gd);
      });
      std::vector<float> dx = g;  // in place: dx aliases dout
      RopeBackward(dx.data(), dx.data(), cos.data(), sin.data(), T, n_head, head_dim, layout);
      EXPECT_LE(RelErr(dx, fd), kFdLimit) << head_dim;
    }
  }
}

TEST(TrainOps, EmbeddingMatchesReferenceAndFiniteDifferences) {
  const int64_t V = 5, C = 7, T = 6;
  const std::vector<int32_t> tokens = {3, 0, 3, 4, 3, 1};  // repeats must accumulate
  const std::vector<float> wte = RandomVec(V * C, 16), g = RandomVec(T * C, 17);
  std::vector<float> out(T * C), ref(T * C);
  train_ref::EmbeddingForward<float>(ref.data(), tokens.data(), wte.data(), T, C);
  EmbeddingForward(out.data(), tokens.data(), wte.data(), T, C);
  EXPECT_EQ(out, ref);
  std::vector<float> dw = RandomVec(V * C, 18), ref_dw = dw;
  train_ref::EmbeddingBackward<float>(ref_dw.data(), g.data(), tokens.data(), T, C);
  EmbeddingBackward(dw.data(), g.data(), tokens.data(), T, C);
  EXPECT_LE(RelErr(dw, ref_dw), kRefLimit);
  const std::vector<double> gd = ToDouble(g);
  const auto fd = FiniteDiffGrad(ToDouble(wte), [&](const std::vector<double>& v) {
    std::vector<double> o(T * C);
    train_ref::EmbeddingForward<double>(o.data(), tokens.data(), v.data(), T, C);
    return testing::Dot(o, gd);
  });
  std::vector<float> dz(V * C, 0.0f);
  EmbeddingBackward(dz.data(), g.data(), tokens.data(), T, C);
  EXPECT_LE(RelErr(dz, fd), kFdLimit);
}

}  // namespace
}  // namespace lathe::kernels
