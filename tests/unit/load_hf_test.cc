// HF folder loader: tiny random Llama (bf16, llama3 rope scaling) and sharded Qwen2 (f16, tied,
// qkv bias) made by tools/ref/make_format_fixtures.py, config.json variants, and error messages.
#include "model/load_hf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "test_util.h"

namespace lathe::model {
namespace {

using ::lathe::testing::FormatsFixture;

// Temp folders, removed at exit.
struct TempDirs {
  ~TempDirs() {
    for (const std::string& d : dirs) std::filesystem::remove_all(d);
  }
  std::string Make() {
    std::string dir = ::testing::TempDir() + "lathe_hf_XXXXXX";
    EXPECT_NE(mkdtemp(dir.data()), nullptr);
    dirs.push_back(dir);
    return dir;
  }
  std::vector<std::string> dirs;
} temp_dirs;

nlohmann::json Expected() {
  auto text = ReadFileToString(FormatsFixture("expected.json"));
  EXPECT_TRUE(text.ok());
  return nlohmann::json::parse(*text);
}

float ToF32(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: return t.as<float>()[i];
    case DType::kF16: return F16ToF32(t.as<uint16_t>()[i]);
    case DType::kBF16: return BF16ToF32(t.as<uint16_t>()[i]);
    default: ADD_FAILURE() << "dtype"; return 0;
  }
}

void ExpectFirst(const Tensor& t, const nlohmann::json& want, const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(ToF32(t, (int64_t)i), want[i].get<float>()) << what << " " << i;
}

TEST(LoadHf, TinyLlamaBf16WithLlama3Scaling) {
  auto w = LoadHfModelDir(FormatsFixture("tiny_llama_hf"));
  ASSERT_TRUE(w.ok()) << w.status().message();
  const ModelConfig& c = w->config;
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.dim, 16);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.rope_dim, 4);
  EXPECT_EQ(c.ffn_dim, 24);
  EXPECT_EQ(c.vocab_size, 32);
  EXPECT_EQ(c.max_seq_len, 256);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.rope_style, RopeStyle::kHalfSplit);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c.rope_scaling.factor, 8.0f);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position, 128);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(w->layers[1].wq.dtype, DType::kBF16);
  EXPECT_EQ(w->output.dtype, DType::kBF16);
  EXPECT_NE(w->output.data, w->tok_embd.data);
  EXPECT_EQ(w->layers[0].attn_norm.dtype, DType::kF32);
  EXPECT_EQ(w->output_norm.dtype, DType::kF32);
  EXPECT_EQ(w->layers[0].bq.data, nullptr);
  auto e = Expected()["llama"];
  ExpectFirst(w->layers[1].wq, e["q_proj_1"], "q_proj_1");
  ExpectFirst(w->layers[0].attn_norm, e["input_layernorm_0"], "input_layernorm_0");
  ExpectFirst(w->output_norm, e["norm"], "norm");
  ExpectFirst(w->output, e["lm_head"], "lm_head");

  auto g = LoadHfGenerationConfig(FormatsFixture("tiny_llama_hf"));
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->bos_token_id, 1);
  EXPECT_EQ(g->eos_token_ids, (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(g->pad_token_id, -1);
  EXPECT_EQ(g->do_sample, true);
  EXPECT_FLOAT_EQ(*g->temperature, 0.6f);
  EXPECT_FLOAT_EQ(*g->top_p, 0.9f);
  EXPECT_FALSE(g->top_k.has_value());
}

TEST(LoadHf, ShardedQwen2F16Tied) {
  auto w = LoadHfModelDir(FormatsFixture("tiny_qwen2_hf_sharded"));
  ASSERT_TRUE(w.ok()) << w.status().message();
  const ModelConfig& c = w->config;
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(w->output.data, w->tok_embd.data);
  EXPECT_EQ(w->tok_embd.dtype, DType::kF16);
  EXPECT_EQ(w->layers[1].bk.dtype, DType::kF32);
  EXPECT_EQ(w->layers[1].bk.shape, std::vector<int64_t>{8});
  auto e = Expected()["qwen2"];
  ExpectFirst(w->layers[1].bk, e["k_bias_1"], "k_bias_1");
  ExpectFirst(w->tok_embd, e["embed"], "embed");
  ExpectFirst(w->layers[0].w_down, e["down_proj_0"], "down_proj_0");
  // generation_config.json from save_pretrained has no sampling settings here.
  auto g = LoadHfGenerationConfig(FormatsFixture("tiny_qwen2_hf_sharded"));
  ASSERT_TRUE(g.ok()) << g.status().message();
}

TEST(LoadHf, ConfigVariants) {
  // transformers 4.x style: rope_theta and rope_scaling at the top level.
  auto c = ParseHfConfig(R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":8,"vocab_size":100,"rope_theta":20000.0,"head_dim":null,
      "rope_scaling":{"type":"linear","factor":2.0},"tie_word_embeddings":true,"attention_bias":true})",
                         "v4.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->n_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->rope_theta, 20000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c->rope_scaling.factor, 2.0f);
  EXPECT_TRUE(c->tied_embeddings);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->o_bias);  // transformers' LlamaAttention: attention_bias puts a bias on o_proj too
  EXPECT_FLOAT_EQ(c->norm_eps, 1e-6f);
  EXPECT_EQ(c->max_seq_len, 2048);

  auto m = ParseHfConfig(R"({"architectures":["MistralForCausalLM"],"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":100,
      "sliding_window":4096,"head_dim":16,"rope_scaling":null,"attention_bias":true})", "mistral.json");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_FALSE(m->qkv_bias || m->o_bias);  // transformers' Mistral has no biases, whatever the key says

  // YaRN as Qwen's long-context configs write it: the attention factor derived from the factor.
  auto y = ParseHfConfig(R"({"architectures":["Qwen3ForCausalLM"],"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":32,"vocab_size":100,
      "rope_scaling":{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32768}})", "yarn.json");
  ASSERT_TRUE(y.ok()) << y.status().message();
  EXPECT_EQ(y->rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(y->rope_scaling.original_max_position, 32768);
  EXPECT_FLOAT_EQ(y->rope_scaling.attention_factor, (float)(1 + 0.1 * std::log(4.0)));
  // Without original_max_position_embeddings: max_position_embeddings, as transformers' standardize_rope_params.
  auto no_orig = ParseHfConfig(R"({"architectures":["Qwen3ForCausalLM"],"hidden_size":64,"intermediate_size":128,
      "num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"max_position_embeddings":4096,
      "rope_scaling":{"rope_type":"yarn","factor":4}})", "yarn.json");
  ASSERT_TRUE(no_orig.ok()) << no_orig.status().message();
  EXPECT_EQ(no_orig->rope_scaling.original_max_position, 4096);
  EXPECT_EQ(m->arch, "mistral");
  EXPECT_EQ(m->sliding_window, 4096);
  EXPECT_EQ(m->head_dim, 16);
  EXPECT_EQ(m->q_dim(), 128);
  EXPECT_EQ(m->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(m->WindowOf(0), 4096);
  EXPECT_EQ(m->WindowOf(1), 4096);

  // Sliding windows as transformers resolves them: mistral absent = 4096, null = none; qwen2 only
  // with use_sliding_window, in layer_types' "sliding_attention" layers or from max_window_layers on.
  const std::string dims = R"("hidden_size":64,"intermediate_size":128,"num_hidden_layers":3,"num_attention_heads":8,"vocab_size":100)";
  auto window_of = [&](const std::string& json) {
    auto r = ParseHfConfig(json, "w.json");
    EXPECT_TRUE(r.ok()) << json << ": " << r.status().message();
    std::vector<int64_t> w;
    if (r.ok())
      for (int64_t l = 0; l < 3; ++l) w.push_back(r->WindowOf(l));
    return w;
  };
  using W = std::vector<int64_t>;
  EXPECT_EQ(window_of(R"({"model_type":"mistral",)" + dims + "}"), (W{4096, 4096, 4096}));
  EXPECT_EQ(window_of(R"({"model_type":"mistral","sliding_window":null,)" + dims + "}"), (W{0, 0, 0}));
  EXPECT_EQ(window_of(R"({"model_type":"llama","sliding_window":16,)" + dims + "}"), (W{0, 0, 0}));
  EXPECT_EQ(window_of(R"({"model_type":"qwen2","sliding_window":16,"max_window_layers":1,)" + dims + "}"),
            (W{0, 0, 0}));
  EXPECT_EQ(window_of(R"({"model_type":"qwen2","use_sliding_window":true,"sliding_window":16,"max_window_layers":1,)" +
                      dims + "}"),
            (W{0, 16, 16}));
  EXPECT_EQ(window_of(R"({"model_type":"qwen2","use_sliding_window":true,)" + dims + "}"), (W{0, 0, 0}));  // 28 on
  EXPECT_EQ(window_of(R"({"model_type":"qwen2","use_sliding_window":true,"max_window_layers":0,)" + dims + "}"),
            (W{4096, 4096, 4096}));
  EXPECT_EQ(window_of(R"({"model_type":"qwen2","use_sliding_window":true,"sliding_window":8,"max_window_layers":0,)"
                      R"("layer_types":["sliding_attention","full_attention","sliding_attention"],)" + dims + "}"),
            (W{8, 0, 8}));

  auto by_type = ParseHfConfig(R"({"model_type":"qwen2","hidden_size":8,"intermediate_size":8,
      "num_hidden_layers":1,"num_attention_heads":2,"vocab_size":10})", "q.json");
  ASSERT_TRUE(by_type.ok()) << by_type.status().message();
  EXPECT_TRUE(by_type->qkv_bias);

  struct Bad {
    std::string json, expect;
  };
  std::string base = R"("hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":8,"vocab_size":100)";
  for (const Bad& b : std::vector<Bad>{
           {R"({"architectures":["GPT2LMHeadModel"]})", "GPT2LMHeadModel"},
           {R"({"architectures":["LlamaForCausalLM"],"hidden_size":64})", "'intermediate_size' is missing"},
           {R"({"architectures":["LlamaForCausalLM"],"hidden_size":"64"})", "'hidden_size' must be an integer"},
           {R"({"architectures":["LlamaForCausalLM"],)" + base + R"(,"rope_scaling":{"rope_type":"dynamic","factor":4}})",
            "\"dynamic\"; lathe supports default, linear, llama3 and yarn"},
           {R"({"architectures":["LlamaForCausalLM"],)" + base + R"(,"rope_scaling":{"rope_type":"yarn"}})",
            "'rope_scaling.factor' is missing"},
           {R"({"architectures":["LlamaForCausalLM"],)" + base + R"(,"rope_scaling":{"rope_type":"llama3","factor":8}})",
            "rope_scaling.low_freq_factor' is missing"},
           {R"({"architectures":["LlamaForCausalLM"],)" + base + R"(,"hidden_act":"gelu"})", "gelu"},
           {R"({"architectures":["LlamaForCausalLM"],)" + base + R"(,"mlp_bias":true})", "mlp_bias"},
           {R"({"architectures":["LlamaForCausalLM"],)" + base, "not valid JSON"},
           {R"({"model_type":"qwen2","use_sliding_window":true,"layer_types":["full_attention"],)" + base + "}",
            "'layer_types' must be a list of 2 layer types"},
           {R"({"model_type":"qwen2","use_sliding_window":true,"layer_types":["full_attention","local"],)" + base + "}",
            "'layer_types[1]' must be \"full_attention\" or \"sliding_attention\", got \"local\""},
           {R"({"model_type":"qwen2","use_sliding_window":true,"sliding_window":0,)" + base + "}",
            "'sliding_window' must be positive"},
           {R"({"model_type":"mistral","sliding_window":-3,)" + base + "}", "'sliding_window' is out of range"},
       }) {
    auto r = ParseHfConfig(b.json, "bad/config.json");
    ASSERT_FALSE(r.ok()) << b.expect;
    EXPECT_NE(r.status().message().find("bad/config.json"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(b.expect), std::string::npos) << r.status().message();
  }

  auto g = ParseHfGenerationConfig(R"({"eos_token_id": 5, "top_k": 40, "max_new_tokens": 10})", "g.json");
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->eos_token_ids, std::vector<int64_t>{5});
  EXPECT_EQ(*g->top_k, 40);
  EXPECT_EQ(*g->max_new_tokens, 10);
  EXPECT_FALSE(ParseHfGenerationConfig(R"({"eos_token_id": ["x"]})", "g.json").ok());
  auto neg = ParseHfGenerationConfig(R"({"pad_token_id": -1, "bos_token_id": null, "eos_token_id": [3, -1]})", "g.json");
  ASSERT_TRUE(neg.ok()) << neg.status().message();
  EXPECT_EQ(neg->pad_token_id, -1);
  EXPECT_EQ(neg->bos_token_id, -1);
  EXPECT_EQ(neg->eos_token_ids, std::vector<int64_t>{3});
}

// Copies the tiny Llama folder with an edited config.json: wrong configs must name the tensor.
TEST(LoadHf, MissingAndMisshapedTensorsNameTheTensor) {
  auto cfg_text = ReadFileToString(FormatsFixture("tiny_llama_hf/config.json"));
  ASSERT_TRUE(cfg_text.ok());
  auto run = [&](const std::string& key, int value) {
    std::string dir = temp_dirs.Make();
    std::string st = FormatsFixture("tiny_llama_hf/model.safetensors");
    EXPECT_EQ(symlink(st.c_str(), (dir + "/model.safetensors").c_str()), 0);
    auto j = nlohmann::json::parse(*cfg_text);
    j[key] = value;
    std::ofstream(dir + "/config.json") << j.dump();
    return LoadHfModelDir(dir).status();
  };
  Status s = run("num_hidden_layers", 3);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("missing tensor 'model.layers.2.input_layernorm.weight'"), std::string::npos)
      << s.message();
  s = run("intermediate_size", 25);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape [24, 16], "
                             "expected [25, 16]"), std::string::npos) << s.message();
  s = run("tie_word_embeddings", 1);  // not a bool
  EXPECT_NE(s.message().find("tie_word_embeddings"), std::string::npos) << s.message();
  auto none = LoadHfModelDir(FormatsFixture("no_such_dir"));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("config.json"), std::string::npos);
}

// The same model with one extra header byte: every bf16 tensor lands on an odd address. The
// loader must copy those into aligned memory and still give the same values.
TEST(LoadHf, MisalignedTensorsAreCopied) {
  auto st = ReadFileToString(FormatsFixture("tiny_llama_hf/model.safetensors"));
  ASSERT_TRUE(st.ok());
  uint64_t n;
  std::memcpy(&n, st->data(), 8);
  uint64_t n1 = n + 1;
  std::string shifted((const char*)&n1, 8);
  shifted += st->substr(8, n) + " " + st->substr(8 + n);
  std::string dir = temp_dirs.Make();
  std::ofstream(dir + "/model.safetensors", std::ios::binary).write(shifted.data(), (std::streamsize)shifted.size());
  std::string cfg = FormatsFixture("tiny_llama_hf/config.json");
  ASSERT_EQ(symlink(cfg.c_str(), (dir + "/config.json").c_str()), 0);
  auto w = LoadHfModelDir(dir);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ((uintptr_t)w->layers[1].wq.data % 2, 0u);
  EXPECT_EQ((uintptr_t)w->tok_embd.data % 2, 0u);
  auto e = Expected()["llama"];
  ExpectFirst(w->layers[1].wq, e["q_proj_1"], "q_proj_1");
  ExpectFirst(w->output, e["lm_head"], "lm_head");
  ExpectFirst(w->output_norm, e["norm"], "norm");
}

}  // namespace
}  // namespace lathe::model
