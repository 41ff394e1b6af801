// Loads a llama2.c checkpoint (.bin: 7 x int32 header, then f32 arrays) as ModelWeights.
#pragma once

#include <string>

#include "core/status.h"
#include "model/weights.h"

namespace lathe::model {

// Header: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative = untied
// classifier stored last), seq_len. Weights stay mmapped (all f32, Meta layout: rope_style is
// kInterleaved, theta 10000, eps 1e-5). The freq_cis tables of legacy exports are skipped; the
// file size must match exactly (with or without them), else the error names the offset.
Result<ModelWeights> LoadLlama2cBin(const std::string& path);

}  // namespace lathe::model
