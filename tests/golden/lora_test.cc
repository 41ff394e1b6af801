// LoRA at inference against PEFT (tools/ref/make_lora_fixture.py): a PEFT adapter over the random
// llama fixture gives PEFT's logits (plain and rsLoRA scaling). The same model re-laid-out with
// Meta's interleaved Q/K rows (as GGUF llama stores it) gives the same logits with the same
// adapter, which checks the B-row permutation. Bad adapters give errors naming the file.
#include "model/lora.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "formats/safetensors.h"
#include "model/load_hf.h"
#include "model/transformer.h"
#include "test_util.h"

namespace lathe::model {
namespace {

std::string Fixtures() { return lathe::testing::SourceDir() + "/tests/golden/fixtures/"; }

std::vector<float> Logits(const ModelWeights& w, const LoraAdapter* a, const std::vector<int32_t>& ids) {
  ThreadPool pool(2);
  TransformerOptions o;
  o.adapter = a;
  Transformer tf(w, pool, o);
  KvCache cache(w.config, 1, (int64_t)ids.size());
  std::vector<float> lg;
  SeqInput in{0, ids, true};
  EXPECT_TRUE(tf.Forward(cache, {&in, 1}, &lg).ok());
  return lg;
}

double MaxAbs(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, (double)std::fabs(a[i] - b[i]));
  return m;
}

class PeftLora : public ::testing::TestWithParam<std::string> {};

TEST_P(PeftLora, LogitsMatchPeft) {
  std::string name = GetParam();
  auto w = LoadHfModelDir(Fixtures() + "llama_gqa_tied/model");
  ASSERT_TRUE(w.ok()) << w.status().message();
  auto a = LoadPeftAdapter(Fixtures() + name + "/adapter", w->config);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ((*a)->rank, 4);
  auto exp = formats::SafetensorsFile::Open(Fixtures() + name + "/expected.safetensors");
  ASSERT_TRUE(exp.ok());
  Tensor ids_t = (*exp)->GetTensor("input_ids").value();
  std::vector<int32_t> ids(ids_t.as<int64_t>(), ids_t.as<int64_t>() + ids_t.numel());
  Tensor want_t = (*exp)->GetTensor("logits").value();
  std::vector<float> want(want_t.as<float>(), want_t.as<float>() + want_t.numel());
  std::vector<float> got = Logits(*w, a->get(), ids);
  EXPECT_LT(MaxAbs(got, want), 1e-4);
  // The adapter matters: without it the logits are far off.
  EXPECT_GT(MaxAbs(Logits(*w, nullptr, ids), want), 1e-2);

  // Meta layout: permute base q/k rows HF -> interleaved, switch the rope style, reload the
  // adapter for that config (its B rows get the same permutation).
  ModelWeights meta = std::move(*w);
  meta.config.rope_style = RopeStyle::kInterleaved;
  const ModelConfig& c = meta.config;
  for (auto& L : meta.layers) {
    for (auto [t, heads] : {std::pair<Tensor*, int64_t>{&L.wq, c.n_heads}, {&L.wk, c.n_kv_heads}}) {
      ASSERT_EQ(t->dtype, DType::kF32);
      const float* src = t->as<float>();
      int64_t hd = c.head_dim, in = t->shape[1];
      std::vector<float> p(t->numel());
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j = 0; j < hd / 2; ++j) {
          std::memcpy(&p[(h * hd + 2 * j) * in], &src[(h * hd + j) * in], in * 4);
          std::memcpy(&p[(h * hd + 2 * j + 1) * in], &src[(h * hd + hd / 2 + j) * in], in * 4);
        }
      *t = meta.OwnF32(std::move(p), t->shape);
    }
  }
  auto am = LoadPeftAdapter(Fixtures() + name + "/adapter", meta.config);
  ASSERT_TRUE(am.ok());
  EXPECT_LT(MaxAbs(Logits(meta, am->get(), ids), want), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PeftLora, ::testing::Values("lora_llama_gqa_tied", "rslora_llama_gqa_tied"));

TEST(PeftLoraErrors, NameTheFileAndKey) {
  auto w = LoadHfModelDir(Fixtures() + "llama_gqa_tied/model");
  ASSERT_TRUE(w.ok());
  std::string dir = ::testing::TempDir() + "/bad_adapter";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  auto write = [&](const std::string& cfg) {
    std::ofstream(dir + "/adapter_config.json") << cfg;
    std::system(("cp " + Fixtures() + "lora_llama_gqa_tied/adapter/adapter_model.safetensors " + dir).c_str());
  };
  write(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_dora": true})");
  auto r = LoadPeftAdapter(dir, w->config);
  EXPECT_NE(r.status().message().find("DoRA"), std::string::npos) << r.status().message();
  // Flags of another JSON type threw (json::value) instead of naming the key.
  for (const char* key : {"use_dora", "fan_in_fan_out", "use_rslora"}) {
    write(std::string(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, ")") + key + R"(": "yes"})");
    r = LoadPeftAdapter(dir, w->config);
    EXPECT_NE(r.status().message().find(std::string("'") + key + "' must be true or false"), std::string::npos)
        << r.status().message();
  }
  write(R"({"peft_type": 3, "r": 4, "lora_alpha": 8})");
  r = LoadPeftAdapter(dir, w->config);
  EXPECT_NE(r.status().message().find("peft_type must be LORA"), std::string::npos) << r.status().message();
  write(R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16})");  // wrong rank for the tensors
  r = LoadPeftAdapter(dir, w->config);
  EXPECT_NE(r.status().message().find("expected [8,"), std::string::npos) << r.status().message();
  write("{not json");
  r = LoadPeftAdapter(dir, w->config);
  EXPECT_NE(r.status().message().find("adapter_config.json: invalid JSON"), std::string::npos) << r.status().message();
  ModelConfig other = w->config;
  other.n_layers = 1;  // adapter has layer 1
  write(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8})");
  r = LoadPeftAdapter(dir, other);
  EXPECT_NE(r.status().message().find("does not match the model"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace lathe::model
