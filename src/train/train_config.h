// TrainConfig: `lathe train` settings under LLaMA-Factory's key names, read from YAML and
// `--key value` overrides. Unknown keys and bad values stop before any work, with an error that
// names the key (and the nearest valid one) and what was expected.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace lathe::train {

struct TrainConfig {
  // model
  std::string model_name_or_path;
  std::string adapter_name_or_path;  // resume / continue a LoRA adapter (PEFT dir)
  // method
  std::string stage = "sft";           // sft | pt
  bool do_train = true;
  std::string finetuning_type = "lora";  // lora | full | freeze
  int64_t lora_rank = 8;
  double lora_alpha = -1;              // default 2 * lora_rank, as LLaMA-Factory
  double lora_dropout = 0;
  std::vector<std::string> lora_target = {"all"};  // all | q_proj,v_proj,... (or q,v,...)
  bool use_rslora = false;
  int64_t freeze_trainable_layers = 2;
  // dataset
  std::vector<std::string> dataset;
  std::vector<std::string> eval_dataset;
  std::string dataset_dir = "data";
  std::string template_name;           // `template` key; empty = from the model
  int64_t cutoff_len = 2048;
  int64_t max_samples = 0;             // 0 = all
  double val_size = 0;                 // fraction (< 1) or count (>= 1)
  bool packing = false;
  bool group_by_length = false;  // HF's: micro-batches of similar-length samples (less padding)
  bool train_on_prompt = false;
  bool mask_history = false;
  bool enable_thinking = true;  // LLaMA-Factory's: the qwen3 template's empty think blocks are targets (true) or prompt
  // training
  int64_t per_device_train_batch_size = 1;
  int64_t per_device_eval_batch_size = 1;
  int64_t gradient_accumulation_steps = 1;
  double learning_rate = 5e-5;
  double num_train_epochs = 3;
  int64_t max_steps = -1;
  std::string lr_scheduler_type = "linear";  // linear | cosine | constant | constant_with_warmup
  double warmup_ratio = 0;
  int64_t warmup_steps = 0;
  double weight_decay = 0;
  double max_grad_norm = 1.0;
  std::string optim = "adamw_torch";
  int64_t optim_resident_mb = 0;       // paged_* optimizers: resident cap of the state (0 = none)
  // quantized base weights (LLaMA-Factory's bitsandbytes keys; QLoRA when 4)
  int64_t quantization_bit = 0;        // 0 = off | 4 | 8
  std::string quantization_method = "bnb";
  std::string quantization_type = "nf4";  // nf4 | fp4 (alias bnb_4bit_quant_type)
  bool double_quantization = true;     // alias bnb_4bit_use_double_quant
  bool bf16 = false;
  bool fp16 = false;
  bool pure_bf16 = false;
  bool gradient_checkpointing = false;
  // lathe: row groups of a micro-batch run side by side on this many workers, each with its own
  // activations (model::TrainModelOptions::row_group_workers); 0 = one per thread (one for full
  // fine-tuning: model::RowGroupWorkers), 1 = the least memory.
  int64_t row_group_workers = 0;
  // logging / output
  int64_t logging_steps = 10;
  int64_t save_steps = 500;
  int64_t save_total_limit = 0;        // 0 = keep all
  int64_t eval_steps = 0;              // 0 = eval at the end only (when there is eval data)
  std::string eval_strategy = "no";    // no | steps | epoch
  std::string output_dir;
  bool overwrite_output_dir = false;
  int64_t seed = 42;
  std::vector<std::string> report_to = {"none"};  // none | tensorboard
  std::string resume_from_checkpoint;  // path | last | empty
  // Keys LLaMA-Factory configs carry that change nothing here (multi-process data loading,
  // hub caching, plotting); they are accepted so those files run unchanged. Listed in docs.
  std::vector<std::string> ignored_keys;

  Status Validate() const;
};

// One key of a LLaMA-Factory-style config file: its value (a YAML list joined by commas) and where it was
// ("FILE line N", or "command line --key").
struct ConfigEntry {
  std::string key, value, where;
};
// A YAML mapping of plain values and lists; `key: null` / `key:` entries are left out (the default stays). Errors name
// the file and line: invalid YAML, not a mapping, a nested mapping.
Result<std::vector<ConfigEntry>> ReadConfigYaml(const std::string& yaml_text, const std::string& source);
// `--key value` pairs as entries: leading dashes stripped, '-' in a key read as '_'.
std::vector<ConfigEntry> OverrideEntries(const std::vector<std::pair<std::string, std::string>>& overrides);

// Parses YAML text (`source` names the file in errors).
Result<TrainConfig> ParseTrainConfig(const std::string& yaml_text, const std::string& source);
// Applies `--key value` overrides (argv-style pairs, leading dashes stripped) on top.
Status ApplyOverrides(TrainConfig* config, const std::vector<std::pair<std::string, std::string>>& overrides);
// Every key the parser understands (for help and suggestions).
std::vector<std::string> TrainConfigKeys();

// The packed dtype (core/dtype.h) the frozen base weights are quantized to on load: quantization_bit
// 4 -> nf4 / fp4, with _dq when double_quantization; 8 -> i8_row. False when quantization_bit is 0.
bool QuantizedBaseDType(const TrainConfig& config, DType* out);

}  // namespace lathe::train
