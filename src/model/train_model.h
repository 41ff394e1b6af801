// TrainModel: the training forward and explicit backward of a Llama-family decoder (LoRA, full or
// freeze fine-tuning) over micro-batches of token sequences, built from the kernels in
// kernels/train_ops.h. No autograd: each layer's forward saves what its backward needs (or only the
// block input under gradient checkpointing) and the backward is written out by hand.
//
// Contract shared by the model (model/train_model.cc) and the trainer (train/trainer.cc):
// - Frozen base weights stay in the dtype they were loaded in and are never written; trainable
//   tensors (LoRA A/B, or the f32 masters of full/freeze parameters) each have an f32 gradient of
//   the same size. A full/freeze master is the only f32 copy the model reads: Create makes it and
//   drops the base tensor's pages when they are a read-only file mapping (they stay valid, re-read
//   from the file on access); CreateInPlace trains writable f32 base tensors themselves.
// - Labels are aligned with input_ids as in Hugging Face (not shifted): token t's hidden state
//   predicts labels[t + 1]; labels equal to kernels::kIgnoreLabel (-100) take no loss. The last
//   token of a row, and with segment_ids the last token of each segment, predicts nothing (as HF's
//   packed-sequence collators, which set each sequence's first label to -100).
// - ForwardBackward adds d(sum of token losses / normalizer)/d(param) into the gradients, so k
//   micro-batches with normalizer = total target tokens of all k equal one batch k times larger.
//   Inside a call the rows run the same way, in groups (TrainModelOptions::row_group_tokens).
// - params() data may be written between steps (optimizer, checkpoint restore, tests setting LoRA
//   weights): every call re-reads the masters (and re-rounds them in bf16 mode). q/k rows (and
//   q/k LoRA B rows) of a Meta-interleaved base (GGUF llama, llama2.c) are kept in that layout in
//   memory; only the saved files are in HF order.
// - Thread safety: one call at a time; all heavy work runs on the pool given to Create. Scratch
//   buffers belong to the row-group workers, are sized by the largest row group seen, and are
//   reused across steps.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/profiler.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/lora.h"
#include "model/weights.h"

namespace lathe::model {

enum class FinetuneMethod { kLora, kFull, kFreeze };

struct TrainModelOptions {
  FinetuneMethod method = FinetuneMethod::kLora;
  // LoRA (PEFT semantics: A kaiming-uniform(a=sqrt(5)) init, B zeros, scale alpha / r or
  // alpha / sqrt(r) with rsLoRA, dropout on the layer input before A).
  int64_t lora_rank = 8;
  double lora_alpha = 16;
  double lora_dropout = 0;
  bool use_rslora = false;
  std::vector<LoraModule> lora_targets = {LoraModule::kQ, LoraModule::kK, LoraModule::kV, LoraModule::kO,
                                          LoraModule::kGate, LoraModule::kUp, LoraModule::kDown};
  // freeze: the last N decoder layers train (all their parameters), everything else is frozen.
  int64_t freeze_trainable_layers = 2;
  // bf16 mixed precision: matmul inputs (activations, output gradients, trainable weights) rounded
  // to bf16, f32 accumulation; f32 master weights and gradients. Frozen base weights are read as
  // stored (never copied; a bf16 checkpoint already is bf16). On CPUs with avx512_bf16 (UsesBf16Dot) the
  // decoder linears' products run on vdpbf16ps with every operand bf16: a frozen f32 W is rounded as
  // it is packed (as torch's autocast casts it), the exact products summed in pairs
  // (kernels::LinearForwardBf16); so do the attention's six products, on q / k / v / dO rounded to bf16
  // and P / dS rounded per tile, as autocast runs SDPA on bf16 tensors (kernels::FlashAttentionForwardBf16).
  bool bf16 = false;
  // fp16 mixed precision: the same with fp16 rounding (overflow to inf, which the trainer's loss
  // scaler detects and skips).
  bool fp16 = false;
  // Keep only each decoder block's input in the forward; recompute the block in the backward.
  bool gradient_checkpointing = false;
  uint64_t seed = 42;  // LoRA init (std::mt19937_64, platform independent) and dropout masks
  int64_t loss_chunk_tokens = 128;  // rows of logits materialized at a time
  // Rows of a micro-batch go through forward + backward in groups of RowGroupRows(B, T, this)
  // rows, each adding into the gradients with the same normalizer, so only one group's activations
  // and scratch are alive at a time. 0 = the whole micro-batch at once. Only the summation order of
  // the weight gradients over tokens depends on it (dropout masks are keyed by the row's position
  // in the micro-batch). 512 tokens keep every GEMM at M >= 512 rows (short rows are grouped).
  int64_t row_group_tokens = 512;
  // Row groups run data-parallel on this many workers, each with its own activations and scratch on
  // a 1-thread pool (side by side on the pool's threads). Two 1-thread GEMMs side by side keep
  // their 1-thread rate; one GEMM split over two threads does not (bench/RESULTS.md). 0 = one per
  // pool thread, or one where the loss runs in group order (RowGroupWorkers); at most the micro-batch's
  // row groups. LoRA: workers > 0 add into private LoRA
  // gradients summed in worker order after the groups, so the result depends on the worker count
  // (summation order) but not on the threads or timing. Full / freeze (at most one worker per
  // thread; a private full gradient would cost more memory than the speed is worth): every worker
  // adds into the shared gradients in group order, each tensor in turn, so the result is that of
  // one worker; the cost is a second group's activations.
  int64_t row_group_workers = 0;
  // Full / freeze: the last row group of a call hands each trained layer's saved tensors back to the
  // OS once its backward is done, making room for the gradients the remaining layers write (with
  // ZeroGrad(true), which hands the gradients' pages back). That lowers the peak only when an
  // optimizer step is one row group (train::LatheHandsBackPages, the memory plan's "overlap"); with
  // more groups or accumulated micro-batches the next forward holds the activations next to every
  // gradient anyway, and faulting the pages back in each step costs time (~1.4 GB/s under KVM).
  bool hand_back_pages = true;
  // f32 mode: LoRA's rank-r update inside the base product (y = [x | scale mid] . [W | B]^T, and without dropout
  // dx = [dy | dmid] . [W ; A]) where kernels::LinearPlusFused holds, instead of a second product adding into y / dx.
  // Only the summation order changes; false runs the separate products (tests compare the two).
  bool lora_plus_products = true;
  Profiler* profiler = nullptr;     // when set, the big ops of each call are recorded
};

// Bytes of the f32 copy of a frozen output head (vocab, dim) that TrainModel packs once for the
// loss's input gradient (kernels::PackForBackwardInput) instead of re-packing it for every chunk
// of tokens: 4 * vocab * dim (dim rounded up to 16), or 0 where it does not keep one (an f32 copy of
// a trained head would change every step; a head over kMaxPackedHeadBytes would cost more memory than
// it saves time; over a quantized base (QLoRA, int8) the run is saving memory, and the copy would be
// ~18% of a SmolLM2-135M QLoRA peak for ~2% of the step).
// bf16_pairs: bf16 mode with a bf16 head (even dim) where UsesBf16Dot(): the head is packed as bf16 pairs
// along the vocabulary instead (kernels::PackForBackwardInputBf16, 2 * vocab * dim bytes), the loss's dx then
// on vdpbf16ps. A trained head keeps no packed copy in any mode: the loss pairs its rows a chunk at a time
// (SmolLM2's 49152 x 576 head: 57 MB of pairs held for ~1% of a full-bf16 step).
constexpr int64_t kMaxPackedHeadBytes = (int64_t)256 << 20;
// Whether trainable decoder linears and LoRA pairs keep 2-byte shadows (refreshed every step) in reduced
// precision: fp16 mode, and bf16 mode where the CPU lacks the bf16 dot product (the f32 GEMM converts bf16
// weights per panel). On the bf16 dot product the kernels round the f32 masters as they pack them.
bool LinearShadows(bool bf16, bool fp16);
// Whether a trained output head (full fine-tuning) keeps a 2-byte shadow of its f32 masters, refreshed every step:
// fp16 mode, and bf16 mode unless the loss runs on the bf16 dot product (even dim), which rounds the masters' rows
// as it reads them (the shadow's bits, without its 2 * vocab * dim bytes).
bool TrainedHeadShadow(bool bf16, bool fp16, int64_t dim);
// LoRA / freeze in bf16 mode on the bf16 dot product (bf16_dot) with a frozen head stored in any dtype but bf16
// (f32, f16, a GGUF block type; even dim, base not quantized for QLoRA / 8-bit): TrainModel keeps a bf16 copy of
// the head (2 * vocab * dim bytes; a block type dequantized first) that the loss takes instead, as autocast
// casts a model loaded in bf16; it is then packed as bf16 pairs (PackedHeadBytes with bf16_pairs). A head in a
// read-only file mapping gives its pages back (re-read for embedding rows only).
bool FrozenHeadAsBf16(bool bf16_dot, bool full, DType head_dtype, int64_t dim, bool quantized_base);
// LoRA / freeze in bf16 mode on the bf16 dot product (bf16_dot) over an f32 base (not quantized): each frozen
// decoder linear whose f32 pages TrainModel can give back (a read-only file mapping, re-read from the file if
// touched again; or CreateInPlace's handed-over weights under LoRA) is kept as a bf16 copy instead (2 bytes
// per param, the f32 pages dropped): the bits the kernels would round it to as they pack it, as autocast
// casts it, so results are unchanged, the packing reads half the bytes and converts nothing. A linear whose
// pages cannot be given back stays f32 (rounded at every pack), so no run holds both.
bool FrozenLinearsAsBf16(bool bf16_dot, DType base_dtype, bool quantized_base);
// bf16 mode on the bf16 dot product keeps each block's q, k, v (after RoPE), attention output, gate and up as
// bf16 for its backward, as autocast's bf16 tensors are: 2 bytes each instead of 4. Every kernel that reads them
// again rounds them to bf16 itself (the linears' weight gradients, the attention's products), except the
// SwiGLU (its forward runs on the rounded gate and up too, so the backward's recomputation matches it) and
// the attention backward's row term bf16(dO) . out, which sees the rounded output. The working f32 copies
// of one block (6 tensors) are per-worker scratch.
inline bool ActivationsAsBf16(bool bf16_dot) { return bf16_dot; }
// Full / freeze in bf16 mode on the bf16 dot product (without gradient checkpointing, which recomputes whole
// blocks): each block's mid residual xmid = x_in + o(att) is not kept for its backward but recomputed there from
// the block input and the kept attention output (o's forward product again, ~2% of a step: the same kernels on the
// same bits), saving dim x 4 bytes per token and layer (35 MB of SmolLM2's 512-token row group). LoRA keeps it:
// o's LoRA product would need its dropout mask again.
inline bool RecomputesMidResidual(bool bf16_dot, bool lora, bool gradient_checkpointing) {
  return bf16_dot && !lora && !gradient_checkpointing;
}
int64_t PackedHeadBytes(int64_t vocab, int64_t dim, bool head_trainable, bool quantized_base, bool bf16_pairs = false);

// Bytes the model holds now, by memory-plan category (vector capacities; base weights excluded:
// they belong to the ModelWeights). weights: f32 masters (in place ones too) + bf16 shadows of
// full/freeze params + the packed frozen head (PackedHeadBytes);
// lora: A/B masters + shadows; activations: the residual stream and saved per-layer tensors;
// temporary: backward scratch, RoPE tables, targets.
// base_released: bytes of the base weights (as stored) to take off the base's count: trainable
// tensors whose file pages were dropped after their f32 copy, and those trained in place (counted
// in weights instead, as the masters they are); frozen f32 linears whose pages were dropped under their
// bf16 copies. frozen_copies: those copies (FrozenLinearsAsBf16), counted in weights too.
struct TrainMemory {
  int64_t weights = 0, lora = 0, gradients = 0, activations = 0, temporary = 0;
  int64_t base_released = 0, frozen_copies = 0;
};

// An RMSNorm weight gradient is summed over a group's tokens in this many contiguous parts (one
// row of partial sums each, then added in part order), whatever the thread count: its bits do not
// depend on the threads. The memory plan counts kNormGradParts x dim floats per worker.
constexpr int64_t kNormGradParts = 8;

// Rows per forward/backward group of a (B, T) micro-batch: max(1, row_group_tokens / T), at most half the
// rows rounded up (so a batch of short rows still makes two groups for two workers); B when
// row_group_tokens is 0. The memory plan (train/memory_plan.cc) sizes activations with it.
int64_t RowGroupRows(int64_t B, int64_t T, int64_t row_group_tokens);
// Workers that run a micro-batch of `groups` row groups (TrainModelOptions::row_group_workers,
// 0 = `threads`, but 1 for `full` fine-tuning): at most `groups`, and for full / freeze at most `threads`
// (their workers wait for each other). Full fine-tuning runs one group at a time with every product split
// over the threads by default: as fast as two workers at 2 threads on Zen 5 (bf16 713-720 vs 705-728 tok/s,
// f32 352-388 vs 321-363; a second group's loss waits for the first's, and an f32 one whole) for a second
// group's activations and held head-gradient pairs less (2466 vs 2847 MB peak). The memory plan counts
// activations, scratch and private LoRA gradients per worker.
int64_t RowGroupWorkers(bool lora, int64_t groups, int64_t row_group_workers, int threads, bool full = false);

// One micro-batch: B rows of T tokens (row-major), padded rows use label -100 beyond their end.
struct TrainBatch {
  std::span<const int32_t> input_ids;    // (B, T)
  std::span<const int32_t> labels;       // (B, T), -100 = no loss
  std::span<const int32_t> segment_ids;  // (B, T) or empty: packed samples attend only within
                                         // their segment and restart positions at 0
  int64_t B = 0, T = 0;
};

// A trainable tensor: f32 master values and gradient, named as the saved file names it (PEFT keys
// such as "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" for LoRA, HF keys such
// as "model.layers.0.mlp.up_proj.weight" for full/freeze), shape in PyTorch order.
struct TrainableTensor {
  std::string name;
  std::vector<int64_t> shape;
  float* data = nullptr;
  float* grad = nullptr;
  int64_t n = 0;
  bool decay = true;  // false for norm weights and biases (HF's no-decay groups)
};

class TrainModel {
 public:
  // REQUIRES: base outlives the model. Errors name the option (e.g. a LoRA target the model lacks).
  static Result<std::unique_ptr<TrainModel>> Create(const ModelWeights& base, ThreadPool& pool,
                                                    const TrainModelOptions& options);
  // As Create, but full/freeze train every f32 base tensor that is not in a read-only file mapping
  // in place (params() data points into `base`, no copy): base's trainable tensors then hold the
  // trained values. For callers that hand the weights over (the training bench).
  static Result<std::unique_ptr<TrainModel>> CreateInPlace(ModelWeights& base, ThreadPool& pool,
                                                           const TrainModelOptions& options);
  virtual ~TrainModel() = default;

  virtual const ModelConfig& config() const = 0;
  // Every trainable tensor, in a fixed order (the same on every call).
  virtual std::span<const TrainableTensor> params() const = 0;
  virtual int64_t trainable_count() const = 0;
  // Zeroes every gradient. hand_back_pages: their pages go back to the OS (they read as zero and the
  // backward faults them in as it writes them); else they are zeroed in place and stay resident.
  virtual void ZeroGrad(bool hand_back_pages = true) = 0;
  // Forward + backward over one micro-batch; accumulates gradients scaled by 1 / normalizer and
  // returns the sum of token losses (nats, unnormalized). Errors for token ids out of range or
  // T > max_seq_len.
  virtual Result<double> ForwardBackward(const TrainBatch& batch, double normalizer) = 0;
  // Forward only (no dropout): returns the sum of token losses; *n_targets gets the token count.
  virtual Result<double> Loss(const TrainBatch& batch, int64_t* n_targets) = 0;
  virtual TrainMemory AllocatedBytes() const { return {}; }
  // TrainModelOptions::profiler (null when not profiling), for the caller's own ops.
  virtual Profiler* profiler() const { return nullptr; }

  // LoRA: the current adapter as an inference LoraAdapter (copies), usable by Transformer.
  virtual Result<std::unique_ptr<LoraAdapter>> ExportAdapter() const = 0;
  // LoRA: the reverse, an adapter's A and B (LoadPeftAdapter's f32, in the model's row layout) into the masters
  // (continuing a saved adapter). Every LoRA pair of the model must find one of the same shape; errors name
  // a.path, the layer and the module.
  virtual Status ImportAdapter(const LoraAdapter& a) = 0;
  // Writes a PEFT adapter dir (adapter_config.json + adapter_model.safetensors), q/k rows in HF's
  // half-split layout whatever the base's RoPE layout.
  virtual Status SavePeftAdapter(const std::string& dir, const std::string& base_model_name) const = 0;
  // Full/freeze: writes an HF model dir (config.json, generation_config.json, model.safetensors in
  // f32 or bf16) with every weight, trained or frozen, in HF layout.
  virtual Status SaveHfModel(const std::string& dir, bool bf16) const = 0;
  // Workers that the row groups of a micro-batch of B rows use at most (RowGroupWorkers with
  // groups = B; a micro-batch never has more groups than rows). The order in which LoRA gradients
  // are summed depends on this count, not on the thread count: two runs whose counts agree give
  // the same bits (1 for full / freeze on any thread count).
  virtual int64_t MaxRowGroupWorkers(int64_t B) const { (void)B; return 1; }
  // The dropout RNG position (a counter of ForwardBackward calls), for checkpoints and resume.
  virtual uint64_t dropout_rng_state() const { return 0; }
  virtual void set_dropout_rng_state(uint64_t) {}
};

}  // namespace lathe::model
