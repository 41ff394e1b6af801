// Quantized base weights for QLoRA-style training and inference: NF4/FP4 (+ double quant) and
// LLM.int8 weights in bitsandbytes' layouts (core/dtype.h), quantized on load from f32/f16/bf16.
// MatMul / MatMulBackwardInput take these tensors as stored (kernels.h, train_ops.h).
#pragma once

#include <cstdint>
#include <memory>

#include "core/status.h"
#include "core/tensor.h"

namespace lathe::kernels {

// Owns one packed quantized weight buffer (64-byte aligned).
class PackedWeight {
 public:
  PackedWeight() = default;
  PackedWeight(DType t, int64_t rows, int64_t cols);  // zero-filled buffer with its header written
  // The weight as a Tensor view {buffer, dtype, {rows, cols}}; valid while *this lives.
  Tensor view() const { return Tensor{buf_.get(), dtype_, {rows_, cols_}}; }
  size_t bytes() const { return bytes_; }
  uint8_t* data() { return buf_.get(); }
  const uint8_t* data() const { return buf_.get(); }
  DType dtype() const { return dtype_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> buf_;
  size_t bytes_ = 0;
  DType dtype_ = DType::kNF4;
  int64_t rows_ = 0, cols_ = 0;
};

// Quantizes a 2-D weight (f32, f16 or bf16) into packed type t as bitsandbytes does:
//   kNF4/kFP4[DQ]: quantize_4bit(w, blocksize=64, quant_type, compress_statistics=DQ)
//   kI8Row:        Int8Params (row-wise absmax; int8 = round(w * 127 / absmax_row))
// Errors (naming `name`) for a non-2-D or non-float source, cols % 64 != 0 for the 4-bit types,
// or non-finite values.
Result<PackedWeight> QuantizeWeight(const Tensor& w, DType t, const char* name = "weight");

// Checks a packed tensor's header against its dtype and shape (for buffers read from files).
Status ValidatePacked(const Tensor& w, const char* name = "weight");

// out(rows, cols) f32 = the dequantized weight (reference; tests and export only).
void DequantizePacked(const Tensor& w, float* out);

// LLM.int8 outlier threshold for the decode path (bitsandbytes' llm_int8_threshold default).
inline constexpr float kInt8OutlierThreshold = 6.0f;

}  // namespace lathe::kernels
