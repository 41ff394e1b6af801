// Internal state of TrainModel (model/train_model.cc forward/backward, model/train_model_save.cc
// saving): trainable masters, effective weight views, saved activations and scratch buffers.
#pragma once

#include <array>
#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cpu.h"
#include "kernels/train_ops.h"
#include "model/train_model.h"

namespace lathe::model::internal {

constexpr int kMods = (int)LoraModule::kCount;

struct LoraParam {
  bool on = false;
  int64_t r = 0, in = 0, out = 0;
  float scale = 0;
  float *a = nullptr, *b = nullptr;    // (r, in), (out, r) f32 masters
  float *ga = nullptr, *gb = nullptr;  // gradients
  Tensor a_eff, b_eff;                 // f32 views, or bf16 shadows in bf16 mode
  std::vector<uint16_t> a16, b16;
};

// One linear layer y = x W^T (+ bias) (+ LoRA).
struct Lin {
  Tensor base;                 // as loaded (never written)
  float* master = nullptr;     // f32 copy when trainable (full / freeze), else null
  float* grad = nullptr;
  Tensor eff;                  // what the matmuls read: base, master view, bf16 shadow or frozen bf16 copy
  std::vector<uint16_t> w16;   // bf16 shadow of the master, or a frozen f32 base's bf16 copy
  const float* bias = nullptr; // (out) effective bias (base or master), null when absent
  float* gbias = nullptr;
  int64_t in = 0, out = 0;
  LoraParam lora;
};

struct Norm {
  const float* w = nullptr;  // (C) base or master
  float* g = nullptr;        // gradient when trainable
};

struct Layer {
  Norm n1, n2;
  Norm qn, kn;  // qwen3's per-head q / k norms (w null when the model has none)
  std::array<Lin, kMods> lin;
  bool trainable = false;  // any parameter (full/freeze weights or LoRA) in this layer
};

// What one decoder block's backward needs (per layer, or one set under checkpointing). The normed
// inputs xn1 = rmsnorm(x_in), xn2 = rmsnorm(xmid) and h = swiglu(gate, up) are not kept: the
// backward recomputes them (bit-identical, a few elementwise passes) into shared buffers. q, k, v,
// att, gate and up are f32, or bf16 in the `16` vectors (the f32 ones then empty) where
// ActivationsAsBf16.
struct Acts {
  std::vector<float> rstd1, q, k, v, att, lse, xmid, rstd2, gate, up;
  // qwen3 (ModelConfig::qk_norm): q and k as projected, before their per-head norm, and each head's 1 / rms.
  std::vector<float> qraw, kraw, rstdq, rstdk;
  std::vector<uint16_t> q16, k16, v16, att16, gate16, up16;
  std::array<std::vector<float>, kMods> mid;  // LoRA x A^T, (N, r)
};

// Gradient storage: anonymous mmapped pages. Zero(true) hands them back to the OS (they read as zero
// until written again), so between steps and during the forward no full/freeze gradient is
// resident; the backward brings each tensor's pages in as it writes them (as PyTorch's
// zero_grad(set_to_none=True) frees its .grad tensors). Zero(false) writes zeros in place (split over pool's threads).
class GradBuffer {
 public:
  explicit GradBuffer(int64_t n);
  ~GradBuffer();
  GradBuffer(const GradBuffer&) = delete;
  GradBuffer& operator=(const GradBuffer&) = delete;
  float* data() const { return p_; }
  void Zero(bool hand_back_pages, ThreadPool* pool = nullptr);
  // Makes the whole pages resident for writing (MADV_POPULATE_WRITE) once after each Zero that handed them
  // back: the advice walks every page even when all are resident (4.5 ms for SmolLM2's 113 MB head gradient),
  // and a full fine-tune asks before each row group's addition.
  void ReadyToWrite();

 private:
  float* p_ = nullptr;
  size_t bytes_ = 0;
  std::atomic<bool> ready_{false};  // pages resident since the last Zero
};

class TrainModelImpl;

// Full / freeze on W > 1 row-group workers: the groups add into each shared gradient tensor in
// group order (group i waits until every earlier group has added into it or finished), so each
// gradient is the same sum in the same order as one worker running the groups one after another:
// the bits do not depend on the worker or thread count. Keyed by the gradient's pointer.
class GradOrder {
 public:
  void Register(const float* grad);
  // A micro-batch starts (turns back to group 0); off = one worker, nothing to wait for.
  void Start(bool on);
  // Runs add() as group `group`'s addition into `grad` (registered), after every earlier group's.
  template <class F>
  void Add(const float* grad, int64_t group, const F& add) {
    if (!on_) {
      add();
      return;
    }
    std::atomic<int64_t>& t = *turns_.at(grad);
    for (int64_t v = t.load(std::memory_order_acquire); v < group; v = t.load(std::memory_order_acquire))
      t.wait(v, std::memory_order_acquire);
    add();
    Pass(t, group);
  }
  // Group `group` is done: no later addition of it will come (a tensor it skipped is passed on once
  // the earlier groups are past it, so the next group is not held back forever).
  void Finish(int64_t group);

 private:
  static void Pass(std::atomic<int64_t>& t, int64_t group);
  bool on_ = false;
  std::unordered_map<const float*, std::unique_ptr<std::atomic<int64_t>>> turns_;

 public:
  bool on() const { return on_; }
};

// One worker's share of a micro-batch's row groups: the activations and scratch of the group it
// runs (sized by the largest group seen, reused across steps), the pool its kernels use and where
// its LoRA gradients go. Worker 0 alone (row_group_workers 1) runs every group on the model's pool
// and adds into the model's gradients. With W > 1 workers each runs its groups (w, w + W, ...) on a
// 1-thread pool of its own, side by side on the model pool's threads; under LoRA workers > 0 add
// into private gradients the model sums into its own in worker order afterwards, under full /
// freeze every worker adds into the model's gradients in group order (GradOrder).
class RowGroupWorker {
 public:
  RowGroupWorker(TrainModelImpl& m, ThreadPool& shared_pool);
  // Solo: this worker's kernels run on its own 1-thread pool instead of the model's.
  void SetSolo(bool solo) { pool_ = solo ? &solo_pool_ : &shared_pool_; }
  // Private LoRA gradients (allocated on first use), zeroed; AddGradsTo adds them into the model's.
  void UsePrivateGrads();
  void AddGradsTo(ThreadPool& pool);
  // Rope tables, targets and buffers for one row group (rows [row0, row0 + g.B) of the micro-batch).
  void Prepare(const TrainBatch& g, int64_t row0);
  // Forward + backward of the prepared row group, the micro-batch's group-th with targets; returns
  // its share of the loss (sum / normalizer).
  double ForwardBackward(double normalizer, int64_t group, bool last_group);
  // Forward of the prepared group; returns its summed token loss, counting targets into *n.
  double Loss(int64_t* n);
  void AddAllocatedBytes(TrainMemory& m) const;

 private:
  void Forward(bool train);
  void BlockForward(int64_t l, const float* x_in, float* x_out, Acts& a, bool train);
  void BlockBackward(int64_t l, Acts& a, float* dres, bool need_dx);
  void SwiGluH(const float* gate, const float* up);  // h_ = swiglu(gate, up)
  // The block's q, k, v, att, gate and up in f32 while it runs: the saved set's own tensors, or where they are
  // kept as bf16 (keep16_) the worker's working copies, rounded into the set by the forward (gate and up
  // in place too, before the SwiGLU reads them) and restored from it by the backward.
  struct Work {
    float *q, *k, *v, *att, *gate, *up;
  };
  Work WorkOf(Acts& a);
  void Keep16(std::vector<uint16_t>& dst, float* src, int64_t n, bool round_src);
  void Restore16(float* dst, const std::vector<uint16_t>& src);
  void Residual(float* out, const float* a, const float* b, int64_t n);  // out = a + b (out may be a)
  // bf16 mode's products of a decoder linear on vdpbf16ps (kernels::LinearForwardBf16 and the backward
  // forms): where the CPU has it (UsesBf16Dot), whatever W's dtype (a quantized or f16 base is dequantized a few
  // rows at a time and rounded to bf16 as it is packed, as bitsandbytes dequantizes into its bf16 compute dtype).
  bool Bf16Dot() const { return bf16dot_; }
  // A LoRA linear whose base and rank-r products all run on vdpbf16ps: the rank-r update is summed inside the
  // base product (kernels::LinearForwardBf16Plus / MatMulBackwardInputBf16Plus), no second pass over y / dx.
  bool LoraFused(const Lin& L) const {
    return L.lora.on && Bf16Dot();
  }
  // The f32 GEMM's form of the same (kernels::LinearPlusFused): the forward's y = [x | scale mid] . [W | B]^T over a
  // float W, and without dropout the input gradient's dx = [dy | dmid] . [W ; A], each where it costs no extra inner
  // chunk.
  bool LoraPlusForward(const Lin& L) const {
    const DType t = L.eff.dtype;
    return L.lora.on && opt_.lora_plus_products && !Bf16Dot() &&
           (t == DType::kF32 || t == DType::kF16 || t == DType::kBF16) && L.lora.b_eff.dtype == DType::kF32 &&
           kernels::LinearPlusFused(L.out, L.in, L.lora.r);
  }
  bool LoraPlusInputGrad(const Lin& L) const {
    return L.lora.on && opt_.lora_plus_products && !Bf16Dot() && opt_.lora_dropout <= 0 &&
           L.lora.a_eff.dtype == DType::kF32 && kernels::LinearPlusFused(L.in, L.out, L.lora.r);
  }
  void LinForward(const Lin& L, const float* x, float* y, float* mid, int64_t layer, int mod, bool train);
  // y (=, +=) x w^T, dx (=, +=) dy w, dw += dy^T x over the group's N_ rows (one dispatch for every product).
  void Forward(float* y, const float* x, const Tensor& w, bool accumulate);
  void InputGrad(float* dx, const float* dy, const Tensor& w, bool accumulate);
  void WeightGrad(float* dw, const float* dy, const float* x, const Tensor& w);
  void LinBackward(const Lin& L, const float* dy, const float* x, const float* mid, float* dx, bool accumulate,
                   bool need_dx, int64_t layer, int mod);
  const float* Round(const float* x, int64_t n, std::vector<float>& scratch);
  // scale * Round(mid) (N x r, into lscr_): the left operand of the LoRA B product in the forward and of
  // B's weight gradient in the backward, so the gradient is that of the product the forward computed.
  const float* ScaledMid(const LoraParam& p, const float* mid);
  const float* Dropped(const float* x, int64_t in, int64_t layer, int mod, std::vector<float>& scratch);
  // RMSNorm of the group's N_ rows of dim (rows, C: of another width, e.g. q's heads of head_dim).
  void RmsFwd(float* out, float* rstd, const float* x, const float* w) { RmsFwd(out, rstd, x, w, N_, c_.dim); }
  void RmsFwd(float* out, float* rstd, const float* x, const float* w, int64_t rows, int64_t C);
  void RmsBwd(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd) {
    RmsBwd(dx, dw, dout, x, w, rstd, N_, c_.dim);
  }
  void RmsBwd(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd, int64_t rows,
              int64_t C);
  void Par(int64_t n, int64_t grain, RangeFn fn) { pool_->ParallelFor(n, grain, fn); }

  // The model's shared state this worker reads (written only between calls).
  const ModelConfig& c_;
  const TrainModelOptions& opt_;
  const std::vector<Layer>& layers_;
  const Tensor &embed_eff_, &head_eff_;
  float* const& embed_master_;
  float* const& g_embed_;
  float* const& g_head_;
  const Norm& final_norm_;
  const int64_t& lowest_trainable_layer_;
  const bool& embed_trainable_;
  const std::vector<float>&pos_cos_, &pos_sin_;
  const uint64_t& step_;
  const kernels::PackedBackwardB* const& head_packed_;  // null: the loss packs per chunk
  GradOrder& order_;
  const std::unordered_map<const float*, GradBuffer*>& grad_buffers_;
  void ReadyToWrite(const float* grad);  // its GradBuffer's ReadyToWrite
  // Tied full: the input gradient of every row of the micro-batch, for the embedding's share of the
  // tied gradient, added after every group's loss (TrainModelImpl::ForwardBackward).
  std::vector<float>& embed_rows_;
  int64_t group_ = 0;  // the group running, for order_

  ThreadPool& shared_pool_;
  ThreadPool solo_pool_{1};
  ThreadPool* pool_;
  // Private LoRA gradients (workers > 0): (A, B) per (layer, module), into grads_store_.
  std::vector<float> grads_store_;
  std::vector<std::array<float*, 2>> private_grads_;
  float* GradA(const Lin& L, int64_t layer, int mod) const {
    return private_grads_.empty() ? L.lora.ga : private_grads_[layer * kMods + mod][0];
  }
  float* GradB(const Lin& L, int64_t layer, int mod) const {
    return private_grads_.empty() ? L.lora.gb : private_grads_[layer * kMods + mod][1];
  }

  // The group: B_ rows of T_ tokens, N_ = B_ * T_; tok0_ = its first token in the micro-batch
  // (dropout masks are keyed by the token's position in the whole micro-batch).
  int64_t B_ = 0, T_ = 0, N_ = 0, tok0_ = 0;
  const int32_t* ids_ = nullptr;
  const int32_t* seg_ = nullptr;
  std::vector<int32_t> targets_;
  std::vector<float> cos_, sin_;
  std::vector<float> res_;  // (n_layers + 1, N, dim) residual stream, block inputs
  std::vector<Acts> acts_;
  std::vector<float> xf_, rstdf_, dxf_, dres_, dtmp_, scratch_out_, ckpt_out_;
  // The loss's head-gradient pairs of the group, added in group order after its dx (kernels::HeadGradParts):
  // full bf16 on W > 1 workers, so a group's loss does not wait for the earlier groups' whole losses.
  kernels::HeadGradParts head_later_;
  std::vector<float> d_att_, dq_, dk_, dv_, dgate_, dup_, dh_, dxn_, dqraw_, dkraw_;
  std::vector<float> rx_, rx2_, rdy_, xd_, lscr_, lmid_, ltmp_, dmid_, rmid_, normdw_;
  std::vector<float> xn_, h_;  // the current block's normed input and SwiGLU output (N, dim), (N, ffn)
  bool bf16dot_ = false;       // opt_.bf16 && UsesBf16Dot(): Bf16Dot()
  bool keep16_ = false;        // ActivationsAsBf16: the working copies below (WorkOf)
  std::vector<float> wq_, wk_, wv_, watt_, wgate_, wup_;
  bool recompute_xmid_ = false;  // RecomputesMidResidual: the current block's xmid in xmid_, not in its Acts
  std::vector<float> xmid_;
};

class TrainModelImpl final : public TrainModel {
 public:
  TrainModelImpl(const ModelWeights& base, ThreadPool& pool, const TrainModelOptions& options,
                 bool in_place = false);
  Status Init();

  const ModelConfig& config() const override { return c_; }
  Profiler* profiler() const override { return opt_.profiler; }
  std::span<const TrainableTensor> params() const override { return params_; }
  int64_t trainable_count() const override { return trainable_count_; }
  void ZeroGrad(bool hand_back_pages = true) override;
  Result<double> ForwardBackward(const TrainBatch& batch, double normalizer) override;
  Result<double> Loss(const TrainBatch& batch, int64_t* n_targets) override;
  TrainMemory AllocatedBytes() const override;
  Result<std::unique_ptr<LoraAdapter>> ExportAdapter() const override;
  Status ImportAdapter(const LoraAdapter& a) override;
  Status SavePeftAdapter(const std::string& dir, const std::string& base_model_name) const override;
  Status SaveHfModel(const std::string& dir, bool bf16) const override;
  int64_t MaxRowGroupWorkers(int64_t B) const override { return Workers(B); }
  uint64_t dropout_rng_state() const override { return step_; }
  void set_dropout_rng_state(uint64_t s) override { step_ = s; }

 private:
  friend class RowGroupWorker;
  float* NewBuffer(int64_t n);  // zeroed, stable address
  float* NewGrad(int64_t n);    // a GradBuffer
  void AddParam(const std::string& name, std::vector<int64_t> shape, float* data, float* grad, bool decay);
  float* MasterCopy(const Tensor& t);  // f32 copy of any dtype
  // The f32 master of a trainable base tensor: the tensor itself (in place) or a MasterCopy, after
  // which the tensor's file pages are dropped. Counts base_released_.
  float* MasterOf(const Tensor& t);
  // A frozen f32 linear as a bf16 copy (FrozenLinearsAsBf16) when its f32 pages can be given back; drops them.
  void FrozenCopy(Lin& L);
  Status CheckBatch(const TrainBatch& b) const;
  void RefreshBf16();
  // Packs the head for the loss's input gradient when PackedHeadBytes keeps one (a trained head: again every call).
  void PackHead();
  void SetEff(Lin& L);
  // Workers for a micro-batch of `groups` row groups (TrainModelOptions::row_group_workers).
  int Workers(int64_t groups) const;
  RowGroupWorker& Worker(int w);
  void Par(int64_t n, int64_t grain, RangeFn fn) { pool_.ParallelFor(n, grain, fn); }
  // Meta interleaved <-> HF half-split row order of a q/k output dimension (rows of `cols`).
  std::vector<float> ToHfRows(const float* src, int64_t heads, int64_t cols) const;

  const ModelWeights& base_;
  ThreadPool& pool_;
  TrainModelOptions opt_;
  bool in_place_ = false;
  int64_t base_released_ = 0, in_place_bytes_ = 0;
  ModelConfig c_;
  std::deque<std::vector<float>> storage_;  // f32 masters (not in place)
  std::deque<GradBuffer> grads_;
  std::unordered_map<const float*, GradBuffer*> grad_buffers_;  // by data()
  std::vector<TrainableTensor> params_;
  int64_t trainable_count_ = 0;

  std::vector<Layer> layers_;
  Tensor embed_eff_, head_eff_;
  float *embed_master_ = nullptr, *g_embed_ = nullptr, *head_master_ = nullptr, *g_head_ = nullptr;
  std::vector<uint16_t> head16_;
  kernels::PackedBackwardB head_packed_;  // head_eff_ packed for the loss's dx (PackedHeadBytes)
  const kernels::PackedBackwardB* head_packed_use_ = nullptr;  // &head_packed_ when the loss uses it
  Norm final_norm_;
  int64_t lowest_trainable_layer_ = 0;
  bool embed_trainable_ = false;
  bool quantized_base_ = false;  // any decoder linear stored NF4/FP4/int8 (QLoRA, 8-bit base)

  std::vector<float> inv_freq_, pos_cos_, pos_sin_;  // (max_seq_len, half)
  uint64_t step_ = 0;  // dropout stream counter
  std::vector<std::unique_ptr<RowGroupWorker>> workers_;
  GradOrder order_;
  std::vector<float> embed_rows_;  // tied full: (B * T, dim), see RowGroupWorker::embed_rows_
};

}  // namespace lathe::model::internal
