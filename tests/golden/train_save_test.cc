// TrainModel saving: PEFT adapters (round trip through model::LoadPeftAdapter and inference logits
// equal to the training forward, for HF and Meta-interleaved bases; byte-identical to the committed
// adapters that PEFT loaded in tools/ref/check_peft_interop.py, with PEFT's logits) and HF model
// dirs (round trip through lathe's HF loader; stories260K saved in HF layout gives transformers'
// logits). With LATHE_TRAIN_INTEROP_OUT=DIR the interop test writes its outputs to DIR instead
// (the first step of the fixture flow, see tools/ref/README.md).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/thread_pool.h"
#include "kernels/train_ops.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "train/optimizer.h"
#include "train_test_util.h"

namespace lathe::model {
namespace {

using namespace train_test;

// The deterministic adapter of the interop fixture: PEFT init of A from seed 7 (std::mt19937_64),
// B[i] = ((k * 7919) % 97 - 48) / 2400 over all B elements in parameter order.
std::unique_ptr<TrainModel> InteropModel(const ModelWeights& w, ThreadPool& pool) {
  TrainModelOptions o;
  o.lora_rank = 4;
  o.lora_alpha = 8;
  o.seed = 7;
  auto m = Make(w, pool, o);
  int64_t k = 0;
  for (const TrainableTensor& t : m->params())
    if (t.name.find("lora_B") != std::string::npos)
      for (int64_t i = 0; i < t.n; ++i, ++k) t.data[i] = (float)((k * 7919 % 97) - 48) / 2400.0f;
  return m;
}

std::string TempDir(const std::string& name) {
  std::string d = ::testing::TempDir() + "/lathe_train_save_" + name;
  std::system(("rm -rf '" + d + "'").c_str());
  return d;
}

using lathe::testing::ReadAll;
// All-position logits of each row through the inference Transformer.
std::vector<std::vector<float>> InferLogits(const ModelWeights& w, const LoraAdapter* a, const Batch& b) {
  ThreadPool pool(2);
  TransformerOptions o;
  o.adapter = a;
  o.exact_activations = true;
  Transformer tf(w, pool, o);
  std::vector<std::vector<float>> out;
  for (int64_t r = 0; r < b.B; ++r) {
    KvCache cache(w.config, 1, b.T);
    std::vector<int32_t> ids(b.ids.begin() + r * b.T, b.ids.begin() + (r + 1) * b.T);
    SeqInput in{0, ids, true};
    std::vector<float> lg;
    EXPECT_TRUE(tf.Forward(cache, {&in, 1}, &lg).ok());
    out.push_back(lg);
  }
  return out;
}

// Sum of token cross-entropies (HF shift) from full logits, in double.
double LossFromLogits(const std::vector<std::vector<float>>& logits, const Batch& b, int64_t V) {
  double s = 0;
  for (int64_t r = 0; r < b.B; ++r)
    for (int64_t t = 0; t + 1 < b.T; ++t) {
      int32_t y = b.labels[r * b.T + t + 1];
      if (y == kernels::kIgnoreLabel) continue;
      const float* row = &logits[r][t * V];
      double mx = *std::max_element(row, row + V), z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp((double)row[v] - mx);
      s += mx + std::log(z) - row[y];
    }
  return s;
}

class PeftSave : public ::testing::TestWithParam<std::string> {};

TEST_P(PeftSave, RoundTripsAndInferenceMatchesTheTrainingForward) {
  const std::string name = GetParam();
  if (name == "stories260k") LATHE_REQUIRE_FILE(StoriesBin());
  auto w = LoadBase(name);
  ASSERT_TRUE(w.ok()) << w.status().message();
  Fixture f("train_" + name);
  ThreadPool pool(2);
  TrainModelOptions o;
  o.lora_rank = 4;
  o.lora_alpha = 8;
  o.use_rslora = name == "stories260k";
  o.lora_targets = {LoraModule::kQ, LoraModule::kK, LoraModule::kV, LoraModule::kUp, LoraModule::kDown};
  auto m = Make(*w, pool, o);
  // Train a few steps so A and B both move away from their init.
  Batch b = FixtureBatch(f);
  train::AdamW opt;
  std::vector<train::ParamRef> refs;
  for (const TrainableTensor& t : m->params()) refs.push_back({t.name, t.data, t.grad, t.n, t.decay});
  for (int s = 0; s < 3; ++s) {
    m->ZeroGrad();
    ASSERT_TRUE(m->ForwardBackward(b.View(), 32).ok());
    opt.Step(refs, 1e-2);
  }
  std::string dir = TempDir(name);
  ASSERT_TRUE(m->SavePeftAdapter(dir, "base/" + name).ok());
  nlohmann::json cfg = nlohmann::json::parse(ReadAll(dir + "/adapter_config.json"));
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["task_type"], "CAUSAL_LM");
  EXPECT_EQ(cfg["r"], 4);
  EXPECT_EQ(cfg["lora_alpha"], 8);
  EXPECT_EQ(cfg["use_rslora"], o.use_rslora);
  EXPECT_EQ(cfg["bias"], "none");
  EXPECT_EQ(cfg["base_model_name_or_path"], "base/" + name);
  EXPECT_EQ(cfg["target_modules"], nlohmann::json({"q_proj", "k_proj", "v_proj", "up_proj", "down_proj"}));

  auto loaded = LoadPeftAdapter(dir, w->config);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  auto exported = m->ExportAdapter();
  ASSERT_TRUE(exported.ok());
  for (int64_t l = 0; l < w->config.n_layers; ++l)
    for (int i = 0; i < (int)LoraModule::kCount; ++i) {
      const LoraPair &x = (*loaded)->at(l, (LoraModule)i), &y = (*exported)->at(l, (LoraModule)i);
      ASSERT_EQ(x.a.data == nullptr, y.a.data == nullptr);
      if (!x.a.data) continue;
      EXPECT_EQ(x.scale, y.scale);
      EXPECT_EQ(std::memcmp(x.a.data, y.a.data, x.a.nbytes()), 0) << l << " " << i;
      EXPECT_EQ(std::memcmp(x.b.data, y.b.data, x.b.nbytes()), 0) << l << " " << i;
    }
  // In a Meta-layout base the saved q/k B rows are in HF order (different from the trained ones).
  if (w->config.rope_style == RopeStyle::kInterleaved) {
    auto st = formats::SafetensorsFile::Open(dir + "/adapter_model.safetensors");
    Tensor qb = (*st)->GetTensor("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight").value();
    EXPECT_NE(std::memcmp(qb.data, (*exported)->at(0, LoraModule::kQ).b.data, qb.nbytes()), 0);
  }
  int64_t n = 0;
  auto loss = m->Loss(b.View(), &n);
  ASSERT_TRUE(loss.ok());
  double inf = LossFromLogits(InferLogits(*w, loaded->get(), b), b, w->config.vocab_size);
  EXPECT_NEAR(inf, *loss, 1e-5 * *loss) << "inference with the saved adapter vs the training forward";
  double base_loss = LossFromLogits(InferLogits(*w, nullptr, b), b, w->config.vocab_size);
  EXPECT_GT(std::fabs(base_loss - *loss), 1e-3) << "the adapter must matter";

  // The saved adapter imported into a fresh model (continuing it, adapter_name_or_path) gives the trained model's
  // parameters and loss bit for bit; an adapter of another rank is refused.
  auto fresh = Make(*w, pool, o);
  ASSERT_TRUE(fresh->ImportAdapter(**loaded).ok());
  ASSERT_EQ(fresh->params().size(), m->params().size());
  for (size_t i = 0; i < m->params().size(); ++i)
    EXPECT_EQ(std::memcmp(fresh->params()[i].data, m->params()[i].data, sizeof(float) * m->params()[i].n), 0)
        << m->params()[i].name;
  int64_t n2 = 0;
  auto loss2 = fresh->Loss(b.View(), &n2);
  ASSERT_TRUE(loss2.ok());
  EXPECT_EQ(*loss2, *loss);
  TrainModelOptions r8 = o;
  r8.lora_rank = 8;
  EXPECT_FALSE(Make(*w, pool, r8)->ImportAdapter(**loaded).ok());
}

INSTANTIATE_TEST_SUITE_P(Bases, PeftSave,
                         ::testing::Values("llama_gqa_tied", "qwen2_bias", "stories260k", "mistral_swa", "qwen2_swa",
                                           "qwen3"));

// The committed adapters in tests/golden/fixtures/train_interop/<name>/adapter were written by
// InteropModel and loaded by PEFT (tools/ref/check_peft_interop.py), which stored its logits.
class PeftInterop : public ::testing::TestWithParam<std::string> {};

TEST_P(PeftInterop, SameBytesAsTheCommittedAdapterAndPeftLogits) {
  const std::string name = GetParam();
  if (name == "stories260k") LATHE_REQUIRE_FILE(StoriesBin());
  auto w = LoadBase(name);
  ASSERT_TRUE(w.ok()) << w.status().message();
  ThreadPool pool(2);
  auto m = InteropModel(*w, pool);
  const char* out_env = std::getenv("LATHE_TRAIN_INTEROP_OUT");
  const std::string base_name = name == "stories260k" ? "stories260K" : "tests/golden/fixtures/" + name + "/model";
  std::string dir = out_env ? std::string(out_env) + "/" + name + "/adapter" : TempDir("interop_" + name);
  ASSERT_TRUE(m->SavePeftAdapter(dir, base_name).ok());
  if (out_env) {
    // Also an HF dir of the (unchanged) full model for transformers to load.
    TrainModelOptions o;
    o.method = FinetuneMethod::kFull;
    auto full = Make(*w, pool, o);
    ASSERT_TRUE(full->SaveHfModel(std::string(out_env) + "/" + name + "/hf", false).ok());
    GTEST_SKIP() << "wrote " << dir << " for tools/ref/check_peft_interop.py";
  }
  const std::string fx = Fixtures() + "train_interop/" + name;
  for (const char* file : {"adapter_config.json", "adapter_model.safetensors"}) {
    EXPECT_EQ(ReadAll(dir + "/" + file), ReadAll(fx + "/adapter/" + file)) << file << " differs from the committed one";
  }
  auto a = LoadPeftAdapter(fx + "/adapter", w->config);
  ASSERT_TRUE(a.ok()) << a.status().message();
  Fixture f("train_interop/" + name);
  Batch b;
  b.ids = f.I32("input_ids");
  b.labels = b.ids;
  b.B = 1;
  b.T = (int64_t)b.ids.size();
  std::vector<float> want = f.F32("peft_logits");
  std::vector<float> got = InferLogits(*w, a->get(), b)[0];
  ASSERT_EQ(got.size(), want.size());
  double e = 0;
  for (size_t i = 0; i < got.size(); ++i) e = std::max(e, (double)std::fabs(got[i] - want[i]));
  EXPECT_LT(e, 1e-4);
  std::vector<float> base = f.F32("base_logits");
  double d = 0;
  for (size_t i = 0; i < got.size(); ++i) d = std::max(d, (double)std::fabs(base[i] - want[i]));
  EXPECT_GT(d, 1e-2) << "the adapter must change PEFT's logits";
  // And the training forward agrees with PEFT's loss on that sequence.
  int64_t n = 0;
  auto loss = m->Loss(b.View(), &n);
  ASSERT_TRUE(loss.ok());
  std::vector<std::vector<float>> wl = {want};
  EXPECT_NEAR(*loss, LossFromLogits(wl, b, w->config.vocab_size), 1e-5 * *loss);
}

INSTANTIATE_TEST_SUITE_P(Bases, PeftInterop, ::testing::Values("qwen2_bias", "stories260k", "qwen3", "llama_attn_bias"));

TEST(HfSave, RoundTripThroughTheHfLoaderGivesTheSameLoss) {
  auto w = LoadBase("qwen2_bias");
  ASSERT_TRUE(w.ok());
  Fixture f("train_qwen2_bias");
  Batch b = FixtureBatch(f);
  ThreadPool pool(2);
  TrainModelOptions o;
  o.method = FinetuneMethod::kFull;
  auto m = Make(*w, pool, o);
  train::AdamW opt(0.9, 0.999, 1e-8, 0.01);
  std::vector<train::ParamRef> refs;
  for (const TrainableTensor& t : m->params()) refs.push_back({t.name, t.data, t.grad, t.n, t.decay});
  for (int s = 0; s < 2; ++s) {
    m->ZeroGrad();
    ASSERT_TRUE(m->ForwardBackward(b.View(), 32).ok());
    opt.Step(refs, 1e-2);
  }
  auto trained = m->Loss(b.View(), nullptr);
  ASSERT_TRUE(trained.ok());
  for (bool bf16 : {false, true}) {
    std::string dir = TempDir(bf16 ? "hf_bf16" : "hf_f32");
    ASSERT_TRUE(m->SaveHfModel(dir, bf16).ok());
    auto w2 = LoadHfModelDir(dir);
    ASSERT_TRUE(w2.ok()) << w2.status().message();
    EXPECT_EQ(w2->config.arch, "qwen2");
    EXPECT_TRUE(w2->config.qkv_bias);
    EXPECT_EQ(w2->layers[0].wq.dtype, bf16 ? DType::kBF16 : DType::kF32);
    auto m2 = Make(*w2, pool, o);
    auto again = m2->Loss(b.View(), nullptr);
    ASSERT_TRUE(again.ok());
    if (bf16) {
      EXPECT_NEAR(*again, *trained, 1e-2 * *trained);
    } else {
      EXPECT_EQ(*again, *trained);
    }
    double orig = m->Loss(b.View(), nullptr).value();
    EXPECT_EQ(orig, *trained);
  }
  // A frozen (freeze-method) save writes the untouched layers too.
  o.method = FinetuneMethod::kFreeze;
  o.freeze_trainable_layers = 1;
  auto fz = Make(*w, pool, o);
  std::string dir = TempDir("hf_freeze");
  ASSERT_TRUE(fz->SaveHfModel(dir, false).ok());
  auto w3 = LoadHfModelDir(dir);
  ASSERT_TRUE(w3.ok());
  EXPECT_EQ(std::memcmp(w3->layers[0].wq.data, w->layers[0].wq.data, w->layers[0].wq.nbytes()), 0);
}

// Sliding windows (mistral: every layer; qwen2: layer_types / max_window_layers) are written so the
// loader reads the same window per layer back, and the reloaded model gives the same loss.
TEST(HfSave, SlidingWindowLayersSurviveTheRoundTrip) {
  for (const std::string name : {"mistral_swa", "qwen2_swa"}) {
    auto w = LoadBase(name);
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_GT(w->config.sliding_window, 0) << name;
    Fixture f("train_" + name);
    Batch b = FixtureBatch(f);
    ThreadPool pool(2);
    TrainModelOptions o;
    o.method = FinetuneMethod::kFull;
    auto m = Make(*w, pool, o);
    const std::string dir = TempDir("hf_" + name);
    ASSERT_TRUE(m->SaveHfModel(dir, false).ok());
    auto w2 = LoadHfModelDir(dir);
    ASSERT_TRUE(w2.ok()) << w2.status().message();
    for (int64_t l = 0; l < w->config.n_layers; ++l)
      EXPECT_EQ(w2->config.WindowOf(l), w->config.WindowOf(l)) << name << " layer " << l;
    auto m2 = Make(*w2, pool, o);
    EXPECT_EQ(m2->Loss(b.View(), nullptr).value(), m->Loss(b.View(), nullptr).value()) << name;
  }
}

TEST(HfSave, InterleavedStoriesSavedInHfLayoutGivesTransformersLogits) {
  LATHE_REQUIRE_FILE(StoriesBin());
  auto w = LoadBase("stories260k");
  ASSERT_TRUE(w.ok());
  ThreadPool pool(2);
  TrainModelOptions o;
  o.method = FinetuneMethod::kFull;
  auto m = Make(*w, pool, o);
  std::string dir = TempDir("hf_stories");
  ASSERT_TRUE(m->SaveHfModel(dir, false).ok());
  auto w2 = LoadHfModelDir(dir);
  ASSERT_TRUE(w2.ok()) << w2.status().message();
  EXPECT_EQ(w2->config.rope_style, RopeStyle::kHalfSplit);
  EXPECT_TRUE(w2->config.tied_embeddings);
  Fixture f("stories260k");
  Batch b;
  b.ids = f.I32("input_ids");
  b.labels = b.ids;
  b.B = 1;
  b.T = (int64_t)b.ids.size();
  std::vector<float> got = InferLogits(*w2, nullptr, b)[0];
  std::vector<float> want = f.F32("logits");
  ASSERT_EQ(got.size(), want.size());
  double e = 0;
  for (size_t i = 0; i < got.size(); ++i) e = std::max(e, (double)std::fabs(got[i] - want[i]));
  EXPECT_LT(e, 1e-4) << "transformers' logits for the HF-layout stories260K";
}

}  // namespace
}  // namespace lathe::model
