// MemoryPlan formulas. Bytes are exact products of the shapes; each line carries its formula.
#include "train/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/check.h"
#include "core/cpu.h"
#include "core/strings.h"
#include "kernels/train_ops.h"
#include "model/train_model.h"
#include "model/transformer.h"

namespace lathe::train {

namespace {

struct LinearShape {
  const char* name;
  int64_t in, out;
};

std::vector<LinearShape> Linears(const model::ModelConfig& c) {
  return {{"q", c.dim, c.q_dim()},    {"k", c.dim, c.kv_dim()},    {"v", c.dim, c.kv_dim()},
          {"o", c.q_dim(), c.dim},    {"gate", c.dim, c.ffn_dim},  {"up", c.dim, c.ffn_dim},
          {"down", c.ffn_dim, c.dim}};
}

int64_t LinearParamsPerLayer(const model::ModelConfig& c) {
  int64_t n = 0;
  for (const auto& l : Linears(c)) n += l.in * l.out;
  return n;
}

// A block's parameters besides its linears: both norms, the q/k/v biases (qwen2; llama's attention_bias with o's
// too), the q/k norms (qwen3).
int64_t NormBiasParamsPerLayer(const model::ModelConfig& c) {
  return 2 * c.dim + (c.qkv_bias ? c.q_dim() + 2 * c.kv_dim() : 0) + (c.o_bias ? c.dim : 0) +
         (c.qk_norm ? 2 * c.head_dim : 0);
}

// Everything that is not a linear layer of a block: embeddings, head, norms, biases.
int64_t OtherParams(const model::ModelConfig& c) { return c.ParamCount() - c.n_layers * LinearParamsPerLayer(c); }

// kernels/cpu/train_matmul.cc Gemm: the calling thread packs the B operand of a GEMM with inner
// dimension L and Kd output columns into panels (at most 4 MiB a round); the buffer grows to the
// largest GEMM of the step. col_align: the block of a quantized W whose columns are B's.
double SharedPanelFloats(int64_t L, int64_t Kd, int64_t col_align = 1) {
  return (double)kernels::TrainGemmBPanelFloats(Kd, L, col_align);
}
// The quantization block of the frozen base linears (1 for plain types).
int64_t BaseColAlign(const TrainSetup& s) {
  if (s.base_quant != "none") return kQuant4Block;
  return GetDTypeInfo(s.base_dtype).block_size;
}

bool Is16Bit(const std::string& p) { return p == "bf16" || p == "fp16" || p == "pure_bf16"; }

}  // namespace

Status TrainSetup::Validate() const {
  auto one_of = [](const std::string& key, const std::string& v, std::vector<std::string> ok) -> Status {
    if (std::find(ok.begin(), ok.end(), v) != ok.end()) return Status::Ok();
    std::string list;
    for (auto& o : ok) list += (list.empty() ? "" : ", ") + o;
    std::string near = Nearest(v, ok);
    return Status::Error(StrFormat("%s: '%s' is not one of %s%s", key.c_str(), v.c_str(), list.c_str(),
                                   near.empty() ? "" : (" (did you mean '" + near + "'?)").c_str()));
  };
  LATHE_RETURN_IF_ERROR(one_of("method", method, {"full", "freeze", "lora", "qlora"}));
  LATHE_RETURN_IF_ERROR(one_of("precision", precision, {"fp32", "fp16", "bf16", "pure_bf16"}));
  LATHE_RETURN_IF_ERROR(one_of("base_quant", base_quant, {"none", "int8", "nf4", "nf4_dq"}));
  LATHE_RETURN_IF_ERROR(
      one_of("optimizer", optimizer, {"adamw", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit", "sgd"}));
  for (const std::string& t : lora_targets) {
    LATHE_RETURN_IF_ERROR(one_of("lora_target", t, {"q", "k", "v", "o", "gate", "up", "down"}));
  }
  if (batch_size < 1 || seq_len < 1 || grad_accum < 1 || lora_rank < 1 || world_size < 1 || loss_chunk_tokens < 1) {
    return Status::Error("batch_size, seq_len, grad_accum, lora_rank, world_size and loss_chunk_tokens must be >= 1");
  }
  if (zero_stage < 0 || zero_stage > 3) return Status::Error("zero_stage must be 0, 1, 2 or 3");
  if (base_quant != "none" && method != "lora" && method != "qlora") {
    return Status::Error("base_quant applies to lora/qlora only (a quantized base cannot be trained directly)");
  }
  return Status::Ok();
}

int64_t LoraParams(const model::ModelConfig& c, const std::vector<std::string>& targets, int64_t rank) {
  int64_t n = 0;
  for (const auto& l : Linears(c)) {
    if (std::find(targets.begin(), targets.end(), l.name) != targets.end()) n += rank * (l.in + l.out);
  }
  return n * c.n_layers;
}

double QuantBytesPerParam(const std::string& q, int64_t in_features) {
  if (q == "nf4") return 0.5 + 4.0 / 64;  // 4-bit codes + one f32 absmax per 64-value block
  if (q == "nf4_dq") {
    // bitsandbytes double quant: absmax as 8-bit codes per 64-block, plus one f32 scale per
    // 256 absmax values, plus the f32 offset (negligible).
    return 0.5 + 1.0 / 64 + 4.0 / (64 * 256);
  }
  if (q == "int8") return 1.0 + 4.0 / (double)in_features;  // int8 + one f32 scale per row
  return 0;
}

std::string BaseQuantOf(const TrainSetup& s) {
  return s.method == "qlora" && s.base_quant == "none" ? "nf4_dq" : s.base_quant;
}

DType BaseQuantDType(const std::string& q) {
  LATHE_CHECK(q == "int8" || q == "nf4" || q == "nf4_dq");
  return q == "int8" ? DType::kI8Row : q == "nf4" ? DType::kNF4 : DType::kNF4DQ;
}

std::string BaseQuantName(DType t) {
  LATHE_CHECK(IsPackedQuant(t));
  return t == DType::kI8Row ? "int8" : IsDoubleQuant(t) ? "nf4_dq" : "nf4";
}

double ActivationBytes(const model::ModelConfig& c, const TrainSetup& s) {
  const double a = Is16Bit(s.precision) ? 2 : 4;  // bytes per saved activation element
  const double tokens = (double)s.batch_size * s.seq_len;
  int64_t lora_r = 0;
  if (s.method == "lora" || s.method == "qlora") lora_r = s.lora_rank * (int64_t)s.lora_targets.size();
  // Per token per layer: residual inputs of both norms (2 dim), normalized outputs (2 dim), q/k/v
  // after RoPE, the attention output, SwiGLU's gate, up and product, LoRA's x·A (r per target);
  // plus f32 rstd of both norms and the attention logsumexp per head.
  double per_layer_elems = 4.0 * c.dim + 2.0 * c.q_dim() + 2.0 * c.kv_dim() + 3.0 * c.ffn_dim + lora_r;
  if (c.qk_norm) per_layer_elems += c.q_dim() + c.kv_dim();  // qwen3: q and k before their norms
  double per_layer = tokens * (per_layer_elems * a + (2.0 + c.n_heads) * 4);
  double final_norm = tokens * (2.0 * c.dim * a + 4);
  if (s.grad_checkpointing) {
    // Only block inputs are kept; one block is recomputed (and its activations live) at a time.
    return tokens * c.dim * a * c.n_layers + per_layer + final_norm;
  }
  return per_layer * c.n_layers + final_norm;
}

int64_t LatheWorkers(const model::ModelConfig& c, const TrainSetup& s) {
  // Row groups are fewest at the longest padded length (rows per group only shrink as T grows).
  const int64_t rows = model::RowGroupRows(s.batch_size, s.seq_len, s.row_group_tokens);
  return model::RowGroupWorkers(s.method == "lora" || s.method == "qlora", (s.batch_size + rows - 1) / rows,
                                s.row_group_workers, s.threads, s.method == "full");
}

bool LatheHandsBackPages(const TrainSetup& s) {
  const bool lora = s.method == "lora" || s.method == "qlora";
  return !lora && !s.grad_checkpointing && s.grad_accum == 1 &&
         LatheGroupTokens(s) >= s.batch_size * s.seq_len;
}

int64_t LatheGroupTokens(const TrainSetup& s) {
  // Batches are padded to their longest row, so T is anything up to seq_len: take the largest
  // group over every T (a shorter T can pack more rows, e.g. 2 x 256 > 1 x 300 tokens).
  int64_t most = 0;
  for (int64_t T = 1; T <= s.seq_len; ++T)
    most = std::max(most, model::RowGroupRows(s.batch_size, T, s.row_group_tokens) * T);
  return most;
}

double MemoryPlan::Total(const std::string& where) const {
  double t = 0;
  for (const PlanLine& l : lines) t += l.where == where ? l.bytes : 0;
  return t;
}

double MemoryPlan::Bytes(const std::string& category) const {
  double t = 0;
  for (const PlanLine& l : lines) t += l.category == category ? l.bytes : 0;
  return t;
}

namespace {

// What model::TrainModel allocates (model/train_model.cc Init / Prepare / LinForward / LinBackward /
// BlockBackward, kernels' cross-entropy chunk): the activations and scratch for the largest row group
// of a micro-batch of batch_size x seq_len (LatheGroupTokens), the rest for the whole model.
MemoryPlan PlanLathe(const model::ModelConfig& c, const TrainSetup& s) {
  MemoryPlan p;
  const int64_t P = c.ParamCount(), L = c.n_layers, dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(),
                ffn = c.ffn_dim, V = c.vocab_size;
  const bool bf16 = s.precision != "fp32";
  const bool lora = s.method == "lora" || s.method == "qlora";
  const double N = (double)LatheGroupTokens(s);  // tokens of one row group
  const double W = (double)LatheWorkers(c, s);       // row-group workers, each with its own group's buffers
  const std::string per_worker = W > 1 ? StrFormat(" x %.0f row-group workers", W) : std::string();
  p.total_params = P;
  auto add = [&](std::string cat, double bytes, std::string formula) {
    p.lines.push_back({std::move(cat), "device", bytes, std::move(formula)});
  };
  if (s.baseline_bytes > 0) {
    add("baseline", s.baseline_bytes,
        "measured: process RSS before the model (binary, libraries) + tokenizer and tokenized datasets");
    add("baseline", kRuntimeOverheadBytes,
        "runtime overhead, a measured constant (thread arenas, code pages of the loop, per-step buffers)");
  }
  // Full / freeze: a trainable tensor's f32 master is the only copy the model reads; the base
  // tensor's pages are dropped once it is copied (file-backed base) or it is trained in place.
  const int64_t base_trainable = s.method == "full"     ? P
                                 : s.method == "freeze" ? std::min(s.freeze_trainable_layers, L) *
                                                              (LinearParamsPerLayer(c) + NormBiasParamsPerLayer(c))
                                                        : 0;
  // LoRA / freeze over an f32 base on the bf16 dot product: frozen linears as bf16 copies, their f32 pages
  // dropped (model::FrozenLinearsAsBf16). Only where the base is counted as stored: the other weight lines
  // below already count every frozen param at 2 B in bf16 mode.
  const int64_t frozen_linear_params =
      s.method == "full" ? 0
                         : (L - (s.method == "freeze" ? std::min(s.freeze_trainable_layers, L) : 0)) * LinearParamsPerLayer(c);
  const bool frozen_as_bf16 = s.method != "full" && model::FrozenLinearsAsBf16(s.precision == "bf16" && UsesBf16Dot(),
                                                                                s.base_dtype, s.base_quant != "none");
  const double frozen_copies = s.base_weight_bytes <= 0 ? 0
                               : s.frozen_copy_bytes >= 0 ? s.frozen_copy_bytes
                               : frozen_as_bf16           ? 2.0 * frozen_linear_params
                                                          : 0;
  const bool full = s.method == "full";
  const bool bf16_dot = s.precision == "bf16" && UsesBf16Dot();
  // LoRA / freeze over a base not stored in bf16: the frozen head as a bf16 copy (model::FrozenHeadAsBf16), then
  // paired (below).
  const bool head_copy = model::FrozenHeadAsBf16(bf16_dot, full, s.head_dtype, dim, s.base_quant != "none");
  if (s.base_weight_bytes > 0) {
    // Assumed file-backed (frozen_copy_bytes < 0): a frozen head taken as a bf16 copy gives its stored pages back
    // too.
    const double released = s.base_released_bytes >= 0
                                ? s.base_released_bytes
                                : s.base_weight_bytes * base_trainable / (double)P +
                                      (frozen_copies > 0 ? 4.0 * frozen_linear_params : 0) +
                                      (head_copy && s.frozen_copy_bytes < 0 ? (double)DTypeBytes(s.head_dtype, V * dim)
                                                                            : 0);
    if (released > 0) {
      add("weights", s.base_weight_bytes - released,
          StrFormat("base weights as loaded (stored dtypes, read in place) minus %.0f B of trainable tensors "
                    "(pages dropped after their f32 copy, or trained in place)%s",
                    released, frozen_copies > 0 ? " and of frozen f32 linears (kept as bf16 copies)" : ""));
    } else {
      add("weights", s.base_weight_bytes, "base weights as loaded (stored dtypes, read in place)");
    }
  } else if (base_trainable > 0) {
    add("weights", (P - base_trainable) * (bf16 ? 2.0 : 4.0),
        StrFormat("%lld frozen base params x %d B (the %lld trainable ones live only as f32 masters)",
                  (long long)(P - base_trainable), bf16 ? 2 : 4, (long long)base_trainable));
  } else if (s.base_quant != "none" && lora) {
    // lathe's packed layouts (core/dtype.h PackedQuantLayout: header, codes, constants, alignment).
    const DType t = BaseQuantDType(s.base_quant);
    const int64_t lin = L * LinearParamsPerLayer(c);
    double packed = 0;  // a weight the packing cannot take stays f32 / bf16 (train::QuantizeBaseWeights)
    int64_t kept = 0;
    for (const auto& l : Linears(c)) {
      if (PackableAs(t, l.in)) {
        packed += (double)PackedQuantBytes(t, l.out, l.in) * L;
      } else {
        packed += l.out * l.in * (bf16 ? 2.0 : 4.0) * L;
        kept += l.out * l.in * L;
      }
    }
    add("weights", packed + (P - lin) * (bf16 ? 2.0 : 4.0),
        StrFormat("%lld linear params packed as %s (%.4f B each, constants included)%s + %lld others x %d B",
                  (long long)lin, DTypeName(t), packed / (double)lin,
                  kept > 0 ? StrFormat(", of which %lld kept as stored (in_features %% 64 != 0)", (long long)kept).c_str()
                           : "",
                  (long long)(P - lin), bf16 ? 2 : 4));
  } else {
    add("weights", P * (bf16 ? 2.0 : 4.0), StrFormat("%lld base params x %d B", (long long)P, bf16 ? 2 : 4));
  }
  if (frozen_copies > 0) {
    add("weights", frozen_copies,
        StrFormat("frozen f32 decoder linears (%lld params) as bf16 copies for the bf16 dot product, as autocast "
                  "casts them", (long long)frozen_linear_params));
  }
  int64_t trainable = 0, shadowed = 0;
  // Trained linears, LoRA pairs and a trained head have bf16 / fp16 shadows unless their products round the f32
  // masters as they pack them (bf16 mode on the bf16 dot product: model::LinearShadows, TrainedHeadShadow).
  const bool lin_shadows = model::LinearShadows(s.precision == "bf16", s.precision == "fp16");
  if (s.method == "full") {
    trainable = P;
    shadowed = (lin_shadows ? L * LinearParamsPerLayer(c) : 0) +
               (model::TrainedHeadShadow(s.precision == "bf16", s.precision == "fp16", dim) ? V * dim : 0);
  } else if (s.method == "freeze") {
    const int64_t n = std::min(s.freeze_trainable_layers, L);
    trainable = n * (LinearParamsPerLayer(c) + NormBiasParamsPerLayer(c));
    shadowed = lin_shadows ? n * LinearParamsPerLayer(c) : 0;
  } else {
    trainable = LoraParams(c, s.lora_targets, s.lora_rank);
    shadowed = lin_shadows ? trainable : 0;
  }
  p.trainable_params = trainable;
  const double shadow = bf16 ? shadowed * 2.0 : 0;
  add(lora ? "lora" : "weights", trainable * 4.0 + shadow,
      StrFormat("%lld trainable params x 4 B (f32 masters)%s", (long long)trainable,
                shadowed > 0 ? StrFormat(" + %lld x 2 B bf16 shadows", (long long)shadowed).c_str() : ""));
  // A bf16 head in bf16 mode on the bf16 dot product: packed as bf16 pairs (half the f32 copy's bytes). A trained
  // head is never packed (model::PackedHeadBytes).
  if (head_copy) {
    add("weights", 2.0 * V * dim,
        StrFormat("frozen output head (%lld x %lld) as a bf16 copy (dequantized / rounded from its stored dtype) "
                  "for the loss on the bf16 dot product",
                  (long long)V, (long long)dim));
  }
  const bool head_pairs = bf16_dot && (full || s.head_dtype == DType::kBF16 || head_copy) &&
                          s.base_quant == "none" && dim % 2 == 0;
  const int64_t ph = model::PackedHeadBytes(V, dim, full, s.base_quant != "none", head_pairs);
  if (ph > 0) {
    add("weights", (double)ph,
        StrFormat("%s output head (%lld x %lld) packed %s %s for the loss's input gradient",
                  full ? "trained" : "frozen", (long long)V, (long long)dim, full ? "every step" : "once",
                  head_pairs ? "as bf16 pairs" : "in f32"));
  }
  add("gradients", trainable * 4.0, StrFormat("%lld trainable params x 4 B (f32)", (long long)trainable));
  if (W > 1 && lora) {  // full / freeze workers add into the shared gradients in turn
    add("gradients", (W - 1) * trainable * 4.0,
        StrFormat("%.0f more row-group worker(s) x %lld LoRA params x 4 B (private gradients, summed after the groups)",
                  W - 1, (long long)trainable));
  }
  double ob = s.optimizer_bytes_per_param;
  if (ob < 0) {
    ob = s.optimizer == "sgd" ? 0 : s.optimizer.find("8bit") != std::string::npos ? 2 + 8.0 / 256 : 8;
  }
  p.lines.push_back({"optimizer", s.optimizer.rfind("paged_", 0) == 0 ? "host" : "device", trainable * ob,
                     StrFormat("%lld trainable params x %.4f B (%s state)", (long long)trainable, ob,
                               s.optimizer.c_str())});
  const int64_t r = lora ? s.lora_rank : 0;
  // Saved per block: rstd of both norms, q, k, v (after RoPE), attention output, its logsumexp,
  // the mid-block residual, SwiGLU's gate and up, LoRA's x A^T for every module kind. The normed
  // inputs and the SwiGLU product are recomputed in the backward (one shared buffer each).
  // bf16 mode on the bf16 dot product keeps q, k, v, att, gate and up as bf16 (model::ActivationsAsBf16): half
  // of those bytes, in floats.
  const bool acts16 = model::ActivationsAsBf16(bf16_dot);
  // (the mid residual not kept where the backward recomputes it: model::RecomputesMidResidual; one worker buffer)
  const bool xmid_again = model::RecomputesMidResidual(bf16_dot, lora, s.grad_checkpointing);
  const double halved = 2.0 * qd + 2.0 * kvd + 2.0 * ffn;
  // qwen3: q and k as projected (before their norms) and each head's 1 / rms, in f32.
  const double qk_raw = c.qk_norm ? (double)qd + kvd + c.n_heads + c.n_kv_heads : 0.0;
  const double per_set =
      (xmid_again ? 0.0 : 1.0) * dim + (acts16 ? 0.5 : 1.0) * halved + 2 + c.n_heads + 7.0 * r + qk_raw;
  // Freeze: layers below the trained ones have no backward and save nothing.
  const double sets = s.grad_checkpointing     ? 1
                      : s.method == "freeze" ? (double)std::min(s.freeze_trainable_layers, L)
                                             : (double)L;
  add("activations", W * 4 * N * ((L + 1.0) * dim + sets * per_set + dim + 1 + (xmid_again ? dim : 0)),
      StrFormat("%.0f tokens (one row group)%s x 4 B x (residual stream (%lld + 1) x dim + %.0f saved set(s) x (%s%s"
                "(2 q_dim + 2 kv_dim + 2 ffn) + heads + 2%s%s) + final norm%s)",
                N, per_worker.c_str(), (long long)L, sets, xmid_again ? "" : "dim + ", acts16 ? "1/2 x bf16 " : "",
                r ? " + 7 r" : "", c.qk_norm ? " + q_dim + kv_dim + heads + kv_heads (q, k before their norms)" : "",
                xmid_again ? " + the mid residual, recomputed per block" : ""));
  if (s.method == "full" && c.tied_embeddings) {
    // The loss of every group adds into the tied embedding / head gradient before the embedding's
    // share does (the same order on any worker count): each row's input gradient waits.
    add("activations", 4.0 * s.batch_size * s.seq_len * dim,
        StrFormat("tied embedding: %lld x %lld tokens x dim x 4 B of input gradient, added after every group's loss",
                  (long long)s.batch_size, (long long)s.seq_len));
  }
  if (LatheHandsBackPages(s)) {
    // Full / freeze, one row group per optimizer step: gradients are paged in as the backward writes
    // them (ZeroGrad hands their pages back) and each trained layer's saved tensors (q, k, v, att,
    // xmid, gate, up and its output in the residual stream) are dropped once its backward is done.
    // Going down the layers one set shrinks as the other grows, so the peak is at one end: all those
    // activations or all those gradients, never both. With several row groups (or accumulated
    // micro-batches) the second forward holds its activations next to the gradients the first
    // wrote: no overlap, and the pages stay resident.
    const int64_t layers = s.method == "full" ? L : std::min(s.freeze_trainable_layers, L);
    const double dropped = 4 * N * layers * (2.0 * dim + (acts16 ? 0.5 : 1.0) * halved);
    const double layer_grads = 4.0 * layers * (LinearParamsPerLayer(c) + NormBiasParamsPerLayer(c));
    add("overlap", -std::min(dropped, layer_grads),
        StrFormat("-min(dropped activations %.0f B, layer gradients %.0f B): saved tensors of %lld trained layers "
                  "are handed back as the backward writes those layers' gradients",
                  dropped, layer_grads, (long long)layers));
  }
  // Backward scratch of one block and the matmul input roundings (bf16) / LoRA buffers.
  int64_t max_in = 0;
  for (const auto& l : Linears(c)) {
    if (!lora || std::find(s.lora_targets.begin(), s.lora_targets.end(), l.name) != s.lora_targets.end()) {
      max_in = std::max(max_in, l.in);
    }
  }
  double scratch = (6.0 + (s.grad_checkpointing ? 1 : 0)) * dim + 2.0 * qd + 2.0 * kvd + 4.0 * ffn;
  if (c.qk_norm) scratch += qd + kvd;  // the gradients of q and k before their norms
  // bf16 mode on the bf16 dot product: the linears' kernels round their operands as they pack them (every base
  // dtype: a quantized or f16 one is dequantized a few rows at a time and rounded as packed), so only the loss's
  // x is rounded into a buffer (RowGroupWorker::LinForward).
  if (bf16) scratch += bf16_dot ? (double)dim : 2.0 * std::max({dim, qd, ffn});  // rounded x and dy
  if (acts16) scratch += halved;  // the running block's f32 copies of its bf16-kept activations
  const bool dropout = s.lora_dropout > 0;
  if (lora) {
    // scale * mid, dmid and rounded mid (r each); with dropout the dropped input and its gradient.
    scratch += 3.0 * r + (dropout ? 2.0 * max_in : 0);
    if (bf16) scratch += r + (dropout && !bf16_dot ? max_in : 0);  // rounded x A^T; the dropped input rounded
  }
  const double chunk = std::min<double>(s.loss_chunk_tokens, N);
  const double half = c.head_dim / 2;
  add("temporary",
      W * 4 * (N * (scratch + 2 * half + 1) + (double)model::kNormGradParts * std::max(dim, c.head_dim)) +
          4.0 * 2 * c.max_seq_len * half,
      StrFormat("(%.0f tokens x 4 B x %.0f (block backward scratch, bf16 roundings, LoRA buffers, RoPE, targets) "
                "+ %lld norm-gradient partial rows)%s + RoPE tables",
                N, scratch + 2 * half + 1, (long long)model::kNormGradParts, per_worker.c_str()));
  // Per chunk token: its logits, x and dx rows, loss, logsumexp, exp sum, and one partial per 256-row
  // softmax block of an f32 head's logits^T (kernels/cpu/train_xent.cc).
  double loss_bytes = W * 4 * chunk * (V + 2.0 * dim + 3 + std::ceil(V / 256.0));
  add("temporary", loss_bytes,
      StrFormat("cross-entropy chunk: %.0f tokens x (vocab %lld + 2 dim + softmax partials) x 4 B%s", chunk,
                (long long)V, per_worker.c_str()));
  // Full bf16: the head gradient's pairs of one loss chunk (kernels::HeadGradParts; train_model.cc); on several
  // workers each keeps its group's, every chunk's, until the earlier groups have added theirs.
  if (s.method == "full" && s.precision == "bf16" && UsesBf16Dot() && dim % 2 == 0) {
    const double held = W > 1 ? N : chunk;
    const double parts = W * (double)kernels::HeadGradPartsBytes(V, dim, (int64_t)held, s.loss_chunk_tokens);
    add("temporary", parts,
        StrFormat("loss's head-gradient pairs of %s: %.0f tokens x (vocab %lld + dim) x 2 B%s",
                  W > 1 ? "the group" : "a chunk", held, (long long)V, per_worker.c_str()));
    if (W == 1) loss_bytes += parts;  // (several workers keep theirs past the loss)
  }
  // RowGroupWorker::ForwardBackward hands the block backward's scratch back before the loss and the loss's pairs
  // after it: the step holds one of the two at a time. The scratch given back: dh, dgate, dup, h (ffn each), dxn,
  // dtmp, xn (dim), d_att, dq (q_dim), dk, dv (kv_dim), and the bf16-kept activations' f32 copies.
  const double given_back = W * 4 * N * (4.0 * ffn + 3.0 * dim + 2.0 * qd + 2.0 * kvd + (acts16 ? halved : 0.0));
  add("overlap", -std::min(loss_bytes, given_back),
      StrFormat("-min(the loss's chunk buffers %.0f B, block backward scratch %.0f B): never resident together",
                loss_bytes, given_back));
  // The GEMMs of a step (kernels/cpu/train_matmul.cc; a quantized base's forward runs the inference
  // kernels): each linear's forward and input gradient, the trained weights' gradients over the
  // group's tokens, LoRA's rank-r products, the cross-entropy's input (and head) gradient.
  // bf16 mode where every product runs on the bf16 dot product (the linears, LoRA's, and the loss's with
  // its head packed in pairs): the f32 training GEMM's shared panels are never packed (its per-thread
  // buffers still serve the attention's tiles).
  // (The loss runs on pairs whatever the head's dtype, packed or not: avx512bf16::HeadBackwardInputTRows.)
  const bool no_f32_gemm = bf16_dot && dim % 2 == 0;
  double panels = SharedPanelFloats(V, dim);
  if (!lora) panels = std::max(panels, SharedPanelFloats((int64_t)chunk, dim));
  for (const auto& l : Linears(c)) {
    if (s.base_quant == "none") panels = std::max(panels, SharedPanelFloats(l.in, l.out));
    panels = std::max(panels, SharedPanelFloats(l.out, l.in, BaseColAlign(s)));
    if (!lora) panels = std::max(panels, SharedPanelFloats((int64_t)N, l.in));
    if (lora && std::find(s.lora_targets.begin(), s.lora_targets.end(), l.name) != s.lora_targets.end()) {
      for (auto [L2, K2] : {std::pair<int64_t, int64_t>{l.in, r}, {r, l.out}, {(int64_t)N, r}, {l.out, r},
                            {(int64_t)N, l.in}, {r, l.in}})
        panels = std::max(panels, SharedPanelFloats(L2, K2));
      // f32 mode's fused LoRA products (kernels::LinearPlusFused): the base's inner dimension plus the rank.
      if (!bf16_dot && kernels::LinearPlusFused(l.out, l.in, r))
        panels = std::max(panels, SharedPanelFloats(l.in + r, l.out));
      if (!bf16_dot && kernels::LinearPlusFused(l.in, l.out, r))
        panels = std::max(panels, SharedPanelFloats(l.out + r, l.in, BaseColAlign(s)));
    }
  }
  if (no_f32_gemm) panels = 0;
  add("temporary", W * 4 * panels,
      StrFormat("matmul B panels packed by the calling thread: %.0f floats (the step's largest GEMM)%s", panels,
                W > 1 ? " x each worker's thread" : ""));
  // CPUs whose kernels have a panel tile (AVX-512) also pack A once per GEMM round: (R, Kd, L, A's rows
  // contiguous, B prepacked) of the same products.
  double apanels = 0;
  auto a_gemm = [&](double R, int64_t Kd, int64_t L, bool rows, bool pre) {
    apanels = std::max(apanels, (double)kernels::TrainGemmAPanelFloats((int64_t)R, Kd, L, rows, pre));
  };
  a_gemm(V, (int64_t)chunk, dim, true, false);  // the loss's logits^T chunk
  a_gemm(chunk, dim, V, false, lora);           // its input gradient
  if (!lora) a_gemm(V, dim, (int64_t)chunk, true, false);
  for (const auto& l : Linears(c)) {
    a_gemm(N, l.out, l.in, true, false);
    a_gemm(N, l.in, l.out, true, false);
    if (!lora) a_gemm(l.out, l.in, (int64_t)N, false, false);
    if (lora) {
      if (!bf16_dot && kernels::LinearPlusFused(l.out, l.in, r)) a_gemm(N, l.out, l.in + r, true, false);
      if (!bf16_dot && kernels::LinearPlusFused(l.in, l.out, r)) a_gemm(N, l.in, l.out + r, true, false);
      a_gemm(N, l.out, r, true, false);
      a_gemm(N, l.in, r, true, false);
      a_gemm(l.out, r, (int64_t)N, false, false);
    }
  }
  if (apanels > 0)  // a tier with the panel tile
    add("temporary", no_f32_gemm ? 0.0 : W * 4 * apanels,
        StrFormat("matmul A micro-panels packed by the calling thread: %.0f floats (the step's largest GEMM)%s",
                  apanels, W > 1 ? " x each worker's thread" : ""));
  // bf16 mode on CPUs with the bf16 dot product (UsesBf16Dot): the decoder linears' products (f32 / bf16
  // weights) and a bf16 head's logits and gradient convert their operands to pairs first, into two
  // buffers of the calling thread (bf16dot_avx512bf16.cc): A (R x L/2 dwords; the head's own rows are
  // read in place) and B (Kd rounded to 16 x L/2 dwords), each the largest of the step's products.
  // On AMX tiles the packers write A in tile order (rows to a multiple of 32, pairs to one of 16); the products whose
  // A is read as row-major pairs (a bf16 head's rows for its logits, the head gradient's pairs over the group's
  // tokens, a fused product whose first part ends inside a step) copy each task's rows into tile order: amx_pairs is
  // the widest of those (the AMX tiles' A rows below).
  const bool amx = bf16_dot && UsesAmxBf16();
  double amx_pairs = 0;
  if (s.precision == "bf16" && UsesBf16Dot()) {
    double pa = 0, pb = 0, ct = 0, fs = 0;
    const auto up = [](double v, double m) { return std::ceil(v / m) * m; };
    // extra: a second product's inner dimension summed in the same pairs (LoRA's rank r in the base product).
    auto pair_gemm = [&](double R, double Kd, double L, double extra = 0) {
      const double pairs = std::ceil(L / 2) + std::ceil(extra / 2);
      const bool tiled = amx && (extra == 0 || (int64_t)std::ceil(L / 2) % 16 == 0);
      if (amx && !tiled) amx_pairs = std::max(amx_pairs, pairs);
      pa = std::max(pa, tiled ? up(R, 32) * up(pairs, 16) : R * pairs);
      pb = std::max(pb, std::ceil(Kd / 16) * 16 * pairs);
    };
    for (const auto& l : Linears(c)) {
      const bool targeted =
          lora && std::find(s.lora_targets.begin(), s.lora_targets.end(), l.name) != s.lora_targets.end();
      pair_gemm(N, l.out, l.in, targeted ? r : 0);
      pair_gemm(N, l.in, l.out, targeted ? r : 0);
      if (!lora) pair_gemm(l.out, l.in, N);
      if (targeted) {
        pair_gemm(r, l.in, N);   // A's gradient
        pair_gemm(r, l.out, N);  // B's, transposed: (r, out) += (x A^T)^T dY, plus that (r, out) block in f32
        ct = std::max(ct, (double)r * l.out);
      }
    }
    // The loss on the pair kernels: any head dtype (even dim).
    const bool head_on_pairs = dim % 2 == 0;
    if (head_on_pairs) {
      pair_gemm(0, chunk, dim);             // logits^T: x's pairs only (the head's rows read in place)
      if (amx) amx_pairs = std::max(amx_pairs, std::ceil(dim / 2.0));
      if (amx && full) amx_pairs = std::max(amx_pairs, std::ceil((double)N / 2));  // the head gradient's pairs
      // (the trained head's gradient: its pairs go to the loss's HeadGradParts, counted above)
      // dx from the head's pairs: dlogits' pairs; a head not packed beforehand (a quantized base's head as
      // stored, a trained head's f32 masters) goes into pairs one inner chunk at a time
      // (avx512bf16::HeadBackwardInputTRows: dim x the chunk's pairs), a head in a block type dequantized first
      // (2 x the chunk's pairs x dim floats).
      const double vp = std::ceil((double)V / 2), nch = std::ceil(vp / 384);
      pa = std::max(pa, amx ? up(chunk, 32) * up(vp, 16) : chunk * vp);
      const double chunk_pairs = nch <= 1 ? vp : std::ceil(std::ceil(vp / nch) / 8) * 8;  // Bf16PairsChunk
      if (!(head_pairs && ph > 0)) pb = std::max(pb, std::ceil(dim / 16.0) * 16 * chunk_pairs);
      if (lora && !head_copy && s.head_dtype != DType::kBF16 && s.head_dtype != DType::kF32)
        fs = 2 * chunk_pairs * dim;
    }
    add("temporary", W * 4 * (pa + pb + ct + fs),
        StrFormat("bf16 dot product's operand pairs: %.0f + %.0f dwords (the step's largest products)%s%s%s", pa, pb,
                  ct > 0 ? StrFormat(", LoRA B's gradient transposed: %.0f floats", ct).c_str() : "",
                  fs > 0 ? StrFormat(", the loss's head rows dequantized: %.0f floats", fs).c_str() : "",
                  per_worker.c_str()));
  }
  // Per thread: the GEMM's conversion / few-rows B strips and A tiles (train_matmul.cc), 96 x 128
  // score tiles (train_attention.cc, two in the backward).
  // GEMM inner dimensions: the linears' in / out, the group's tokens (weight gradients), the vocabulary
  // (the head's input gradient); weights converted per panel when the frozen base is not f32 or the
  // trained weights have bf16 / fp16 shadows.
  const int64_t max_inner = std::max({(int64_t)N, V, dim, qd, ffn});
  const bool converts_w = bf16 || s.base_quant != "none" || s.base_dtype != DType::kF32;
  // A base in another dtype than f32 / bf16 on the pair kernels: 16 dequantized rows on their way to pairs.
  const bool dequant_rows = bf16_dot && (s.base_quant != "none" || (s.base_dtype != DType::kF32 &&
                                                                         s.base_dtype != DType::kBF16));
  // (and a head stored in a block type: 64 dequantized rows and their pairs per task of the loss's logits; an f32
  // head there (full fine-tuning's masters, a quantized base's head as stored): the pairs only)
  const bool head_row_pairs = bf16_dot && dim % 2 == 0 && !head_copy && (full || s.head_dtype != DType::kBF16);
  // Where the pair tiles run on FMAs (Bf16PairsOnFma): a task's A rows of one inner chunk widened to floats,
  // 64 rows x 2 x up to 384 pairs (Bf16PairsChunk; avx512bf16::PairGemmBlock), attention tiles 8 rows at most.
  const double widened = bf16_dot && Bf16PairsOnFma() ? 64.0 * 2 * 384 : 0.0;
  // The pair packers' blocks on the bf16 dot product (bf16_pairs.h): 8 row pairs of strips (PairStripsRows) and
  // 16 rows of bf16 pairs (PairStripsT), each up to the widest linear dimension: 16 floats per column.
  const double packers = bf16_dot ? 16.0 * std::max({dim, qd, ffn}) : 0.0;
  // On AMX tiles (UsesAmxBf16; kernels/cpu/bf16dot_amx.cc): a task's A rows in tile order where its product reads
  // A as row-major pairs, 64 rows of amx_pairs rounded up to 16 (above), and its strips' zero-padded last steps,
  // 256 dwords a strip of the widest output.
  const double amx_tiles = amx
                               ? 64.0 * std::ceil(amx_pairs / 16) * 16 + 256.0 * (double)((std::max({dim, qd, ffn}) + 15) / 16)
                               : 0.0;
  const double per_thread =
      4.0 * ((double)kernels::TrainGemmThreadFloats(max_inner, converts_w, BaseColAlign(s)) + 3 * 96 * 128 + widened +
             packers + amx_tiles +
             // LoRA's dB / dmid pass over dy in f32 (kernels::LoraGradPair): 16 floats per output of the widest linear
             (lora && !bf16_dot ? (double)kernels::LoraGradPairFloats(std::max({dim, qd, ffn})) : 0.0) +
             (dequant_rows     ? std::max(16.0 * std::max({dim, qd, ffn}), 64.0 * dim) + 32.0 * dim
              : head_row_pairs ? 32.0 * dim
                               : 0.0));
  // The attention backward's dQ partials: heads x T x head_dim per run of key tiles after the first
  // (kernels::AttentionBackwardRuns), and its dK / dV key tiles (+ per-head parts where the heads are not
  // grouped per task: kernels::AttentionBackwardKeyFloats), on the worker's pool (1 thread when W > 1).
  const double dq_runs = (double)kernels::AttentionBackwardRuns(s.seq_len) - 1;
  const double dq_partials = 4.0 * dq_runs * c.n_heads * (double)s.seq_len * c.head_dim;
  const double attn_keys = 4.0 * (double)kernels::AttentionBackwardKeyFloats(
                                     s.seq_len, (int)c.n_heads, (int)c.n_kv_heads, (int)c.head_dim, W > 1 ? 1 : s.threads);
  add("temporary", s.threads * per_thread + W * (dq_partials + attn_keys),
      StrFormat("per-thread kernel scratch: %d threads x %.0f KiB (matmul packing and AMX tiles, attention tiles) + %.0f KiB of "
                "attention dQ partials and dK / dV tiles%s",
                s.threads, per_thread / 1024, (dq_partials + attn_keys) / 1024, per_worker.c_str()));
  // bf16 mode on CPUs with the bf16 dot product: the attention's products take their operands as bf16 pairs,
  // packed once per call by the worker's thread (q and dO as rows and transposed per head, K / V strips per
  // kv head; kernels::FlashAttentionBf16Bytes), plus two tile buffers per thread (P / dS as pairs).
  if (s.precision == "bf16" && UsesBf16Dot()) {
    const double packs = (double)kernels::FlashAttentionBf16Bytes(s.seq_len, (int)c.n_heads, (int)c.n_kv_heads,
                                                                  (int)c.head_dim);
    const double tiles = 2.0 * 4 * 128 * (48 + 16);
    add("temporary", W * packs + s.threads * tiles,
        StrFormat("bf16 dot product's attention operands: %.0f KiB of pairs per call%s + %d threads x %.0f KiB of tile "
                  "pairs",
                  packs / 1024, per_worker.c_str(), s.threads, tiles / 1024));
  }
  // Saving keeps a whole copy of what is written: the model in the saved dtype (full / freeze,
  // plus one f32 tensor being rounded under bf16), the adapter in f32 (LoRA).
  const double save = lora ? trainable * 4.0 : P * (bf16 ? 2.0 : 4.0) + (bf16 ? 4.0 * V * dim : 0);
  if (lora) {
    add("temporary", save, "while saving: the adapter's tensors in f32");
  } else {
    add("temporary", save,
        StrFormat("while saving: %lld params x %d B%s", (long long)P, bf16 ? 2 : 4,
                  bf16 ? " + the embedding in f32 while it is rounded" : ""));
  }
  // The trainer saves after ZeroGrad, which handed the gradients' pages back.
  add("overlap", -std::min(save, trainable * 4.0),
      "-min(save copy, gradients): saving happens after ZeroGrad has handed the gradient pages back");
  return p;
}

}  // namespace

Result<MemoryPlan> PlanTraining(const model::ModelConfig& c, const TrainSetup& setup) {
  TrainSetup s = setup;
  s.base_quant = BaseQuantOf(s);
  LATHE_RETURN_IF_ERROR(s.Validate());
  if (s.lathe) return PlanLathe(c, s);
  MemoryPlan p;
  int64_t P = c.ParamCount(), lin = c.n_layers * LinearParamsPerLayer(c), other = OtherParams(c);
  if (s.param_count > 0) {
    lin = (int64_t)((double)lin * s.param_count / P);
    other = s.param_count - lin;
    P = s.param_count;
  }
  p.total_params = P;
  const bool mixed = s.precision == "bf16" || s.precision == "fp16";
  const bool pure = s.precision == "pure_bf16";
  const double wb = Is16Bit(s.precision) ? 2 : 4;  // bytes per working weight
  const double W = s.world_size;
  const double shard_params = s.zero_stage >= 3 ? W : 1;
  auto add = [&](std::string cat, std::string where, double bytes, std::string formula) {
    p.lines.push_back({std::move(cat), std::move(where), bytes, std::move(formula)});
  };

  int64_t trainable = 0;
  if (s.method == "full") {
    trainable = P;
    add("weights", "device", P * wb / shard_params,
        StrFormat("%lld params x %.0f B (%s weights)%s", (long long)P, wb, s.precision.c_str(),
                  shard_params > 1 ? " / world (ZeRO-3)" : ""));
  } else if (s.method == "freeze") {
    int64_t per_layer = LinearParamsPerLayer(c) + NormBiasParamsPerLayer(c);
    trainable = std::min(s.freeze_trainable_layers, c.n_layers) * per_layer;
    add("weights", "device", P * wb / shard_params,
        StrFormat("%lld params x %.0f B (%s); the last %lld layers train", (long long)P, wb, s.precision.c_str(),
                  (long long)std::min(s.freeze_trainable_layers, c.n_layers)));
  } else {  // lora / qlora
    trainable = LoraParams(c, s.lora_targets, s.lora_rank);
    if (s.base_quant == "none") {
      add("weights", "device", P * wb / shard_params,
          StrFormat("%lld frozen params x %.0f B (%s)", (long long)P, wb, s.precision.c_str()));
    } else {
      double qb = QuantBytesPerParam(s.base_quant, c.dim);
      add("weights", "device", lin * qb / shard_params,
          StrFormat("%lld linear-layer params x %.4f B (%s incl. quantization constants)", (long long)lin, qb,
                    s.base_quant.c_str()));
      add("weights", "device", other * 2.0 / shard_params,
          StrFormat("%lld embedding/norm/bias params x 2 B (kept in 16 bits, as bitsandbytes does)", (long long)other));
    }
  }
  p.trainable_params = trainable;
  const bool lora = s.method == "lora" || s.method == "qlora";
  // Trainable parameters: f32 masters under fp32/mixed precision, bf16 under pure_bf16.
  const double master = pure ? 2 : 4;
  if (lora) {
    add("lora", "device", trainable * master,
        StrFormat("%lld LoRA params (rank %lld on %zu module kinds x %lld layers) x %.0f B", (long long)trainable,
                  (long long)s.lora_rank, s.lora_targets.size(), (long long)c.n_layers, master));
  } else if (mixed) {
    add("weights", "device", trainable * 4.0 / shard_params,
        StrFormat("%lld trainable params x 4 B (f32 master copy under %s mixed precision)", (long long)trainable,
                  s.precision.c_str()));
  }
  const double shard_grads = s.zero_stage >= 2 ? W : 1;
  add("gradients", "device", trainable * master / shard_grads,
      StrFormat("%lld trainable params x %.0f B%s", (long long)trainable, master,
                shard_grads > 1 ? " / world (ZeRO-2+)" : ""));
  double opt_b = 0;
  std::string opt_f;
  if (s.optimizer == "adamw" || s.optimizer == "paged_adamw_32bit") {
    opt_b = pure ? 4 : 8;
    opt_f = pure ? "AdamW m and v in bf16: 2 x 2 B" : "AdamW m and v in f32: 2 x 4 B";
  } else if (s.optimizer == "adamw_8bit" || s.optimizer == "paged_adamw_8bit") {
    opt_b = 2 + 2 * 4.0 / 256;
    opt_f = "8-bit AdamW: m and v as 1-byte codes + one f32 absmax per 256-value block each";
  } else {
    opt_b = 0;
    opt_f = "SGD without momentum keeps no state";
  }
  const double shard_opt = s.zero_stage >= 1 ? W : 1;
  const bool paged = s.optimizer.rfind("paged_", 0) == 0;
  add("optimizer", s.cpu_offload || paged ? "host" : "device", trainable * opt_b / shard_opt,
      StrFormat("%lld trainable params x %.4f B (%s)%s%s", (long long)trainable, opt_b, opt_f.c_str(),
                shard_opt > 1 ? " / world (ZeRO-1+)" : "",
                paged ? "; paged: may be pushed out of RAM" : s.cpu_offload ? "; offloaded to host" : ""));
  add("activations", "device", ActivationBytes(c, s),
      StrFormat("batch %lld x seq %lld tokens x per-layer saved tensors x %lld layers%s", (long long)s.batch_size,
                (long long)s.seq_len, (long long)c.n_layers,
                s.grad_checkpointing ? " (checkpointing: block inputs + one recomputed block)" : ""));
  const double tokens = (double)s.batch_size * s.seq_len;
  double chunk = std::min<double>(s.loss_chunk_tokens, tokens);
  add("temporary", "device", 2 * chunk * c.vocab_size * 4.0,
      StrFormat("cross-entropy chunk: %.0f tokens x vocab %lld x (logits + dlogits) x 4 B", chunk,
                (long long)c.vocab_size));
  add("temporary", "device", tokens * (2.0 * c.dim + c.q_dim() + 2.0 * c.kv_dim() + 2.0 * c.ffn_dim) * 4,
      "backward scratch of one block: d(activations) in f32 for every token");
  if (s.baseline_bytes > 0) {
    add("baseline", "device", s.baseline_bytes, "measured process baseline (binary, libraries, tokenizer, data)");
  }
  return p;
}

MemoryPlan PlanInference(const model::ModelConfig& c, const InferSetup& s) {
  MemoryPlan p;
  const int64_t P = s.param_count > 0 ? s.param_count : c.ParamCount(), norms = c.n_layers * 2 * c.dim + c.dim;
  p.total_params = P;
  const DTypeInfo& wi = GetDTypeInfo(s.weight_dtype);
  double wb = (double)wi.block_bytes / wi.block_size;
  p.lines.push_back({"weights", "device", (P - norms) * wb + norms * 4.0,
                     StrFormat("%lld params x %.4f B (%s) + %lld norm params x 4 B", (long long)(P - norms), wb,
                               wi.name, (long long)norms)});
  // The bytes the KV store allocates per token (model::KvBlockStore::BlockBytes: the serving engine's and
  // generate's cache).
  LATHE_CHECK_MSG(model::IsKvCacheDType(s.kv_dtype), "KV cache dtype %s: expected f32, f16 or bf16",
                  DTypeName(s.kv_dtype));
  double kv = (double)model::KvBlockStore::BlockBytes(c, 1, s.kv_dtype) * s.kv_tokens * s.kv_seqs;
  p.lines.push_back({"kv_cache", "device", kv,
                     StrFormat("%lld layers x 2 (K, V) x kv_dim %lld x %lld tokens x %lld seqs x %s", (long long)c.n_layers,
                               (long long)c.kv_dim(), (long long)s.kv_tokens, (long long)s.kv_seqs,
                               DTypeName(s.kv_dtype))});
  double t = (double)s.batch_tokens;
  p.lines.push_back({"activations", "device",
                     t * (3.0 * c.dim + 2.0 * c.q_dim() + 2.0 * c.kv_dim() + 2.0 * c.ffn_dim) * 4,
                     StrFormat("%lld tokens per forward x (3 dim + 2 q_dim + 2 kv_dim + 2 ffn) x 4 B", (long long)s.batch_tokens)});
  p.lines.push_back({"temporary", "device", (double)s.kv_seqs * c.vocab_size * 4.0,
                     StrFormat("logits: %lld rows x vocab %lld x 4 B", (long long)s.kv_seqs, (long long)c.vocab_size)});
  return p;
}

Result<model::ModelConfig> NamedArchitecture(const std::string& name) {
  struct Arch {
    const char* name;
    const char* arch;
    int64_t layers, dim, heads, kv_heads, ffn, vocab, ctx;
    float theta;
    bool tied, bias;
    int64_t head_dim = 0;  // 0: dim / heads
    bool qk_norm = false;
  };
  static const Arch kArchs[] = {
      {"llama-7b", "llama", 32, 4096, 32, 32, 11008, 32000, 4096, 10000, false, false},
      {"llama-13b", "llama", 40, 5120, 40, 40, 13824, 32000, 4096, 10000, false, false},
      {"llama-70b", "llama", 80, 8192, 64, 8, 28672, 32000, 4096, 10000, false, false},
      {"llama3-8b", "llama", 32, 4096, 32, 8, 14336, 128256, 8192, 500000, false, false},
      {"mistral-7b", "mistral", 32, 4096, 32, 8, 14336, 32000, 32768, 1000000, false, false},
      {"qwen2.5-0.5b", "qwen2", 24, 896, 14, 2, 4864, 151936, 32768, 1000000, true, true},
      {"qwen2.5-7b", "qwen2", 28, 3584, 28, 4, 18944, 152064, 32768, 1000000, false, true},
      {"smollm2-135m", "llama", 30, 576, 9, 3, 1536, 49152, 8192, 100000, true, false},
      {"smollm2-360m", "llama", 32, 960, 15, 5, 2560, 49152, 8192, 100000, true, false},
      {"smollm2-1.7b", "llama", 24, 2048, 32, 32, 8192, 49152, 8192, 130000, true, false},
      {"qwen3-0.6b", "qwen3", 28, 1024, 16, 8, 3072, 151936, 40960, 1000000, true, false, 128, true},
      {"qwen3-1.7b", "qwen3", 28, 2048, 16, 8, 6144, 151936, 40960, 1000000, true, false, 128, true},
      {"qwen3-4b", "qwen3", 36, 2560, 32, 8, 9728, 151936, 40960, 1000000, true, false, 128, true},
      {"qwen3-8b", "qwen3", 36, 4096, 32, 8, 12288, 151936, 40960, 1000000, false, false, 128, true},
  };
  for (const Arch& a : kArchs) {
    if (name != a.name) continue;
    model::ModelConfig c;
    c.arch = a.arch;
    c.n_layers = a.layers;
    c.dim = a.dim;
    c.n_heads = a.heads;
    c.n_kv_heads = a.kv_heads;
    c.head_dim = a.head_dim > 0 ? a.head_dim : a.dim / a.heads;
    c.qk_norm = a.qk_norm;
    c.rope_dim = c.head_dim;
    c.ffn_dim = a.ffn;
    c.vocab_size = a.vocab;
    c.max_seq_len = a.ctx;
    c.rope_theta = a.theta;
    c.tied_embeddings = a.tied;
    c.qkv_bias = a.bias;
    return c;
  }
  std::string near = Nearest(name, NamedArchitectures());
  std::string list;
  for (auto& n : NamedArchitectures()) list += (list.empty() ? "" : ", ") + n;
  return Status::Error(StrFormat("unknown architecture '%s'%s; known: %s", name.c_str(),
                                 near.empty() ? "" : (" (did you mean '" + near + "'?)").c_str(), list.c_str()));
}

std::vector<std::string> NamedArchitectures() {
  return {"llama-7b",     "llama-13b",    "llama-70b",    "llama3-8b",  "mistral-7b", "qwen2.5-0.5b", "qwen2.5-7b",
          "smollm2-135m", "smollm2-360m", "smollm2-1.7b", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b",     "qwen3-8b"};
}

}  // namespace lathe::train
