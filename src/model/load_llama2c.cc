// llama2.c .bin loading: header checks, exact size accounting, views into the mapping.
#include "model/load_llama2c.h"

#include <cstring>
#include <memory>

#include "core/mapped_file.h"

namespace lathe::model {

namespace {
constexpr int64_t kMaxDim = int64_t{1} << 24;  // any real value fits; keeps size math in range
}

Result<ModelWeights> LoadLlama2cBin(const std::string& path) {
  LATHE_ASSIGN_OR_RETURN(auto mf_unique, MappedFile::Open(path));
  std::shared_ptr<MappedFile> mf(std::move(mf_unique));
  const char* file = path.c_str();
  if (mf->size() < 28) {
    return Status::Error(StrFormat("%s: truncated at offset %zu: the llama2.c header needs 28 bytes", file,
                                   mf->size()));
  }
  int32_t h[7];
  std::memcpy(h, mf->data(), sizeof(h));
  static const char* kNames[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                                  "seq_len"};
  for (int i = 0; i < 7; ++i) {
    int64_t v = h[i];
    if (i == 5 && v < 0) v = -v;
    if (v <= 0 || v > kMaxDim) {
      return Status::Error(StrFormat("%s: header field %s (offset %d) is %d; not a llama2.c checkpoint?", file,
                                     kNames[i], 4 * i, h[i]));
    }
  }
  ModelWeights w;
  ModelConfig& c = w.config;
  c.arch = "llama";
  c.dim = h[0];
  c.ffn_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.tied_embeddings = h[5] > 0;
  c.vocab_size = h[5] > 0 ? h[5] : -(int64_t)h[5];
  c.max_seq_len = h[6];
  if (c.dim % c.n_heads != 0 || c.n_heads % c.n_kv_heads != 0 || (c.dim / c.n_heads) % 2 != 0) {
    return Status::Error(StrFormat("%s: dim %lld, n_heads %lld, n_kv_heads %lld are inconsistent (need dim %% "
                                   "n_heads == 0, even head size, n_heads %% n_kv_heads == 0)", file,
                                   (long long)c.dim, (long long)c.n_heads, (long long)c.n_kv_heads));
  }
  c.head_dim = c.dim / c.n_heads;
  c.rope_dim = c.head_dim;
  c.rope_theta = 10000.0f;
  c.norm_eps = 1e-5f;
  c.rope_style = RopeStyle::kInterleaved;
  const int64_t L = c.n_layers, D = c.dim, F = c.ffn_dim, KV = c.kv_dim();

  // Exact size: every array in llama2.c order, counted in floats. 128-bit so that no header
  // (fields < 2^24) can overflow the arithmetic before it is compared with the file size.
  using i128 = __int128;
  const i128 n_weights = (i128)c.vocab_size * D + (i128)L * D + (i128)L * D * D + (i128)2 * L * KV * D +
                         (i128)L * D * D + (i128)L * D + (i128)3 * L * D * F + D;
  const int64_t n_freq = c.max_seq_len * c.head_dim;  // real + imag, (seq_len, head_size / 2) each
  const i128 n_cls = c.tied_embeddings ? 0 : (i128)c.vocab_size * D;
  const i128 with_freq_128 = 28 + 4 * (n_weights + n_freq + n_cls);
  const i128 without_freq_128 = 28 + 4 * (n_weights + n_cls);
  if (without_freq_128 > (i128)UINT64_MAX / 2) {
    return Status::Error(StrFormat("%s: header (%s) describes an impossibly large model", file, c.Summary().c_str()));
  }
  const uint64_t with_freq = (uint64_t)with_freq_128, without_freq = (uint64_t)without_freq_128;
  const uint64_t size = mf->size();
  if (size != with_freq && size != without_freq) {
    if (size < without_freq) {
      return Status::Error(StrFormat("%s: truncated: the header (%s) needs %llu bytes of weights ending at offset "
                                     "%llu, the file ends at offset %llu", file, c.Summary().c_str(),
                                     (unsigned long long)(without_freq - 28), (unsigned long long)without_freq,
                                     (unsigned long long)size));
    }
    return Status::Error(StrFormat("%s: size %llu matches neither %llu (with freq_cis tables) nor %llu (without) "
                                   "for the header (%s)", file, (unsigned long long)size,
                                   (unsigned long long)with_freq, (unsigned long long)without_freq,
                                   c.Summary().c_str()));
  }
  const bool has_freq = size == with_freq;

  const float* p = (const float*)(mf->data() + 28);  // mmap is page-aligned, so 4-byte aligned
  auto take = [&p](int64_t n) {
    const float* r = p;
    p += n;
    return r;
  };
  auto view = [](const float* d, std::vector<int64_t> shape) {
    Tensor t;
    t.data = d;
    t.dtype = DType::kF32;
    t.shape = std::move(shape);
    return t;
  };
  w.layers.resize(L);
  w.tok_embd = view(take(c.vocab_size * D), {c.vocab_size, D});
  const float* rms_att = take(L * D);
  const float* wq = take(L * D * D);
  const float* wk = take(L * KV * D);
  const float* wv = take(L * KV * D);
  const float* wo = take(L * D * D);
  const float* rms_ffn = take(L * D);
  const float* w1 = take(L * F * D);
  const float* w2 = take(L * D * F);
  const float* w3 = take(L * F * D);
  w.output_norm = view(take(D), {D});
  if (has_freq) take(n_freq);
  w.output = c.tied_embeddings ? w.tok_embd : view(take(c.vocab_size * D), {c.vocab_size, D});
  for (int64_t l = 0; l < L; ++l) {
    LayerWeights& lw = w.layers[l];
    lw.attn_norm = view(rms_att + l * D, {D});
    lw.wq = view(wq + l * D * D, {D, D});
    lw.wk = view(wk + l * KV * D, {KV, D});
    lw.wv = view(wv + l * KV * D, {KV, D});
    lw.wo = view(wo + l * D * D, {D, D});
    lw.ffn_norm = view(rms_ffn + l * D, {D});
    lw.w_gate = view(w1 + l * F * D, {F, D});  // w1: gate (silu), w3: up, w2: down
    lw.w_down = view(w2 + l * D * F, {D, F});
    lw.w_up = view(w3 + l * F * D, {F, D});
  }
  w.owners.push_back(mf);
  LATHE_RETURN_IF_ERROR(w.Validate(path));
  return w;
}

}  // namespace lathe::model
