// ModelConfig: the hyper-parameters of a Llama-family decoder, whatever file it came from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lathe::model {

enum class RopeStyle {
  kInterleaved,  // rotate pairs (2i, 2i+1): Meta checkpoints, llama2.c, GGUF "llama" (Q/K permuted)
  kHalfSplit,    // rotate (i, i + d/2): HF transformers checkpoints, GGUF qwen2 (NEOX)
};

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3, kYarn } type = Type::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_max_position = 8192;
  // YaRN (Qwen2.5 / Qwen3 long context): the ramp between extrapolated and interpolated frequencies over the
  // pairs from beta_fast to beta_slow rotations in original_max_position (floored / ceiled when truncate), and
  // cos / sin scaled by attention_factor (0.1 ln(factor) + 1 unless given).
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  bool truncate = true;
  float attention_factor = 1.0f;
};

struct ModelConfig {
  std::string arch = "llama";  // llama | mistral | qwen2 | qwen3 (smollm2 and llama3 are "llama")
  int64_t n_layers = 0;
  int64_t dim = 0;             // hidden size
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;        // usually dim / n_heads
  int64_t ffn_dim = 0;         // intermediate size
  int64_t vocab_size = 0;
  int64_t max_seq_len = 2048;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  int64_t rope_dim = 0;        // dims rotated per head (== head_dim for these archs)
  RopeStyle rope_style = RopeStyle::kHalfSplit;
  RopeScaling rope_scaling;
  bool tied_embeddings = false;
  bool qkv_bias = false;       // qwen2; llama / qwen3 with attention_bias
  bool o_bias = false;         // llama / qwen3 with attention_bias: o_proj has a bias too (qwen2's has none)
  // qwen3: each head's q and k RMS-normalized over head_dim (weights q_norm, k_norm of head_dim, shared by the
  // heads, eps norm_eps) after the projections and before RoPE.
  bool qk_norm = false;
  // Sliding-window attention (mistral, qwen2 with use_sliding_window): in the layers that use it a
  // query at position t sees keys (t - sliding_window, t] only, as transformers masks it. 0 = none.
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;  // which layers use sliding_window; empty = every layer

  // Keys a query of `layer` may see back from itself (itself included); 0 = all earlier positions.
  int64_t WindowOf(int64_t layer) const {
    if (sliding_window <= 0) return 0;
    if (sliding_layers.empty()) return sliding_window;
    return layer >= 0 && layer < (int64_t)sliding_layers.size() && sliding_layers[(size_t)layer] ? sliding_window : 0;
  }

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  // Total parameters (weights only), counting a tied head once.
  int64_t ParamCount() const;
  std::string Summary() const;
};

}  // namespace lathe::model
