// QuantizeBaseWeights: per-weight packing of the frozen base for QLoRA / int8-base training.
#include "train/quantize_base.h"

#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <vector>

#include "core/strings.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"

namespace lathe::train {

namespace {

bool IsPlainFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// Hands the whole pages inside [p, p + n) back to the kernel: a file mapping's pages leave the
// resident set (they would be read from the file again if touched), anonymous memory reads back as
// zeros. Partial pages at the ends are kept: they may hold a neighbouring tensor. Returns the bytes.
int64_t ReleasePages(const void* p, size_t n) {
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t b = ((uintptr_t)p + page - 1) & ~(page - 1), e = ((uintptr_t)p + n) & ~(page - 1);
  if (e <= b || madvise((void*)b, e - b, MADV_DONTNEED) != 0) return 0;
  return (int64_t)(e - b);
}

}  // namespace

Result<QuantizeBaseReport> QuantizeBaseWeights(model::ModelWeights* w, DType dtype, int64_t frozen_layers) {
  QuantizeBaseReport r;
  static const char* kNames[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  for (int64_t l = 0; l < (int64_t)w->layers.size(); ++l) {
    model::LayerWeights& lw = w->layers[l];
    Tensor* ts[] = {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down};
    for (int i = 0; i < 7; ++i) {
      Tensor& t = *ts[i];
      std::string name = StrFormat("model.layers.%lld.%s.weight", (long long)l, kNames[i]);
      if (l >= frozen_layers || t.data == nullptr || t.dtype == dtype) continue;
      if (t.ndim() != 2) return Status::Error(name + ": expected a 2-D weight");
      const int64_t rows = t.shape[0], cols = t.shape[1];
      if (!PackableAs(dtype, cols)) {
        r.kept.push_back(StrFormat("%s (%lld x %lld, %s): in_features %% 64 != 0", name.c_str(),
                                   (long long)rows, (long long)cols, DTypeName(t.dtype)));
        continue;
      }
      std::vector<float> f32;  // a GGUF quant type: dequantize this one weight, then pack it
      Tensor src = t;
      if (!IsPlainFloat(t.dtype)) {
        f32.resize((size_t)(rows * cols));
        kernels::DequantizeRows(t, 0, rows, f32.data());
        src = Tensor{f32.data(), DType::kF32, {rows, cols}};
      }
      Result<kernels::PackedWeight> pw = kernels::QuantizeWeight(src, dtype, name.c_str());
      if (!pw.ok()) return pw.status().WithContext("key 'quantization_bit'");
      auto owned = std::make_shared<kernels::PackedWeight>(std::move(*pw));
      r.released_bytes += ReleasePages(t.data, t.nbytes());
      r.source_bytes += (int64_t)t.nbytes();
      t = owned->view();
      w->owners.push_back(owned);
      r.quantized++;
    }
  }
  auto add = [&](const Tensor& t, bool linear) {
    if (t.data == nullptr) return;
    r.base_bytes += (int64_t)t.nbytes();
    r.base_params += t.numel();
    if (linear) {
      r.linear_bytes += (int64_t)t.nbytes();
      r.linear_params += t.numel();
    }
  };
  add(w->tok_embd, false);
  if (w->output.data != w->tok_embd.data) add(w->output, false);
  add(w->output_norm, false);
  for (const model::LayerWeights& lw : w->layers) {
    for (const Tensor* t : {&lw.attn_norm, &lw.ffn_norm, &lw.bq, &lw.bk, &lw.bv, &lw.bo, &lw.q_norm, &lw.k_norm}) add(*t, false);
    for (const Tensor* t : {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down}) add(*t, true);
  }
  return r;
}

}  // namespace lathe::train
