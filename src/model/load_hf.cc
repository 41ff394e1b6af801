// HF folder loading: config.json parsing, generation_config.json, safetensors -> ModelWeights.
#include "model/load_hf.h"

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "formats/safetensors.h"

namespace lathe::model {

namespace {

using json = nlohmann::json;

constexpr int64_t kMaxConfigInt = int64_t{1} << 31;  // keeps products like dim * q_dim in range

Result<json> ParseJson(const std::string& text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    return Status::Error(StrFormat("%s: not valid JSON (offset %zu): %s", source.c_str(), (size_t)e.byte, e.what()));
  } catch (const std::exception& e) {
    return Status::Error(StrFormat("%s: not valid JSON: %s", source.c_str(), e.what()));
  }
}

// For error messages: dump() recurses, so nested values (untrusted, maybe very deep) are only named.
std::string Show(const json& v) {
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  std::string s = v.dump();
  if (s.size() > 80) {
    s.resize(77);
    s += "...";
  }
  return s;
}

// Typed access to a JSON object; a key holding null counts as absent (HF writes "head_dim": null).
class Obj {
 public:
  Obj(const json& j, std::string source, std::string prefix = "")
      : j_(j), source_(std::move(source)), prefix_(std::move(prefix)) {}
  const json* Find(const std::string& key) const {
    if (!j_.is_object()) return nullptr;
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  bool Has(const std::string& key) const { return Find(key) != nullptr; }
  // Whether the key is written with a null value (for keys where null and absent differ).
  bool IsNull(const std::string& key) const {
    if (!j_.is_object()) return false;
    auto it = j_.find(key);
    return it != j_.end() && it->is_null();
  }
  Status Err(const std::string& key, const std::string& what) const {
    return Status::Error(StrFormat("%s: key '%s%s' %s", source_.c_str(), prefix_.c_str(), key.c_str(), what.c_str()));
  }
  Result<int64_t> Int(const std::string& key, std::optional<int64_t> def = std::nullopt) const {
    const json* v = Find(key);
    if (!v) {
      if (def) return *def;
      return Err(key, "is missing");
    }
    if (!v->is_number_integer()) return Err(key, "must be an integer, got " + Show(*v));
    int64_t x = v->get<int64_t>();
    if (x < 0 || x > kMaxConfigInt) return Err(key, "is out of range: " + Show(*v));
    return x;
  }
  Result<double> Num(const std::string& key, std::optional<double> def = std::nullopt) const {
    const json* v = Find(key);
    if (!v) {
      if (def) return *def;
      return Err(key, "is missing");
    }
    if (!v->is_number()) return Err(key, "must be a number, got " + Show(*v));
    double x = v->get<double>();
    // Values end up in floats; out-of-range ones would be undefined to convert.
    if (!(std::fabs(x) <= 3.0e38)) return Err(key, "is out of range: " + Show(*v));
    return x;
  }
  Result<bool> Bool(const std::string& key, bool def) const {
    const json* v = Find(key);
    if (!v) return def;
    if (!v->is_boolean()) return Err(key, "must be true or false, got " + Show(*v));
    return v->get<bool>();
  }
  Result<std::string> Str(const std::string& key, const std::string& def) const {
    const json* v = Find(key);
    if (!v) return def;
    if (!v->is_string()) return Err(key, "must be a string, got " + Show(*v));
    return v->get<std::string>();
  }

 private:
  const json& j_;
  std::string source_, prefix_;
};

// Qwen2's sliding window as transformers' Qwen2Config resolves it: only with use_sliding_window
// (sliding_window absent = 4096), in the layers `layer_types` marks "sliding_attention", or without
// layer_types in layers >= max_window_layers (absent = 28).
Status ParseQwen2SlidingWindow(const Obj& cfg, ModelConfig* c) {
  LATHE_ASSIGN_OR_RETURN(bool use_sw, cfg.Bool("use_sliding_window", false));
  if (!use_sw || cfg.IsNull("sliding_window")) return Status::Ok();
  LATHE_ASSIGN_OR_RETURN(c->sliding_window, cfg.Int("sliding_window", 4096));
  if (c->sliding_window == 0) return cfg.Err("sliding_window", "must be positive with use_sliding_window");
  c->sliding_layers.assign((size_t)c->n_layers, false);
  if (const json* types = cfg.Find("layer_types")) {
    if (!types->is_array() || (int64_t)types->size() != c->n_layers) {
      return cfg.Err("layer_types", StrFormat("must be a list of %lld layer types", (long long)c->n_layers));
    }
    for (size_t i = 0; i < types->size(); ++i) {
      const json& t = (*types)[i];
      if (t == "sliding_attention") {
        c->sliding_layers[i] = true;
      } else if (t != "full_attention") {
        return cfg.Err(StrFormat("layer_types[%zu]", i),
                       "must be \"full_attention\" or \"sliding_attention\", got " + Show(t));
      }
    }
    return Status::Ok();
  }
  LATHE_ASSIGN_OR_RETURN(int64_t first, cfg.Int("max_window_layers", 28));
  for (int64_t l = first; l < c->n_layers; ++l) c->sliding_layers[(size_t)l] = true;
  return Status::Ok();
}

Status ParseRopeScaling(const Obj& cfg, const json* scaling, const std::string& key, const std::string& source,
                        ModelConfig* c) {
  if (!scaling) return Status::Ok();
  if (!scaling->is_object()) return cfg.Err(key, "must be an object, got " + Show(*scaling));
  Obj s(*scaling, source, key + ".");
  LATHE_ASSIGN_OR_RETURN(std::string type, s.Str("rope_type", ""));
  if (type.empty()) {
    LATHE_ASSIGN_OR_RETURN(type, s.Str("type", "default"));
  }
  if (type == "default") return Status::Ok();
  if (type == "linear") {
    c->rope_scaling.type = RopeScaling::Type::kLinear;
    LATHE_ASSIGN_OR_RETURN(double f, s.Num("factor"));
    c->rope_scaling.factor = (float)f;
  } else if (type == "llama3") {
    c->rope_scaling.type = RopeScaling::Type::kLlama3;
    LATHE_ASSIGN_OR_RETURN(double f, s.Num("factor"));
    LATHE_ASSIGN_OR_RETURN(double lo, s.Num("low_freq_factor"));
    LATHE_ASSIGN_OR_RETURN(double hi, s.Num("high_freq_factor"));
    LATHE_ASSIGN_OR_RETURN(int64_t orig, s.Int("original_max_position_embeddings"));
    if (!(hi > lo) || orig <= 0) return s.Err("high_freq_factor", "must exceed low_freq_factor (and "
                                                                  "original_max_position_embeddings be > 0)");
    c->rope_scaling.factor = (float)f;
    c->rope_scaling.low_freq_factor = (float)lo;
    c->rope_scaling.high_freq_factor = (float)hi;
    c->rope_scaling.original_max_position = orig;
  } else if (type == "yarn") {
    // transformers' _compute_yarn_parameters: factor, original_max_position_embeddings (absent: the model's
    // max_position_embeddings, as standardize_rope_params fills it), beta_fast / beta_slow, truncate,
    // attention_factor (or derived from factor, mscale and mscale_all_dim).
    RopeScaling& r = c->rope_scaling;
    r.type = RopeScaling::Type::kYarn;
    LATHE_ASSIGN_OR_RETURN(double f, s.Num("factor"));
    LATHE_ASSIGN_OR_RETURN(r.original_max_position, s.Int("original_max_position_embeddings", c->max_seq_len));
    if (r.original_max_position <= 0) return s.Err("original_max_position_embeddings", "must be positive");
    r.factor = (float)f;
    LATHE_ASSIGN_OR_RETURN(double fast, s.Num("beta_fast", 32));
    LATHE_ASSIGN_OR_RETURN(double slow, s.Num("beta_slow", 1));
    if (!(fast > 0 && slow > 0)) return s.Err("beta_fast", "and beta_slow must be positive");
    r.beta_fast = (float)fast;
    r.beta_slow = (float)slow;
    LATHE_ASSIGN_OR_RETURN(r.truncate, s.Bool("truncate", true));
    const auto mscale = [&](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    if (s.Has("attention_factor") && !s.IsNull("attention_factor")) {
      LATHE_ASSIGN_OR_RETURN(double a, s.Num("attention_factor"));
      r.attention_factor = (float)a;
    } else {
      LATHE_ASSIGN_OR_RETURN(double m, s.Num("mscale", 0));
      LATHE_ASSIGN_OR_RETURN(double m_all, s.Num("mscale_all_dim", 0));
      r.attention_factor = (float)(m != 0 && m_all != 0 ? mscale(f, m) / mscale(f, m_all) : mscale(f, 1));
    }
  } else {
    return s.Err("rope_type", "is \"" + type + "\"; lathe supports default, linear, llama3 and yarn");
  }
  if (!(c->rope_scaling.factor > 0)) return s.Err("factor", "must be positive");
  return Status::Ok();
}

bool FileExists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

}  // namespace

Result<ModelConfig> ParseHfConfig(const std::string& json_text, const std::string& source) {
  LATHE_ASSIGN_OR_RETURN(json j, ParseJson(json_text, source));
  if (!j.is_object()) return Status::Error(source + ": config is not a JSON object");
  Obj cfg(j, source);
  ModelConfig c;
  std::string arch_name;
  if (const json* a = cfg.Find("architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string()) {
      return cfg.Err("architectures", "must be a list of class names, got " + Show(*a));
    }
    arch_name = (*a)[0].get<std::string>();
  }
  LATHE_ASSIGN_OR_RETURN(std::string model_type, cfg.Str("model_type", ""));
  if (arch_name == "LlamaForCausalLM" || (arch_name.empty() && model_type == "llama")) c.arch = "llama";
  else if (arch_name == "MistralForCausalLM" || (arch_name.empty() && model_type == "mistral")) c.arch = "mistral";
  else if (arch_name == "Qwen2ForCausalLM" || (arch_name.empty() && model_type == "qwen2")) c.arch = "qwen2";
  else if (arch_name == "Qwen3ForCausalLM" || (arch_name.empty() && model_type == "qwen3")) c.arch = "qwen3";
  else {
    return Status::Error(StrFormat("%s: architecture '%s' (model_type '%s') is not supported; lathe loads "
                                   "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM",
                                   source.c_str(),
                                   arch_name.c_str(), model_type.c_str()));
  }
  LATHE_ASSIGN_OR_RETURN(std::string act, cfg.Str("hidden_act", "silu"));
  if (act != "silu") return cfg.Err("hidden_act", "is \"" + act + "\"; only silu (SwiGLU) is supported");
  LATHE_ASSIGN_OR_RETURN(bool mlp_bias, cfg.Bool("mlp_bias", false));
  if (mlp_bias) return cfg.Err("mlp_bias", "is true; MLP biases are not supported");

  LATHE_ASSIGN_OR_RETURN(c.dim, cfg.Int("hidden_size"));
  LATHE_ASSIGN_OR_RETURN(c.ffn_dim, cfg.Int("intermediate_size"));
  LATHE_ASSIGN_OR_RETURN(c.n_layers, cfg.Int("num_hidden_layers"));
  LATHE_ASSIGN_OR_RETURN(c.n_heads, cfg.Int("num_attention_heads"));
  LATHE_ASSIGN_OR_RETURN(c.n_kv_heads, cfg.Int("num_key_value_heads", c.n_heads));
  LATHE_ASSIGN_OR_RETURN(c.vocab_size, cfg.Int("vocab_size"));
  if (c.n_heads == 0) return cfg.Err("num_attention_heads", "must be positive");
  if (cfg.Has("head_dim")) {
    LATHE_ASSIGN_OR_RETURN(c.head_dim, cfg.Int("head_dim"));
  } else {
    if (c.dim % c.n_heads != 0) return cfg.Err("hidden_size", "is not a multiple of num_attention_heads");
    c.head_dim = c.dim / c.n_heads;
  }
  c.rope_dim = c.head_dim;
  LATHE_ASSIGN_OR_RETURN(c.max_seq_len, cfg.Int("max_position_embeddings", 2048));
  LATHE_ASSIGN_OR_RETURN(double eps, cfg.Num("rms_norm_eps", 1e-6));
  c.norm_eps = (float)eps;
  LATHE_ASSIGN_OR_RETURN(c.tied_embeddings, cfg.Bool("tie_word_embeddings", false));
  if (c.arch == "qwen2") {
    c.qkv_bias = true;  // Qwen2 always has q/k/v biases; its config has no switch for it
    LATHE_RETURN_IF_ERROR(ParseQwen2SlidingWindow(cfg, &c));
  } else if (c.arch != "mistral") {  // transformers' Mistral has no biases (nor the key)
    // Llama / Qwen3 attention_bias: q, k, v and o projections all have biases.
    LATHE_ASSIGN_OR_RETURN(c.qkv_bias, cfg.Bool("attention_bias", false));
    c.o_bias = c.qkv_bias;
  }
  if (c.arch != "qwen2") {
    if (c.arch == "qwen3") {
      // Qwen3: q_norm / k_norm per head; the sliding-window switches as Qwen2's (off in every released model).
      c.qk_norm = true;
      LATHE_RETURN_IF_ERROR(ParseQwen2SlidingWindow(cfg, &c));
    }
    if (c.arch == "mistral") {
      // transformers' MistralConfig: absent = 4096, null = no window (Mistral 7B v0.2 on).
      if (!cfg.IsNull("sliding_window")) {
        LATHE_ASSIGN_OR_RETURN(c.sliding_window, cfg.Int("sliding_window", 4096));
      }
    }
  }
  // transformers 5 moved rope_theta and the scaling dict into "rope_parameters".
  const json* params = cfg.Find("rope_parameters");
  double theta = 10000.0;
  if (params) {
    if (!params->is_object()) return cfg.Err("rope_parameters", "must be an object");
    LATHE_ASSIGN_OR_RETURN(theta, Obj(*params, source, "rope_parameters.").Num("rope_theta", 10000.0));
    LATHE_RETURN_IF_ERROR(ParseRopeScaling(cfg, params, "rope_parameters", source, &c));
  }
  if (cfg.Has("rope_theta")) {
    LATHE_ASSIGN_OR_RETURN(theta, cfg.Num("rope_theta"));
  }
  if (!(theta > 0)) return cfg.Err("rope_theta", "must be positive");
  c.rope_theta = (float)theta;
  if (cfg.Has("rope_scaling")) {
    c.rope_scaling = RopeScaling();
    LATHE_RETURN_IF_ERROR(ParseRopeScaling(cfg, cfg.Find("rope_scaling"), "rope_scaling", source, &c));
  }
  c.rope_style = RopeStyle::kHalfSplit;
  return c;
}

Result<GenerationConfig> ParseHfGenerationConfig(const std::string& json_text, const std::string& source) {
  LATHE_ASSIGN_OR_RETURN(json j, ParseJson(json_text, source));
  if (!j.is_object()) return Status::Error(source + ": not a JSON object");
  Obj o(j, source);
  GenerationConfig g;
  // Token ids: an int (negative means none, as some exports write -1) or, for eos, a list.
  auto token_id = [&](const std::string& key, const json& x, int64_t* out) -> Status {
    if (!x.is_number_integer()) return o.Err(key, "must be a token id or a list of them, got " + Show(x));
    int64_t v = x.get<int64_t>();
    *out = v < 0 ? -1 : v;
    return Status::Ok();
  };
  if (const json* b = o.Find("bos_token_id")) LATHE_RETURN_IF_ERROR(token_id("bos_token_id", *b, &g.bos_token_id));
  if (const json* p = o.Find("pad_token_id")) LATHE_RETURN_IF_ERROR(token_id("pad_token_id", *p, &g.pad_token_id));
  if (const json* e = o.Find("eos_token_id")) {
    std::vector<json> ids = e->is_array() ? std::vector<json>(e->begin(), e->end()) : std::vector<json>{*e};
    for (const json& x : ids) {
      int64_t id;
      LATHE_RETURN_IF_ERROR(token_id("eos_token_id", x, &id));
      if (id >= 0) g.eos_token_ids.push_back(id);
    }
  }
  if (o.Has("do_sample")) {
    LATHE_ASSIGN_OR_RETURN(bool b, o.Bool("do_sample", false));
    g.do_sample = b;
  }
  if (o.Has("temperature")) {
    LATHE_ASSIGN_OR_RETURN(double t, o.Num("temperature"));
    g.temperature = (float)t;
  }
  if (o.Has("top_p")) {
    LATHE_ASSIGN_OR_RETURN(double p, o.Num("top_p"));
    g.top_p = (float)p;
  }
  if (o.Has("top_k")) {
    LATHE_ASSIGN_OR_RETURN(int64_t k, o.Int("top_k"));
    g.top_k = k;
  }
  if (o.Has("max_new_tokens")) {
    LATHE_ASSIGN_OR_RETURN(int64_t n, o.Int("max_new_tokens"));
    g.max_new_tokens = n;
  }
  return g;
}

Result<GenerationConfig> LoadHfGenerationConfig(const std::string& dir) {
  for (const char* name : {"generation_config.json", "config.json"}) {
    std::string p = JoinPath(dir, name);
    if (!FileExists(p)) continue;
    LATHE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(p));
    LATHE_ASSIGN_OR_RETURN(GenerationConfig g, ParseHfGenerationConfig(text, p));
    if (std::string(name) == "config.json") {  // only the token ids are meant for generation there
      GenerationConfig ids;
      ids.bos_token_id = g.bos_token_id;
      ids.eos_token_ids = g.eos_token_ids;
      ids.pad_token_id = g.pad_token_id;
      return ids;
    }
    return g;
  }
  return GenerationConfig();
}

namespace {

// Resolves HF tensor names into views, converting or copying where the forward pass needs it.
class WeightReader {
 public:
  WeightReader(const formats::SafetensorsSet& set, ModelWeights* w) : set_(set), w_(w) {}

  // A matrix kept in its stored dtype (copied only if the file leaves it misaligned).
  Result<Tensor> Matrix(const std::string& name, std::vector<int64_t> shape) {
    LATHE_ASSIGN_OR_RETURN(Tensor t, Get(name, shape));
    if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16) {
      return Status::Error(StrFormat("%s: tensor '%s' has dtype %s; weights must be f32, f16 or bf16",
                                     set_.FileFor(name)->path().c_str(), name.c_str(), DTypeName(t.dtype)));
    }
    return w_->Aligned(std::move(t));
  }

  // A 1-D tensor (norm weight, bias) converted to f32.
  Result<Tensor> Vector(const std::string& name, int64_t n) {
    LATHE_ASSIGN_OR_RETURN(Tensor t, Get(name, {n}));
    std::vector<float> out(n);
    const uint8_t* p = (const uint8_t*)t.data;
    for (int64_t i = 0; i < n; ++i) {
      switch (t.dtype) {
        case DType::kF32: std::memcpy(&out[i], p + 4 * i, 4); break;
        case DType::kF64: { double d; std::memcpy(&d, p + 8 * i, 8); out[i] = (float)d; break; }
        case DType::kF16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); out[i] = F16ToF32(h); break; }
        case DType::kBF16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); out[i] = BF16ToF32(h); break; }
        default:
          return Status::Error(StrFormat("%s: tensor '%s' has dtype %s; expected a float type",
                                         set_.FileFor(name)->path().c_str(), name.c_str(), DTypeName(t.dtype)));
      }
    }
    return w_->OwnF32(std::move(out), {n});
  }

 private:
  Result<Tensor> Get(const std::string& name, const std::vector<int64_t>& shape) {
    LATHE_ASSIGN_OR_RETURN(Tensor t, set_.GetTensor(name));
    if (t.shape != shape) {
      Tensor want;
      want.shape = shape;
      return Status::Error(StrFormat("%s: tensor '%s' has shape %s, expected %s from config.json",
                                     set_.FileFor(name)->path().c_str(), name.c_str(), t.ShapeString().c_str(),
                                     want.ShapeString().c_str()));
    }
    return t;
  }

  const formats::SafetensorsSet& set_;
  ModelWeights* w_;
};

}  // namespace

Result<ModelWeights> LoadHfModelDir(const std::string& dir) {
  std::string config_path = JoinPath(dir, "config.json");
  LATHE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path));
  ModelWeights w;
  LATHE_ASSIGN_OR_RETURN(w.config, ParseHfConfig(text, config_path));
  const ModelConfig& c = w.config;
  LATHE_ASSIGN_OR_RETURN(auto set_unique, formats::SafetensorsSet::Open(dir));
  std::shared_ptr<formats::SafetensorsSet> set(std::move(set_unique));
  w.owners.push_back(set);
  WeightReader r(*set, &w);
  LATHE_ASSIGN_OR_RETURN(w.tok_embd, r.Matrix("model.embed_tokens.weight", {c.vocab_size, c.dim}));
  LATHE_ASSIGN_OR_RETURN(w.output_norm, r.Vector("model.norm.weight", c.dim));
  if (c.tied_embeddings) {
    w.output = w.tok_embd;
  } else {
    LATHE_ASSIGN_OR_RETURN(w.output, r.Matrix("lm_head.weight", {c.vocab_size, c.dim}));
  }
  w.layers.resize(c.n_layers);
  for (int64_t i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w.layers[i];
    std::string p = "model.layers." + std::to_string(i) + ".";
    LATHE_ASSIGN_OR_RETURN(l.attn_norm, r.Vector(p + "input_layernorm.weight", c.dim));
    LATHE_ASSIGN_OR_RETURN(l.ffn_norm, r.Vector(p + "post_attention_layernorm.weight", c.dim));
    LATHE_ASSIGN_OR_RETURN(l.wq, r.Matrix(p + "self_attn.q_proj.weight", {c.q_dim(), c.dim}));
    LATHE_ASSIGN_OR_RETURN(l.wk, r.Matrix(p + "self_attn.k_proj.weight", {c.kv_dim(), c.dim}));
    LATHE_ASSIGN_OR_RETURN(l.wv, r.Matrix(p + "self_attn.v_proj.weight", {c.kv_dim(), c.dim}));
    LATHE_ASSIGN_OR_RETURN(l.wo, r.Matrix(p + "self_attn.o_proj.weight", {c.dim, c.q_dim()}));
    if (c.qkv_bias) {
      LATHE_ASSIGN_OR_RETURN(l.bq, r.Vector(p + "self_attn.q_proj.bias", c.q_dim()));
      LATHE_ASSIGN_OR_RETURN(l.bk, r.Vector(p + "self_attn.k_proj.bias", c.kv_dim()));
      LATHE_ASSIGN_OR_RETURN(l.bv, r.Vector(p + "self_attn.v_proj.bias", c.kv_dim()));
    }
    if (c.o_bias) {
      LATHE_ASSIGN_OR_RETURN(l.bo, r.Vector(p + "self_attn.o_proj.bias", c.dim));
    }
    if (c.qk_norm) {
      LATHE_ASSIGN_OR_RETURN(l.q_norm, r.Vector(p + "self_attn.q_norm.weight", c.head_dim));
      LATHE_ASSIGN_OR_RETURN(l.k_norm, r.Vector(p + "self_attn.k_norm.weight", c.head_dim));
    }
    LATHE_ASSIGN_OR_RETURN(l.w_gate, r.Matrix(p + "mlp.gate_proj.weight", {c.ffn_dim, c.dim}));
    LATHE_ASSIGN_OR_RETURN(l.w_up, r.Matrix(p + "mlp.up_proj.weight", {c.ffn_dim, c.dim}));
    LATHE_ASSIGN_OR_RETURN(l.w_down, r.Matrix(p + "mlp.down_proj.weight", {c.dim, c.ffn_dim}));
  }
  LATHE_RETURN_IF_ERROR(w.Validate(dir));
  return w;
}

}  // namespace lathe::model
