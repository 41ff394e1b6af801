// ModelWeights: tensor views for every weight of a decoder, plus whatever owns their bytes
// (mmapped files, converted buffers). Loaders fill it; the forward pass only reads it.
// Linear weights are (out_features, in_features) in PyTorch order, in their stored dtype.
#pragma once

#include <any>
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"

namespace lathe::model {

struct LayerWeights {
  Tensor attn_norm;              // (dim)        f32
  Tensor wq, wk, wv, wo;         // (q_dim, dim), (kv_dim, dim), (kv_dim, dim), (dim, q_dim)
  Tensor bq, bk, bv;             // (q_dim), (kv_dim), (kv_dim) f32; data == nullptr when absent
  Tensor q_norm, k_norm;         // (head_dim) f32 (qwen3's per-head q/k RMSNorm); data == nullptr when absent
  Tensor bo;                     // (dim) f32 o_proj bias (attention_bias); data == nullptr when absent
  Tensor ffn_norm;               // (dim)        f32
  Tensor w_gate, w_up, w_down;   // (ffn, dim), (ffn, dim), (dim, ffn)

  // Every tensor of the layer; an absent one has data == nullptr.
  std::array<const Tensor*, 15> All() const {
    return {&attn_norm, &wq, &wk, &wv, &wo, &bq, &bk, &bv, &bo, &q_norm, &k_norm, &ffn_norm, &w_gate, &w_up, &w_down};
  }
};

struct ModelWeights {
  ModelConfig config;
  Tensor tok_embd;               // (vocab, dim)
  Tensor output_norm;            // (dim) f32
  Tensor output;                 // (vocab, dim); same view as tok_embd when tied
  Tensor rope_freqs;             // (rope_dim / 2) f32 divisors of each rope frequency (GGUF
                                 // llama3 scaling); data == nullptr when absent
  std::vector<LayerWeights> layers;

  // Keeps the storage alive: mmapped files, vectors of converted data, etc.
  std::vector<std::shared_ptr<void>> owners;
  // Makes a float buffer owned by these weights and returns a Tensor over it.
  Tensor OwnF32(std::vector<float> data, std::vector<int64_t> shape);
  // t itself where its data is aligned for its type (Tensor::aligned), else an owned copy: a file may place a
  // tensor anywhere (safetensors' header length, a GGUF's general.alignment of 1 or 2), the kernels read it as T*.
  Tensor Aligned(Tensor t);
  // Bytes of every tensor as stored (a tied head once).
  double StoredBytes() const;
  // Checks every shape against the config; errors name the tensor.
  Status Validate(const std::string& source) const;
};

}  // namespace lathe::model
