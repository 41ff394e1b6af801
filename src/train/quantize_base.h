// Quantizes the frozen linear weights of a loaded model into a packed bitsandbytes dtype (QLoRA's
// NF4/FP4 (+DQ) base, or LLM.int8), one weight at a time, for `lathe train` with quantization_bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/weights.h"

namespace lathe::train {

struct QuantizeBaseReport {
  int64_t quantized = 0;                        // weights now in the packed dtype
  std::vector<std::string> kept;                // "blk.L.name (rows x cols): why", left as they were
  int64_t base_bytes = 0, base_params = 0;      // every base tensor after quantization
  int64_t linear_bytes = 0, linear_params = 0;  // the 7 linear weights of each layer
  int64_t source_bytes = 0;                     // bytes of the packed weights' sources
  int64_t released_bytes = 0;                   // of which handed back (whole pages)
};

// Replaces wq, wk, wv, wo, w_gate, w_up, w_down of layers [0, frozen_layers) with packed `dtype`
// weights (owned by `w`). Sources in f32/f16/bf16 are quantized directly; GGUF quant types are
// dequantized first, one weight at a time. Weights whose shape the format cannot take (4-bit types
// need in_features % 64 == 0) stay as they are and are listed in the report. Embeddings, norms and
// the output head are not touched (as bitsandbytes / PEFT leave them).
// The source bytes of every packed weight are released (madvise MADV_DONTNEED over their whole
// pages): an mmapped file's pages leave the resident set, owned buffers read back as zeros, so no
// other view may still read a packed weight's source (loaders never share linear weights).
Result<QuantizeBaseReport> QuantizeBaseWeights(model::ModelWeights* w, DType dtype, int64_t frozen_layers);

}  // namespace lathe::train
