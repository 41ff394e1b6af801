// ModelWeights helpers: owned buffers, aligned copies and shape validation.
#include "model/weights.h"

#include <cstring>


namespace lathe::model {

double ModelWeights::StoredBytes() const {
  double b = (double)tok_embd.nbytes() + (double)output_norm.nbytes();
  if (output.data && output.data != tok_embd.data) b += (double)output.nbytes();
  for (const LayerWeights& l : layers) {
    for (const Tensor* t : l.All())
      if (t->data) b += (double)t->nbytes();
  }
  return b;
}

Tensor ModelWeights::OwnF32(std::vector<float> data, std::vector<int64_t> shape) {
  auto holder = std::make_shared<std::vector<float>>(std::move(data));
  Tensor t;
  t.data = holder->data();
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  owners.push_back(holder);
  return t;
}

Tensor ModelWeights::Aligned(Tensor t) {
  if (t.aligned()) return t;
  auto copy = std::make_shared<std::vector<uint64_t>>((t.nbytes() + 7) / 8);
  std::memcpy(copy->data(), t.data, t.nbytes());
  t.data = copy->data();
  owners.push_back(copy);
  return t;
}

namespace {
Status CheckShape(const std::string& source, const std::string& name, const Tensor& t,
                  std::vector<int64_t> want) {
  if (!t.data) return Status::Error(StrFormat("%s: missing tensor %s", source.c_str(), name.c_str()));
  // Plain integer, bool and f64 tensors are not weights the kernels read (a file may still label one so).
  if (t.dtype == DType::kF64 || (t.dtype >= DType::kI8 && t.dtype <= DType::kBool)) {
    return Status::Error(StrFormat("%s: tensor %s has dtype %s; weights must be f32, f16, bf16 or a quantized block "
                                   "type", source.c_str(), name.c_str(), DTypeName(t.dtype)));
  }
  if (t.shape != want) {
    Tensor w;
    w.shape = want;
    return Status::Error(StrFormat("%s: tensor %s has shape %s, expected %s", source.c_str(), name.c_str(),
                                   t.ShapeString().c_str(), w.ShapeString().c_str()));
  }
  return Status::Ok();
}
}  // namespace

Status ModelWeights::Validate(const std::string& source) const {
  const ModelConfig& c = config;
  if (c.n_layers <= 0 || c.dim <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 ||
      c.ffn_dim <= 0 || c.vocab_size <= 0) {
    return Status::Error(source + ": incomplete model config: " + c.Summary());
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return Status::Error(StrFormat("%s: n_heads %lld is not a multiple of n_kv_heads %lld", source.c_str(),
                                   (long long)c.n_heads, (long long)c.n_kv_heads));
  }
  if (c.head_dim % 2 != 0 || c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return Status::Error(source + ": head_dim and rope_dim must be even with rope_dim <= head_dim");
  }
  if ((int64_t)layers.size() != c.n_layers) {
    return Status::Error(StrFormat("%s: %zu layers loaded, config says %lld", source.c_str(), layers.size(),
                                   (long long)c.n_layers));
  }
  LATHE_RETURN_IF_ERROR(CheckShape(source, "token embedding", tok_embd, {c.vocab_size, c.dim}));
  LATHE_RETURN_IF_ERROR(CheckShape(source, "output norm", output_norm, {c.dim}));
  LATHE_RETURN_IF_ERROR(CheckShape(source, "output", output, {c.vocab_size, c.dim}));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const LayerWeights& l = layers[i];
    std::string p = "layer " + std::to_string(i) + " ";
    LATHE_RETURN_IF_ERROR(CheckShape(source, p + "attn_norm", l.attn_norm, {c.dim}));
    LATHE_RETURN_IF_ERROR(CheckShape(source, p + "q", l.wq, {c.q_dim(), c.dim}));
    LATHE_RETURN_IF_ERROR(CheckShape(source, p + "k", l.wk, {c.kv_dim(), c.dim}));
    LATHE_RETURN_IF_ERROR(CheckShape(source, p + "v", l.wv, {c.kv_dim(), c.dim}));
    LATHE_RETURN_IF_ERROR(CheckShape(source, p + "o", l.wo, {c.dim, c.q_dim()}));
    LATHE_RETURN_IF_ERROR(CheckShape(source, p + "ffn_norm", l.ffn_norm, {c.dim}));
    LATHE_RETURN_IF_ERROR(CheckShape(source, p + "gate", l.w_gate, {c.ffn_dim, c.dim}));
    LATHE_RETURN_IF_ERROR(CheckShape(source, p + "up", l.w_up, {c.ffn_dim, c.dim}));
    LATHE_RETURN_IF_ERROR(CheckShape(source, p + "down", l.w_down, {c.dim, c.ffn_dim}));
    if (c.qkv_bias) {
      LATHE_RETURN_IF_ERROR(CheckShape(source, p + "q bias", l.bq, {c.q_dim()}));
      LATHE_RETURN_IF_ERROR(CheckShape(source, p + "k bias", l.bk, {c.kv_dim()}));
      LATHE_RETURN_IF_ERROR(CheckShape(source, p + "v bias", l.bv, {c.kv_dim()}));
    }
    if (c.o_bias) LATHE_RETURN_IF_ERROR(CheckShape(source, p + "o bias", l.bo, {c.dim}));
    if (c.qk_norm) {
      LATHE_RETURN_IF_ERROR(CheckShape(source, p + "q norm", l.q_norm, {c.head_dim}));
      LATHE_RETURN_IF_ERROR(CheckShape(source, p + "k norm", l.k_norm, {c.head_dim}));
    }
    for (const Tensor* n : {&l.attn_norm, &l.ffn_norm, &l.q_norm, &l.k_norm}) {
      if (n->data && n->dtype != DType::kF32) return Status::Error(source + ": " + p + "norm weights must be f32");
    }
  }
  return Status::Ok();
}

}  // namespace lathe::model
