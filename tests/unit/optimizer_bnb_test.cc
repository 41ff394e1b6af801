// 8-bit and paged AdamW: loss curve vs fp32 AdamW over 200 steps, paged == unpaged with states 4x
// the resident cap (the mapping's resident bytes under cap + slack), the optim factory and the
// quantization config keys.
#include "train/optimizer_bnb.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace lathe::train {
namespace {

// Softmax regression (a tiny "LM head": 32 features -> 128 classes, 4096 weights, bitsandbytes'
// min_8bit_size) on a fixed synthetic data set. Returns the loss before each step; grads in g.
struct Problem {
  static constexpr int kIn = 32, kOut = 128, kN = 1024;
  std::vector<float> x, w_true;
  std::vector<int> y;
  Problem() {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0, 1);
    x.resize(kN * kIn);
    for (float& v : x) v = nd(rng);
    w_true.resize(kOut * kIn);
    for (float& v : w_true) v = nd(rng) * 0.5f;
    y.resize(kN);
    for (int n = 0; n < kN; ++n) {
      int best = 0;
      float bv = -1e30f;
      for (int c = 0; c < kOut; ++c) {
        float s = 0;
        for (int k = 0; k < kIn; ++k) s += w_true[c * kIn + k] * x[n * kIn + k];
        if (s > bv) bv = s, best = c;
      }
      y[n] = best;
    }
    // Half of the labels random: the loss plateaus well above 0 instead of overfitting to ~0,
    // where relative gaps between curves mean nothing.
    std::uniform_int_distribution<int> uc(0, kOut - 1);
    for (int n = 0; n < kN; n += 2) y[n] = uc(rng);
  }
  double LossAndGrad(const std::vector<float>& w, const std::vector<float>& b, std::vector<float>* gw,
                     std::vector<float>* gb) const {
    std::fill(gw->begin(), gw->end(), 0.0f);
    std::fill(gb->begin(), gb->end(), 0.0f);
    double loss = 0;
    std::vector<double> z(kOut);
    for (int n = 0; n < kN; ++n) {
      double mx = -1e300;
      for (int c = 0; c < kOut; ++c) {
        double s = b[c];
        for (int k = 0; k < kIn; ++k) s += (double)w[c * kIn + k] * x[n * kIn + k];
        z[c] = s;
        mx = std::max(mx, s);
      }
      double se = 0;
      for (int c = 0; c < kOut; ++c) se += std::exp(z[c] - mx);
      loss += std::log(se) + mx - z[y[n]];
      for (int c = 0; c < kOut; ++c) {
        const double p = std::exp(z[c] - mx) / se - (c == y[n] ? 1.0 : 0.0);
        (*gb)[c] += (float)(p / kN);
        for (int k = 0; k < kIn; ++k) (*gw)[c * kIn + k] += (float)(p * x[n * kIn + k] / kN);
      }
    }
    return loss / kN;
  }
};

std::vector<double> Train(Optimizer& opt, int steps) {
  static const Problem prob;
  std::vector<float> w(Problem::kOut * Problem::kIn, 0.0f), b(Problem::kOut, 0.0f), gw(w.size()),
      gb(b.size());
  std::vector<ParamRef> refs = {{"w", w.data(), gw.data(), (int64_t)w.size(), true},
                                {"b", b.data(), gb.data(), (int64_t)b.size(), false}};
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    losses.push_back(prob.LossAndGrad(w, b, &gw, &gb));
    opt.Step(refs, 1e-2);
  }
  return losses;
}

TEST(BnbAdamW, EightBitLossCurveWithinTwoPercentOfFp32Over200Steps) {
  AdamW ref(0.9, 0.999, 1e-8, 0.01);
  BnbAdamW::Options o;
  o.weight_decay = 0.01;
  BnbAdamW q(std::move(o));
  const std::vector<double> a = Train(ref, 200), b = Train(q, 200);
  ASSERT_TRUE(q.Is8Bit(0));   // 4096 weights: 8-bit state
  ASSERT_FALSE(q.Is8Bit(1));  // 128 biases: under min_8bit_size, 32-bit state as bitsandbytes
  double worst = 0;
  for (size_t s = 0; s < a.size(); ++s) worst = std::max(worst, std::fabs(b[s] - a[s]) / a[s]);
  std::printf("loss fp32 %.4f -> %.4f, 8-bit %.4f -> %.4f, worst relative gap %.4f\n", a[0], a.back(), b[0],
              b.back(), worst);
  EXPECT_LT(a.back(), 0.8 * a[0]);  // it trains
  EXPECT_LT(worst, 0.02);
  // 2 bytes per parameter + one f32 absmax per 256 for each moment (plus the small tensor's f32 state).
  EXPECT_NEAR(q.StateBytesPerParam(), 2.03125, 1e-9);
  EXPECT_EQ(q.StateBytes(), (size_t)(2 * 4096 + 2 * 4 * 16 + 2 * 4 * 128));
}

TEST(BnbAdamW, PagedStatesFourTimesTheCapMatchUnpagedAndStayUnderTheCap) {
  // 4 tensors of 2^19 elements: 8-bit state 4 MiB (+ absmax), 32-bit state 16 MiB; caps are 1/4.
  for (int bits : {8, 32}) {
    SCOPED_TRACE(bits);
    const int64_t n = 1 << 19;
    std::vector<std::vector<float>> p1(4), p2(4), g(4);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0, 1);
    for (int i = 0; i < 4; ++i) {
      p1[i].resize(n);
      g[i].resize(n);
      for (auto& v : p1[i]) v = nd(rng);
      p2[i] = p1[i];
    }
    std::vector<ParamRef> r1, r2;
    for (int i = 0; i < 4; ++i) {
      r1.push_back({"p", p1[i].data(), g[i].data(), n, true});
      r2.push_back({"p", p2[i].data(), g[i].data(), n, true});
    }
    const size_t state = bits == 8 ? 4 * 2 * (size_t)n : 4 * 8 * (size_t)n;
    const size_t cap = state / 4;
    BnbAdamW::Options a, b;
    a.bits = b.bits = bits;
    a.weight_decay = b.weight_decay = 0.1;
    auto pool = PagedStatePool::Create(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp", cap);
    ASSERT_TRUE(pool.ok()) << pool.status().message();
    b.pool = std::move(*pool);
    BnbAdamW plain(std::move(a)), paged(std::move(b));
    ASSERT_TRUE(paged.Prepare(r2).ok());
    EXPECT_GE(paged.pool()->mapped_bytes(), state);
    size_t max_resident = 0;
    for (int s = 0; s < 3; ++s) {
      for (int i = 0; i < 4; ++i)
        for (int64_t j = 0; j < n; ++j) g[i][j] = nd(rng) * (s + 1);
      plain.Step(r1, 1e-3);
      paged.Step(r2, 1e-3);
      max_resident = std::max(max_resident, paged.pool()->ResidentBytes());
    }
    for (int i = 0; i < 4; ++i) EXPECT_EQ(p1[i], p2[i]) << "param " << i;
    for (int i = 0; i < 4; ++i) EXPECT_EQ(plain.M(i), paged.M(i)) << "m of param " << i;
    // Slack: the region just used (up to one chunk of each state array) and partial edge pages.
    const size_t slack = (bits == 8 ? 4 : 16) * (size_t)BnbAdamW::kChunk + 64 * 4096;
    std::printf(
        "%d-bit: state %zu KiB, cap %zu KiB, max resident after a step %zu KiB (tracked peak %zu KiB)\n",
        bits, state >> 10, cap >> 10, max_resident >> 10, paged.pool()->peak_tracked_bytes() >> 10);
    EXPECT_LE(max_resident, cap + slack);
    EXPECT_LE(paged.pool()->peak_tracked_bytes(), cap + slack);
    paged.mutable_pool()->PageOutAll();
    EXPECT_LE(paged.pool()->ResidentBytes(), (size_t)16 * 4096);  // only partial edge pages may remain
    EXPECT_EQ(plain.M(0), paged.M(0));  // and the state reads back from the file
  }
}

TEST(BnbAdamW, RawStateRoundTripResumesBitIdentically) {
  const int64_t n = 5000;  // 8-bit state with a partial last block, plus a small f32-state tensor
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> w(n), b(100), gw(n), gb(100);
  for (auto& v : w) v = nd(rng);
  for (auto& v : b) v = nd(rng);
  auto grads = [&](int s) {
    std::mt19937 r(100 + s);
    std::normal_distribution<float> d(0, 1);
    for (auto& v : gw) v = d(r);
    for (auto& v : gb) v = d(r);
  };
  std::vector<ParamRef> refs = {{"w", w.data(), gw.data(), n, true}, {"b", b.data(), gb.data(), 100, false}};
  BnbAdamW::Options o1, o2;
  o1.weight_decay = o2.weight_decay = 0.1;
  BnbAdamW a(std::move(o1));
  for (int s = 0; s < 3; ++s) grads(s), a.Step(refs, 1e-2);
  // Snapshot, continue two steps; then restore the snapshot into a fresh optimizer and redo them.
  std::vector<std::vector<uint8_t>> saved;
  for (const auto& r : a.RawState()) saved.emplace_back(r.data, r.data + r.bytes);
  const std::vector<float> w3 = w, b3 = b;
  for (int s = 3; s < 5; ++s) grads(s), a.Step(refs, 1e-2);
  const std::vector<float> w5 = w, b5 = b;
  w = w3;
  b = b3;
  BnbAdamW c(std::move(o2));
  ASSERT_TRUE(c.Prepare(refs).ok());
  auto raw = c.RawState();
  ASSERT_EQ(raw.size(), saved.size());
  EXPECT_EQ(raw[0].name, "0.m_codes");
  EXPECT_EQ(raw[4].name, "1.m");
  for (size_t i = 0; i < raw.size(); ++i) {
    ASSERT_EQ(raw[i].bytes, saved[i].size());
    std::copy(saved[i].begin(), saved[i].end(), raw[i].data);
  }
  c.set_steps(3);
  for (int s = 3; s < 5; ++s) grads(s), c.Step(refs, 1e-2);
  EXPECT_EQ(w, w5);
  EXPECT_EQ(b, b5);
}

TEST(BnbAdamW, FactoryPicksTheOptimizer) {
  TrainConfig c;
  c.weight_decay = 0.05;
  c.output_dir = "/nonexistent-dir-for-test";  // falls back to $TMPDIR / /tmp for the paged file
  for (const char* name : {"adamw_torch", "adamw_hf"}) {
    c.optim = name;
    auto o = MakeOptimizer(c);
    ASSERT_TRUE(o.ok());
    EXPECT_NE(dynamic_cast<AdamW*>(o->get()), nullptr) << name;
  }
  c.optim = "sgd";
  EXPECT_NE(dynamic_cast<Sgd*>(MakeOptimizer(c)->get()), nullptr);
  c.optim = "adamw_8bit";
  auto q = MakeOptimizer(c);
  ASSERT_TRUE(q.ok());
  auto* b = dynamic_cast<BnbAdamW*>(q->get());
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->pool(), nullptr);
  EXPECT_LT(b->StateBytesPerParam(), 2.1);
  c.optim = "paged_adamw_8bit";
  c.optim_resident_mb = 3;
  auto pq = MakeOptimizer(c);
  ASSERT_TRUE(pq.ok()) << pq.status().message();
  b = dynamic_cast<BnbAdamW*>(pq->get());
  ASSERT_NE(b, nullptr);
  ASSERT_NE(b->pool(), nullptr);
  EXPECT_EQ(b->pool()->cap_bytes(), (size_t)3 << 20);
  c.optim = "paged_adamw_32bit";
  auto p32 = MakeOptimizer(c);  // kept alive: b points into it
  ASSERT_TRUE(p32.ok());
  b = dynamic_cast<BnbAdamW*>(p32->get());
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->StateBytesPerParam(), 8.0);
  c.optim = "adafactor";
  auto bad = MakeOptimizer(c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("optim"), std::string::npos);
}

TEST(TrainConfigQuant, KeysAliasesAndBaseDType) {
  auto c = ParseTrainConfig(
      "model_name_or_path: m\noutput_dir: o\ndataset: d\nquantization_bit: 4\nquantization_type: fp4\n"
      "double_quantization: false\noptim: paged_adamw_8bit\noptim_resident_mb: 64\n",
      "cfg.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->quantization_bit, 4);
  EXPECT_EQ(c->quantization_type, "fp4");
  EXPECT_FALSE(c->double_quantization);
  EXPECT_EQ(c->optim_resident_mb, 64);
  DType t;
  ASSERT_TRUE(QuantizedBaseDType(*c, &t));
  EXPECT_EQ(t, DType::kFP4);
  auto a = ParseTrainConfig(
      "quantization_bit: 4\nbnb_4bit_quant_type: nf4\nbnb_4bit_use_double_quant: true\n", "a.yaml");
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(QuantizedBaseDType(*a, &t));
  EXPECT_EQ(t, DType::kNF4DQ);
  auto e = ParseTrainConfig("quantization_bit: 8\n", "e.yaml");
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE(QuantizedBaseDType(*e, &t));
  EXPECT_EQ(t, DType::kI8Row);
  auto none = ParseTrainConfig("optim: adamw_8bit\n", "n.yaml");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(QuantizedBaseDType(*none, &t));
  auto bad = ParseTrainConfig("quantization_bit: 3\n", "b.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("quantization_bit"), std::string::npos) << bad.status().message();
  auto bad_type = ParseTrainConfig("bnb_4bit_quant_type: nf5\n", "b.yaml");
  ASSERT_FALSE(bad_type.ok());
  EXPECT_NE(bad_type.status().message().find("nf4"), std::string::npos) << bad_type.status().message();
  EXPECT_FALSE(ParseTrainConfig("optim_resident_mb: -1\n", "b.yaml").ok());
  // The spelling on the command line.
  TrainConfig o;
  ASSERT_TRUE(ApplyOverrides(&o, {{"--optim-resident-mb", "128"}, {"--quantization-bit", "8"}}).ok());
  EXPECT_EQ(o.optim_resident_mb, 128);
  EXPECT_EQ(o.quantization_bit, 8);
}

}  // namespace
}  // namespace lathe::train
