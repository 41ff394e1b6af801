// TrainModel against PyTorch + PEFT (tools/ref/make_train_fixture.py, float64 references): loss and
// the gradient of every trainable tensor for LoRA (all 7 targets, plain and rsLoRA, packed rows with
// segment ids, sliding-window attention) and full fine-tuning (tied head, qwen2 biases), on the random HF fixtures and on
// stories260K (Meta interleaved q/k), and the losses of 10 AdamW steps with clipping.
#include <gtest/gtest.h>

#include "core/thread_pool.h"
#include "train/optimizer.h"
#include "train_test_util.h"

namespace lathe::model {
namespace {

using namespace train_test;

// Measured f32 vs f64 budgets are ~1e-6 (MANIFEST.json); these limits leave room for summation order.
constexpr double kLossRel = 1e-5;
constexpr double kGradErr = 1e-4;

std::vector<train::ParamRef> Refs(const TrainModel& m) {
  std::vector<train::ParamRef> r;
  for (const TrainableTensor& t : m.params()) r.push_back({t.name, t.data, t.grad, t.n, t.decay});
  return r;
}

TrainModelOptions LoraOptions(bool rslora = false) {
  TrainModelOptions o;
  o.method = FinetuneMethod::kLora;
  o.lora_rank = 4;
  o.lora_alpha = 8;
  o.use_rslora = rslora;
  return o;
}

// Checks loss and every gradient of m against "<prefix>grad.<name>" after one ForwardBackward.
void CheckGradients(TrainModel& m, const Fixture& f, const Batch& b, const std::string& prefix,
                    const std::string& n_name, bool sparse_embed = false) {
  const double n = f.F64(n_name.empty() ? "n_targets" : n_name);
  m.ZeroGrad();
  auto loss = m.ForwardBackward(b.View(), n);
  ASSERT_TRUE(loss.ok()) << loss.status().message();
  double want = f.F64(prefix + "loss_sum");
  EXPECT_NEAR(*loss, want, kLossRel * std::fabs(want)) << prefix;
  int64_t n_targets = 0;
  auto l2 = m.Loss(b.View(), &n_targets);
  ASSERT_TRUE(l2.ok());
  EXPECT_EQ(n_targets, (int64_t)n);
  EXPECT_NEAR(*l2, want, kLossRel * std::fabs(want));
  double worst = 0;
  std::string worst_name;
  for (const TrainableTensor& t : m.params()) {
    std::vector<float> got = ToHfLayout(t, t.grad, m.config());
    std::vector<float> exp = f.F32(prefix + "grad." + t.name);
    if (sparse_embed && t.name == "model.embed_tokens.weight") {
      // Only the rows of tokens in the batch are stored; the others must be exactly zero.
      std::vector<int32_t> rows = f.I32("full.embed_rows");
      const int64_t C = t.shape[1];
      std::vector<float> sel;
      std::vector<bool> used(t.shape[0]);
      for (int32_t r : rows) {
        sel.insert(sel.end(), got.begin() + r * C, got.begin() + (r + 1) * C);
        used[r] = true;
      }
      for (int64_t r = 0; r < t.shape[0]; ++r) {
        if (used[r]) continue;
        for (int64_t j = 0; j < C; ++j) ASSERT_EQ(got[r * C + j], 0.0f) << "row " << r;
      }
      got = sel;
    }
    ASSERT_EQ(got.size(), exp.size()) << t.name;
    double e = NormErr(got.data(), exp.data(), (int64_t)exp.size());
    EXPECT_LT(e, kGradErr) << t.name;
    if (e > worst) worst = e, worst_name = t.name;
  }
  std::printf("[ %s ] loss %.8g (ref %.8g), worst grad normalized error %.3g (%s)\n", prefix.c_str(), *loss, want,
              worst, worst_name.c_str());
}

// The 10-step AdamW trajectory (lr 1e-3, wd 0.01 except norms/biases, clip 1.0) of the fixture.
void CheckAdamW(TrainModel& m, const Fixture& f, const Batch& b, const std::string& key) {
  std::vector<float> want = f.F32(key);
  const double n = f.F64("n_targets");
  train::AdamW opt(0.9, 0.999, 1e-8, 0.01);
  auto refs = Refs(m);
  double worst = 0;
  for (size_t s = 0; s < want.size(); ++s) {
    m.ZeroGrad();
    auto loss = m.ForwardBackward(b.View(), n);
    ASSERT_TRUE(loss.ok());
    double got = *loss / n;
    EXPECT_NEAR(got, want[s], 2e-4) << key << " step " << s;
    worst = std::max(worst, std::fabs(got - want[s]));
    train::ClipGradNorm(refs, 1.0);
    opt.Step(refs, 1e-3);
  }
  EXPECT_LT(want.back(), want.front() - 1e-3) << "the reference trajectory should descend";
  std::printf("[ %s ] 10 AdamW steps: %.6f -> %.6f, max |loss diff| %.3g\n", key.c_str(), want.front(), want.back(),
              worst);
}

class TrainLora : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainLora, LossGradientsAndAdamWMatchPeft) {
  const std::string name = GetParam();
  if (name == "stories260k") LATHE_REQUIRE_FILE(StoriesBin());
  auto w = LoadBase(name);
  ASSERT_TRUE(w.ok()) << w.status().message();
  Fixture f("train_" + name);
  ASSERT_TRUE(f.ok());
  ThreadPool pool(2);
  auto m = Make(*w, pool, LoraOptions());
  ASSERT_TRUE(m);
  EXPECT_EQ(m->params().size(), (size_t)(w->config.n_layers * 14));
  SetParams(*m, f, "lora.init.");
  Batch b = FixtureBatch(f);
  CheckGradients(*m, f, b, "lora.", "");
  if (f.Has("rslora.loss_sum")) {
    auto rs = Make(*w, pool, LoraOptions(true));
    SetParams(*rs, f, "lora.init.");
    CheckGradients(*rs, f, b, "rslora.", "");
  }
  if (f.Has("packed.loss_sum")) {
    CheckGradients(*m, f, FixtureBatch(f, "packed_ids", "packed_labels", "packed_seg"), "packed.", "packed.n_targets");
  }
  SetParams(*m, f, "lora.init.");
  CheckAdamW(*m, f, b, "lora.adamw_losses");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TrainLora,
                         ::testing::Values("llama_gqa_tied", "qwen2_bias", "llama_gqa4_untied", "stories260k",
                                           "mistral_swa", "qwen2_swa", "qwen3", "llama_attn_bias", "qwen3_yarn"));

class TrainFull : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainFull, LossAndEveryGradientMatchTorch) {
  const std::string name = GetParam();
  auto w = LoadBase(name);
  ASSERT_TRUE(w.ok()) << w.status().message();
  Fixture f("train_full_" + name);
  ASSERT_TRUE(f.ok());
  ThreadPool pool(2);
  TrainModelOptions o;
  o.method = FinetuneMethod::kFull;
  auto m = Make(*w, pool, o);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->trainable_count(), w->config.ParamCount());
  Batch b = FixtureBatch(f);
  CheckGradients(*m, f, b, "full.", "", /*sparse_embed=*/!w->config.tied_embeddings);
  if (f.Has("full.adamw_losses")) CheckAdamW(*m, f, b, "full.adamw_losses");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TrainFull,
                         ::testing::Values("llama_gqa_tied", "qwen2_bias", "qwen3", "llama_attn_bias"));

}  // namespace
}  // namespace lathe::model
