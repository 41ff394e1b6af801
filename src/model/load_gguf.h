// Builds ModelWeights from a GGUF file (llama, mistral, qwen2, qwen3 architectures); the tensors stay
// in the mapping in their stored dtype.
#pragma once

#include <memory>

#include "core/status.h"
#include "formats/gguf.h"
#include "model/weights.h"

namespace lathe::model {

// Reads the {arch}.* hyper-parameters into a ModelConfig (vocab size from the embedding).
Result<ModelConfig> ConfigFromGguf(const formats::GgufFile& gguf);
// The weights keep `gguf` alive through ModelWeights::owners.
Result<ModelWeights> LoadGgufWeights(std::shared_ptr<formats::GgufFile> gguf);

}  // namespace lathe::model
