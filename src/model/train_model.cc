// TrainModel: setup of trainable tensors (LoRA / full / freeze), the training forward and the
// hand-written backward over the kernels of kernels/train_ops.h. Saving is in train_model_save.cc.
#include "model/train_model.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/check.h"
#include "core/mapped_file.h"
#include "kernels/kernels.h"
#include "kernels/train_ops.h"
#include "model/train_model_impl.h"
#include "model/transformer.h"

namespace lathe::model {

namespace internal {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

const char* const kModNames[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
bool IsAttn(int m) { return m <= (int)LoraModule::kO; }

}  // namespace

TrainModelImpl::TrainModelImpl(const ModelWeights& base, ThreadPool& pool, const TrainModelOptions& options,
                               bool in_place)
    : base_(base), pool_(pool), opt_(options), in_place_(in_place), c_(base.config) {}

float* TrainModelImpl::NewBuffer(int64_t n) {
  storage_.emplace_back((size_t)n, 0.0f);
  return storage_.back().data();
}

GradBuffer::GradBuffer(int64_t n) : bytes_((size_t)n * sizeof(float)) {
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  LATHE_CHECK(p != MAP_FAILED);
  p_ = (float*)p;
}

GradBuffer::~GradBuffer() { munmap(p_, bytes_); }

void GradBuffer::Zero(bool hand_back_pages, ThreadPool* pool) {
  if (hand_back_pages) {
    LATHE_CHECK(madvise(p_, bytes_, MADV_DONTNEED) == 0);
  } else if (pool) {  // 1 MiB pieces (a full fine-tune's 538 MB took 57 ms on one thread)
    constexpr int64_t kPiece = (int64_t)1 << 18;
    const int64_t n = (int64_t)(bytes_ / sizeof(float));
    pool->ParallelFor((n + kPiece - 1) / kPiece, 1, [&](int64_t b, int64_t e, int) {
      std::memset(p_ + b * kPiece, 0, sizeof(float) * (size_t)(std::min(n, e * kPiece) - b * kPiece));
    });
  } else {
    std::memset(p_, 0, bytes_);
  }
  ready_.store(!hand_back_pages);
}

float* TrainModelImpl::NewGrad(int64_t n) {
  grads_.emplace_back(n);
  grad_buffers_[grads_.back().data()] = &grads_.back();
  return grads_.back().data();
}

// madvise over the whole 4 KiB pages inside [p, p + n) (none if the buffer spans no whole page).
// Returns the bytes advised (0 if madvise failed).
static int64_t AdviseWholePages(float* p, int64_t n, int advice) {
  const uintptr_t page = 4096, b = ((uintptr_t)p + page - 1) & ~(page - 1), e = ((uintptr_t)(p + n)) & ~(page - 1);
  return e > b && madvise((void*)b, e - b, advice) == 0 ? (int64_t)(e - b) : 0;
}

// Makes a gradient's whole pages resident and writable before a kernel read-modify-writes it. After
// GradBuffer::Zero a page's first read maps the shared zero page, and the write that follows copies
// it and flushes that TLB entry on every CPU running the process: one inter-processor interrupt per
// 4 KiB with 2 threads (full-f32 at 2 threads ran 25% slower for it). Populating for writing first
// is one pass with no flushes; the pages are the ones the kernel is about to write, so the memory
// plan's progressive paging of gradients is unchanged. Kernels without MADV_POPULATE_WRITE (before
// 5.14, EINVAL) keep the old behaviour.
#ifndef MADV_POPULATE_WRITE
constexpr int MADV_POPULATE_WRITE = 23;
#endif

void GradBuffer::ReadyToWrite() {
  if (ready_.exchange(true)) return;
  AdviseWholePages(p_, (int64_t)(bytes_ / sizeof(float)), MADV_POPULATE_WRITE);
}

void RowGroupWorker::ReadyToWrite(const float* grad) { grad_buffers_.at(grad)->ReadyToWrite(); }

// Hands a buffer's whole pages back to the OS (anonymous memory: they read as zero next time);
// for saved activations whose backward is done, rewritten by the next forward.
static void DropPages(float* p, int64_t n) { AdviseWholePages(p, n, MADV_DONTNEED); }
template <class T>
static void DropPages(std::vector<T>& v) {
  if (!v.empty()) AdviseWholePages((float*)v.data(), (int64_t)(v.size() * sizeof(T) / sizeof(float)), MADV_DONTNEED);
}
// Brings a dropped buffer's pages back in one call before its kernels write it: page by page, the faults inside
// the kernels cost ~10x more here (a 2-vCPU VM: ~0.3 s of a full-bf16 step for the block scratch).
template <class T>
static void PopulatePages(std::vector<T>& v) {
  if (!v.empty())
    AdviseWholePages((float*)v.data(), (int64_t)(v.size() * sizeof(T) / sizeof(float)), MADV_POPULATE_WRITE);
}

void TrainModelImpl::AddParam(const std::string& name, std::vector<int64_t> shape, float* data, float* grad,
                              bool decay) {
  TrainableTensor t;
  t.name = name;
  t.n = 1;
  for (int64_t d : shape) t.n *= d;
  t.shape = std::move(shape);
  t.data = data;
  t.grad = grad;
  t.decay = decay;
  trainable_count_ += t.n;
  params_.push_back(std::move(t));
}

float* TrainModelImpl::MasterCopy(const Tensor& t) {
  float* m = NewBuffer(t.numel());
  if (t.ndim() == 2) {
    const int64_t rows = t.shape[0], cols = t.shape[1];
    Par(rows, 64, [&](int64_t b, int64_t e, int) { kernels::DequantizeRows(t, b, e - b, m + b * cols); });
  } else {
    LATHE_CHECK(t.dtype == DType::kF32);
    std::memcpy(m, t.data, t.numel() * sizeof(float));
  }
  return m;
}

float* TrainModelImpl::MasterOf(const Tensor& t) {
  if (in_place_ && t.dtype == DType::kF32 && !InReadOnlyFileMapping(t.data, t.nbytes())) {
    base_released_ += t.nbytes();
    in_place_bytes_ += t.nbytes();
    return const_cast<float*>(t.as<float>());  // CreateInPlace: the caller handed the weights over
  }
  float* m = MasterCopy(t);
  base_released_ += (int64_t)DropFilePages(t.data, t.nbytes());
  return m;
}

void TrainModelImpl::FrozenCopy(Lin& L) {
  const size_t bytes = L.base.nbytes();
  const bool file = InReadOnlyFileMapping(L.base.data, bytes);
  // In place: the caller handed the weights over; LoRA never reads a frozen base again (freeze saves its
  // frozen layers from the base, so only a file mapping, re-read on access, may go there).
  if (!file && !(in_place_ && opt_.method == FinetuneMethod::kLora)) return;
  const float* src = L.base.as<float>();
  const int64_t n = L.out * L.in;
  L.w16.resize(n);
  Par(n, 1 << 14, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) L.w16[i] = F32ToBF16(src[i]);
  });
  if (file) {
    base_released_ += (int64_t)DropFilePages(L.base.data, bytes);
  } else {
    base_released_ += AdviseWholePages(const_cast<float*>(src), n, MADV_DONTNEED);
  }
}

static Tensor F32View(const float* p, std::vector<int64_t> shape) {
  Tensor t;
  t.data = p;
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  return t;
}

static Tensor Bf16View(const std::vector<uint16_t>& v, std::vector<int64_t> shape, bool f16 = false) {
  Tensor t;
  t.data = v.data();
  t.dtype = f16 ? DType::kF16 : DType::kBF16;
  t.shape = std::move(shape);
  return t;
}

// bf16 mode rounds trainable weights (shadow copies refreshed every call) and activations; frozen
// weights are read as stored (a bf16 checkpoint already is bf16) so they are never copied. On the bf16 dot
// product the decoder linears and LoRA's products round W as they pack it (RNE, F32ToBF16's bits), so their
// trainable weights need no shadow: the kernels read the f32 masters (LinearShadows).
void TrainModelImpl::SetEff(Lin& L) {
  const bool shadow = LinearShadows(opt_.bf16, opt_.fp16);
  if (L.master) {
    L.eff = F32View(L.master, {L.out, L.in});
    if (shadow) {
      L.w16.resize(L.out * L.in);
      L.eff = Bf16View(L.w16, {L.out, L.in}, opt_.fp16);
    }
  } else if (!L.w16.empty()) {
    L.eff = Bf16View(L.w16, {L.out, L.in});  // a frozen f32 linear's bf16 copy (FrozenLinearsAsBf16)
  } else {
    L.eff = L.base;
  }
  if (L.lora.on) {
    LoraParam& p = L.lora;
    p.a_eff = F32View(p.a, {p.r, p.in});
    p.b_eff = F32View(p.b, {p.out, p.r});
    if (shadow) {
      p.a16.resize(p.r * p.in);
      p.b16.resize(p.out * p.r);
      p.a_eff = Bf16View(p.a16, {p.r, p.in}, opt_.fp16);
      p.b_eff = Bf16View(p.b16, {p.out, p.r}, opt_.fp16);
    }
  }
}

Status TrainModelImpl::Init() {
  const ModelConfig& c = c_;
  if (c.n_layers <= 0 || c.dim <= 0 || c.vocab_size <= 0) return Status::Error("TrainModel: empty model config");
  if (c.rope_dim != c.head_dim) {
    return Status::Error(StrFormat("TrainModel: partial rotary embeddings (rope_dim %lld != head_dim %lld) are not "
                                   "supported", (long long)c.rope_dim, (long long)c.head_dim));
  }
  if ((int64_t)base_.layers.size() != c.n_layers) return Status::Error("TrainModel: layer count mismatch");
  const bool lora = opt_.method == FinetuneMethod::kLora;
  if (lora) {
    if (opt_.lora_rank < 1) return Status::Error(StrFormat("lora_rank: must be >= 1, got %lld", (long long)opt_.lora_rank));
    if (!(opt_.lora_alpha > 0)) return Status::Error("lora_alpha: must be > 0");
    if (!(opt_.lora_dropout >= 0 && opt_.lora_dropout < 1)) return Status::Error("lora_dropout: must be in [0, 1)");
    if (opt_.lora_targets.empty()) return Status::Error("lora_target: no target modules");
    for (LoraModule m : opt_.lora_targets) {
      if ((int)m < 0 || (int)m >= kMods) return Status::Error("lora_target: unknown module");
    }
  }
  if (opt_.method == FinetuneMethod::kFreeze &&
      (opt_.freeze_trainable_layers < 1 || opt_.freeze_trainable_layers > c.n_layers)) {
    return Status::Error(StrFormat("freeze_trainable_layers: must be in [1, %lld] for this model, got %lld",
                                   (long long)c.n_layers, (long long)opt_.freeze_trainable_layers));
  }
  if (opt_.loss_chunk_tokens < 1) return Status::Error("loss_chunk_tokens: must be >= 1");
  if (opt_.row_group_tokens < 0) return Status::Error("row_group_tokens: must be >= 0 (0 = the whole micro-batch)");
  const bool full = opt_.method == FinetuneMethod::kFull;
  const float lora_scale = (float)(opt_.use_rslora ? opt_.lora_alpha / std::sqrt((double)opt_.lora_rank)
                                                   : opt_.lora_alpha / (double)opt_.lora_rank);
  std::mt19937_64 rng(opt_.seed);

  // Embedding (first in HF's parameter order).
  embed_trainable_ = full;
  if (full) {
    embed_master_ = MasterOf(base_.tok_embd);
    g_embed_ = NewGrad(base_.tok_embd.numel());
    AddParam("model.embed_tokens.weight", {c.vocab_size, c.dim}, embed_master_, g_embed_, true);
    embed_eff_ = F32View(embed_master_, {c.vocab_size, c.dim});
  } else {
    embed_eff_ = base_.tok_embd;
  }

  for (const LayerWeights& W : base_.layers)
    for (const Tensor* t : {&W.wq, &W.wk, &W.wv, &W.wo, &W.w_gate, &W.w_up, &W.w_down})
      quantized_base_ = quantized_base_ || IsPackedQuant(t->dtype);
  layers_.resize(c.n_layers);
  lowest_trainable_layer_ = c.n_layers;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& W = base_.layers[l];
    Layer& Ly = layers_[l];
    const bool train_all = full || (opt_.method == FinetuneMethod::kFreeze && l >= c.n_layers - opt_.freeze_trainable_layers);
    const Tensor* ws[kMods] = {&W.wq, &W.wk, &W.wv, &W.wo, &W.w_gate, &W.w_up, &W.w_down};
    const Tensor* bs[kMods] = {&W.bq, &W.bk, &W.bv, &W.bo, nullptr, nullptr, nullptr};
    std::string pre = StrFormat("model.layers.%lld.", (long long)l);
    for (int m = 0; m < kMods; ++m) {
      Lin& L = Ly.lin[m];
      L.base = *ws[m];
      L.out = L.base.shape[0];
      L.in = L.base.shape[1];
      std::string key = pre + (IsAttn(m) ? "self_attn." : "mlp.") + kModNames[m];
      if (train_all) {
        L.master = MasterOf(L.base);
        L.grad = NewGrad(L.out * L.in);
        AddParam(key + ".weight", {L.out, L.in}, L.master, L.grad, true);
      }
      if (bs[m] && bs[m]->data) {
        if (train_all) {
          float* bm = MasterOf(*bs[m]);
          L.bias = bm;
          L.gbias = NewGrad(L.out);
          AddParam(key + ".bias", {L.out}, bm, L.gbias, false);
        } else {
          L.bias = bs[m]->as<float>();
        }
      }
      if (lora && std::find(opt_.lora_targets.begin(), opt_.lora_targets.end(), (LoraModule)m) != opt_.lora_targets.end()) {
        LoraParam& p = L.lora;
        p.on = true;
        p.r = opt_.lora_rank;
        p.in = L.in;
        p.out = L.out;
        p.scale = lora_scale;
        p.a = NewBuffer(p.r * p.in);
        p.b = NewBuffer(p.out * p.r);
        p.ga = NewGrad(p.r * p.in);
        p.gb = NewGrad(p.out * p.r);
        // PEFT: kaiming_uniform_(a=sqrt(5)) on A (r, in) = U(-1/sqrt(in), 1/sqrt(in)); B = 0.
        const double bound = 1.0 / std::sqrt((double)p.in);
        for (int64_t i = 0; i < p.r * p.in; ++i) {
          double u = (double)(rng() >> 11) * (1.0 / 9007199254740992.0);
          p.a[i] = (float)((2 * u - 1) * bound);
        }
        std::string pk = "base_model.model." + key;
        AddParam(pk + ".lora_A.weight", {p.r, p.in}, p.a, p.ga, true);
        AddParam(pk + ".lora_B.weight", {p.out, p.r}, p.b, p.gb, true);
      }
      if (!L.master && FrozenLinearsAsBf16(opt_.bf16 && UsesBf16Dot(), L.base.dtype, quantized_base_)) FrozenCopy(L);
      SetEff(L);
      if (L.master || L.lora.on) Ly.trainable = true;
    }
    // A norm weight: its f32 master and gradient when the layer trains, else read as loaded.
    const auto norm = [&](const Tensor& t, int64_t n, const std::string& name) -> Norm {
      if (!train_all) return {t.as<float>(), nullptr};
      float *master = MasterOf(t), *grad = NewGrad(n);
      AddParam(pre + name, {n}, master, grad, false);
      return {master, grad};
    };
    Ly.n1 = norm(W.attn_norm, c.dim, "input_layernorm.weight");
    Ly.n2 = norm(W.ffn_norm, c.dim, "post_attention_layernorm.weight");
    if (c.qk_norm) {  // qwen3
      Ly.qn = norm(W.q_norm, c.head_dim, "self_attn.q_norm.weight");
      Ly.kn = norm(W.k_norm, c.head_dim, "self_attn.k_norm.weight");
    }
    if (Ly.trainable) lowest_trainable_layer_ = std::min(lowest_trainable_layer_, l);
  }
  if (full) {
    float* fn = MasterOf(base_.output_norm);
    final_norm_ = {fn, NewGrad(c.dim)};
    AddParam("model.norm.weight", {c.dim}, fn, final_norm_.g, false);
    if (c.tied_embeddings) {
      head_master_ = embed_master_;
      g_head_ = g_embed_;
    } else {
      head_master_ = MasterOf(base_.output);
      g_head_ = NewGrad(base_.output.numel());
      AddParam("lm_head.weight", {c.vocab_size, c.dim}, head_master_, g_head_, true);
    }
    head_eff_ = F32View(head_master_, {c.vocab_size, c.dim});
    // On the bf16 dot product the loss rounds the f32 masters' rows as it reads them (the bits of a bf16 shadow).
    if (TrainedHeadShadow(opt_.bf16, opt_.fp16, c.dim)) {
      head16_.resize(c.vocab_size * c.dim);
      head_eff_ = Bf16View(head16_, {c.vocab_size, c.dim}, opt_.fp16);
    }
  } else {
    final_norm_ = {base_.output_norm.as<float>(), nullptr};
    head_eff_ = base_.output;
  }
  if (full) lowest_trainable_layer_ = 0;

  // RoPE angles per position, as Transformer::EnsureRopeTable.
  inv_freq_ = RopeInvFreq(c, base_.rope_freqs.data ? base_.rope_freqs.as<float>() : nullptr);
  const int64_t half = (int64_t)inv_freq_.size();
  pos_cos_.resize(c.max_seq_len * half);
  pos_sin_.resize(c.max_seq_len * half);
  RopeCosSinRows(inv_freq_, RopeCosSinScale(c), 0, c.max_seq_len, pos_cos_.data(), pos_sin_.data());
  if (FrozenHeadAsBf16(opt_.bf16 && UsesBf16Dot(), full, head_eff_.dtype, c.dim, quantized_base_)) {
    // bf16 mode with a frozen head stored in another dtype (f32, f16, a GGUF block type): the loss takes it as
    // bf16, as autocast casts a model loaded in bf16, so its logits and dx run on vdpbf16ps like a bf16 head's
    // (a copy plus its pairs, the bytes of the f32 pack it replaces).
    head16_.resize(c.vocab_size * c.dim);
    if (head_eff_.dtype == DType::kF32) {
      const float* src = head_eff_.as<float>();
      Par(c.vocab_size * c.dim, 4096, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) head16_[i] = F32ToBF16(src[i]);
      });
    } else {  // f16 or a block type (a GGUF head): dequantized rows, rounded as the pair packers round them
      const Tensor src = head_eff_;
      Par(c.vocab_size, 64, [&](int64_t b, int64_t e, int) {
        std::vector<float> rows((e - b) * c.dim);
        kernels::DequantizeRows(src, b, e - b, rows.data());
        for (int64_t i = 0; i < (e - b) * c.dim; ++i) head16_[b * c.dim + i] = F32ToBF16(rows[i]);
      });
    }
    // The head as stored is read again only for embedding rows (tied) or not at all: from a read-only file
    // mapping its pages go back (re-read on access); other memory stays (the embedding may read it).
    if (InReadOnlyFileMapping(head_eff_.data, head_eff_.nbytes()))
      base_released_ += (int64_t)DropFilePages(head_eff_.data, head_eff_.nbytes());
    head_eff_ = Bf16View(head16_, {c.vocab_size, c.dim}, false);
  }
  if (opt_.row_group_workers < 0) return Status::Error("row_group_workers: must be >= 0 (0 = one per pool thread)");
  for (const TrainableTensor& t : params_) order_.Register(t.grad);
  workers_.push_back(std::make_unique<RowGroupWorker>(*this, pool_));
  return Status::Ok();
}

void GradOrder::Register(const float* grad) {
  if (grad && !turns_.count(grad)) turns_.emplace(grad, std::make_unique<std::atomic<int64_t>>(0));
}

void GradOrder::Start(bool on) {
  on_ = on;
  for (auto& [g, t] : turns_) t->store(0, std::memory_order_relaxed);
}

void GradOrder::Pass(std::atomic<int64_t>& t, int64_t group) {
  int64_t v = t.load(std::memory_order_relaxed);
  while (v < group + 1 && !t.compare_exchange_weak(v, group + 1, std::memory_order_release)) {
  }
  t.notify_all();
}

void GradOrder::Finish(int64_t group) {
  if (!on_) return;
  // A tensor this group added into is past it already; one it skipped waits for the earlier groups
  // (so a later group never adds next to an earlier one).
  for (auto& [g, t] : turns_) {
    for (int64_t v = t->load(std::memory_order_acquire); v < group; v = t->load(std::memory_order_acquire))
      t->wait(v, std::memory_order_acquire);
    Pass(*t, group);
  }
}

RowGroupWorker::RowGroupWorker(TrainModelImpl& m, ThreadPool& shared_pool)
    : c_(m.c_), opt_(m.opt_), layers_(m.layers_), embed_eff_(m.embed_eff_), head_eff_(m.head_eff_),
      embed_master_(m.embed_master_), g_embed_(m.g_embed_), g_head_(m.g_head_), final_norm_(m.final_norm_),
      lowest_trainable_layer_(m.lowest_trainable_layer_), embed_trainable_(m.embed_trainable_),
      pos_cos_(m.pos_cos_), pos_sin_(m.pos_sin_), step_(m.step_), head_packed_(m.head_packed_use_),
      order_(m.order_), grad_buffers_(m.grad_buffers_), embed_rows_(m.embed_rows_), shared_pool_(shared_pool),
      pool_(&shared_pool) {
  // Layers below the lowest trainable one have no backward: their forward borrows set 0, which
  // that layer's own forward then overwrites.
  acts_.resize(opt_.gradient_checkpointing ? 1 : std::max<int64_t>(c_.n_layers - lowest_trainable_layer_, 1));
  normdw_.resize((size_t)kNormGradParts * std::max(c_.dim, c_.head_dim));
  bf16dot_ = opt_.bf16 && UsesBf16Dot();
  keep16_ = ActivationsAsBf16(bf16dot_);
  recompute_xmid_ =
      RecomputesMidResidual(bf16dot_, opt_.method == FinetuneMethod::kLora, opt_.gradient_checkpointing);
}

RowGroupWorker::Work RowGroupWorker::WorkOf(Acts& a) {
  if (keep16_) return {wq_.data(), wk_.data(), wv_.data(), watt_.data(), wgate_.data(), wup_.data()};
  return {a.q.data(), a.k.data(), a.v.data(), a.att.data(), a.gate.data(), a.up.data()};
}

// dst = bf16(src), and src = dst's values too where round_src (one pass, chunk by chunk while it is in cache).
void RowGroupWorker::Keep16(std::vector<uint16_t>& dst, float* src, int64_t n, bool round_src) {
  ScopedOp op(opt_.profiler, "acts_to_bf16", 0, (round_src ? 12.0 : 6.0) * n);
  Par(n, 8192, [&](int64_t b, int64_t e, int) {
    kernels::ToBf16(dst.data() + b, src + b, e - b);
    if (round_src) kernels::FromBf16(src + b, dst.data() + b, e - b);
  });
}

void RowGroupWorker::Restore16(float* dst, const std::vector<uint16_t>& src) {
  ScopedOp op(opt_.profiler, "acts_from_bf16", 0, 6.0 * (double)src.size());
  Par((int64_t)src.size(), 8192, [&](int64_t b, int64_t e, int) { kernels::FromBf16(dst + b, src.data() + b, e - b); });
}

void RowGroupWorker::UsePrivateGrads() {
  if (private_grads_.empty()) {
    int64_t n = 0;
    for (const Layer& Ly : layers_)
      for (const Lin& L : Ly.lin)
        if (L.lora.on) n += L.lora.r * (L.lora.in + L.lora.out);
    grads_store_.resize(n);
    private_grads_.assign(layers_.size() * kMods, {nullptr, nullptr});
    float* p = grads_store_.data();
    for (size_t l = 0; l < layers_.size(); ++l)
      for (int m = 0; m < kMods; ++m) {
        const LoraParam& lp = layers_[l].lin[m].lora;
        if (!lp.on) continue;
        private_grads_[l * kMods + m] = {p, p + lp.r * lp.in};
        p += lp.r * (lp.in + lp.out);
      }
  }
  std::fill(grads_store_.begin(), grads_store_.end(), 0.0f);
}

void RowGroupWorker::AddGradsTo(ThreadPool& pool) {
  for (size_t l = 0; l < layers_.size(); ++l)
    for (int m = 0; m < kMods; ++m) {
      const LoraParam& lp = layers_[l].lin[m].lora;
      if (!lp.on) continue;
      for (int ab = 0; ab < 2; ++ab) {
        float* dst = ab == 0 ? lp.ga : lp.gb;
        const float* src = private_grads_[l * kMods + m][ab];
        pool.ParallelFor(lp.r * (ab == 0 ? lp.in : lp.out), 16384,
                         [&](int64_t b, int64_t e, int) { kernels::Axpy(dst + b, 1.0f, src + b, e - b); });
      }
    }
}

void TrainModelImpl::ZeroGrad(bool hand_back_pages) {
  for (GradBuffer& g : grads_) g.Zero(hand_back_pages, &pool_);
}

Status TrainModelImpl::CheckBatch(const TrainBatch& b) const {
  if (b.B < 1 || b.T < 1) return Status::Error(StrFormat("batch: B and T must be >= 1 (got %lld, %lld)", (long long)b.B, (long long)b.T));
  if (b.T > c_.max_seq_len) {
    return Status::Error(StrFormat("batch: sequence length %lld exceeds the model's max_seq_len %lld", (long long)b.T,
                                   (long long)c_.max_seq_len));
  }
  const size_t n = (size_t)(b.B * b.T);
  if (b.input_ids.size() != n || b.labels.size() != n || (!b.segment_ids.empty() && b.segment_ids.size() != n)) {
    return Status::Error(StrFormat("batch: input_ids/labels/segment_ids must hold B*T = %zu values", n));
  }
  for (size_t i = 0; i < n; ++i) {
    int32_t id = b.input_ids[i], lb = b.labels[i];
    if (id < 0 || id >= c_.vocab_size) {
      return Status::Error(StrFormat("batch: input_ids[%zu] = %d out of range (vocab size %lld)", i, id, (long long)c_.vocab_size));
    }
    if (lb != kernels::kIgnoreLabel && (lb < 0 || lb >= c_.vocab_size)) {
      return Status::Error(StrFormat("batch: labels[%zu] = %d out of range (vocab size %lld, -100 = ignored)", i, lb,
                                     (long long)c_.vocab_size));
    }
  }
  return Status::Ok();
}

void TrainModelImpl::RefreshBf16() {
  if (!opt_.bf16 && !opt_.fp16) return;
  auto round = [&](const float* src, uint16_t* dst, int64_t n) {
    Par(n, 4096, [&](int64_t b, int64_t e, int) {
      if (opt_.fp16) {
        for (int64_t i = b; i < e; ++i) dst[i] = F32ToF16(src[i]);
        return;
      }
      for (int64_t i = b; i < e; ++i) dst[i] = F32ToBF16(src[i]);
    });
  };
  if (LinearShadows(opt_.bf16, opt_.fp16)) {
    for (Layer& Ly : layers_)
      for (Lin& L : Ly.lin) {
        if (L.master) round(L.master, L.w16.data(), L.out * L.in);
        if (L.lora.on) {
          round(L.lora.a, L.lora.a16.data(), L.lora.r * L.lora.in);
          round(L.lora.b, L.lora.b16.data(), L.lora.out * L.lora.r);
        }
      }
  }
  if (head_master_ && !head16_.empty()) round(head_master_, head16_.data(), c_.vocab_size * c_.dim);
}

void RowGroupWorker::Prepare(const TrainBatch& b, int64_t row0) {
  const ModelConfig& c = c_;
  B_ = b.B;
  T_ = b.T;
  N_ = B_ * T_;
  tok0_ = row0 * T_;
  ids_ = b.input_ids.data();
  seg_ = b.segment_ids.empty() ? nullptr : b.segment_ids.data();
  const int64_t N = N_, half = c.head_dim / 2;
  targets_.resize(N);
  cos_.resize(N * half);
  sin_.resize(N * half);
  for (int64_t r = 0; r < B_; ++r) {
    int64_t start = 0;
    for (int64_t t = 0; t < T_; ++t) {
      const int64_t i = r * T_ + t;
      if (seg_ && t > 0 && seg_[i] != seg_[i - 1]) start = t;
      const int64_t pos = t - start;
      std::memcpy(&cos_[i * half], &pos_cos_[pos * half], half * sizeof(float));
      std::memcpy(&sin_[i * half], &pos_sin_[pos * half], half * sizeof(float));
      // Token t predicts labels[t + 1], never across a row end or a segment boundary.
      bool ok = t + 1 < T_ && (!seg_ || seg_[i + 1] == seg_[i]);
      targets_[i] = ok ? b.labels[i + 1] : kernels::kIgnoreLabel;
    }
  }
  const int64_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), ffn = c.ffn_dim;
  res_.resize((c.n_layers + 1) * N * dim);
  if (keep16_) {
    for (auto [w, n] : {std::pair{&wq_, qd}, {&wk_, kvd}, {&wv_, kvd}, {&watt_, qd}, {&wgate_, ffn}, {&wup_, ffn}})
      w->resize(N * n);
  }
  for (Acts& a : acts_) {
    a.rstd1.resize(N);
    a.lse.resize(N * c.n_heads);
    if (!recompute_xmid_) a.xmid.resize(N * dim);
    a.rstd2.resize(N);
    // q, k, v, att, gate, up: as bf16 (keep16_) or f32.
    const auto size6 = [&](auto& q, auto& k, auto& v, auto& att, auto& gate, auto& up) {
      q.resize(N * qd), k.resize(N * kvd), v.resize(N * kvd), att.resize(N * qd), gate.resize(N * ffn), up.resize(N * ffn);
    };
    if (keep16_) {
      size6(a.q16, a.k16, a.v16, a.att16, a.gate16, a.up16);
    } else {
      size6(a.q, a.k, a.v, a.att, a.gate, a.up);
    }
    if (opt_.method == FinetuneMethod::kLora)
      for (auto& mid : a.mid) mid.resize(N * opt_.lora_rank);
    if (c.qk_norm) {
      a.qraw.resize(N * qd);
      a.kraw.resize(N * kvd);
      a.rstdq.resize(N * c.n_heads);
      a.rstdk.resize(N * c.n_kv_heads);
    }
  }
  if (recompute_xmid_) xmid_.resize(N * dim);
  xf_.resize(N * dim);
  rstdf_.resize(N);
  xn_.resize(N * dim);
  h_.resize(N * ffn);
}

const float* RowGroupWorker::Round(const float* x, int64_t n, std::vector<float>& s) {
  if (!opt_.bf16 && !opt_.fp16) return x;
  s.resize(n);
  float* o = s.data();
  Par(n, 16384, [&](int64_t b, int64_t e, int) {
    if (opt_.fp16) {  // round to nearest even, |x| > 65504 -> inf
      for (int64_t i = b; i < e; ++i) o[i] = F16ToF32(F32ToF16(x[i]));
      return;
    }
    kernels::RoundToBf16(o + b, x + b, e - b);
  });
  return o;
}

// PEFT's nn.Dropout on the LoRA input: inverted dropout, a fresh mask per call of ForwardBackward
// (step_), layer and module. The mask is a hash of the element's index in the whole micro-batch
// (tok0_ offsets a row group's), so the backward, a checkpointed recompute and any row grouping
// see the same mask without storing it.
const float* RowGroupWorker::Dropped(const float* x, int64_t in, int64_t layer, int mod, std::vector<float>& s) {
  const double p = opt_.lora_dropout;
  if (s.capacity() < (size_t)(N_ * in)) {
    // Room for the widest LoRA input at once: grown module by module (o's q_dim, then down's ffn) the vector would
    // double past it, and the memory plan counts N x the widest input.
    int64_t widest = in;
    for (const Layer& Ly : layers_)
      for (const Lin& L : Ly.lin)
        if (L.lora.on) widest = std::max(widest, L.in);
    s.reserve(N_ * widest);
  }
  s.resize(N_ * in);
  float* o = s.data();
  const uint64_t key = SplitMix(SplitMix(opt_.seed ^ 0x6c6f7261ull) ^ (step_ * 1315423911ull) ^ ((uint64_t)layer << 40) ^
                                ((uint64_t)mod << 56));
  const uint64_t thresh = (uint64_t)(p * 18446744073709551616.0);
  const float keep_scale = (float)(1.0 / (1.0 - p));
  Par(N_, 16, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b * in; i < e * in; ++i)
      o[i] = SplitMix(key + (uint64_t)(tok0_ * in + i)) < thresh ? 0.0f : x[i] * keep_scale;
  });
  return o;
}

void RowGroupWorker::RmsFwd(float* out, float* rstd, const float* x, const float* w, int64_t rows, int64_t C) {
  ScopedOp op(opt_.profiler, "rmsnorm_fwd", 3.0 * rows * C, 8.0 * rows * C);
  Par(rows, 16, [&](int64_t b, int64_t e, int) {
    kernels::RmsNormForward(out + b * C, rstd + b, x + b * C, w, e - b, C, c_.norm_eps);
  });
}

void RowGroupWorker::RmsBwd(float* dx, float* dw, const float* dout, const float* x, const float* w,
                            const float* rstd, int64_t rows, int64_t C) {
  ScopedOp op(opt_.profiler, "rmsnorm_bwd", 6.0 * rows * C, 12.0 * rows * C);
  // One dw row per chunk (also a throwaway target when the norm is frozen), summed in chunk order:
  // the pool hands chunks to whichever thread claims them, so rows keyed by thread index would
  // make dw depend on the schedule, and a chunk count that followed the threads would make it
  // depend on the thread count (full / freeze runs would not resume bit-identically on another).
  const int64_t grain = (rows + kNormGradParts - 1) / kNormGradParts, parts = (rows + grain - 1) / grain;
  std::fill(normdw_.begin(), normdw_.begin() + parts * C, 0.0f);
  Par(rows, grain, [&](int64_t b, int64_t e, int) {
    float* tdw = &normdw_[b / grain * C];
    kernels::RmsNormBackward(dx + b * C, tdw, dout + b * C, x + b * C, w, rstd + b, e - b, C);
  });
  if (dw) {
    order_.Add(dw, group_, [&] {
      for (int64_t p = 0; p < parts; ++p)
        for (int64_t i = 0; i < C; ++i) dw[i] += normdw_[p * C + i];
    });
  }
}

void RowGroupWorker::LinForward(const Lin& L, const float* x, float* y, float* mid, int64_t layer, int mod, bool train) {
  const int64_t N = N_;
  ScopedOp op(opt_.profiler, "linear_fwd", 2.0 * N * L.in * L.out,
              (double)L.eff.nbytes() + 4.0 * N * (L.in + L.out),
              opt_.profiler ? StrFormat("[%lld, %lld] x [%lld, %lld] %s", (long long)N, (long long)L.in,
                                        (long long)L.out, (long long)L.in, DTypeName(L.eff.dtype))
                            : std::string());
  if (LoraFused(L)) {
    // LoRA's update inside the base product: y = [x | scale mid] . [W | B]^T, one pass over y.
    const LoraParam& p = L.lora;
    if (train && opt_.lora_dropout > 0) {
      Forward(mid, Dropped(x, L.in, layer, mod, xd_), p.a_eff, false);  // (N, r)
      kernels::LinearForwardBf16Plus(*pool_, y, x, N, L.eff, ScaledMid(p, mid), p.b_eff);
    } else {  // mid = x A^T on the same pairs of x
      kernels::LoraForwardBf16(*pool_, y, mid, x, N, L.eff, p.a_eff, p.b_eff,
                               [&](float* m) { return ScaledMid(p, m); });
    }
    if (L.bias) {
      Par(N, 16, [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r) kernels::Axpy(y + r * L.out, 1.0f, L.bias, L.out);
      });
    }
    return;
  }
  // The bf16 kernels round their operands as they pack them (the same bits as rounding first): x is rounded
  // here only for a product that takes it as given.
  const float* xr = Bf16Dot() ? x : Round(x, N * L.in, rx_);
  if (LoraPlusForward(L)) {
    // f32 mode: mid = drop(x) A^T first, then y = [x | scale mid] . [W | B]^T in one product (one pass over y).
    const LoraParam& p = L.lora;
    const float* xd = train && opt_.lora_dropout > 0 ? Dropped(x, L.in, layer, mod, xd_) : x;
    Forward(mid, xd == x ? xr : Round(xd, N * p.in, rx2_), p.a_eff, false);  // (N, r)
    kernels::LinearForwardPlus(*pool_, y, xr, N, L.eff, ScaledMid(p, mid), p.b_eff);
    if (L.bias) {
      Par(N, 16, [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r) kernels::Axpy(y + r * L.out, 1.0f, L.bias, L.out);
      });
    }
    return;
  }
  Forward(y, xr, L.eff, false);
  if (L.bias) {
    Par(N, 16, [&](int64_t b, int64_t e, int) {
      for (int64_t r = b; r < e; ++r) kernels::Axpy(y + r * L.out, 1.0f, L.bias, L.out);
    });
  }
  if (!L.lora.on) return;
  const LoraParam& p = L.lora;
  const float* xd = train && opt_.lora_dropout > 0 ? Dropped(x, L.in, layer, mod, xd_) : x;
  // Without dropout the A input is x itself: reuse its rounding (rx_ still holds it).
  Forward(mid, xd == x ? xr : Bf16Dot() ? xd : Round(xd, N * p.in, rx2_), p.a_eff, false);  // (N, r)
  // y += (scale * mid) B^T straight into y: the scale on the rank-r side (as in the backward), no
  // (N, out) product buffer and no pass over y to add it.
  Forward(y, ScaledMid(p, mid), p.b_eff, /*accumulate=*/true);  // (N, out)
}

// One product of a linear or of its LoRA pair: on vdpbf16ps in bf16 mode where Bf16Dot() holds (the kernels
// round their operands as they pack them), else the training GEMM.
void RowGroupWorker::Forward(float* y, const float* x, const Tensor& w, bool accumulate) {
  if (Bf16Dot()) {
    kernels::LinearForwardBf16(*pool_, y, x, N_, w, accumulate);
  } else {
    kernels::LinearForward(*pool_, y, x, N_, w, accumulate);
  }
}

void RowGroupWorker::InputGrad(float* dx, const float* dy, const Tensor& w, bool accumulate) {
  if (Bf16Dot()) {
    kernels::MatMulBackwardInputBf16(*pool_, dx, dy, N_, w, accumulate);
  } else {
    kernels::MatMulBackwardInput(*pool_, dx, dy, N_, w, accumulate);
  }
}

// dw (w's shape) += dy^T x.
void RowGroupWorker::WeightGrad(float* dw, const float* dy, const float* x, const Tensor& w) {
  if (Bf16Dot()) {
    kernels::MatMulBackwardWeightBf16(*pool_, dw, dy, x, N_, w.shape[0], w.shape[1]);
  } else {
    kernels::MatMulBackwardWeight(*pool_, dw, dy, x, N_, w.shape[0], w.shape[1]);
  }
}

const float* RowGroupWorker::ScaledMid(const LoraParam& p, const float* mid) {
  const int64_t N = N_;
  const float* mr = Round(mid, N * p.r, rmid_);
  lscr_.resize(N * p.r);
  float* smid = lscr_.data();
  Par(N, 64, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b * p.r; i < e * p.r; ++i) smid[i] = p.scale * mr[i];
  });
  return smid;
}

void RowGroupWorker::LinBackward(const Lin& L, const float* dy, const float* x, const float* mid, float* dx, bool accumulate,
                                 bool need_dx, int64_t layer, int mod) {
  const int64_t N = N_;
  ScopedOp op(opt_.profiler, "linear_bwd",
              ((need_dx ? 2.0 : 0.0) + (L.grad ? 2.0 : 0.0)) * N * L.in * L.out,
              (double)L.eff.nbytes() + 4.0 * N * (L.in + 2 * L.out),
              opt_.profiler ? StrFormat("[%lld, %lld] x [%lld, %lld]", (long long)N, (long long)L.out,
                                        (long long)L.out, (long long)L.in)
                            : std::string());
  const bool bf16dot = Bf16Dot();
  const float* dyr = bf16dot ? dy : Round(dy, N * L.out, rdy_);
  // LoRA's input gradient inside the base product (without dropout): dx = [dy | dmid] . [W ; A] below.
  const bool fused_dx = need_dx && LoraFused(L) && opt_.lora_dropout <= 0;
  // f32 mode: dx = [dy | dmid] . [W ; A] in one product after dmid (below).
  const bool plus_dx = need_dx && LoraPlusInputGrad(L);
  if (need_dx && !fused_dx && !plus_dx) InputGrad(dx, dyr, L.eff, accumulate);
  if (L.grad) {
    const float* xr = bf16dot ? x : Round(x, N * L.in, rx_);
    order_.Add(L.grad, group_, [&] {
      ReadyToWrite(L.grad);
      WeightGrad(L.grad, dyr, xr, L.eff);
    });
  }
  if (L.gbias) {
    order_.Add(L.gbias, group_, [&] {
      Par(L.out, 64, [&](int64_t b, int64_t e, int) {
        for (int64_t r = 0; r < N; ++r)
          for (int64_t j = b; j < e; ++j) L.gbias[j] += dy[r * L.out + j];
      });
    });
  }
  if (!L.lora.on) return;
  const LoraParam& p = L.lora;
  // out = scale * mid B^T, mid = drop(x) A^T: gB += dy^T (scale mid), dmid = scale (dy B); the scale
  // goes on the rank-r side (N x r floats) instead of a pass over dy (N x out).
  const float* smid = ScaledMid(p, mid);
  dmid_.resize(N * p.r);
  // f32 products (not the bf16 fused dx): dB and dmid in one pass over dy where the kernels have it, the same bits.
  const bool pair = !fused_dx && !bf16dot && kernels::LoraGradPair(*pool_, dmid_.data(), GradB(L, layer, mod), dyr,
                                                                   smid, p.b_eff, N);
  if (!pair) WeightGrad(GradB(L, layer, mod), dyr, smid, p.b_eff);
  const auto scale_dmid = [&](float* dm) {
    Par(N, 64, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b * p.r; i < e * p.r; ++i) dm[i] *= p.scale;
    });
    return dm;
  };
  if (fused_dx) {  // dmid = dy B on the same pairs of dy as the fused product
    kernels::LoraBackwardInputBf16(*pool_, dx, dmid_.data(), dyr, N, L.eff, p.b_eff, p.a_eff, scale_dmid, accumulate);
  } else if (pair) {
    scale_dmid(dmid_.data());
  } else {
    InputGrad(dmid_.data(), dyr, p.b_eff, false);  // (N, r)
    scale_dmid(dmid_.data());
  }
  const float* dmr = bf16dot ? dmid_.data() : Round(dmid_.data(), N * p.r, rmid_);
  const bool drop = opt_.lora_dropout > 0;
  const float* xd = drop ? Dropped(x, L.in, layer, mod, xd_) : x;
  const float* xa = bf16dot ? xd : Round(xd, N * p.in, rx_);
  // f32 products: dA with x read in place where the kernels have it (the same bits).
  if (bf16dot || !kernels::LoraGradA(*pool_, GradA(L, layer, mod), dmr, xa, N, p.in, p.r))
    WeightGrad(GradA(L, layer, mod), dmr, xa, p.a_eff);
  if (!need_dx || fused_dx) return;
  if (plus_dx) {
    kernels::MatMulBackwardInputPlus(*pool_, dx, dyr, N, L.eff, dmr, p.a_eff, accumulate);
    return;
  }
  if (!drop) {
    InputGrad(dx, dmr, p.a_eff, /*accumulate=*/true);
    return;
  }
  ltmp_.resize(N * p.in);
  InputGrad(ltmp_.data(), dmr, p.a_eff, false);
  // d drop(x) / dx = mask / keep = drop(x) / x elementwise; use the mask directly.
  const double pr = opt_.lora_dropout;
  const uint64_t key = SplitMix(SplitMix(opt_.seed ^ 0x6c6f7261ull) ^ (step_ * 1315423911ull) ^ ((uint64_t)layer << 40) ^
                                ((uint64_t)mod << 56));
  const uint64_t thresh = (uint64_t)(pr * 18446744073709551616.0);
  const float keep_scale = (float)(1.0 / (1.0 - pr));
  const float* t = ltmp_.data();
  const int64_t in = p.in;
  Par(N, 16, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b * in; i < e * in; ++i)
      if (SplitMix(key + (uint64_t)(tok0_ * in + i)) >= thresh) dx[i] += t[i] * keep_scale;
  });
}

// out = a + b elementwise (out may be a): a copy and kernels::Axpy(1), which rounds 1 * b + a exactly as b + a,
// vectorized where a plain loop would not be (the build's -fno-strict-aliasing keeps GCC from it).
void RowGroupWorker::Residual(float* out, const float* a, const float* b, int64_t n) {
  Par(n, 4096, [&](int64_t s, int64_t e, int) {
    if (out != a) std::memcpy(out + s, a + s, sizeof(float) * (e - s));
    kernels::Axpy(out + s, 1.0f, b + s, e - s);
  });
}

void RowGroupWorker::SwiGluH(const float* gate, const float* up) {
  ScopedOp op(opt_.profiler, "swiglu_fwd", 0, 12.0 * N_ * c_.ffn_dim);
  float* h = h_.data();
  Par(N_ * c_.ffn_dim, 4096, [&](int64_t b, int64_t e, int) { kernels::SwiGluForward(h + b, gate + b, up + b, e - b); });
}

void RowGroupWorker::BlockForward(int64_t l, const float* x_in, float* x_out, Acts& a, bool train) {
  const ModelConfig& c = c_;
  const Layer& Ly = layers_[l];
  const int64_t N = N_, dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), T = T_;
  const int H = (int)c.n_heads, KV = (int)c.n_kv_heads, hd = (int)c.head_dim;
  const auto layout = c.rope_style == RopeStyle::kInterleaved ? kernels::RopeLayout::kInterleaved
                                                              : kernels::RopeLayout::kHalfSplit;
  const int64_t half = hd / 2;
  float* xn = xn_.data();
  RmsFwd(xn, a.rstd1.data(), x_in, Ly.n1.w);
  using M = LoraModule;
  const Work w = WorkOf(a);
  // qwen3: q and k as projected go to qraw / kraw, their per-head norms to the working q / k.
  const bool qkn = c.qk_norm;
  LinForward(Ly.lin[(int)M::kQ], xn, qkn ? a.qraw.data() : w.q, a.mid[(int)M::kQ].data(), l, (int)M::kQ, train);
  LinForward(Ly.lin[(int)M::kK], xn, qkn ? a.kraw.data() : w.k, a.mid[(int)M::kK].data(), l, (int)M::kK, train);
  LinForward(Ly.lin[(int)M::kV], xn, w.v, a.mid[(int)M::kV].data(), l, (int)M::kV, train);
  if (qkn) {
    RmsFwd(w.q, a.rstdq.data(), a.qraw.data(), Ly.qn.w, N * H, hd);
    RmsFwd(w.k, a.rstdk.data(), a.kraw.data(), Ly.kn.w, N * KV, hd);
  }
  float *q = w.q, *k = w.k;
  {
    ScopedOp rope_op(opt_.profiler, "rope_fwd", 0, 8.0 * N * (qd + kvd));
    Par(N, 16, [&](int64_t b, int64_t e, int) {
      kernels::RopeForward(q + b * qd, q + b * qd, &cos_[b * half], &sin_[b * half], e - b, H, hd, layout);
      kernels::RopeForward(k + b * kvd, k + b * kvd, &cos_[b * half], &sin_[b * half], e - b, KV, hd, layout);
    });
  }
  const float scale = 1.0f / std::sqrt((float)hd);
  {
    ScopedOp att_op(opt_.profiler, "attention_fwd", 2.0 * B_ * T * T * H * hd, 4.0 * N * (qd + 2 * kvd));
    const auto attention = Bf16Dot() ? kernels::FlashAttentionForwardBf16 : kernels::FlashAttentionForward;
    for (int64_t r = 0; r < B_; ++r) {
      attention(*pool_, &w.att[r * T * qd], &a.lse[r * T * H], &w.q[r * T * qd], &w.k[r * T * kvd], &w.v[r * T * kvd],
                seg_ ? seg_ + r * T : nullptr, T, H, KV, hd, scale, c.WindowOf(l));
    }
  }
  scratch_out_.resize(N * dim);
  // o's product rounds att to bf16 as it packs it: the same bits from the f32 copy as from the kept one.
  LinForward(Ly.lin[(int)M::kO], w.att, scratch_out_.data(), a.mid[(int)M::kO].data(), l, (int)M::kO, train);
  if (keep16_) {
    Keep16(a.q16, w.q, N * qd, false);
    Keep16(a.k16, w.k, N * kvd, false);
    Keep16(a.v16, w.v, N * kvd, false);
    Keep16(a.att16, w.att, N * qd, false);
  }
  float* xm = recompute_xmid_ ? xmid_.data() : a.xmid.data();
  const float* so = scratch_out_.data();
  {
    ScopedOp res_op(opt_.profiler, "residual", (double)N * dim, 12.0 * N * dim);
    Residual(xm, x_in, so, N * dim);
  }
  RmsFwd(xn, a.rstd2.data(), xm, Ly.n2.w);
  LinForward(Ly.lin[(int)M::kGate], xn, w.gate, a.mid[(int)M::kGate].data(), l, (int)M::kGate, train);
  LinForward(Ly.lin[(int)M::kUp], xn, w.up, a.mid[(int)M::kUp].data(), l, (int)M::kUp, train);
  if (keep16_) {
    Keep16(a.gate16, w.gate, N * c.ffn_dim, true);
    Keep16(a.up16, w.up, N * c.ffn_dim, true);
  }
  SwiGluH(w.gate, w.up);
  LinForward(Ly.lin[(int)M::kDown], h_.data(), scratch_out_.data(), a.mid[(int)M::kDown].data(), l, (int)M::kDown,
             train);
  ScopedOp res_op(opt_.profiler, "residual", (double)N * dim, 12.0 * N * dim);
  Residual(x_out, xm, so, N * dim);
}

void RowGroupWorker::Forward(bool train) {
  const int64_t N = N_, dim = c_.dim;
  float* x0 = res_.data();
  {
    ScopedOp op(opt_.profiler, "embedding_fwd", 0, 8.0 * N * dim);
    if (embed_master_) {
      Par(N, 16, [&](int64_t s, int64_t e, int) { kernels::EmbeddingForward(x0 + s * dim, ids_ + s, embed_master_, e - s, dim); });
    } else {
      Par(N, 16, [&](int64_t s, int64_t e, int) {
        for (int64_t i = s; i < e; ++i) kernels::DequantizeRows(embed_eff_, ids_[i], 1, x0 + i * dim);
      });
    }
  }
  for (int64_t l = 0; l < c_.n_layers; ++l) {
    Acts& a = acts_[opt_.gradient_checkpointing ? 0 : std::max<int64_t>(l - lowest_trainable_layer_, 0)];
    BlockForward(l, &res_[l * N * dim], &res_[(l + 1) * N * dim], a, train);
  }
  RmsFwd(xf_.data(), rstdf_.data(), &res_[c_.n_layers * N * dim], final_norm_.w);
}

void RowGroupWorker::BlockBackward(int64_t l, Acts& a, float* dres, bool need_dx) {
  const ModelConfig& c = c_;
  const Layer& Ly = layers_[l];
  const int64_t N = N_, dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), T = T_, nf = N * c.ffn_dim;
  const int H = (int)c.n_heads, KV = (int)c.n_kv_heads, hd = (int)c.head_dim;
  const auto layout = c.rope_style == RopeStyle::kInterleaved ? kernels::RopeLayout::kInterleaved
                                                              : kernels::RopeLayout::kHalfSplit;
  const int64_t half = hd / 2;
  using M = LoraModule;
  dh_.resize(nf);
  dgate_.resize(nf);
  dup_.resize(nf);
  dxn_.resize(N * dim);
  dtmp_.resize(N * dim);
  // MLP: x_out = xmid + down(swiglu(gate(xn2), up(xn2))). h and xn2 are recomputed (same kernels,
  // same inputs and partition: bit-identical to the forward's).
  const Work w = WorkOf(a);
  if (keep16_) {
    Restore16(w.gate, a.gate16);
    Restore16(w.up, a.up16);
    Restore16(w.att, a.att16);
  }
  const float* xmid = a.xmid.data();
  if (recompute_xmid_) {
    // xmid = x_in + o(att) again, as BlockForward made it (the same product on the same bits: o rounds att to
    // bf16 as it packs it, and att16 holds those bits).
    scratch_out_.resize(N * dim);
    LinForward(Ly.lin[(int)M::kO], w.att, scratch_out_.data(), a.mid[(int)M::kO].data(), l, (int)M::kO, true);
    ScopedOp res_op(opt_.profiler, "residual", (double)N * dim, 12.0 * N * dim);
    Residual(xmid_.data(), &res_[l * N * dim], scratch_out_.data(), N * dim);
    xmid = xmid_.data();
  }
  SwiGluH(w.gate, w.up);
  LinBackward(Ly.lin[(int)M::kDown], dres, h_.data(), a.mid[(int)M::kDown].data(), dh_.data(), false, true, l,
              (int)M::kDown);
  {
    ScopedOp op(opt_.profiler, "swiglu_bwd", 0, 20.0 * nf);
    Par(nf, 4096, [&](int64_t b, int64_t e, int) {
      kernels::SwiGluBackward(dgate_.data() + b, dup_.data() + b, dh_.data() + b, w.gate + b, w.up + b, e - b);
    });
  }
  float* xn = xn_.data();
  RmsFwd(xn, a.rstd2.data(), xmid, Ly.n2.w);
  LinBackward(Ly.lin[(int)M::kUp], dup_.data(), xn, a.mid[(int)M::kUp].data(), dxn_.data(), false, true, l,
              (int)M::kUp);
  LinBackward(Ly.lin[(int)M::kGate], dgate_.data(), xn, a.mid[(int)M::kGate].data(), dxn_.data(), true, true,
              l, (int)M::kGate);
  RmsBwd(dtmp_.data(), Ly.n2.g, dxn_.data(), xmid, Ly.n2.w, a.rstd2.data());
  float* dr = dres;
  const float* dt = dtmp_.data();
  {
    ScopedOp op(opt_.profiler, "residual", (double)N * dim, 12.0 * N * dim);
    Residual(dr, dr, dt, N * dim);
  }
  // Attention: xmid = x_in + o(attn(rope(q(xn1)), rope(k(xn1)), v(xn1))).
  d_att_.resize(N * qd);
  if (keep16_) {  // (att restored above)
    Restore16(w.q, a.q16);
    Restore16(w.k, a.k16);
    Restore16(w.v, a.v16);
  }
  LinBackward(Ly.lin[(int)M::kO], dres, w.att, a.mid[(int)M::kO].data(), d_att_.data(), false, true, l, (int)M::kO);
  dq_.resize(N * qd);
  dk_.resize(N * kvd);
  dv_.resize(N * kvd);
  const float scale = 1.0f / std::sqrt((float)hd);
  {
    ScopedOp op(opt_.profiler, "attention_bwd", 5.0 * B_ * T * T * H * hd, 8.0 * N * (2 * qd + 4 * kvd));
    const auto attention =
        Bf16Dot() ? kernels::FlashAttentionBackwardBf16 : kernels::FlashAttentionBackward;
    for (int64_t r = 0; r < B_; ++r) {
      attention(*pool_, &dq_[r * T * qd], &dk_[r * T * kvd], &dv_[r * T * kvd], &d_att_[r * T * qd], &w.q[r * T * qd],
                &w.k[r * T * kvd], &w.v[r * T * kvd], &w.att[r * T * qd], &a.lse[r * T * H],
                seg_ ? seg_ + r * T : nullptr, T, H, KV, hd, scale, c.WindowOf(l));
    }
  }
  float *dq = dq_.data(), *dk = dk_.data();
  {
    ScopedOp op(opt_.profiler, "rope_bwd", 0, 8.0 * N * (qd + kvd));
    Par(N, 16, [&](int64_t b, int64_t e, int) {
      kernels::RopeBackward(dq + b * qd, dq + b * qd, &cos_[b * half], &sin_[b * half], e - b, H, hd, layout);
      kernels::RopeBackward(dk + b * kvd, dk + b * kvd, &cos_[b * half], &sin_[b * half], e - b, KV, hd, layout);
    });
  }
  if (c.qk_norm) {  // through qwen3's per-head norms: the gradients of q and k as projected
    dqraw_.resize(N * qd);
    dkraw_.resize(N * kvd);
    RmsBwd(dqraw_.data(), Ly.qn.g, dq, a.qraw.data(), Ly.qn.w, a.rstdq.data(), N * H, hd);
    RmsBwd(dkraw_.data(), Ly.kn.g, dk, a.kraw.data(), Ly.kn.w, a.rstdk.data(), N * KV, hd);
    dq = dqraw_.data();
    dk = dkraw_.data();
  }
  // Below the lowest trainable layer nothing needs d(block input): skip the q/k/v input gradients.
  const bool dxn = need_dx || Ly.n1.g;
  RmsFwd(xn, a.rstd1.data(), &res_[l * N * dim], Ly.n1.w);
  LinBackward(Ly.lin[(int)M::kQ], dq, xn, a.mid[(int)M::kQ].data(), dxn_.data(), false, dxn, l, (int)M::kQ);
  LinBackward(Ly.lin[(int)M::kK], dk, xn, a.mid[(int)M::kK].data(), dxn_.data(), true, dxn, l, (int)M::kK);
  LinBackward(Ly.lin[(int)M::kV], dv_.data(), xn, a.mid[(int)M::kV].data(), dxn_.data(), true, dxn, l,
              (int)M::kV);
  if (!dxn) return;
  RmsBwd(dtmp_.data(), Ly.n1.g, dxn_.data(), &res_[l * N * dim], Ly.n1.w, a.rstd1.data());
  ScopedOp res_op(opt_.profiler, "residual", (double)N * dim, 12.0 * N * dim);
  Residual(dr, dr, dt, N * dim);
}

namespace {

// Rows [r0, r0 + rows) of a micro-batch.
TrainBatch RowsOf(const TrainBatch& b, int64_t r0, int64_t rows) {
  const size_t off = (size_t)(r0 * b.T), n = (size_t)(rows * b.T);
  TrainBatch g;
  g.input_ids = b.input_ids.subspan(off, n);
  g.labels = b.labels.subspan(off, n);
  if (!b.segment_ids.empty()) g.segment_ids = b.segment_ids.subspan(off, n);
  g.B = rows;
  g.T = b.T;
  return g;
}

// Whether any token of rows [r0, r0 + rows) predicts a label (Prepare's rule: labels[t + 1] within
// the row and the segment).
bool HasTargets(const TrainBatch& b, int64_t r0, int64_t rows) {
  for (int64_t r = r0; r < r0 + rows; ++r)
    for (int64_t t = 0; t + 1 < b.T; ++t) {
      const int64_t i = r * b.T + t;
      if (b.labels[i + 1] != kernels::kIgnoreLabel && (b.segment_ids.empty() || b.segment_ids[i + 1] == b.segment_ids[i]))
        return true;
    }
  return false;
}

}  // namespace

// Rows are independent until the gradient sums: each group adds d(its token losses / normalizer)
// into the gradients, which is the whole batch's gradient up to summation order. A group without
// targets would add exact zeros and is skipped.
Result<double> TrainModelImpl::ForwardBackward(const TrainBatch& batch, double normalizer) {
  LATHE_RETURN_IF_ERROR(CheckBatch(batch));
  if (!(normalizer > 0)) return Status::Error("ForwardBackward: normalizer must be > 0");
  ++step_;
  RefreshBf16();
  PackHead();
  const int64_t G = RowGroupRows(batch.B, batch.T, opt_.row_group_tokens);
  std::vector<int64_t> starts;  // first rows of the groups with targets
  for (int64_t r0 = 0; r0 < batch.B; r0 += G)
    if (HasTargets(batch, r0, std::min(G, batch.B - r0))) starts.push_back(r0);
  const int64_t n = (int64_t)starts.size();
  std::vector<double> losses(n, 0.0);
  const int W = Workers(n);
  const bool lora = opt_.method == FinetuneMethod::kLora;
  // Worker w runs groups w, w + W, ...: which groups add into which gradients is fixed by W alone
  // (LoRA) or not at all (full / freeze add in group order), so the result does not depend on the
  // threads or their timing.
  order_.Start(W > 1 && !lora);
  const bool tied_rows = g_embed_ && g_embed_ == g_head_;
  if (tied_rows) embed_rows_.resize(batch.B * batch.T * c_.dim);
  auto run = [&](int w) {
    RowGroupWorker& k = Worker(w);
    for (int64_t i = w; i < n; i += W) {
      k.Prepare(RowsOf(batch, starts[i], std::min(G, batch.B - starts[i])), starts[i]);
      losses[i] = k.ForwardBackward(normalizer, i, i == n - 1);
      order_.Finish(i);
    }
  };
  if (W == 1) {
    Worker(0).SetSolo(false);
    run(0);
  } else {
    for (int w = 0; w < W; ++w) {
      Worker(w).SetSolo(true);
      if (w > 0 && lora) Worker(w).UsePrivateGrads();
    }
    // Full / freeze: a group waits for the one before it, so each worker needs a thread of its own
    // (RowGroupWorkers keeps W <= threads); the pool's idle threads claim the workers' chunks.
    pool_.ParallelFor(W, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t w = b; w < e; ++w) run((int)w);
    });
    if (lora)
      for (int w = 1; w < W; ++w) Worker(w).AddGradsTo(pool_);
  }
  if (tied_rows) {
    // The embedding's share of the tied gradient, after every group's loss: the same order on any
    // worker count.
    ScopedOp op(opt_.profiler, "embedding_bwd", 0, 12.0 * (double)batch.B * batch.T * c_.dim);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t rows = std::min(G, batch.B - starts[i]), t0 = starts[i] * batch.T;
      kernels::EmbeddingBackward(g_embed_, embed_rows_.data() + t0 * c_.dim, batch.input_ids.data() + t0,
                                 rows * batch.T, c_.dim);
    }
  }
  double loss = 0;
  for (double l : losses) loss += l;
  return loss * normalizer;
}

int TrainModelImpl::Workers(int64_t groups) const {
  return (int)RowGroupWorkers(opt_.method == FinetuneMethod::kLora, groups, opt_.row_group_workers, pool_.size(),
                              opt_.method == FinetuneMethod::kFull);
}

RowGroupWorker& TrainModelImpl::Worker(int w) {
  while ((int)workers_.size() <= w) workers_.push_back(std::make_unique<RowGroupWorker>(*this, pool_));
  return *workers_[w];
}

void TrainModelImpl::PackHead() {
  head_packed_use_ = nullptr;
  const bool pairs = opt_.bf16 && UsesBf16Dot() && head_eff_.dtype == DType::kBF16 && c_.dim % 2 == 0;
  if (PackedHeadBytes(c_.vocab_size, c_.dim, head_master_ != nullptr, quantized_base_, pairs) == 0) return;
  if (head_packed_.src != head_eff_.data) {
    ScopedOp op(opt_.profiler, "pack_head", 0, 2.0 * (double)head_eff_.nbytes());
    if (pairs) {
      kernels::PackForBackwardInputBf16(pool_, head_eff_, &head_packed_);
    } else {
      kernels::PackForBackwardInput(pool_, head_eff_, &head_packed_);
    }
  }
  head_packed_use_ = &head_packed_;
}

double RowGroupWorker::ForwardBackward(double normalizer, int64_t group, bool last_group) {
  group_ = group;
  Forward(/*train=*/true);
  // The peak of a step holds either the loss's buffers (its chunk's logits and head-gradient pairs) or the block
  // backward's scratch, not both: the scratch's pages go back until BlockBackward, which writes each of these
  // buffers before reading it, and the loss's pairs go back after it (anonymous pages: zero when touched again).
  const auto block_scratch = {&dh_, &dgate_, &dup_, &dxn_, &dtmp_, &d_att_, &dq_, &dk_, &dv_, &h_, &xn_, &wq_, &wk_,
                              &wv_, &watt_, &wgate_, &wup_, &xmid_};
  for (auto* v : block_scratch) DropPages(*v);
  if (!order_.on()) {  // (given back after the last group's loss, below)
    PopulatePages(head_later_.a);
    PopulatePages(head_later_.b);
  }
  const int64_t N = N_, dim = c_.dim;
  dxf_.resize(N * dim);
  const float* xfr = Round(xf_.data(), N * dim, rx_);
  float loss = 0;
  {
    // Logits and dx, plus the head's gradient when it is trained (2 flops a multiply-add each).
    ScopedOp ce_op(opt_.profiler, "cross_entropy_fwd_bwd", (g_head_ ? 6.0 : 4.0) * N * dim * c_.vocab_size,
                   (double)head_eff_.nbytes() * 2 + 8.0 * N * dim);
    // The head gradient's bf16 pairs of one chunk (or, held for the group order, of every chunk) live in the
    // worker's head_later_, which the memory plan counts per worker.
    auto ce = [&] {
      if (g_head_) ReadyToWrite(g_head_);  // every vocab row is written
      loss = kernels::CrossEntropyBackward(*pool_, dxf_.data(), g_head_, xfr, N, head_eff_, targets_.data(),
                                           (float)normalizer, 1.0f, opt_.loss_chunk_tokens, head_packed_, opt_.bf16,
                                           g_head_ ? &head_later_ : nullptr);
    };
    if (g_head_ && order_.on() && kernels::HeadGradCanWait(head_eff_, opt_.bf16)) {
      // Several workers: loss and dx now, beside the other workers' losses; only the head gradient's products
      // wait for the earlier groups' (the bits of ce() in turn).
      loss = kernels::CrossEntropyBackward(*pool_, dxf_.data(), nullptr, xfr, N, head_eff_, targets_.data(),
                                           (float)normalizer, 1.0f, opt_.loss_chunk_tokens, head_packed_, opt_.bf16,
                                           &head_later_);
      order_.Add(g_head_, group_, [&] {
        ReadyToWrite(g_head_);
        kernels::AddHeadGrad(*pool_, g_head_, head_later_);
      });
    } else if (g_head_) {
      order_.Add(g_head_, group_, ce);
    } else {
      ce();
    }
    if (!order_.on()) {
      DropPages(head_later_.a);
      DropPages(head_later_.b);
    }
  }
  for (auto* v : block_scratch) PopulatePages(*v);
  dres_.resize(N * dim);
  RmsBwd(dres_.data(), final_norm_.g, dxf_.data(), &res_[c_.n_layers * N * dim], final_norm_.w, rstdf_.data());
  for (int64_t l = c_.n_layers - 1; l >= lowest_trainable_layer_; --l) {
    Acts* a = &acts_[opt_.gradient_checkpointing ? 0 : l - lowest_trainable_layer_];
    if (opt_.gradient_checkpointing) {
      // Recompute the block from its saved input; its output (already in res_) goes to scratch.
      ckpt_out_.resize(N * dim);
      BlockForward(l, &res_[l * N * dim], ckpt_out_.data(), *a, true);
    }
    BlockBackward(l, *a, dres_.data(), l > lowest_trainable_layer_ || embed_trainable_);
    if (opt_.method != FinetuneMethod::kLora && !opt_.gradient_checkpointing && opt_.hand_back_pages &&
        last_group) {
      // Full / freeze: this layer's saved tensors and its output are dead; giving their pages back
      // makes room for the gradients the remaining layers write (the forward faults them in again).
      // Not before the last group: the next group's forward would fault them straight back in
      // while the gradients written so far stay resident (TrainModelOptions::hand_back_pages).
      for (auto* v : {&a->q, &a->k, &a->v, &a->att, &a->xmid, &a->gate, &a->up}) DropPages(*v);
      for (auto* v : {&a->q16, &a->k16, &a->v16, &a->att16, &a->gate16, &a->up16}) DropPages(*v);
      DropPages(&res_[(l + 1) * N * dim], N * dim);
    }
  }
  if (g_embed_ && g_embed_ == g_head_) {
    // Tied: the loss of a later group adds into this gradient too; the rows wait for every loss.
    std::copy(dres_.begin(), dres_.begin() + N * dim, embed_rows_.begin() + tok0_ * dim);
  } else if (g_embed_) {
    order_.Add(g_embed_, group_, [&] {
      ScopedOp op(opt_.profiler, "embedding_bwd", 0, 12.0 * N * dim);
      kernels::EmbeddingBackward(g_embed_, dres_.data(), ids_, N, dim);
    });
  }
  return (double)loss;
}

Result<double> TrainModelImpl::Loss(const TrainBatch& batch, int64_t* n_targets) {
  LATHE_RETURN_IF_ERROR(CheckBatch(batch));
  RefreshBf16();
  const int64_t G = RowGroupRows(batch.B, batch.T, opt_.row_group_tokens);
  double loss = 0;
  int64_t n = 0;
  RowGroupWorker& k = Worker(0);
  k.SetSolo(false);
  for (int64_t r0 = 0; r0 < batch.B; r0 += G) {
    const int64_t rows = std::min(G, batch.B - r0);
    if (!HasTargets(batch, r0, rows)) continue;
    k.Prepare(RowsOf(batch, r0, rows), r0);
    loss += k.Loss(&n);
  }
  if (n_targets) *n_targets = n;
  return loss;
}

double RowGroupWorker::Loss(int64_t* n) {
  Forward(/*train=*/false);
  for (int32_t t : targets_) *n += t != kernels::kIgnoreLabel;
  const float* xfr = Round(xf_.data(), N_ * c_.dim, rx_);
  return kernels::CrossEntropyForward(*pool_, xfr, N_, head_eff_, targets_.data(), 1.0f, opt_.loss_chunk_tokens,
                                      opt_.bf16);
}

Result<std::unique_ptr<LoraAdapter>> TrainModelImpl::ExportAdapter() const {
  if (opt_.method != FinetuneMethod::kLora) return Status::Error("ExportAdapter: the model is not trained with LoRA");
  auto a = std::make_unique<LoraAdapter>();
  a->path = "(training)";
  a->rank = opt_.lora_rank;
  a->alpha = opt_.lora_alpha;
  a->rslora = opt_.use_rslora;
  for (LoraModule m : opt_.lora_targets) a->target_modules.push_back(LoraModuleName(m));
  a->layers.resize(c_.n_layers);
  for (int64_t l = 0; l < c_.n_layers; ++l)
    for (int m = 0; m < kMods; ++m) {
      const LoraParam& p = layers_[l].lin[m].lora;
      if (!p.on) continue;
      auto sa = std::make_shared<std::vector<float>>(p.a, p.a + p.r * p.in);
      auto sb = std::make_shared<std::vector<float>>(p.b, p.b + p.out * p.r);
      LoraPair& pair = a->layers[l][m];
      pair.a = F32View(sa->data(), {p.r, p.in});
      pair.b = F32View(sb->data(), {p.out, p.r});
      pair.scale = p.scale;
      a->storage.push_back(sa);
      a->storage.push_back(sb);
    }
  return a;
}

Status TrainModelImpl::ImportAdapter(const LoraAdapter& a) {
  if (opt_.method != FinetuneMethod::kLora) return Status::Error("ImportAdapter: the model is not trained with LoRA");
  for (int64_t l = 0; l < c_.n_layers; ++l)
    for (int m = 0; m < kMods; ++m) {
      const LoraParam& p = layers_[l].lin[m].lora;
      if (!p.on) continue;
      const LoraPair* src = l < (int64_t)a.layers.size() && a.at(l, (LoraModule)m).a.data ? &a.at(l, (LoraModule)m)
                                                                                        : nullptr;
      if (!src) {
        return Status::Error(StrFormat("%s: the adapter has no %s weights for layer %lld (an adapter of some layers "
                                       "only, layers_to_transform, cannot be continued)",
                                       a.path.c_str(), LoraModuleName((LoraModule)m), (long long)l));
      }
      if (src->a.numel() != p.r * p.in || src->b.numel() != p.out * p.r) {
        return Status::Error(StrFormat("%s: layer %lld %s has another rank or shape than the model's LoRA",
                                       a.path.c_str(), (long long)l, LoraModuleName((LoraModule)m)));
      }
      std::memcpy(p.a, src->a.data, sizeof(float) * p.r * p.in);
      std::memcpy(p.b, src->b.data, sizeof(float) * p.out * p.r);
    }
  return Status::Ok();
}

}  // namespace internal

bool LinearShadows(bool bf16, bool fp16) { return fp16 || (bf16 && !UsesBf16Dot()); }

bool TrainedHeadShadow(bool bf16, bool fp16, int64_t dim) {
  return fp16 || (bf16 && !(UsesBf16Dot() && dim % 2 == 0));
}

bool FrozenHeadAsBf16(bool bf16_dot, bool full, DType head_dtype, int64_t dim, bool quantized_base) {
  return bf16_dot && !full && head_dtype != DType::kBF16 && dim % 2 == 0 && !quantized_base;
}

bool FrozenLinearsAsBf16(bool bf16_dot, DType base_dtype, bool quantized_base) {
  return bf16_dot && base_dtype == DType::kF32 && !quantized_base;
}

int64_t PackedHeadBytes(int64_t vocab, int64_t dim, bool head_trainable, bool quantized_base, bool bf16_pairs) {
  const int64_t bytes =
      bf16_pairs ? kernels::PackedBackwardBPairBytes(vocab, dim) : kernels::PackedBackwardBBytes(vocab, dim);
  if (quantized_base || head_trainable || bytes > kMaxPackedHeadBytes) return 0;
  return bytes;
}

int64_t RowGroupRows(int64_t B, int64_t T, int64_t row_group_tokens) {
  if (row_group_tokens <= 0 || T <= 0) return B;
  // At most half the rows (rounded up): a batch of short rows makes two groups, which two workers run side by
  // side (each product on one thread) instead of one group whose products split over the threads.
  return std::clamp<int64_t>(row_group_tokens / T, 1, std::max<int64_t>((B + 1) / 2, 1));
}

int64_t RowGroupWorkers(bool lora, int64_t groups, int64_t row_group_workers, int threads, bool full) {
  if (groups < 2) return 1;
  // Full / freeze workers wait for each other (GradOrder): at most one per thread.
  const int64_t most = lora ? groups : std::min<int64_t>(groups, std::max(threads, 1));
  const int64_t asked = row_group_workers > 0 ? row_group_workers : full ? 1 : threads;
  return std::clamp<int64_t>(asked, 1, most);
}


Result<std::unique_ptr<TrainModel>> TrainModel::Create(const ModelWeights& base, ThreadPool& pool,
                                                       const TrainModelOptions& options) {
  auto m = std::make_unique<internal::TrainModelImpl>(base, pool, options);
  LATHE_RETURN_IF_ERROR(m->Init());
  return std::unique_ptr<TrainModel>(std::move(m));
}

Result<std::unique_ptr<TrainModel>> TrainModel::CreateInPlace(ModelWeights& base, ThreadPool& pool,
                                                              const TrainModelOptions& options) {
  auto m = std::make_unique<internal::TrainModelImpl>(base, pool, options, /*in_place=*/true);
  LATHE_RETURN_IF_ERROR(m->Init());
  return std::unique_ptr<TrainModel>(std::move(m));
}

namespace internal {

TrainMemory TrainModelImpl::AllocatedBytes() const {
  auto cap = [](const auto& v) { return (int64_t)(v.capacity() * sizeof(v[0])); };
  TrainMemory m;
  int64_t storage = 0, shadows = 0;
  for (const std::vector<float>& v : storage_) storage += cap(v);
  for (const TrainableTensor& t : params_) m.gradients += t.n * (int64_t)sizeof(float);
  for (const Layer& Ly : layers_)
    for (const Lin& L : Ly.lin) shadows += (L.master ? cap(L.w16) : 0) + cap(L.lora.a16) + cap(L.lora.b16);
  if (head_master_) shadows += cap(head16_);
  // storage_ holds the f32 masters (MasterCopy, LoRA A/B), grads_ the gradients.
  (opt_.method == FinetuneMethod::kLora ? m.lora : m.weights) = storage + shadows + in_place_bytes_;
  m.weights += cap(head_packed_.data) + (int64_t)head_packed_.pairs.capacity() * 4;  // a copy of a frozen base tensor
  if (!head_master_) m.weights += cap(head16_);  // a frozen f32 head's bf16 copy (FrozenHeadAsBf16)
  for (const Layer& Ly : layers_)
    for (const Lin& L : Ly.lin)
      if (!L.master) m.frozen_copies += cap(L.w16);  // frozen f32 linears' bf16 copies (FrozenLinearsAsBf16)
  m.weights += m.frozen_copies;
  for (const auto& w : workers_) w->AddAllocatedBytes(m);
  m.activations += cap(embed_rows_);
  for (const auto* v : {&inv_freq_, &pos_cos_, &pos_sin_}) m.temporary += cap(*v);
  m.base_released = base_released_;
  return m;
}

void RowGroupWorker::AddAllocatedBytes(TrainMemory& m) const {
  auto cap = [](const auto& v) { return (int64_t)(v.capacity() * sizeof(v[0])); };
  m.gradients += cap(grads_store_);
  m.activations += cap(res_) + cap(xf_) + cap(rstdf_) + cap(xmid_);
  for (const Acts& a : acts_) {
    for (const auto* v : {&a.rstd1, &a.q, &a.k, &a.v, &a.att, &a.lse, &a.xmid, &a.rstd2, &a.gate, &a.up, &a.qraw,
                          &a.kraw, &a.rstdq, &a.rstdk})
      m.activations += cap(*v);
    for (const auto* v : {&a.q16, &a.k16, &a.v16, &a.att16, &a.gate16, &a.up16}) m.activations += cap(*v);
    for (const auto& v : a.mid) m.activations += cap(v);
  }
  for (const auto* v : {&dxf_, &dres_, &dtmp_, &scratch_out_, &ckpt_out_, &d_att_, &dq_, &dk_, &dv_, &dqraw_,
                        &dkraw_, &dgate_, &dup_, &dh_, &dxn_, &rx_, &rx2_, &rdy_, &xd_, &lscr_, &lmid_, &ltmp_, &dmid_, &rmid_,
                        &normdw_, &cos_, &sin_, &xn_, &h_, &wq_, &wk_, &wv_, &watt_, &wgate_, &wup_})
    m.temporary += cap(*v);
  m.temporary += cap(targets_) + cap(head_later_.a) + cap(head_later_.b) + cap(head_later_.tokens);
}

}  // namespace internal

}  // namespace lathe::model
