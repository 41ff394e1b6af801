// Inference forward pass of a Llama-family decoder over a batch of sequences, each appending
// tokens to its own slot of a KV cache. Activations of all sequences are stacked into one
// (T_total, dim) matrix so every linear layer is one matmul for the whole batch.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/huge_buffer.h"
#include "core/status.h"
#include "core/profiler.h"
#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "model/lora.h"
#include "model/weights.h"

namespace lathe::model {

// The element types a KV cache may hold (f32, f16, bf16), and their size.
inline bool IsKvCacheDType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }
// The commands' default KV element type (`--kv-cache-dtype auto`): the model's own for f32 and bf16 linear
// weights (f32 exact; bf16 as PyTorch and vLLM's auto keep a bf16 model's cache, and on AMD Zen 4 / 5 its
// attention then runs on vdpbf16ps: attention_avx512bf16.cc), f16 for every other (f16 and block-quantized
// weights: llama.cpp's default cache). 16 bits: half the cache's memory and the attention's reads.
// DefaultKvCacheDTypeFor: the same rule for a linear-weight dtype (`lathe estimate --inference --kv-dtype auto`).
inline DType DefaultKvCacheDTypeFor(DType weights) {
  return weights == DType::kF32 || weights == DType::kBF16 ? weights : DType::kF16;
}
inline DType DefaultKvCacheDType(const ModelWeights& w) {
  return w.layers.empty() ? DType::kF16 : DefaultKvCacheDTypeFor(w.layers[0].wq.dtype);
}
inline size_t KvElemBytes(DType t) { return DTypeBytes(t, 1); }

// KvBlockStore: K and V in fixed-size blocks of tokens, laid out per layer as [block][offset][kv_dim],
// elements of one dtype: f32 (the default, exact), f16 or bf16 (half the bytes: llama.cpp's default
// cache is f16; vLLM's --kv-cache-dtype). New K / V rows are rounded to it (round to nearest even)
// as they are written; attention widens them back exactly. A sequence's tokens live in the blocks its
// block table lists: position p is at (block_table[p / block_size], p % block_size). The serving
// engine's KvCacheManager hands out blocks (with prefix sharing); KvCache below is the simple owner.
class KvBlockStore {
 public:
  // REQUIRES IsKvCacheDType(kv_dtype). populate: commit every page now (a server's pool: otherwise the
  // steps that first write each block take its page faults); else pages are committed as first written
  // (generate / chat: only the context actually used).
  KvBlockStore(const ModelConfig& config, int64_t n_blocks, int64_t block_size, DType kv_dtype = DType::kF32,
               bool populate = false);
  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t kv_dim() const { return kv_dim_; }
  DType dtype() const { return dtype_; }
  size_t bytes() const { return k_.size() + v_.size(); }
  // Bytes one block takes across all layers (K and V).
  static size_t BlockBytes(const ModelConfig& config, int64_t block_size, DType kv_dtype = DType::kF32);
  // A layer's K / V elements (of dtype()). Within a layer each block holds its positions head by head
  // ([block][kv head][position][head_dim]): one KV head's slice of a block is one contiguous run (2 KiB at
  // SmolLM2's head_dim 64 in f16), which a decode step's attention of that head reads whole. Position p of
  // KV head h is at element HeadOffset(h) + PosOffset(block, offset) from the layer's start.
  const void* KLayer(int64_t layer) const { return k_.data() + Index(layer, 0, 0, 0) * elt_; }
  const void* VLayer(int64_t layer) const { return v_.data() + Index(layer, 0, 0, 0) * elt_; }
  int64_t HeadOffset(int64_t kv_head) const { return kv_head * block_size_ * head_dim_; }
  int64_t PosOffset(int64_t block, int64_t offset) const {
    return (block * block_size_ * n_kv_heads_ + offset) * head_dim_;
  }
  // Stores one position's K and V rows (kv_dim floats each, head after head), rounded to dtype().
  void Write(int64_t layer, int64_t block, int64_t offset, const float* k, const float* v);
  // One position's row widened to f32 (tests, tools).
  void ReadK(int64_t layer, int64_t block, int64_t offset, float* out) const;
  void ReadV(int64_t layer, int64_t block, int64_t offset, float* out) const;
  // Copies every layer's K/V of one block to another (copy-on-write of a shared block).
  void CopyBlock(int64_t src, int64_t dst);

 private:
  size_t Index(int64_t layer, int64_t block, int64_t kv_head, int64_t offset) const {
    return ((((size_t)layer * n_blocks_ + block) * n_kv_heads_ + kv_head) * block_size_ + offset) * head_dim_;
  }
  int64_t n_layers_, n_blocks_, block_size_, n_kv_heads_, head_dim_, kv_dim_;
  DType dtype_;
  size_t elt_;  // bytes per element
  // Anonymous huge-page memory: a 16-position block per 4 KiB page had a decode step's attention
  // waiting on page walks (bench/RESULTS.md, KV cache dtypes).
  HugePageBuffer k_, v_;
};

// One sequence of a batch in block-table form.
struct PagedSeqInput {
  std::span<const int32_t> tokens;       // new tokens, at positions start_pos, start_pos + 1, ...
  int64_t start_pos = 0;                 // tokens already in the cache for this sequence
  std::span<const int32_t> block_table;  // must cover start_pos + tokens.size() positions
  bool all_logits = false;               // logits for every new token, else only for the last
  // LoRA adapter for this sequence's rows (multi-LoRA serving); null = TransformerOptions::adapter
  // (usually none). Not owned. Rows of different adapters share the base matmuls.
  const LoraAdapter* adapter = nullptr;
  // The last sampled_rows tokens (tokens the model itself sampled: decode steps) go through
  // block-quantized weights with int8 activations, as llama.cpp does; every other row (prompt
  // tokens) with f32 ones. By role, so a row never depends on its batch-mates, and prompts keep
  // f32 accuracy (int8 prefill flips SmolLM2's near-tie answer). The default, 0, is the exact one:
  // a caller that does not say gets f32 rows, slower but never less accurate.
  int64_t sampled_rows = 0;
};

// KvCache: n_slots independent sequences of up to max_len tokens, each with its own run of
// blocks in one KvBlockStore, and a length per slot. For generate/chat/eval/bench.
class KvCache {
 public:
  KvCache(const ModelConfig& config, int n_slots, int64_t max_len, int64_t block_size = 16,
          DType kv_dtype = DType::kF32);
  int n_slots() const { return n_slots_; }
  int64_t max_len() const { return max_len_; }
  int64_t length(int slot) const { return len_[slot]; }
  // Forgets the last tokens of a slot (or all of them): later tokens overwrite them.
  void Truncate(int slot, int64_t new_len);
  void Clear(int slot) { Truncate(slot, 0); }
  void SetLength(int slot, int64_t len) { len_[slot] = len; }
  size_t bytes() const { return store_.bytes(); }
  KvBlockStore& store() { return store_; }
  std::span<const int32_t> BlockTable(int slot) const {
    return std::span<const int32_t>(tables_).subspan((size_t)slot * blocks_per_slot_, blocks_per_slot_);
  }

 private:
  int n_slots_;
  int64_t max_len_;
  int64_t blocks_per_slot_;
  KvBlockStore store_;
  std::vector<int32_t> tables_;
  std::vector<int64_t> len_;
};

struct SeqInput {
  int slot = 0;
  std::span<const int32_t> tokens;  // appended at positions cache.length(slot) ...
  bool all_logits = false;          // logits for every token, else only for the last
  int64_t sampled_rows = 0;         // trailing sampled tokens with int8 activations: PagedSeqInput
};

struct TransformerOptions {
  // Prompt rows (not PagedSeqInput::sampled_rows) of block-quantized weights use f32 activations; on CPUs
  // with AVX-512 VNNI int16 ones for Q8_0 / Q4_* / Q5_* / Q4_K / Q5_K (kernels::MatMulRows, one pass over W with the
  // step's int8 sampled rows), elsewhere with avx512_bf16 bf16 ones times the dequantized weights rounded to
  // bf16 (kernels::MatMulBf16, as a BF16 model's prompt rows); this keeps f32 activations for every row (see kernels::MatMul):
  // exact products of the stored weights, slower decode. Off = llama.cpp's int8 activations.
  // Either way, every output logit within kExactLogitMargin of a row's maximum is recomputed
  // exactly (f32 activations): the logits feed sampling directly, and int8 noise (~1 logit)
  // flips near-ties — SmolLM2 answers "L'..." instead of "The capital of France is Paris." with
  // a plain int8 head (tests/golden/fixtures/MANIFEST.json measures it). BF16 weights on CPUs with
  // avx512_bf16 take bf16-rounded x (vdpbf16ps, kernels::StripWeight) at every M, as llama.cpp does;
  // their head's top logits are recomputed the same way, and exact_activations keeps f32 x there too.
  bool exact_activations = false;
  // Prompt rows of block-quantized weights on int8 activations, as the sampled rows (and llama.cpp's every row):
  // one arithmetic and one pass over W for a serving step's prompt and decode rows (SmolLM2 Q8_0 on Zen 4:
  // c=32 +30%, bench/RESULTS.md), at int8's precision for the prompt's K / V and logits. Each row's result
  // still does not depend on its batch. Ignored with exact_activations.
  bool int8_prompt_rows = false;
  // When set, every op of Forward is recorded (name, shape, time, FLOPs, bytes). Not owned.
  Profiler* profiler = nullptr;
  // When set, its LoRA deltas are added to the adapted linear layers. Not owned.
  const LoraAdapter* adapter = nullptr;
  // Float (f32 / f16 / bf16) linear weights are repacked at construction into 16-row strips
  // (kernels::StripWeight, same bytes as stored), one arena on transparent huge pages, and their file pages dropped (a file-mapped weight is
  // not resident twice): decode streams each strip, prefill runs the training GEMM on them without
  // packing, and a row's result still does not depend on its batch. Off: the weights are read as
  // stored (the dot-product GEMV and panel).
  bool strip_float_weights = true;
};

class Transformer {
 public:
  // Logits this close to a row's maximum (in nats) are always exact; beyond it a token's
  // probability is < e^-6 of the top's, and the int8 error (~1) barely moves it.
  static constexpr float kExactLogitMargin = 6.0f;

  // REQUIRES: weights outlive the Transformer; weights.Validate() passed.
  Transformer(const ModelWeights& weights, ThreadPool& pool, TransformerOptions options = {});
  const ModelConfig& config() const { return w_.config; }
  const ModelWeights& weights() const { return w_; }
  ThreadPool& pool() { return pool_; }

  // Runs the batch; `logits` gets (rows, vocab) in batch order: n_tokens rows for sequences with
  // all_logits, one row for the others. Error if a token id is out of range or a slot overflows;
  // on error nothing is written to the cache. Advances each slot's length.
  Status Forward(KvCache& cache, std::span<const SeqInput> batch, std::vector<float>* logits);
  // The same over block tables: writes the new tokens' K/V into their blocks and attends over
  // positions [0, start_pos + i] of each sequence. Lengths are the caller's to track.
  Status ForwardPaged(KvBlockStore& store, std::span<const PagedSeqInput> batch, std::vector<float>* logits);

 private:
  void EnsureRopeTable(int64_t n_pos);
  void ApplyRope(float* x, int64_t n_heads, int64_t pos) const;  // x: (n_heads, head_dim)
  void Attention(KvBlockStore& store, int64_t layer, std::span<const PagedSeqInput> batch);

  // Recomputes exactly the logits of each row within kExactLogitMargin of its maximum.
  void RefineLogits(const float* rows, int64_t n_rows, float* logits);
  // y(M, out) = x(M, in) . W^T (+ the adapter's LoRA delta for (layer, module) when set).
  void Linear(const char* name, const float* x, int64_t M, const Tensor& w, float* y, int64_t layer = -1,
              LoraModule module = LoraModule::kCount);
  // One precision run of a non-strip W: kernels::MatMul, or MatMulBf16 for prompt rows (exact) unless
  // options_.exact_activations.
  void MatMulRun(const float* x, int64_t M, const Tensor& w, float* y, bool exact);
  // Linear for weights that share x (q/k/v, gate/up), the same results: for one token row through
  // one kernels::MatMulShared (one op `name` in a profile), else one Linear per part.
  struct SharedPart {
    const char* name;
    const Tensor* w;
    float* y;
    LoraModule module;
  };
  void LinearShared(const char* name, const float* x, int64_t M, int64_t layer, std::initializer_list<SharedPart> parts);
  // y += the adapters' LoRA delta for (layer, module), per run of rows.
  void AddLora(const float* x, float* y, int64_t layer, LoraModule module);
  static std::string OpShape(int64_t M, const Tensor& w);

  const ModelWeights& w_;
  ThreadPool& pool_;
  TransformerOptions options_;
  std::vector<float> inv_freq_;           // (rope_dim / 2)
  std::vector<float> rope_cos_, rope_sin_;  // (n_pos, rope_dim / 2)
  float rope_scale_ = 1.0f;                 // RopeCosSinScale: YaRN's attention factor
  std::vector<float> refine_cut_;  // RefineLogits: each row's cut
  int64_t rope_pos_ = 0;
  // Scratch, grown as needed and reused across calls.
  // Runs of consecutive rows with the same activation precision (see PagedSeqInput::sampled_rows):
  // for the T token rows and for the output rows of the head. Linear splits a block-quantized
  // matmul along them.
  struct PrecisionRun {
    int64_t n_rows;
    bool exact;
  };
  static void AddRun(std::vector<PrecisionRun>* runs, int64_t n, bool exact);
  std::vector<PrecisionRun> token_runs_, out_runs_;
  std::vector<kernels::RowRun> row_runs_;  // Linear's runs for kernels::MatMulRows
  // runs as kernels::MatMulRows takes them (exact rows int16, the others int8), in row_runs_.
  std::span<const kernels::RowRun> RowRunsOf(const std::vector<PrecisionRun>& runs);
  std::vector<float> x_, xb_, q_, k_, v_, att_, hb_, hb2_, rows_, lora_mid_, lora_out_;
  std::vector<int64_t> row_pos_;  // position of each stacked row
  std::vector<int32_t> row_block_;  // the cache block of each stacked row's position
  // fn(b, e) over row ranges of [0, T) on the pool (on the caller alone when T rows are little work):
  // for the row-wise ops of a prefill (norms, SwiGLU, RoPE + K/V writes, residuals).
  void Rows(int64_t T, double work_per_row, const std::function<void(int64_t, int64_t)>& fn);
  // Runs of stacked rows that share one adapter (set per ForwardPaged; empty = no LoRA at all).
  struct LoraRun {
    int64_t row0, n_rows;
    const LoraAdapter* adapter;
  };
  std::vector<LoraRun> lora_runs_;
  std::vector<std::vector<float>> scores_;  // per thread
  // Strip copies of the float linear weights (strip_float_weights), by the stored tensor's data.
  const kernels::StripWeight* Strips(const Tensor& w) const;
  std::unordered_map<const void*, kernels::StripWeight> strips_;
  HugePageBuffer strip_arena_;  // the strip copies (strips_), one mapping on transparent huge pages
};

// Rope inverse frequencies for a config (theta, rope_dim, linear or llama3 scaling, or the
// per-frequency divisors of a GGUF rope_freqs tensor when given).
std::vector<float> RopeInvFreq(const ModelConfig& c, const float* freq_divisors);
// What RoPE's cos and sin are multiplied by (transformers' attention_scaling): YaRN's attention factor, else 1.
float RopeCosSinScale(const ModelConfig& c);
// cos / sin (n_pos - p0, inv_freq.size()) of positions [p0, n_pos): float32 angles as transformers and llama2.c,
// times `scale` (RopeCosSinScale). The inference and training rope tables.
void RopeCosSinRows(const std::vector<float>& inv_freq, float scale, int64_t p0, int64_t n_pos, float* cos,
                    float* sin);

}  // namespace lathe::model
