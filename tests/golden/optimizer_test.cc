// AdamW / SGD / clip_grad_norm_ / LR schedules against torch and transformers
// (tools/ref/make_optimizer_fixture.py): 10 steps, parameter by parameter.
#include "train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/thread_pool.h"

#include "formats/safetensors.h"
#include "test_util.h"

namespace lathe::train {
namespace {

struct Fx {
  std::unique_ptr<formats::SafetensorsFile> st;
  std::vector<float> F(const std::string& name) const {
    Tensor t = st->GetTensor(name).value();
    return std::vector<float>(t.as<float>(), t.as<float>() + t.numel());
  }
  std::vector<double> D(const std::string& name) const {
    Tensor t = st->GetTensor(name).value();
    return std::vector<double>(t.as<double>(), t.as<double>() + t.numel());
  }
};

Fx Load() {
  auto st = formats::SafetensorsFile::Open(lathe::testing::SourceDir() +
                                           "/tests/golden/fixtures/optimizer/expected.safetensors");
  EXPECT_TRUE(st.ok()) << st.status().message();
  return Fx{std::move(*st)};
}

double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (double)(a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  return std::sqrt(num / den);
}

TEST(Optimizer, AdamWWithClippingAndCosineMatchesTorch) {
  Fx fx = Load();
  std::vector<std::vector<float>> p(3), g(3);
  for (int i = 0; i < 3; ++i) p[i] = fx.F("p0_" + std::to_string(i));
  std::vector<ParamRef> refs(3);
  for (int i = 0; i < 3; ++i) refs[i] = {"p" + std::to_string(i), p[i].data(), nullptr, (int64_t)p[i].size(), i != 1};
  AdamW opt(0.9, 0.999, 1e-8, 0.1);
  auto sched = LrSchedule::Make("cosine", 1e-2, 3, 10);
  ASSERT_TRUE(sched.ok());
  std::vector<double> lrs = fx.D("adamw_lr"), norms = fx.D("adamw_grad_norm");
  for (int s = 0; s < 10; ++s) {
    for (int i = 0; i < 3; ++i) {
      g[i] = fx.F("grad_" + std::to_string(s) + "_" + std::to_string(i));
      refs[i].grad = g[i].data();
    }
    EXPECT_NEAR(ClipGradNorm(refs, 1.0), norms[s], 1e-5 * norms[s]) << "step " << s;
    EXPECT_NEAR(sched->At(s), lrs[s], 1e-12) << "step " << s;
    opt.Step(refs, sched->At(s));
    for (int i = 0; i < 3; ++i) {
      EXPECT_LT(RelErr(p[i], fx.F("adamw_" + std::to_string(s) + "_" + std::to_string(i))), 1e-6)
          << "step " << s << " param " << i;
    }
  }
  EXPECT_EQ(opt.steps(), 10);
}

// Step on a thread pool (lathe train and bench train set the model's pool): the same bits as on the
// caller's thread, for a tensor split into many chunks and one too small to split.
TEST(Optimizer, AdamWOnAPoolGivesTheSameBits) {
  const std::vector<int64_t> sizes = {300001, 1000};
  std::vector<std::vector<float>> p0, g;
  uint32_t r = 7;
  auto next = [&] {
    r = r * 1664525u + 1013904223u;
    return (float)((int32_t)r) / 2147483648.0f;
  };
  for (int64_t n : sizes) {
    p0.emplace_back(n);
    g.emplace_back(n);
    for (int64_t j = 0; j < n; ++j) p0.back()[j] = next(), g.back()[j] = 0.01f * next();
  }
  std::vector<std::vector<float>> results[2];
  for (int pooled : {0, 1}) {
    ThreadPool pool(3);
    std::vector<std::vector<float>> p = p0;
    std::vector<ParamRef> refs;
    for (size_t i = 0; i < p.size(); ++i) refs.push_back({"p", p[i].data(), g[i].data(), (int64_t)p[i].size(), i == 0});
    AdamW opt(0.9, 0.999, 1e-8, 0.1);
    if (pooled) opt.SetPool(&pool);
    for (int s = 0; s < 3; ++s) opt.Step(refs, 1e-2);
    results[pooled] = p;
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_NE(results[0][i], p0[i]);
    EXPECT_EQ(results[1][i], results[0][i]) << "param " << i;
  }
}

TEST(Optimizer, SgdWithWeightDecayMatchesTorch) {
  Fx fx = Load();
  std::vector<std::vector<float>> p(3), g(3);
  std::vector<ParamRef> refs(3);
  for (int i = 0; i < 3; ++i) {
    p[i] = fx.F("p0_" + std::to_string(i));
    refs[i] = {"p", p[i].data(), nullptr, (int64_t)p[i].size(), i != 1};
  }
  Sgd opt(0.05);
  for (int s = 0; s < 10; ++s) {
    for (int i = 0; i < 3; ++i) {
      g[i] = fx.F("grad_" + std::to_string(s) + "_" + std::to_string(i));
      refs[i].grad = g[i].data();
    }
    opt.Step(refs, 0.1);
  }
  for (int i = 0; i < 3; ++i) EXPECT_LT(RelErr(p[i], fx.F("sgd_final_" + std::to_string(i))), 1e-6) << i;
}

TEST(Optimizer, SchedulesMatchTransformers) {
  Fx fx = Load();
  for (const char* name : {"linear", "cosine", "constant_with_warmup", "constant"}) {
    auto s = LrSchedule::Make(name, 1e-2, std::string(name) == "constant" ? 0 : 3, 12);
    ASSERT_TRUE(s.ok());
    std::vector<double> want = fx.D(std::string("lr_") + name);
    for (int i = 0; i < 12; ++i) EXPECT_NEAR(s->At(i), want[i], 1e-12) << name << " step " << i;
  }
  EXPECT_FALSE(LrSchedule::Make("cosin", 1e-3, 0, 10).ok());
  EXPECT_EQ(WarmupSteps(0, 0.1, 95), 10);  // ceil, as transformers
  EXPECT_EQ(WarmupSteps(7, 0.1, 95), 7);
}

}  // namespace
}  // namespace lathe::train
