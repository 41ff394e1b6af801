// ModelConfig helpers.
#include "model/config.h"

#include "core/status.h"

namespace lathe::model {

int64_t ModelConfig::ParamCount() const {
  int64_t per_layer = 2 * dim                                 // two norms
                      + dim * q_dim() + 2 * dim * kv_dim()    // q, k, v
                      + q_dim() * dim                         // o
                      + 3 * dim * ffn_dim;                    // gate, up, down
  if (qkv_bias) per_layer += q_dim() + 2 * kv_dim();
  if (o_bias) per_layer += dim;
  if (qk_norm) per_layer += 2 * head_dim;
  int64_t n = n_layers * per_layer + vocab_size * dim + dim;  // + embedding + final norm
  if (!tied_embeddings) n += vocab_size * dim;
  return n;
}

std::string ModelConfig::Summary() const {
  std::string window;
  if (sliding_window > 0) {
    int64_t n = 0;
    for (int64_t l = 0; l < n_layers; ++l) n += WindowOf(l) > 0;
    window = StrFormat(", sliding window %lld (%lld of %lld layers)", (long long)sliding_window, (long long)n,
                       (long long)n_layers);
  }
  return StrFormat("%s: %lld layers, dim %lld, heads %lld/%lld (head_dim %lld), ffn %lld, vocab %lld, "
                   "rope theta %g %s%s, %s head%s%s%s",
                   arch.c_str(), (long long)n_layers, (long long)dim, (long long)n_heads, (long long)n_kv_heads,
                   (long long)head_dim, (long long)ffn_dim, (long long)vocab_size, rope_theta,
                   rope_style == RopeStyle::kInterleaved ? "interleaved" : "half-split",
                   rope_scaling.type == RopeScaling::Type::kLlama3   ? " (llama3 scaling)"
                   : rope_scaling.type == RopeScaling::Type::kLinear ? " (linear scaling)"
                   : rope_scaling.type == RopeScaling::Type::kYarn   ? " (yarn scaling)"
                                                                     : "",
                   tied_embeddings ? "tied" : "untied",
                   qkv_bias ? (o_bias ? ", q/k/v/o bias" : ", qkv bias") : o_bias ? ", o bias" : "",
                   qk_norm ? ", q/k norm" : "", window.c_str());
}

}  // namespace lathe::model
