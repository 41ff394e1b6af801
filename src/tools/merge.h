// `lathe merge`: folds a PEFT LoRA adapter into its base model's weights, W + scale * (B A) for each adapted linear
// (what PEFT's merge_and_unload() computes), and writes a model that needs no adapter: a GGUF base gives a GGUF
// (through ConvertGguf, so in any llama-quantize type, as llama.cpp's llama-export-lora writes one), an HF model
// folder gives an HF folder (the same shards, tensor names, config and tokenizer files).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "tools/convert.h"

namespace lathe::tools {

struct MergeOptions {
  // GGUF: a `lathe convert` type for the whole file (default: the base's own type when it is f32, f16 or bf16;
  // f16 over a quantized base, as llama-export-lora: an adapter's small changes would mostly round away in a
  // 4-bit grid, and `lathe quantize` makes any type from the f16 file).
  // HF: f32, f16 or bf16 for every floating tensor (default: each tensor keeps its stored dtype).
  std::string dtype;
  // HF: new shards of at most this many bytes (model-00001-of-0000N.safetensors + index, or model.safetensors when
  // one is enough), as transformers' save_pretrained(max_shard_size=); 0 keeps the base's files.
  uint64_t max_shard_bytes = 0;
};

struct MergeStats {
  std::string format;     // "gguf" or "hf"
  std::string dtype;      // GGUF: the target type's name; HF: the --dtype given, or "as stored"
  int64_t merged = 0;     // linear weights the adapter changed
  int64_t tensors = 0;    // tensors written
  int64_t files = 0;      // files written (safetensors shards, config, tokenizer, ...)
  uint64_t bytes_out = 0; // bytes of tensor data written
  ConvertStats convert;   // GGUF: the conversion's counts (fallbacks, requantized matrices)
};

// base: a GGUF file or an HF model folder; adapter_dirs: PEFT LoRA adapters for it (each checked against the base's
// shapes by LoadPeftAdapter), merged in order, their changes summed in f32 and rounded once (none: the model is
// rewritten as it is, in options' dtype and shards); out: a .gguf path for a GGUF base, a folder for an HF base (created; files in it that
// the merge writes are replaced whole, each written under a temporary name and renamed). Errors name the file,
// tensor or key: a base in another format, an adapter module that finds no tensor in the base, an output that is the
// base itself, a dtype the output format cannot hold.
Result<MergeStats> MergeLora(const std::string& base, const std::vector<std::string>& adapter_dirs,
                             const std::string& out, const MergeOptions& options, ThreadPool& pool);

}  // namespace lathe::tools
