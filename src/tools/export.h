// `lathe export CONFIG.yaml`: LLaMA-Factory's `llamafactory-cli export` config (model_name_or_path,
// adapter_name_or_path, export_dir, export_size, infer_dtype, ...) run as a LoRA merge (tools/merge.h): the same
// YAML files work unchanged, for HF bases (an HF folder in export_dir, resharded to export_size GB) and GGUF ones
// (export_dir/model.gguf).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "tools/merge.h"

namespace lathe::tools {

struct ExportConfig {
  std::string model_name_or_path;
  std::vector<std::string> adapter_name_or_path;  // merged in order (a YAML list or a comma list)
  std::string finetuning_type = "lora";           // lora needs an adapter; full / freeze export the model as it is
  std::string template_name;                      // accepted: the chat template travels in the tokenizer files
  std::string export_dir;
  double export_size = 5;                         // GB (10^9 bytes) per shard, as LLaMA-Factory's default
  std::string infer_dtype = "auto";               // auto (as stored) | float32 | float16 | bfloat16
  std::vector<std::string> ignored_keys;          // accepted and without effect here (export_device, ...)
};

// Parses the YAML; overrides (key, value) from the command line apply after it. Errors name the file and line or the
// key: an unknown key (with the nearest known one), a bad value, a feature not available here
// (export_quantization_bit: GPTQ; export_legacy_format: true; export_hub_model_id), a missing required key.
Result<ExportConfig> ParseExportConfig(const std::string& yaml_text, const std::string& source,
                                       const std::vector<std::pair<std::string, std::string>>& overrides = {});

// Runs the export; *written gets the output path (export_dir, or export_dir/model.gguf for a GGUF base).
Result<MergeStats> RunExport(const ExportConfig& config, ThreadPool& pool, std::string* written);

}  // namespace lathe::tools
