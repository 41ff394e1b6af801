// Loads a Hugging Face transformers model folder (config.json + safetensors, single or sharded)
// for LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "model/weights.h"

namespace lathe::model {

// config.json text -> ModelConfig. Understands both the transformers 4.x keys (rope_theta,
// rope_scaling) and 5.x (rope_parameters). rope_style is kHalfSplit: HF checkpoints keep Q/K in
// the half-split layout, so no permutation is done. `source` names the file in errors.
Result<ModelConfig> ParseHfConfig(const std::string& json_text, const std::string& source);

// The parts of generation_config.json a server needs. Absent values stay empty / -1.
struct GenerationConfig {
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;  // "eos_token_id" may be an int or a list
  int64_t pad_token_id = -1;
  std::optional<bool> do_sample;
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int64_t> top_k;
  std::optional<int64_t> max_new_tokens;
};
Result<GenerationConfig> ParseHfGenerationConfig(const std::string& json_text, const std::string& source);
// dir/generation_config.json; when absent, bos/eos/pad from dir/config.json; when both are
// absent, an empty GenerationConfig.
Result<GenerationConfig> LoadHfGenerationConfig(const std::string& dir);

// Reads dir/config.json and the weights (model.safetensors or model.safetensors.index.json).
// Matrices stay mmapped in their stored dtype (f32/f16/bf16); 1-D tensors (norms, biases) are
// converted to f32. The returned weights own the mappings. Errors name the file and tensor.
Result<ModelWeights> LoadHfModelDir(const std::string& dir);

}  // namespace lathe::model
