// GGUF -> GGUF dtype conversion: dequantize each row to f32, requantize to the target.
#include "tools/convert.h"

#include <memory>
#include <vector>

#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "kernels/kernels.h"

namespace lathe::tools {

uint32_t GgufFileType(DType t) {
  switch (t) {
    case DType::kF32: return 0;
    case DType::kF16: return 1;
    case DType::kQ4_0: return 2;
    case DType::kQ4_1: return 3;
    case DType::kQ8_0: return 7;
    case DType::kBF16: return 32;
    default: return 0;
  }
}

DType ConvertedDType(const std::string& name, const std::vector<int64_t>& shape, DType target, bool tied_embedding) {
  if (shape.size() < 2) return DType::kF32;
  // Rows that are not whole blocks cannot be block-quantized: keep them in f16.
  if (IsQuantized(target) && shape.back() % GetDTypeInfo(target).block_size != 0) return DType::kF16;
  if (name == "token_embd.weight" && tied_embedding && (target == DType::kQ4_0 || target == DType::kQ4_1)) {
    return DType::kQ8_0;
  }
  return target;
}

Result<ConvertStats> ConvertGguf(const std::string& in_path, const std::string& out_path, DType target,
                                 ThreadPool& pool) {
  if (target != DType::kF32 && target != DType::kF16 && target != DType::kBF16 && target != DType::kQ8_0 &&
      target != DType::kQ4_0 && target != DType::kQ4_1) {
    return Status::Error(StrFormat("cannot convert to %s (supported: f32, f16, bf16, q8_0, q4_0, q4_1)", DTypeName(target)));
  }
  if (in_path == out_path) return Status::Error("output path equals the input path; choose another -o");
  LATHE_ASSIGN_OR_RETURN(auto in, formats::GgufFile::Open(in_path));
  bool tied = in->FindTensor("output.weight") == nullptr;
  formats::GgufWriter w;
  for (const std::string& key : in->keys()) {
    if (key == "general.file_type") continue;
    w.Set(key, *in->Find(key));
  }
  w.SetUint32("general.file_type", GgufFileType(target));
  ConvertStats st;
  std::vector<std::unique_ptr<std::vector<uint8_t>>> buffers;
  for (const formats::GgufTensorInfo& ti : in->tensors()) {
    LATHE_ASSIGN_OR_RETURN(Tensor t, in->GetTensor(ti.name));
    DType to = ConvertedDType(ti.name, t.shape, target, tied);
    int64_t row = t.shape.back();
    if (to == DType::kF16 && target != DType::kF16) st.f16_fallbacks++;
    st.tensors++;
    st.params += t.numel();
    st.bytes_in += t.nbytes();
    if (to == t.dtype) {  // unchanged: copy bytes through the mapping
      LATHE_RETURN_IF_ERROR(w.AddTensor(ti.name, to, t.shape, t.data, t.nbytes()));
      st.bytes_out += t.nbytes();
      continue;
    }
    int64_t rows = t.numel() / row;
    size_t out_row_bytes = DTypeBytes(to, row);
    auto buf = std::make_unique<std::vector<uint8_t>>(out_row_bytes * rows);
    Tensor rows_view = t;
    rows_view.shape = {rows, row};
    uint8_t* dst = buf->data();
    pool.ParallelFor(rows, 64, [&](int64_t b, int64_t e, int) {
      std::vector<float> tmp(row);
      for (int64_t r = b; r < e; ++r) {
        kernels::DequantizeRows(rows_view, r, 1, tmp.data());
        kernels::QuantizeRow(to, tmp.data(), row, dst + r * out_row_bytes);
      }
    });
    LATHE_RETURN_IF_ERROR(w.AddTensor(ti.name, to, t.shape, buf->data(), buf->size()));
    st.bytes_out += buf->size();
    buffers.push_back(std::move(buf));
  }
  LATHE_RETURN_IF_ERROR(w.Write(out_path));
  return st;
}

}  // namespace lathe::tools
