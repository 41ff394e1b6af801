// Transformer::Forward: embedding -> N x (RMSNorm, GQA attention with RoPE, RMSNorm, SwiGLU) ->
// RMSNorm -> output head, for a stacked batch of sequences.
#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>

#include "core/check.h"
#include "core/mapped_file.h"
#include "kernels/kernels.h"

namespace lathe::model {

KvBlockStore::KvBlockStore(const ModelConfig& c, int64_t n_blocks, int64_t block_size, DType kv_dtype,
                           bool populate)
    : n_layers_(c.n_layers),
      n_blocks_(n_blocks),
      block_size_(block_size),
      n_kv_heads_(c.n_kv_heads),
      head_dim_(c.head_dim),
      kv_dim_(c.kv_dim()),
      dtype_(kv_dtype),
      elt_(KvElemBytes(kv_dtype)) {
  LATHE_CHECK(n_blocks > 0 && block_size > 0);
  LATHE_CHECK_MSG(IsKvCacheDType(kv_dtype), "KV cache dtype %s: expected f32, f16 or bf16", DTypeName(kv_dtype));
  const size_t n = (size_t)n_layers_ * n_blocks * block_size * kv_dim_ * elt_;
  k_ = HugePageBuffer(n);
  v_ = HugePageBuffer(n);
  if (populate) {  // a fresh 1 GiB pool faulted ~0.8 s of page zeroing into a c=32 bench level otherwise
    k_.Populate();
    v_.Populate();
  }
}

size_t KvBlockStore::BlockBytes(const ModelConfig& c, int64_t block_size, DType kv_dtype) {
  return (size_t)c.n_layers * block_size * c.kv_dim() * 2 * KvElemBytes(kv_dtype);
}

namespace {
void LoadRow(DType t, const uint8_t* src, int64_t n, float* dst) {
  switch (t) {
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(((const uint16_t*)src)[i]);
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToF32(((const uint16_t*)src)[i]);
      break;
    default:
      std::memcpy(dst, src, n * sizeof(float));
  }
}
}  // namespace

void KvBlockStore::Write(int64_t layer, int64_t block, int64_t offset, const float* k, const float* v) {
  for (int64_t h = 0; h < n_kv_heads_; ++h) {
    const size_t i = Index(layer, block, h, offset) * elt_;
    kernels::RoundKv(dtype_, k + h * head_dim_, head_dim_, k_.data() + i);
    kernels::RoundKv(dtype_, v + h * head_dim_, head_dim_, v_.data() + i);
  }
}

void KvBlockStore::ReadK(int64_t layer, int64_t block, int64_t offset, float* out) const {
  for (int64_t h = 0; h < n_kv_heads_; ++h)
    LoadRow(dtype_, k_.data() + Index(layer, block, h, offset) * elt_, head_dim_, out + h * head_dim_);
}

void KvBlockStore::ReadV(int64_t layer, int64_t block, int64_t offset, float* out) const {
  for (int64_t h = 0; h < n_kv_heads_; ++h)
    LoadRow(dtype_, v_.data() + Index(layer, block, h, offset) * elt_, head_dim_, out + h * head_dim_);
}

void KvBlockStore::CopyBlock(int64_t src, int64_t dst) {
  const size_t n = (size_t)block_size_ * kv_dim_ * elt_;  // a block is contiguous within a layer
  for (int64_t l = 0; l < n_layers_; ++l) {
    std::memcpy(k_.data() + Index(l, dst, 0, 0) * elt_, k_.data() + Index(l, src, 0, 0) * elt_, n);
    std::memcpy(v_.data() + Index(l, dst, 0, 0) * elt_, v_.data() + Index(l, src, 0, 0) * elt_, n);
  }
}

KvCache::KvCache(const ModelConfig& c, int n_slots, int64_t max_len, int64_t block_size, DType kv_dtype)
    : n_slots_(n_slots),
      max_len_(max_len),
      blocks_per_slot_((max_len + block_size - 1) / block_size),
      store_(c, n_slots * blocks_per_slot_, block_size, kv_dtype),
      tables_((size_t)n_slots * blocks_per_slot_),
      len_(n_slots, 0) {
  for (size_t i = 0; i < tables_.size(); ++i) tables_[i] = (int32_t)i;
}

void KvCache::Truncate(int slot, int64_t new_len) {
  LATHE_CHECK(slot >= 0 && slot < n_slots_ && new_len >= 0);
  if (new_len < len_[slot]) len_[slot] = new_len;
}

std::vector<float> RopeInvFreq(const ModelConfig& c, const float* freq_divisors) {
  int64_t half = c.rope_dim / 2;
  std::vector<float> inv(half);
  for (int64_t i = 0; i < half; ++i) {
    // As transformers: 1 / theta^(2i/d) in float32.
    inv[i] = 1.0f / std::pow(c.rope_theta, (float)(2 * i) / (float)c.rope_dim);
  }
  const RopeScaling& s = c.rope_scaling;
  if (freq_divisors) {
    for (int64_t i = 0; i < half; ++i) inv[i] /= freq_divisors[i];
  } else if (s.type == RopeScaling::Type::kLinear) {
    for (float& f : inv) f /= s.factor;
  } else if (s.type == RopeScaling::Type::kYarn) {
    // transformers' _compute_yarn_parameters (float32 as torch computes it).
    const double dim = (double)c.rope_dim, base = c.rope_theta;
    const auto correction_dim = [&](double rotations) {
      return dim * std::log((double)s.original_max_position / (rotations * 2 * M_PI)) / (2 * std::log(base));
    };
    double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
    if (s.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const float pos_freq = std::pow(c.rope_theta, (float)(2 * i) / (float)c.rope_dim);
      const float extrapolation = 1.0f / pos_freq, interpolation = 1.0f / (s.factor * pos_freq);
      const float ramp = std::clamp(((float)i - (float)low) / (float)(high - low), 0.0f, 1.0f);
      const float extrapolation_factor = 1.0f - ramp;
      inv[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
    }
  } else if (s.type == RopeScaling::Type::kLlama3) {
    // transformers' _compute_llama3_parameters.
    float old_ctx = (float)s.original_max_position;
    float low_wavelen = old_ctx / s.low_freq_factor;
    float high_wavelen = old_ctx / s.high_freq_factor;
    for (float& f : inv) {
      float wavelen = 2.0f * (float)M_PI / f;
      float scaled = wavelen > low_wavelen ? f / s.factor : f;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        float smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        scaled = (1.0f - smooth) * scaled / s.factor + smooth * scaled;
      }
      f = scaled;
    }
  }
  return inv;
}

float RopeCosSinScale(const ModelConfig& c) {
  return c.rope_scaling.type == RopeScaling::Type::kYarn ? c.rope_scaling.attention_factor : 1.0f;
}

void RopeCosSinRows(const std::vector<float>& inv_freq, float scale, int64_t p0, int64_t n_pos, float* cos,
                    float* sin) {
  const int64_t half = (int64_t)inv_freq.size();
  for (int64_t p = p0; p < n_pos; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = (float)p * inv_freq[i];  // float32 product, as transformers and llama2.c
      cos[(p - p0) * half + i] = (float)std::cos((double)angle) * scale;
      sin[(p - p0) * half + i] = (float)std::sin((double)angle) * scale;
    }
  }
}

Transformer::Transformer(const ModelWeights& weights, ThreadPool& pool, TransformerOptions options)
    : w_(weights), pool_(pool), options_(options) {
  inv_freq_ = RopeInvFreq(w_.config, w_.rope_freqs.data ? w_.rope_freqs.as<float>() : nullptr);
  rope_scale_ = RopeCosSinScale(w_.config);
  scores_.resize(pool.size());
  if (options_.strip_float_weights) {
    std::vector<const Tensor*> linears = {&w_.output};
    for (const LayerWeights& L : w_.layers)
      for (const Tensor* t : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) linears.push_back(t);
    // One arena for every strip copy, 64-byte aligned pieces, on transparent huge pages: a decode step streams
    // all of it, one TLB entry per 2 MiB instead of per 4 KiB page (F32 / BF16 1-thread decode +5-12%
    // against a malloc'd copy per tensor, bench/RESULTS.md).
    std::vector<std::pair<const Tensor*, size_t>> todo;  // tensor, offset in the arena
    size_t total = 0;
    for (const Tensor* t : linears) {
      const DType dt = t->dtype;
      if (!t->data || t->ndim() != 2 || !(dt == DType::kF32 || dt == DType::kF16 || dt == DType::kBF16)) continue;
      if (std::any_of(todo.begin(), todo.end(), [&](const auto& e) { return e.first->data == t->data; })) continue;
      todo.push_back({t, total});
      total += (kernels::StripWeightBytes(dt, t->shape[0], t->shape[1]) + 63) / 64 * 64;
    }
    strip_arena_ = HugePageBuffer(total);
    for (const auto& [t, offset] : todo) {
      // exact_activations: no bf16 rounding of x either (BF16 weights keep the f32-arithmetic strips).
      strips_[t->data] = kernels::PackStripWeight(pool_, *t, strip_arena_.data() + offset,
                                                  /*bf16_dot=*/!options_.exact_activations);
      // The stored copy is now read only for embedding rows (a tied head): its file pages go back, and
      // the few rows looked up fault in again.
      DropFilePages(t->data, t->nbytes());
    }
  }
}

void Transformer::Rows(int64_t T, double work_per_row, const std::function<void(int64_t, int64_t)>& fn) {
  // Two tasks per thread at least 8 rows each; a row's arithmetic never depends on the split.
  const int64_t grain = std::max<int64_t>(8, (T + 2 * pool_.size() - 1) / (2 * pool_.size()));
  pool_.ParallelFor(T, grain, [&](int64_t b, int64_t e, int) { fn(b, e); }, work_per_row * (double)T);
}

const kernels::StripWeight* Transformer::Strips(const Tensor& w) const {
  if (strips_.empty()) return nullptr;
  auto it = strips_.find(w.data);
  return it == strips_.end() ? nullptr : &it->second;
}

void Transformer::EnsureRopeTable(int64_t n_pos) {
  if (n_pos <= rope_pos_) return;
  int64_t half = (int64_t)inv_freq_.size();
  int64_t new_n = std::max(n_pos, rope_pos_ * 2);
  rope_cos_.resize(new_n * half);
  rope_sin_.resize(new_n * half);
  RopeCosSinRows(inv_freq_, rope_scale_, rope_pos_, new_n, &rope_cos_[rope_pos_ * half], &rope_sin_[rope_pos_ * half]);
  rope_pos_ = new_n;
}

void Transformer::ApplyRope(float* x, int64_t n_heads, int64_t pos) const {
  const ModelConfig& c = w_.config;
  int64_t half = c.rope_dim / 2;
  const float* cs = &rope_cos_[pos * half];
  const float* sn = &rope_sin_[pos * half];
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * c.head_dim;
    if (c.rope_style == RopeStyle::kInterleaved) {
      for (int64_t i = 0; i < half; ++i) {
        float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * cs[i] - b * sn[i];
        v[2 * i + 1] = a * sn[i] + b * cs[i];
      }
    } else {
      for (int64_t i = 0; i < half; ++i) {
        float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
      }
    }
  }
}

void Transformer::Attention(KvBlockStore& store, int64_t layer, std::span<const PagedSeqInput> batch) {
  const ModelConfig& c = w_.config;
  const int64_t hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
  const int64_t q_dim = c.q_dim(), bs = store.block_size();
  const float scale = 1.0f / std::sqrt((float)hd);
  const int64_t window = c.WindowOf(layer);
  // Work items: (sequence, KV head, chunk of that sequence's new tokens); the `group` query heads of
  // a KV head share each K/V row read (kernels::GroupAttention).
  struct Item {
    int seq;
    int64_t row0;    // first stacked row of the sequence
    int64_t t0, t1;  // token range within the sequence's new tokens
    int64_t kv_head;
  };
  std::vector<Item> items;
  int64_t row = 0;
  double work = 0;  // flops: q.k and p.v over every attended position of every query head
  for (size_t s = 0; s < batch.size(); ++s) {
    int64_t n = (int64_t)batch[s].tokens.size();
    // 16 tokens per item: their scores (16 x group x context floats) stay in L2 while the K/V
    // position blocks are shared by all of them (kernels::GroupAttentionRows).
    int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(n, 16));
    for (int64_t g = 0; g < c.n_kv_heads; ++g)
      for (int64_t t = 0; t < n; t += chunk) items.push_back({(int)s, row, t, std::min(n, t + chunk), g});
    row += n;
    for (int64_t t = 0; t < n; ++t) {  // positions each new token attends to
      const int64_t end = batch[s].start_pos + t + 1;
      work += 4.0 * hd * c.n_heads * (double)(window > 0 ? std::min(end, window) : end);
    }
  }
  const DType kvt = store.dtype();
  const size_t elt = KvElemBytes(kvt);
  const uint8_t* k_layer = (const uint8_t*)store.KLayer(layer);
  const uint8_t* v_layer = (const uint8_t*)store.VLayer(layer);
  pool_.ParallelFor((int64_t)items.size(), 1, [&](int64_t b, int64_t e, int thread) {
    std::vector<float>& sc = scores_[thread];
    static thread_local std::vector<int64_t> off;
    for (int64_t it = b; it < e; ++it) {
      const Item& item = items[it];
      const PagedSeqInput& seq = batch[item.seq];
      const int64_t kvo = store.HeadOffset(item.kv_head);
      // Offsets of every position's K/V row in the layer (same layout for K and V).
      const int64_t n_pos = seq.start_pos + item.t1;
      if ((int64_t)off.size() < n_pos) off.resize(n_pos);
      const int64_t n_tok = item.t1 - item.t0;
      if ((int64_t)sc.size() < n_tok * group * n_pos) sc.resize(n_tok * group * n_pos);
      for (int64_t p = 0; p < n_pos; ++p) off[p] = store.PosOffset(seq.block_table[p / bs], p % bs);
      const int64_t r = item.row0 + item.t0, h0 = item.kv_head * group;
      kernels::GroupAttentionRows(&q_[r * q_dim + h0 * hd], q_dim, n_tok, (int)group, k_layer + kvo * elt,
                                  v_layer + kvo * elt, kvt, off.data(), seq.start_pos + item.t0, (int)hd, scale,
                                  &att_[r * q_dim + h0 * hd], q_dim, sc.data(), window);
    }
  }, work);
}

void Transformer::RefineLogits(const float* rows, int64_t n_rows, float* logits) {
  const int64_t V = w_.config.vocab_size, dim = w_.config.dim;
  // Candidate by candidate, the vocabulary in chunks spread over the threads (a decode step has one row: by rows,
  // one thread did it all). A flat distribution (an untrained model; a high-entropy position) puts much of the
  // vocabulary within the margin: each candidate costs a row's dequantization and an f32 dot, ~5x its share of the
  // int8 head product, and an f32-x product over the whole head was no faster (kernels::MatMul dequantizes W).
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (V + kChunk - 1) / kChunk;
  refine_cut_.resize(n_rows);
  double candidates = 0;
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* row = logits + r * V;
    const float cut = row[kernels::Argmax(row, V)] - kExactLogitMargin;
    refine_cut_[r] = cut;
    for (int64_t v = 0; v < V; ++v) candidates += row[v] >= cut;
  }
  // The usual few candidates (a peaked distribution) stay on the calling thread, as before: no wake-up per token.
  pool_.ParallelFor(n_rows * chunks, 1, [&](int64_t b, int64_t e, int) {
    std::vector<float> wrow(dim);
    for (int64_t task = b; task < e; ++task) {
      const int64_t r = task / chunks, v0 = task % chunks * kChunk;
      float* row = logits + r * V;
      for (int64_t v = v0; v < std::min(V, v0 + kChunk); ++v) {
        if (row[v] < refine_cut_[r]) continue;
        kernels::DequantizeRows(w_.output, v, 1, wrow.data());
        row[v] = kernels::Dot(rows + r * dim, wrow.data(), dim);
      }
    }
  }, candidates * 4.0 * dim);
}

Status Transformer::Forward(KvCache& cache, std::span<const SeqInput> batch, std::vector<float>* logits) {
  std::vector<PagedSeqInput> paged(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const SeqInput& s = batch[i];
    if (s.slot < 0 || s.slot >= cache.n_slots()) return Status::Error(StrFormat("KV cache slot %d out of range", s.slot));
    for (size_t j = 0; j < i; ++j) {
      if (batch[j].slot == s.slot) return Status::Error(StrFormat("KV cache slot %d appears twice in a batch", s.slot));
    }
    if (cache.length(s.slot) + (int64_t)s.tokens.size() > cache.max_len()) {
      return Status::Error(StrFormat("sequence of %lld tokens exceeds the context of %lld tokens",
                                     (long long)(cache.length(s.slot) + (int64_t)s.tokens.size()),
                                     (long long)cache.max_len()));
    }
    paged[i] = {s.tokens, cache.length(s.slot), cache.BlockTable(s.slot), s.all_logits, nullptr, s.sampled_rows};
  }
  LATHE_RETURN_IF_ERROR(ForwardPaged(cache.store(), paged, logits));
  for (const SeqInput& s : batch) cache.SetLength(s.slot, cache.length(s.slot) + (int64_t)s.tokens.size());
  return Status::Ok();
}

Status Transformer::ForwardPaged(KvBlockStore& store, std::span<const PagedSeqInput> batch, std::vector<float>* logits) {
  const ModelConfig& c = w_.config;
  const int64_t dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), ffn = c.ffn_dim;
  int64_t T = 0, n_out = 0, max_pos = 0;
  for (const PagedSeqInput& s : batch) {
    int64_t n = (int64_t)s.tokens.size();
    if (n == 0) return Status::Error("empty sequence in batch");
    if (s.start_pos < 0 || (s.start_pos + n + store.block_size() - 1) / store.block_size() > (int64_t)s.block_table.size()) {
      return Status::Error(StrFormat("block table of %zu blocks cannot hold %lld tokens", s.block_table.size(),
                                     (long long)(s.start_pos + n)));
    }
    for (int32_t b : s.block_table.first((s.start_pos + n + store.block_size() - 1) / store.block_size())) {
      if (b < 0 || b >= store.n_blocks()) return Status::Error(StrFormat("block id %d out of range", b));
    }
    for (int32_t id : s.tokens) {
      if (id < 0 || id >= c.vocab_size) {
        return Status::Error(StrFormat("token id %d out of range (vocab size %lld)", id, (long long)c.vocab_size));
      }
    }
    T += n;
    n_out += s.all_logits ? n : 1;
    max_pos = std::max(max_pos, s.start_pos + n);
  }
  EnsureRopeTable(max_pos);
  token_runs_.clear();
  out_runs_.clear();
  for (const PagedSeqInput& s : batch) {
    const int64_t n = (int64_t)s.tokens.size();
    const int64_t n_exact = options_.int8_prompt_rows && !options_.exact_activations
                                ? 0
                                : n - std::clamp<int64_t>(s.sampled_rows, 0, n);
    AddRun(&token_runs_, n_exact, true);
    AddRun(&token_runs_, n - n_exact, false);
    if (s.all_logits) {
      AddRun(&out_runs_, n_exact, true);
      AddRun(&out_runs_, n - n_exact, false);
    } else {
      // The one row whose logits are sampled from (a prompt's last token, or a decode token): the head
      // with int8 x, as for decode rows, whatever the row's own precision. Every logit within
      // kExactLogitMargin of the top is recomputed with f32 x below (RefineLogits), so only logits
      // e^-6 below the top's probability see the int8 noise; the bf16 form cost a full dequantization
      // of the head for one or two rows (~3 ms per step for SmolLM2's 49152 x 576 Q8_0 head, ~4% of
      // a c=32 serving step). Rows whose every logit is wanted (all_logits: prompt logprobs, eval)
      // keep their precision.
      AddRun(&out_runs_, 1, false);
    }
  }
  // Group consecutive sequences with the same adapter into row runs for the LoRA deltas.
  lora_runs_.clear();
  {
    int64_t row0 = 0;
    for (const PagedSeqInput& s : batch) {
      const LoraAdapter* a = s.adapter ? s.adapter : options_.adapter;
      int64_t n = (int64_t)s.tokens.size();
      if (a) {
        if (!lora_runs_.empty() && lora_runs_.back().adapter == a &&
            lora_runs_.back().row0 + lora_runs_.back().n_rows == row0) {
          lora_runs_.back().n_rows += n;
        } else {
          lora_runs_.push_back({row0, n, a});
        }
      }
      row0 += n;
    }
  }
  x_.resize(T * dim);
  xb_.resize(T * dim);
  q_.resize(T * q_dim);
  k_.resize(T * kv_dim);
  v_.resize(T * kv_dim);
  att_.resize(T * q_dim);
  hb_.resize(T * ffn);
  hb2_.resize(T * ffn);
  row_pos_.resize(T);
  row_block_.resize(T);

  Profiler* prof = options_.profiler;
  // Embedding rows.
  int64_t r = 0;
  std::optional<ScopedOp> embed_op(std::in_place, prof, "embedding", 0, (double)T * w_.tok_embd.row_bytes());
  for (const PagedSeqInput& s : batch) {
    for (size_t i = 0; i < s.tokens.size(); ++i, ++r) {
      kernels::DequantizeRows(w_.tok_embd, s.tokens[i], 1, &x_[r * dim]);
      row_pos_[r] = s.start_pos + (int64_t)i;
    }
  }

  embed_op.reset();
  const double norm_bytes = 8.0 * T * dim;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    {
      ScopedOp op(prof, "rmsnorm", 4.0 * T * dim, norm_bytes);
      Rows(T, 4.0 * dim, [&](int64_t b, int64_t e) {
        kernels::RmsNorm(&x_[b * dim], L.attn_norm.as<float>(), &xb_[b * dim], e - b, dim, c.norm_eps);
      });
    }
    LinearShared("matmul_qkv", xb_.data(), T, l,
                 {{"matmul_q", &L.wq, q_.data(), LoraModule::kQ},
                  {"matmul_k", &L.wk, k_.data(), LoraModule::kK},
                  {"matmul_v", &L.wv, v_.data(), LoraModule::kV}});
    if (c.qkv_bias) {
      for (int64_t t = 0; t < T; ++t) {
        kernels::Axpy(&q_[t * q_dim], 1.0f, L.bq.as<float>(), q_dim);
        kernels::Axpy(&k_[t * kv_dim], 1.0f, L.bk.as<float>(), kv_dim);
        kernels::Axpy(&v_[t * kv_dim], 1.0f, L.bv.as<float>(), kv_dim);
      }
    }
    r = 0;
    const int64_t bs = store.block_size();
    std::optional<ScopedOp> rope_op(std::in_place, prof, "rope_kv_write", 3.0 * T * (q_dim + kv_dim),
                                    4.0 * T * (q_dim + 3 * kv_dim));
    for (const PagedSeqInput& s : batch) {
      for (size_t i = 0; i < s.tokens.size(); ++i, ++r) row_block_[r] = s.block_table[row_pos_[r] / bs];
    }
    Rows(T, 4.0 * (q_dim + kv_dim), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t pos = row_pos_[t];
        if (c.qk_norm) {  // qwen3: each head's q and k RMS-normalized over head_dim, before RoPE
          kernels::RmsNorm(&q_[t * q_dim], L.q_norm.as<float>(), &q_[t * q_dim], c.n_heads, c.head_dim, c.norm_eps);
          kernels::RmsNorm(&k_[t * kv_dim], L.k_norm.as<float>(), &k_[t * kv_dim], c.n_kv_heads, c.head_dim,
                           c.norm_eps);
        }
        ApplyRope(&q_[t * q_dim], c.n_heads, pos);
        ApplyRope(&k_[t * kv_dim], c.n_kv_heads, pos);
        store.Write(l, row_block_[t], pos % bs, &k_[t * kv_dim], &v_[t * kv_dim]);
      }
    });
    rope_op.reset();
    {
      double ctx = 0;  // attended positions, summed over new tokens
      for (const PagedSeqInput& s : batch) {
        int64_t n = (int64_t)s.tokens.size();
        ctx += (double)n * s.start_pos + (double)n * (n + 1) / 2;
      }
      ScopedOp op(prof, "attention", 4.0 * ctx * q_dim, 8.0 * ctx * kv_dim);
      Attention(store, l, batch);
    }
    Linear("matmul_o", att_.data(), T, L.wo, xb_.data(), l, LoraModule::kO);
    if (c.o_bias) {
      for (int64_t t = 0; t < T; ++t) kernels::Axpy(&xb_[t * dim], 1.0f, L.bo.as<float>(), dim);
    }
    {
      ScopedOp op(prof, "residual_norm", 5.0 * T * dim, 3 * norm_bytes);
      Rows(T, 5.0 * dim, [&](int64_t b, int64_t e) {
        kernels::Axpy(&x_[b * dim], 1.0f, &xb_[b * dim], (e - b) * dim);
        kernels::RmsNorm(&x_[b * dim], L.ffn_norm.as<float>(), &xb_[b * dim], e - b, dim, c.norm_eps);
      });
    }
    LinearShared("matmul_gate_up", xb_.data(), T, l,
                 {{"matmul_gate", &L.w_gate, hb_.data(), LoraModule::kGate},
                  {"matmul_up", &L.w_up, hb2_.data(), LoraModule::kUp}});
    {
      ScopedOp op(prof, "silu_mul", 6.0 * T * ffn, 12.0 * T * ffn);
      // Row by row: a row's elements take the same (vector or tail) path whatever its batch.
      Rows(T, 6.0 * ffn, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) kernels::SiluMul(&hb_[t * ffn], &hb2_[t * ffn], ffn);
      });
    }
    Linear("matmul_down", hb_.data(), T, L.w_down, xb_.data(), l, LoraModule::kDown);
    {
      ScopedOp op(prof, "residual", 1.0 * T * dim, norm_bytes * 1.5);
      Rows(T, 1.0 * dim, [&](int64_t b, int64_t e) { kernels::Axpy(&x_[b * dim], 1.0f, &xb_[b * dim], (e - b) * dim); });
    }
  }
  // Final norm only on the rows whose logits are wanted.
  rows_.resize(n_out * dim);
  int64_t o = 0;
  r = 0;
  for (const PagedSeqInput& s : batch) {
    int64_t n = (int64_t)s.tokens.size();
    int64_t first = s.all_logits ? 0 : n - 1;
    for (int64_t i = first; i < n; ++i, ++o) std::memcpy(&rows_[o * dim], &x_[(r + i) * dim], dim * sizeof(float));
    r += n;
  }
  kernels::RmsNorm(rows_.data(), w_.output_norm.as<float>(), rows_.data(), n_out, dim, c.norm_eps);
  logits->resize(n_out * c.vocab_size);
  Linear("matmul_head", rows_.data(), n_out, w_.output, logits->data());
  // Quantized heads (int8 x) and bf16 pair strips (bf16 x): the logits near the top recomputed with f32 x.
  const kernels::StripWeight* head_strips = Strips(w_.output);
  if (!options_.exact_activations && (IsQuantized(w_.output.dtype) || (head_strips && head_strips->bf16_pairs))) {
    ScopedOp op(prof, "refine_logits");
    RefineLogits(rows_.data(), n_out, logits->data());
  }
  return Status::Ok();
}

void Transformer::AddRun(std::vector<PrecisionRun>* runs, int64_t n, bool exact) {
  if (n == 0) return;
  if (!runs->empty() && runs->back().exact == exact) {
    runs->back().n_rows += n;
  } else {
    runs->push_back({n, exact});
  }
}

void Transformer::Linear(const char* name, const float* x, int64_t M, const Tensor& w, float* y, int64_t layer,
                         LoraModule module) {
  {
    ScopedOp op(options_.profiler, name, 2.0 * M * w.numel(), (double)w.nbytes() + 4.0 * M * (w.shape[0] + w.shape[1]),
                options_.profiler ? OpShape(M, w) : std::string());
    // Layer matmuls take the T token rows, the head (layer < 0) the output rows.
    const std::vector<PrecisionRun>& runs = layer >= 0 ? token_runs_ : out_runs_;
    if (const kernels::StripWeight* sw = Strips(w)) {
      kernels::MatMulStrips(pool_, x, M, *sw, y);
    } else if (!options_.exact_activations && kernels::MatMulInt16Takes(w)) {
      // Sampled rows int8, prompt rows int16, one pass over W for both.
      kernels::MatMulRows(pool_, x, M, w, y, RowRunsOf(runs));
    } else if (options_.exact_activations || !IsQuantized(w.dtype) || runs.size() < 2) {
      const bool exact = options_.exact_activations || (runs.size() == 1 && runs.front().exact);
      MatMulRun(x, M, w, y, exact);
    } else {
      int64_t r = 0;
      for (const PrecisionRun& run : runs) {
        MatMulRun(x + r * w.shape[1], run.n_rows, w, y + r * w.shape[0], run.exact);
        r += run.n_rows;
      }
      LATHE_CHECK(r == M);
    }
  }
  if (layer >= 0) AddLora(x, y, layer, module);
}

std::span<const kernels::RowRun> Transformer::RowRunsOf(const std::vector<PrecisionRun>& runs) {
  row_runs_.clear();
  for (const PrecisionRun& run : runs) row_runs_.push_back({run.n_rows, run.exact});
  return row_runs_;
}

void Transformer::MatMulRun(const float* x, int64_t M, const Tensor& w, float* y, bool exact) {
  // Prompt rows (exact) of a block-quantized W: bf16 arithmetic where the CPU has the bf16 dot product
  // (kernels::MatMulBf16; f32 elsewhere), f32 with options_.exact_activations. (Weights that take int16 prompt
  // rows go through kernels::MatMulRows in Linear.)
  if (exact && !options_.exact_activations) {
    kernels::MatMulBf16(pool_, x, M, w, y);
  } else {
    kernels::MatMul(pool_, x, M, w, y, exact);
  }
}

void Transformer::LinearShared(const char* name, const float* x, int64_t M, int64_t layer,
                               std::initializer_list<SharedPart> parts) {
  // One kernels::MatMulShared for a decode step (one token row: one precision run), where it joins
  // the weights on the GEMV path; otherwise one Linear (one profile op) per weight.
  // Prompt rows on the bf16 arithmetic (MatMulRun) take Linear too: MatMulShared has no such form.
  const bool exact = options_.exact_activations || (token_runs_.size() == 1 && token_runs_.front().exact);
  bool stripped = false;
  for (const SharedPart& p : parts)
    stripped = stripped || Strips(*p.w) ||
               (exact && !options_.exact_activations &&
                (kernels::MatMulInt16Takes(*p.w) || kernels::MatMulBf16Rounds(*p.w)));
  // Several rows of weights that are all strips: one kernels::MatMulStripsShared (x packed once for the GEMM).
  bool all_strips = M > 1;
  for (const SharedPart& p : parts) all_strips = all_strips && Strips(*p.w);
  // Several rows of block-quantized weights on the int8 GEMM's runs (Linear's MatMulRows): one
  // kernels::MatMulRowsShared (x quantized once).
  bool all_rows = M > 1 && !options_.exact_activations;
  for (const SharedPart& p : parts) all_rows = all_rows && !Strips(*p.w) && kernels::MatMulInt16Takes(*p.w);
  if ((M != 1 || stripped) && !all_strips && !all_rows) {
    for (const SharedPart& p : parts) Linear(p.name, x, M, *p.w, p.y, layer, p.module);
    return;
  }
  const Tensor* ws[4];
  const kernels::StripWeight* sws[4];
  float* ys[4];
  size_t n = 0;
  double flops = 0, bytes = 4.0 * M * (*parts.begin()).w->shape[1];
  std::string shape;
  for (const SharedPart& p : parts) {
    LATHE_CHECK(n < 4);
    ws[n] = p.w;
    sws[n] = Strips(*p.w);
    ys[n++] = p.y;
    flops += 2.0 * M * p.w->numel();
    bytes += (double)p.w->nbytes() + 4.0 * M * p.w->shape[0];
    if (options_.profiler) shape += (shape.empty() ? "" : " + ") + OpShape(M, *p.w);
  }
  {
    ScopedOp op(options_.profiler, name, flops, bytes, shape);
    if (all_strips) {
      kernels::MatMulStripsShared(pool_, x, M, std::span<const kernels::StripWeight* const>(sws, n),
                                  std::span<float* const>(ys, n));
    } else if (all_rows) {
      kernels::MatMulRowsShared(pool_, x, M, std::span<const Tensor* const>(ws, n), std::span<float* const>(ys, n),
                                RowRunsOf(token_runs_));
    } else {
      kernels::MatMulShared(pool_, x, M, std::span<const Tensor* const>(ws, n), std::span<float* const>(ys, n),
                            exact);
    }
  }
  for (const SharedPart& p : parts) AddLora(x, p.y, layer, p.module);
}

void Transformer::AddLora(const float* x, float* y, int64_t layer, LoraModule module) {
  for (const LoraRun& run : lora_runs_) {
    const LoraPair& p = run.adapter->at(layer, module);
    if (!p.a.data) continue;
    const int64_t m = run.n_rows;
    ScopedOp op(options_.profiler, "lora", 2.0 * m * (p.a.numel() + p.b.numel()),
                4.0 * (p.a.numel() + p.b.numel()));
    const int64_t r = p.a.shape[0], out = p.b.shape[0];
    lora_mid_.resize(m * r);
    lora_out_.resize(m * out);
    kernels::MatMul(pool_, x + run.row0 * p.a.shape[1], m, p.a, lora_mid_.data());  // (m, r) = x A^T
    kernels::MatMul(pool_, lora_mid_.data(), m, p.b, lora_out_.data());             // (m, out) = (x A^T) B^T
    kernels::Axpy(y + run.row0 * out, p.scale, lora_out_.data(), m * out);
  }
}

std::string Transformer::OpShape(int64_t M, const Tensor& w) {
  return StrFormat("[%lld, %lld] x [%lld, %lld] %s", (long long)M, (long long)w.shape[1], (long long)w.shape[0],
                   (long long)w.shape[1], DTypeName(w.dtype));
}

}  // namespace lathe::model
