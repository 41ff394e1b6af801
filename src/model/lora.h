// LoRA adapters for inference: a PEFT adapter directory (adapter_config.json +
// adapter_model.safetensors) loaded as per-layer, per-module A (r, in) and B (out, r) in f32 with
// PEFT's scaling (alpha / r, or alpha / sqrt(r) with rsLoRA). The forward adds
// scale * (x A^T) B^T to each adapted linear layer.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"

namespace lathe::model {

enum class LoraModule : int { kQ = 0, kK, kV, kO, kGate, kUp, kDown, kCount };
// PEFT's module name ("q_proj", ...) and whether it lives under self_attn or mlp.
const char* LoraModuleName(LoraModule m);

struct LoraPair {
  Tensor a;  // (r, in) f32; data == nullptr when the module is not adapted
  Tensor b;  // (out, r) f32
  float scale = 0;
};

struct LoraAdapter {
  std::string path;
  int64_t rank = 0;
  double alpha = 0;
  bool rslora = false;
  std::vector<std::string> target_modules;
  std::vector<std::array<LoraPair, (size_t)LoraModule::kCount>> layers;
  std::vector<std::shared_ptr<std::vector<float>>> storage;
  const LoraPair& at(int64_t layer, LoraModule m) const { return layers[layer][(size_t)m]; }
};

// Loads a PEFT LoRA adapter for a model of `config`. Adapters are in HF's half-split Q/K layout;
// for a model with interleaved RoPE (GGUF llama, llama2.c) the q/k B rows are permuted to match.
// Errors name the file and key: unsupported PEFT features (DoRA, biases, modules_to_save,
// embedding adapters), shape mismatches, unknown modules.
Result<std::unique_ptr<LoraAdapter>> LoadPeftAdapter(const std::string& dir, const ModelConfig& config);

}  // namespace lathe::model
