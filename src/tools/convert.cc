// GGUF -> GGUF type conversion: dequantize each row to f32, requantize to the type llama-quantize
// would choose for that tensor (src/llama-quant.cpp of llama.cpp, dense models, no imatrix).
#include "tools/convert.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <numeric>
#include <vector>

#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "kernels/kernels.h"

namespace lathe::tools {

namespace {

// llama_ftype values.
enum FileType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 7, kQ5_0 = 8, kQ5_1 = 9, kQ2_K = 10, kQ3_K_S = 11,
  kQ3_K_M = 12, kQ3_K_L = 13, kQ4_K_S = 14, kQ4_K_M = 15, kQ5_K_S = 16, kQ5_K_M = 17, kQ6_K = 18, kBF16 = 32,
};

const ConvertTarget kTargets[] = {
    {"f32", DType::kF32, kF32},        {"f16", DType::kF16, kF16},        {"bf16", DType::kBF16, kBF16},
    {"q8_0", DType::kQ8_0, kQ8_0},     {"q4_0", DType::kQ4_0, kQ4_0},     {"q4_1", DType::kQ4_1, kQ4_1},
    {"q5_0", DType::kQ5_0, kQ5_0},     {"q5_1", DType::kQ5_1, kQ5_1},     {"q2_k", DType::kQ2_K, kQ2_K},
    {"q3_k_s", DType::kQ3_K, kQ3_K_S}, {"q3_k_m", DType::kQ3_K, kQ3_K_M}, {"q3_k_l", DType::kQ3_K, kQ3_K_L},
    {"q4_k_s", DType::kQ4_K, kQ4_K_S}, {"q4_k_m", DType::kQ4_K, kQ4_K_M}, {"q5_k_s", DType::kQ5_K, kQ5_K_S},
    {"q5_k_m", DType::kQ5_K, kQ5_K_M}, {"q6_k", DType::kQ6_K, kQ6_K},
};

enum class Category { kOutput, kTokenEmbd, kAttnQkv, kAttnKvB, kAttnV, kAttnK, kAttnQ, kAttnOutput,
                      kFfnUp, kFfnGate, kFfnDown, kOther };

bool Has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// llama.cpp's tensor_get_category (the order of the tests matters: "ffn_up" also matches experts).
Category CategoryOf(const std::string& n) {
  if (n == "output.weight") return Category::kOutput;
  if (n == "token_embd.weight" || n == "per_layer_token_embd.weight") return Category::kTokenEmbd;
  if (Has(n, "attn_qkv.weight")) return Category::kAttnQkv;
  if (Has(n, "attn_kv_b.weight")) return Category::kAttnKvB;
  if (Has(n, "attn_v.weight")) return Category::kAttnV;
  if (Has(n, "attn_k.weight")) return Category::kAttnK;
  if (Has(n, "attn_q.weight")) return Category::kAttnQ;
  if (Has(n, "attn_output.weight")) return Category::kAttnOutput;
  if (Has(n, "ffn_up")) return Category::kFfnUp;
  if (Has(n, "ffn_gate")) return Category::kFfnGate;
  if (Has(n, "ffn_down")) return Category::kFfnDown;
  return Category::kOther;
}

bool IsAttnV(Category c) { return c == Category::kAttnV || c == Category::kAttnQkv || c == Category::kAttnKvB; }

// llama.cpp's tensor_allows_quantization, the parts that concern the architectures lathe reads:
// matrices named *weight, not norms, not an MoE router, not positional or token-type embeddings.
bool AllowsQuantization(const ConvertTensor& t) {
  if (t.shape.size() < 2) return false;
  const std::string& n = t.name;
  if (n.size() < 6 || n.compare(n.size() - 6, 6, "weight") != 0) return false;
  return !Has(n, "_norm.weight") && !Has(n, "ffn_gate_inp.weight") && n != "position_embd.weight" &&
         n != "token_types.weight";
}

int LayerOf(const std::string& name) {
  int layer = -1;
  std::sscanf(name.c_str(), "blk.%d.", &layer);
  return layer;
}

// llama.cpp's tensor_type_fallback: a type whose block does not divide the row length gives way to a
// 32-block one, and that to f16.
DType Fallback(DType t, int64_t ncols) {
  if (ncols % GetDTypeInfo(t).block_size == 0) return t;
  DType r = t;
  switch (t) {
    case DType::kQ2_K:
    case DType::kQ3_K: r = DType::kQ4_0; break;
    case DType::kQ4_K: r = DType::kQ5_0; break;
    case DType::kQ5_K: r = DType::kQ5_1; break;
    case DType::kQ6_K: r = DType::kQ8_0; break;
    default: break;
  }
  return ncols % GetDTypeInfo(r).block_size == 0 ? r : DType::kF16;
}

// llama-quantize visits (and writes) tensors by layer, non-layer tensors first, then by name; its
// per-layer counters depend on that order.
std::vector<size_t> QuantizeOrder(const std::vector<ConvertTensor>& tensors) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int la = LayerOf(tensors[a].name), lb = LayerOf(tensors[b].name);
    return la != lb ? la < lb : tensors[a].name < tensors[b].name;
  });
  return order;
}

struct MixState {
  const ConvertTarget& target;
  const ConvertModel& model;
  bool tied = true;
  int n_attention_wv = 0, i_attention_wv = 0, i_ffn_down = 0;
};

bool UseMoreBits(int i_layer, int n_layers) {
  return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

// llama.cpp's llama_tensor_get_type_impl for dense models (no experts), the K-quant and legacy file types.
DType MixType(MixState& s, DType t, const ConvertTensor& tensor, Category c) {
  const uint32_t ft = s.target.file_type;
  const int64_t gqa = s.model.n_head_kv > 0 ? s.model.n_head / s.model.n_head_kv : 0;
  if (c == Category::kOutput || (s.tied && c == Category::kTokenEmbd)) {
    if (tensor.shape.back() % GetDTypeInfo(t).block_size != 0) return DType::kQ8_0;
    return t == DType::kQ8_0 ? t : DType::kQ6_K;
  }
  if (c == Category::kTokenEmbd) return t;
  if (IsAttnV(c)) {
    if (ft == kQ2_K) {
      t = gqa >= 4 ? DType::kQ4_K : DType::kQ3_K;
    } else if (ft == kQ3_K_M) {
      t = s.i_attention_wv < 2 ? DType::kQ5_K : DType::kQ4_K;
    } else if (ft == kQ3_K_L) {
      t = DType::kQ5_K;
    } else if ((ft == kQ4_K_M || ft == kQ5_K_M) && UseMoreBits(s.i_attention_wv, s.n_attention_wv)) {
      t = DType::kQ6_K;
    } else if (ft == kQ4_K_S && s.i_attention_wv < 4) {
      t = DType::kQ5_K;
    }
    // Llama 2 70B (80 layers, grouped KV heads): its attn_v is 8x smaller than attn_q; more bits are cheap.
    const bool is_70b = s.model.arch == "llama" && s.model.n_layer == 80 && s.model.n_head != s.model.n_head_kv;
    if (is_70b && (t == DType::kQ3_K || t == DType::kQ4_K)) t = DType::kQ5_K;
    ++s.i_attention_wv;
    return t;
  }
  if (c == Category::kFfnDown) {
    const int i = s.i_ffn_down++, n = (int)s.model.n_layer;
    if (ft == kQ2_K) return DType::kQ3_K;
    if (ft == kQ3_K_M) return i < n / 16 ? DType::kQ5_K : DType::kQ4_K;
    if (ft == kQ3_K_L) return DType::kQ5_K;
    if ((ft == kQ4_K_M || ft == kQ5_K_M) && UseMoreBits(i, n)) return DType::kQ6_K;
    if (ft == kQ4_K_S && i < n / 8) return DType::kQ5_K;
    return t;
  }
  if (c == Category::kAttnOutput) {
    if (ft == kQ2_K) return DType::kQ3_K;
    if (ft == kQ3_K_M) return DType::kQ4_K;
    if (ft == kQ3_K_L) return DType::kQ5_K;
    return t;
  }
  if (c == Category::kAttnQkv) {
    if (ft == kQ3_K_M || ft == kQ3_K_L) return DType::kQ4_K;
    if (ft == kQ4_K_M) return DType::kQ5_K;
    if (ft == kQ5_K_M) return DType::kQ6_K;
  }
  return t;
}

struct Planned {
  DType dtype;
  bool fallback;  // the mix's type did not fit the row length
};

std::vector<Planned> Plan(const ConvertTarget& target, const std::vector<ConvertTensor>& tensors,
                          const ConvertModel& model) {
  MixState s{target, model};
  for (const ConvertTensor& t : tensors) {
    const Category c = CategoryOf(t.name);
    if (IsAttnV(c)) ++s.n_attention_wv;
    if (c == Category::kOutput) s.tied = false;
  }
  std::vector<Planned> out(tensors.size());
  for (size_t i : QuantizeOrder(tensors)) {
    const ConvertTensor& t = tensors[i];
    if (t.shape.size() < 2) {
      out[i] = {DType::kF32, false};
      continue;
    }
    if (!AllowsQuantization(t)) {
      out[i] = {t.dtype, false};
      continue;
    }
    DType d = target.dtype;
    if (IsQuantized(d)) d = MixType(s, d, t, CategoryOf(t.name));
    const DType f = IsQuantized(d) ? Fallback(d, t.shape.back()) : d;
    out[i] = {f, f != d};
  }
  return out;
}

}  // namespace

Result<ConvertTarget> ParseConvertTarget(const std::string& name) {
  std::string n = name;
  for (char& ch : n) ch = (char)std::tolower((unsigned char)ch);
  if (n == "q3_k" || n == "q4_k" || n == "q5_k") n += "_m";
  for (const ConvertTarget& t : kTargets) {
    if (t.name == n) return t;
  }
  return Status::Error("--dtype '" + name + "' is unknown; expected one of: " + ConvertTargetNames());
}

const char* ConvertTargetNames() {
  return "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_s, q3_k_m, q3_k_l, q4_k_s, q4_k_m, "
         "q5_k_s, q5_k_m, q6_k (q3_k, q4_k, q5_k = the _m mixes)";
}

std::vector<DType> PlanConvertedDTypes(const ConvertTarget& target, const std::vector<ConvertTensor>& tensors,
                                       const ConvertModel& model) {
  std::vector<DType> out;
  for (const Planned& p : Plan(target, tensors, model)) out.push_back(p.dtype);
  return out;
}

void ConvertRows(ThreadPool& pool, const Tensor& t, DType to, const RowEdit& edit, uint8_t* dst) {
  const int64_t row = t.ndim() == 0 ? 1 : t.shape.back(), rows = t.numel() / std::max<int64_t>(row, 1);
  const size_t out_row_bytes = DTypeBytes(to, row);
  Tensor rows_view = t;
  rows_view.shape = {rows, row};
  pool.ParallelFor(rows, 16, [&](int64_t b, int64_t e, int) {
    std::vector<float> tmp(row);
    for (int64_t r = b; r < e; ++r) {
      kernels::DequantizeRows(rows_view, r, 1, tmp.data());
      if (edit) edit(r, tmp.data());
      kernels::QuantizeRow(to, tmp.data(), row, dst + r * out_row_bytes);
    }
  });
}

Result<ConvertStats> ConvertGguf(const std::string& in_path, const std::string& out_path, const ConvertTarget& target,
                                 ThreadPool& pool, bool allow_requantize, const TensorEdits& edits) {
  if (in_path == out_path) return Status::Error("output path equals the input path; choose another -o");
  LATHE_ASSIGN_OR_RETURN(auto in, formats::GgufFile::Open(in_path));
  ConvertModel model;
  if (auto arch = in->GetString("general.architecture"); arch.ok()) model.arch = *arch;
  auto hp = [&](const char* key) -> int64_t {
    auto v = in->GetInt(model.arch + "." + key);
    return v.ok() ? *v : 0;
  };
  model.n_layer = hp("block_count");
  model.n_head = hp("attention.head_count");
  model.n_head_kv = hp("attention.head_count_kv");
  if (model.n_head_kv == 0) model.n_head_kv = model.n_head;
  std::vector<ConvertTensor> descs;
  for (const formats::GgufTensorInfo& ti : in->tensors()) descs.push_back({ti.name, ti.shape, ti.dtype});
  const std::vector<Planned> plan = Plan(target, descs, model);
  for (size_t i = 0; i < descs.size() && !allow_requantize; ++i) {
    if (IsQuantized(descs[i].dtype) && IsQuantized(plan[i].dtype) && descs[i].dtype != plan[i].dtype) {
      return Status::Error(in_path + ": tensor '" + descs[i].name + "' is already " + DTypeName(descs[i].dtype) +
                           "; quantizing it again to " + DTypeName(plan[i].dtype) +
                           " loses more than quantizing the f32/f16/bf16 original (pass --allow-requantize to do it anyway)");
    }
  }

  formats::GgufWriter w;
  for (const std::string& key : in->keys()) {
    if (key == "general.file_type") continue;
    w.Set(key, *in->Find(key));
  }
  w.SetUint32("general.file_type", target.file_type);
  if (IsQuantized(target.dtype)) w.SetUint32("general.quantization_version", 2);
  ConvertStats st;
  // In llama-quantize's order, so that its file and ours are the same bytes.
  for (size_t i : QuantizeOrder(descs)) {
    const std::string& name = descs[i].name;
    LATHE_ASSIGN_OR_RETURN(Tensor t, in->GetTensor(name));
    const DType to = plan[i].dtype;
    int64_t row = t.shape.back();
    st.fallbacks += plan[i].fallback;
    st.tensors++;
    st.params += t.numel();
    st.bytes_in += t.nbytes();
    const RowEdit edit = edits ? edits(name) : RowEdit();
    if (to == t.dtype && !edit) {  // unchanged: copy bytes through the mapping
      LATHE_RETURN_IF_ERROR(w.AddTensor(name, to, t.shape, t.data, t.nbytes()));
      st.bytes_out += t.nbytes();
      continue;
    }
    st.requantized += IsQuantized(t.dtype) && IsQuantized(to);
    const int64_t rows = t.numel() / row;
    const size_t out_row_bytes = DTypeBytes(to, row);
    // Converted as the writer reaches it, into its reused buffer: one tensor in memory at a time.
    auto fill = [t, to, edit, &pool](uint8_t* dst) {
      ConvertRows(pool, t, to, edit, dst);
      return Status::Ok();
    };
    LATHE_RETURN_IF_ERROR(w.AddTensorFilled(name, to, t.shape, out_row_bytes * rows, fill));
    st.bytes_out += out_row_bytes * rows;
  }
  LATHE_RETURN_IF_ERROR(w.Write(out_path));
  return st;
}

}  // namespace lathe::tools
