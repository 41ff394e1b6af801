// Converts a GGUF model to another weight type, keeping its metadata (tokenizer included), the way
// llama.cpp's llama-quantize does (without an importance matrix): the same file types by the same
// names, the same per-tensor choice of block type inside a mix (q4_k_m keeps attn_v / ffn_down of
// some layers in q6_k, the output head in q6_k, ...), the same fallbacks when a row is not whole
// blocks (q4_k -> q5_0 -> f16, ...), quantizers that give its bytes, and its tensor order: from an
// f32/f16/bf16 source the output file is byte-identical to llama-quantize's (checked on SmolLM2 for
// several file types). 1-D tensors become f32 (llama-quantize keeps their stored type; converters
// from HF write them in f32, so the two agree on such files).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace lathe::tools {

// A `lathe convert --dtype` target: one of llama-quantize's file types.
struct ConvertTarget {
  std::string name;      // lower case: "q4_k_m"
  DType dtype;           // the default block type of the mix (q4_k for q4_k_m)
  uint32_t file_type;    // general.file_type (llama.cpp's llama_ftype)
};
// By name, case-insensitive: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k_s q3_k_m q3_k_l q4_k_s
// q4_k_m q5_k_s q5_k_m q6_k; q3_k, q4_k and q5_k name the _m mixes, as in llama-quantize.
Result<ConvertTarget> ParseConvertTarget(const std::string& name);
// Every name ParseConvertTarget accepts (for help and errors).
const char* ConvertTargetNames();

// What the per-tensor choice looks at: each tensor's name and shape (ne order reversed, i.e. the
// row length last, as lathe stores shapes) and a few hyperparameters of the model.
struct ConvertTensor {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype;  // as stored in the source
};
struct ConvertModel {
  std::string arch;  // general.architecture
  int64_t n_layer = 0, n_head = 0, n_head_kv = 0;
};
// The dtype each tensor gets under `target`, in the order given.
std::vector<DType> PlanConvertedDTypes(const ConvertTarget& target, const std::vector<ConvertTensor>& tensors,
                                       const ConvertModel& model);

struct ConvertStats {
  int64_t tensors = 0;
  int64_t params = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  int64_t fallbacks = 0;  // matrices stored in another type than the mix asked for: rows not whole blocks
  int64_t requantized = 0;  // quantized matrices quantized again to another type (precision lost twice)
};

// Changes a tensor's values on the way through: given a row index and that row as f32 (dequantized, the
// file's layout), edits it in place before it is stored. Called from the pool's threads, each row once.
using RowEdit = std::function<void(int64_t row, float* values)>;
// For a tensor's name, its RowEdit, or an empty one to leave the tensor as the conversion makes it.
using TensorEdits = std::function<RowEdit(const std::string& name)>;

// t's rows (its last dimension) into dst as `to`: each row dequantized to f32, edited (when edit is set), then
// quantized or rounded to `to` (kernels::QuantizeRow: llama.cpp's quantizers, round to nearest even for f16 / bf16);
// rows split over the pool. dst holds DTypeBytes(to, row) bytes per row.
void ConvertRows(ThreadPool& pool, const Tensor& t, DType to, const RowEdit& edit, uint8_t* dst);

// Writes out_path (temp file + rename: an existing file is only replaced by a complete one). With
// allow_requantize false, a matrix that is already quantized and would get another quantized type
// is an error naming it (llama-quantize's rule; `lathe convert` allows it, `lathe quantize` asks).
// edits (optional): tensors it gives a RowEdit are always rewritten from their f32 rows, edited, even where
// their type stays the same (`lathe merge` folds a LoRA adapter in this way).
Result<ConvertStats> ConvertGguf(const std::string& in_path, const std::string& out_path, const ConvertTarget& target,
                                 ThreadPool& pool, bool allow_requantize = true, const TensorEdits& edits = {});

}  // namespace lathe::tools
