// Inference forward pass of a Llama-family decoder over a batch of sequences, each appending
// tokens to its own slot of a KV cache. Activations of all sequences are stacked into one
// (T_total, dim) matrix so every linear layer is one matmul for the whole batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/weights.h"

namespace lathe::model {

// K and V for n_slots sequences of up to max_len tokens each, f32, laid out
// [layer][slot][pos][kv_dim]. (The serving engine's paged cache replaces this for `serve`.)
class KvCache {
 public:
  KvCache(const ModelConfig& config, int n_slots, int64_t max_len);
  int n_slots() const { return n_slots_; }
  int64_t max_len() const { return max_len_; }
  int64_t length(int slot) const { return len_[slot]; }
  // Forgets the last tokens of a slot (or all of them): later tokens overwrite them.
  void Truncate(int slot, int64_t new_len);
  void Clear(int slot) { Truncate(slot, 0); }
  size_t bytes() const { return k_.size() * sizeof(float) * 2; }

  float* K(int64_t layer, int slot, int64_t pos) { return &k_[Index(layer, slot, pos)]; }
  float* V(int64_t layer, int slot, int64_t pos) { return &v_[Index(layer, slot, pos)]; }
  void SetLength(int slot, int64_t len) { len_[slot] = len; }

 private:
  size_t Index(int64_t layer, int slot, int64_t pos) const {
    return (((size_t)layer * n_slots_ + slot) * max_len_ + pos) * kv_dim_;
  }
  int n_slots_;
  int64_t max_len_;
  int64_t kv_dim_;
  std::vector<float> k_, v_;
  std::vector<int64_t> len_;
};

struct SeqInput {
  int slot = 0;
  std::span<const int32_t> tokens;  // appended at positions cache.length(slot) ...
  bool all_logits = false;          // logits for every token, else only for the last
};

class Transformer {
 public:
  // REQUIRES: weights outlive the Transformer; weights.Validate() passed.
  Transformer(const ModelWeights& weights, ThreadPool& pool);
  const ModelConfig& config() const { return w_.config; }
  const ModelWeights& weights() const { return w_; }
  ThreadPool& pool() { return pool_; }

  // Runs the batch; `logits` gets (rows, vocab) in batch order: n_tokens rows for sequences with
  // all_logits, one row for the others. Error if a token id is out of range or a slot overflows.
  Status Forward(KvCache& cache, std::span<const SeqInput> batch, std::vector<float>* logits);

 private:
  void EnsureRopeTable(int64_t n_pos);
  void ApplyRope(float* x, int64_t n_heads, int64_t pos) const;  // x: (n_heads, head_dim)
  void Attention(KvCache& cache, int64_t layer, std::span<const SeqInput> batch);

  const ModelWeights& w_;
  ThreadPool& pool_;
  std::vector<float> inv_freq_;           // (rope_dim / 2)
  std::vector<float> rope_cos_, rope_sin_;  // (n_pos, rope_dim / 2)
  int64_t rope_pos_ = 0;
  // Scratch, grown as needed and reused across calls.
  std::vector<float> x_, xb_, q_, k_, v_, att_, hb_, hb2_, rows_;
  std::vector<int64_t> row_pos_;  // position of each stacked row
  std::vector<std::vector<float>> scores_;  // per thread
};

// Rope inverse frequencies for a config (theta, rope_dim, linear or llama3 scaling, or the
// per-frequency divisors of a GGUF rope_freqs tensor when given).
std::vector<float> RopeInvFreq(const ModelConfig& c, const float* freq_divisors);

}  // namespace lathe::model
