// MemoryPlan: where every byte of a training or inference run goes, per category, with the
// formula behind each line. `lathe estimate` prints it; the trainer sizes its arenas from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/config.h"

namespace lathe::train {

// The knobs that decide memory, with LLaMA-Factory's names where it has them.
struct TrainSetup {
  std::string method = "lora";        // full | freeze | lora | qlora
  std::string precision = "bf16";     // fp32 | fp16 | bf16 | pure_bf16
  std::string base_quant = "none";    // none | int8 | nf4 | nf4_dq (qlora implies nf4_dq)
  std::string optimizer = "adamw";    // adamw | adamw_8bit | paged_adamw_8bit | paged_adamw_32bit | sgd
  int64_t batch_size = 1;             // per device micro-batch
  int64_t seq_len = 512;
  int64_t grad_accum = 1;             // grads are accumulated in place; > 1 rules out lathe's
                                      // activation / gradient overlap (LatheHandsBackPages)
  bool grad_checkpointing = false;
  int64_t lora_rank = 8;
  double lora_dropout = 0;            // lathe: dropout keeps a dropped copy of each LoRA input
  std::vector<std::string> lora_targets = {"q", "k", "v", "o", "gate", "up", "down"};
  int64_t freeze_trainable_layers = 2;  // freeze: the last N layers train
  int zero_stage = 0;                 // 0-3: shard optimizer states (1), + grads (2), + params (3)
  int world_size = 1;
  bool cpu_offload = false;           // optimizer states (and params with ZeRO-3) live in host RAM
  int64_t loss_chunk_tokens = 1024;   // tokens per cross-entropy chunk (logits never all at once)
  int64_t param_count = 0;            // > 0 overrides the config's count (`--params 7B`), scaling
                                      // linear and other parameters in proportion
  // lathe's own TrainModel (`lathe train`) instead of a PyTorch-style run: every saved activation
  // and gradient in f32 whatever the precision, bf16 shadows of trainable weights under bf16, the
  // frozen base read as stored, and its exact scratch buffers (see docs/memory.md).
  bool lathe = false;
  double base_weight_bytes = 0;       // lathe: > 0 = bytes of the loaded base weights as stored
                                      // (GGUF quant types, bf16 safetensors, ...)
  DType base_dtype = DType::kF32;     // lathe: the decoder linears' dtype as loaded (how the GEMMs
                                      // convert and align them; a quantized base's packed type)
  DType head_dtype = DType::kF32;     // lathe: the output head's dtype as loaded (whether the loss runs on
                                      // the bf16 dot product, and from a copy)
  double base_released_bytes = -1;    // lathe: >= 0 = of those, the bytes TrainModel made non-
                                      // resident (TrainMemory::base_released); < 0 = assume a
                                      // file-backed base: every trainable tensor's pages dropped
  double frozen_copy_bytes = -1;      // lathe, with base_weight_bytes: >= 0 = bytes of the frozen f32 linears'
                                      // bf16 copies TrainModel holds (TrainMemory::frozen_copies, their f32
                                      // pages in base_released_bytes); < 0 = every frozen one where
                                      // model::FrozenLinearsAsBf16 (a file-backed base)
  double optimizer_bytes_per_param = -1;  // lathe: >= 0 = the optimizer's own figure
  double baseline_bytes = 0;          // measured process baseline (binary, libraries, tokenizer,
                                      // datasets); a "baseline" line when > 0
  int threads = 1;                    // lathe: pool threads (per-thread norm gradient rows)
  int64_t row_group_tokens = 512;     // lathe: TrainModelOptions::row_group_tokens (rows run
                                      // forward + backward in groups; 0 = the whole micro-batch)
  int64_t row_group_workers = 0;      // lathe: TrainModelOptions::row_group_workers (LoRA row
                                      // groups run data-parallel; 0 = one per thread, or
                                      // one for full fine-tuning)
  Status Validate() const;
};

struct InferSetup {
  DType weight_dtype = DType::kBF16;
  DType kv_dtype = DType::kF32;
  int64_t kv_tokens = 4096;  // per sequence
  int64_t kv_seqs = 1;
  int64_t batch_tokens = 512;  // tokens per forward (prefill chunk), for activations
  int64_t param_count = 0;     // > 0 overrides the config's count (`--params 7B`)
};

struct PlanLine {
  std::string category;  // weights | lora | gradients | optimizer | activations | overlap (<= 0: bytes of
                         // two lines never resident together) | temporary | kv_cache | baseline
  std::string where;     // device | host
  double bytes = 0;
  std::string formula;   // how the number was computed, in words and symbols
};

struct MemoryPlan {
  std::vector<PlanLine> lines;
  int64_t total_params = 0;
  int64_t trainable_params = 0;
  double Total(const std::string& where = "device") const;
  double Bytes(const std::string& category) const;  // device + host
};

// Parameters of the linear layers a LoRA target list covers, and the LoRA params for rank r.
int64_t LoraParams(const model::ModelConfig& c, const std::vector<std::string>& targets, int64_t rank);
// Bytes per parameter of a quantized base weight, constants included (see the .cc for the
// bitsandbytes layouts).
double QuantBytesPerParam(const std::string& base_quant, int64_t in_features);
// The one mapping between TrainSetup::base_quant and lathe's packed dtypes (the plan, `lathe estimate`
// and `lathe train` all go through it). BaseQuantOf: the setup's base_quant with qlora's default
// applied (qlora implies nf4_dq). BaseQuantDType REQUIRES base_quant != "none". BaseQuantName: the
// setup name of a packed dtype (FP4 packs to the same bytes as NF4, so it plans as its NF4 twin).
std::string BaseQuantOf(const TrainSetup& s);
DType BaseQuantDType(const std::string& base_quant);
std::string BaseQuantName(DType packed);
// Saved activations of the training forward for one micro-batch (bytes).
double ActivationBytes(const model::ModelConfig& c, const TrainSetup& s);
// lathe: the most tokens one row group (model::RowGroupRows) of a micro-batch of batch_size rows of
// at most seq_len tokens holds: TrainModel's activations and scratch are sized for it.
int64_t LatheGroupTokens(const TrainSetup& s);
// lathe: the row-group workers a micro-batch runs on (model::RowGroupWorkers at the longest length; one by
// default for full fine-tuning).
int64_t LatheWorkers(const model::ModelConfig& c, const TrainSetup& s);
// lathe: whether the run hands gradient and activation pages back to the OS each step
// (model::TrainModelOptions::hand_back_pages): full / freeze without gradient checkpointing whose
// optimizer step is one row group (one micro-batch, no accumulation). Only then do the two overlap
// (the plan's "overlap" line); otherwise they are zeroed and rewritten in place.
bool LatheHandsBackPages(const TrainSetup& s);

// lathe mode, with a measured baseline: what a training process holds beyond the baseline and the
// planned buffers — malloc arenas of the pool threads, code and library pages first touched by the
// training loop, per-step batches, JSON and file buffers. Measured as (peak RSS - plan without it)
// of stories260K runs (tests/e2e/memory_rss.py, 4 settings): 0.4 to 1.9 MiB once the matmul B
// panels (which grew with the tokens per GEMM) were planned; see docs/memory.md.
constexpr double kRuntimeOverheadBytes = 1.0 * 1024 * 1024;

Result<MemoryPlan> PlanTraining(const model::ModelConfig& c, const TrainSetup& s);
MemoryPlan PlanInference(const model::ModelConfig& c, const InferSetup& s);

// Named architectures for estimating without a model file (llama-7b, llama-13b, llama-70b,
// llama3-8b, mistral-7b, qwen2.5-0.5b, qwen2.5-7b, smollm2-135m, smollm2-360m, smollm2-1.7b,
// qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b).
Result<model::ModelConfig> NamedArchitecture(const std::string& name);
std::vector<std::string> NamedArchitectures();

}  // namespace lathe::train
