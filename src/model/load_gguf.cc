// GGUF -> ModelWeights: llama.cpp's tensor names and metadata keys.
#include "model/load_gguf.h"

#include <cmath>
#include <cstring>

namespace lathe::model {

Result<ModelConfig> ConfigFromGguf(const formats::GgufFile& g) {
  ModelConfig c;
  LATHE_ASSIGN_OR_RETURN(c.arch, g.GetString("general.architecture"));
  const std::string& a = c.arch;
  if (a != "llama" && a != "mistral" && a != "qwen2" && a != "qwen3") {
    return Status::Error(StrFormat("%s: architecture '%s' is not supported (supported: llama, mistral, qwen2, qwen3)",
                                   g.path().c_str(), a.c_str()));
  }
  LATHE_ASSIGN_OR_RETURN(c.n_layers, g.GetInt(a + ".block_count"));
  // Each block has tensors of its own in the file: a count beyond them is corrupt (and would size the layer table).
  if (c.n_layers <= 0 || c.n_layers > (int64_t)g.tensors().size()) {
    return Status::Error(StrFormat("%s: %s.block_count is %lld; expected 1 to %zu (the file's tensor count)",
                                   g.path().c_str(), a.c_str(), (long long)c.n_layers, g.tensors().size()));
  }
  LATHE_ASSIGN_OR_RETURN(c.dim, g.GetInt(a + ".embedding_length"));
  LATHE_ASSIGN_OR_RETURN(c.ffn_dim, g.GetInt(a + ".feed_forward_length"));
  LATHE_ASSIGN_OR_RETURN(c.n_heads, g.GetInt(a + ".attention.head_count"));
  LATHE_ASSIGN_OR_RETURN(c.n_kv_heads, g.GetIntOr(a + ".attention.head_count_kv", c.n_heads));
  LATHE_ASSIGN_OR_RETURN(c.max_seq_len, g.GetIntOr(a + ".context_length", 2048));
  double eps, theta;
  LATHE_ASSIGN_OR_RETURN(eps, g.GetFloatOr(a + ".attention.layer_norm_rms_epsilon", 1e-5));
  LATHE_ASSIGN_OR_RETURN(theta, g.GetFloatOr(a + ".rope.freq_base", 10000.0));
  c.norm_eps = (float)eps;
  c.rope_theta = (float)theta;
  // The head size is attention.key_length where the file has it (Qwen3: 128 for any hidden size), else
  // embedding_length / head_count.
  if (c.n_heads <= 0 || (!g.Find(a + ".attention.key_length") && c.dim % c.n_heads != 0)) {
    return Status::Error(StrFormat("%s: %s.attention.head_count %lld does not divide embedding_length %lld",
                                   g.path().c_str(), a.c_str(), (long long)c.n_heads, (long long)c.dim));
  }
  LATHE_ASSIGN_OR_RETURN(c.head_dim, g.GetIntOr(a + ".attention.key_length", c.dim / c.n_heads));
  LATHE_ASSIGN_OR_RETURN(c.rope_dim, g.GetIntOr(a + ".rope.dimension_count", c.head_dim));
  std::string scaling;
  LATHE_ASSIGN_OR_RETURN(scaling, g.GetStringOr(a + ".rope.scaling.type", "none"));
  if (scaling == "linear") {
    double f;
    LATHE_ASSIGN_OR_RETURN(f, g.GetFloat(a + ".rope.scaling.factor"));
    c.rope_scaling.type = RopeScaling::Type::kLinear;
    c.rope_scaling.factor = (float)f;
  } else if (scaling == "yarn") {
    // llama.cpp's YaRN (as convert_hf_to_gguf writes Qwen's): the same ramp as transformers', beta 32 / 1 unless
    // given, cos / sin scaled by attn_factor x (1 + 0.1 ln factor).
    RopeScaling& r = c.rope_scaling;
    r.type = RopeScaling::Type::kYarn;
    double f, attn, fast, slow;
    LATHE_ASSIGN_OR_RETURN(f, g.GetFloat(a + ".rope.scaling.factor"));
    LATHE_ASSIGN_OR_RETURN(r.original_max_position, g.GetInt(a + ".rope.scaling.original_context_length"));
    LATHE_ASSIGN_OR_RETURN(attn, g.GetFloatOr(a + ".rope.scaling.attn_factor", 1.0));
    LATHE_ASSIGN_OR_RETURN(fast, g.GetFloatOr(a + ".rope.scaling.yarn_beta_fast", 32.0));
    LATHE_ASSIGN_OR_RETURN(slow, g.GetFloatOr(a + ".rope.scaling.yarn_beta_slow", 1.0));
    if (!(f > 0) || r.original_max_position <= 0 || !(fast > 0) || !(slow > 0)) {
      return Status::Error(StrFormat("%s: %s.rope.scaling: yarn needs a positive factor, original_context_length "
                                     "and betas", g.path().c_str(), a.c_str()));
    }
    r.factor = (float)f;
    r.beta_fast = (float)fast;
    r.beta_slow = (float)slow;
    r.attention_factor = (float)(attn * (f > 1 ? 1.0 + 0.1 * std::log(f) : 1.0));
  } else if (scaling != "none") {
    return Status::Error(StrFormat("%s: %s.rope.scaling.type '%s' is not supported (none, linear, yarn)",
                                   g.path().c_str(), a.c_str(), scaling.c_str()));
  }
  // llama.cpp rotates interleaved pairs for llama (Q/K were permuted by the converter) and
  // halves (NEOX) for qwen2 and qwen3.
  c.rope_style = a == "qwen2" || a == "qwen3" ? RopeStyle::kHalfSplit : RopeStyle::kInterleaved;
  c.qkv_bias = g.FindTensor("blk.0.attn_q.bias") != nullptr;
  c.o_bias = g.FindTensor("blk.0.attn_output.bias") != nullptr;
  c.qk_norm = a == "qwen3";
  c.tied_embeddings = g.FindTensor("output.weight") == nullptr;
  const formats::GgufTensorInfo* emb = g.FindTensor("token_embd.weight");
  if (!emb) return Status::Error(g.path() + ": missing tensor 'token_embd.weight'");
  if (emb->shape.size() != 2) return Status::Error(g.path() + ": tensor 'token_embd.weight' is not 2-D");
  c.vocab_size = emb->shape[0];
  return c;
}

namespace {

// A tensor's view in the mapping, or an owned copy where the file's alignment leaves it misaligned for its type.
Result<Tensor> Get(ModelWeights& w, const formats::GgufFile& g, const std::string& name) {
  LATHE_ASSIGN_OR_RETURN(Tensor t, g.GetTensor(name));
  return w.Aligned(std::move(t));
}

// f32 view, or an owned f32 copy for 1-D tensors stored in another dtype (norms, biases).
Result<Tensor> Vector(ModelWeights& w, const formats::GgufFile& g, const std::string& name) {
  LATHE_ASSIGN_OR_RETURN(Tensor t, Get(w, g, name));
  if (t.dtype == DType::kF32) return t;
  if (t.dtype != DType::kF16 && t.dtype != DType::kBF16) {
    return Status::Error(StrFormat("%s: tensor '%s' is %s; 1-D weights must be f32, f16 or bf16", g.path().c_str(),
                                   name.c_str(), DTypeName(t.dtype)));
  }
  std::vector<float> v(t.numel());
  const uint16_t* h = t.as<uint16_t>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = t.dtype == DType::kF16 ? F16ToF32(h[i]) : BF16ToF32(h[i]);
  return w.OwnF32(std::move(v), t.shape);
}

}  // namespace

Result<ModelWeights> LoadGgufWeights(std::shared_ptr<formats::GgufFile> gp) {
  const formats::GgufFile& g = *gp;
  ModelWeights w;
  LATHE_ASSIGN_OR_RETURN(w.config, ConfigFromGguf(g));
  w.owners.push_back(gp);
  LATHE_ASSIGN_OR_RETURN(w.tok_embd, Get(w, g, "token_embd.weight"));
  LATHE_ASSIGN_OR_RETURN(w.output_norm, Vector(w, g, "output_norm.weight"));
  if (w.config.tied_embeddings) {
    w.output = w.tok_embd;
  } else {
    LATHE_ASSIGN_OR_RETURN(w.output, Get(w, g, "output.weight"));
  }
  if (g.FindTensor("rope_freqs.weight")) {
    LATHE_ASSIGN_OR_RETURN(w.rope_freqs, Vector(w, g, "rope_freqs.weight"));
    if (w.rope_freqs.numel() != w.config.rope_dim / 2) {
      return Status::Error(g.path() + ": tensor 'rope_freqs.weight' must have rope_dim/2 elements");
    }
  }
  w.layers.resize(w.config.n_layers);
  for (int64_t i = 0; i < w.config.n_layers; ++i) {
    LayerWeights& l = w.layers[i];
    std::string p = "blk." + std::to_string(i) + ".";
    LATHE_ASSIGN_OR_RETURN(l.attn_norm, Vector(w, g, p + "attn_norm.weight"));
    LATHE_ASSIGN_OR_RETURN(l.ffn_norm, Vector(w, g, p + "ffn_norm.weight"));
    LATHE_ASSIGN_OR_RETURN(l.wq, Get(w, g, p + "attn_q.weight"));
    LATHE_ASSIGN_OR_RETURN(l.wk, Get(w, g, p + "attn_k.weight"));
    LATHE_ASSIGN_OR_RETURN(l.wv, Get(w, g, p + "attn_v.weight"));
    LATHE_ASSIGN_OR_RETURN(l.wo, Get(w, g, p + "attn_output.weight"));
    LATHE_ASSIGN_OR_RETURN(l.w_gate, Get(w, g, p + "ffn_gate.weight"));
    LATHE_ASSIGN_OR_RETURN(l.w_up, Get(w, g, p + "ffn_up.weight"));
    LATHE_ASSIGN_OR_RETURN(l.w_down, Get(w, g, p + "ffn_down.weight"));
    if (w.config.qkv_bias) {
      LATHE_ASSIGN_OR_RETURN(l.bq, Vector(w, g, p + "attn_q.bias"));
      LATHE_ASSIGN_OR_RETURN(l.bk, Vector(w, g, p + "attn_k.bias"));
      LATHE_ASSIGN_OR_RETURN(l.bv, Vector(w, g, p + "attn_v.bias"));
    }
    if (w.config.o_bias) {
      LATHE_ASSIGN_OR_RETURN(l.bo, Vector(w, g, p + "attn_output.bias"));
    }
    if (w.config.qk_norm) {
      LATHE_ASSIGN_OR_RETURN(l.q_norm, Vector(w, g, p + "attn_q_norm.weight"));
      LATHE_ASSIGN_OR_RETURN(l.k_norm, Vector(w, g, p + "attn_k_norm.weight"));
    }
  }
  LATHE_RETURN_IF_ERROR(w.Validate(g.path()));
  return w;
}

}  // namespace lathe::model
