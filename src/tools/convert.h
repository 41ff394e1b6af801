// Converts a GGUF model to another weight dtype (f32, f16, bf16, q8_0, q4_0, q4_1), keeping its
// metadata (tokenizer included). Follows llama-quantize's conventions: 1-D tensors stay f32; a
// tied embedding under a 4-bit target is stored as q8_0, since it is also the output head; a
// matrix whose rows are not whole quantization blocks (stories260K's FFN of 172) is kept in f16.
#pragma once

#include <string>

#include "core/dtype.h"
#include "core/status.h"
#include "core/thread_pool.h"

namespace lathe::tools {

struct ConvertStats {
  int64_t tensors = 0;
  int64_t params = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  int64_t f16_fallbacks = 0;  // matrices kept in f16 because their rows are not whole blocks
};

// The dtype a tensor gets under `target` (see the header comment).
DType ConvertedDType(const std::string& name, const std::vector<int64_t>& shape, DType target, bool tied_embedding);
// llama.cpp's general.file_type for a target dtype.
uint32_t GgufFileType(DType target);

Result<ConvertStats> ConvertGguf(const std::string& in_path, const std::string& out_path, DType target,
                                 ThreadPool& pool);

}  // namespace lathe::tools
