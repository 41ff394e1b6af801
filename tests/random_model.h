// Small Llama-style configs, and a model of random f32 weights (N(0, 0.02) linears and embedding, unit norms, tied head) for a config, for tests
// that need shapes no fixture has.
#pragma once

#include <random>
#include <vector>

#include "model/weights.h"

namespace lathe::testing {

// A Llama-style config with a tied head, RoPE over the whole head and room for 64 positions.
inline model::ModelConfig SmallLlamaConfig(int64_t n_layers, int64_t dim, int64_t n_heads, int64_t n_kv_heads,
                                           int64_t head_dim, int64_t ffn_dim, int64_t vocab_size = 300) {
  model::ModelConfig c;
  c.n_layers = n_layers;
  c.dim = dim;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  c.rope_dim = head_dim;
  c.ffn_dim = ffn_dim;
  c.vocab_size = vocab_size;
  c.max_seq_len = 64;
  c.tied_embeddings = true;
  return c;
}

inline model::ModelWeights RandomModelWeights(const model::ModelConfig& c, uint32_t seed = 7) {
  model::ModelWeights w;
  w.config = c;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  auto rnd = [&](std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v((size_t)n);
    for (float& x : v) x = nd(rng);
    return w.OwnF32(std::move(v), shape);
  };
  auto ones = [&](int64_t n) { return w.OwnF32(std::vector<float>((size_t)n, 1.0f), {n}); };
  w.tok_embd = rnd({c.vocab_size, c.dim});
  w.output = w.tok_embd;
  w.output_norm = ones(c.dim);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    model::LayerWeights L;
    L.attn_norm = ones(c.dim);
    L.ffn_norm = ones(c.dim);
    L.wq = rnd({c.q_dim(), c.dim});
    L.wk = rnd({c.kv_dim(), c.dim});
    L.wv = rnd({c.kv_dim(), c.dim});
    L.wo = rnd({c.dim, c.q_dim()});
    L.w_gate = rnd({c.ffn_dim, c.dim});
    L.w_up = rnd({c.ffn_dim, c.dim});
    L.w_down = rnd({c.dim, c.ffn_dim});
    if (c.qk_norm) {
      L.q_norm = ones(c.head_dim);
      L.k_norm = ones(c.head_dim);
    }
    w.layers.push_back(L);
  }
  return w;
}

}  // namespace lathe::testing
