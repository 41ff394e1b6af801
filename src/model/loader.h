// LoadModel: opens whatever a user points at — a GGUF file, an HF model directory, or a
// llama2.c .bin — and returns its weights and tokenizer.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "model/lora.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace lathe::model {

struct LoadOptions {
  // Overrides the tokenizer found with the model (tokenizer.json, tokenizer.model or a llama2.c
  // tokenizer .bin). Required for a llama2.c .bin without a tokenizer beside it.
  std::string tokenizer_path;
  // A PEFT LoRA adapter directory to load with the model (applied by passing it to the
  // Transformer's options).
  std::string adapter_path;
};

struct LoadedModel {
  ModelWeights weights;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<LoraAdapter> adapter;  // null without LoadOptions::adapter_path
  std::string path;
  std::string format;  // gguf | hf | llama2c
};

Result<std::unique_ptr<LoadedModel>> LoadModel(const std::string& path, const LoadOptions& options = {});

// Loads just a tokenizer from a model file or a tokenizer file (tokenizer.json, *.model,
// llama2.c tokenizer .bin with its vocab size inferred from the file).
Result<std::unique_ptr<tokenizer::Tokenizer>> LoadTokenizer(const std::string& path);

}  // namespace lathe::model
