// Optimizers and learning-rate schedules with PyTorch / transformers semantics: AdamW as
// torch.optim.AdamW (decoupled weight decay, bias correction), SGD as torch.optim.SGD,
// global-norm clipping as torch.nn.utils.clip_grad_norm_, and the linear / cosine / constant /
// constant_with_warmup schedules of transformers.get_scheduler (evaluated at the optimizer step
// index, starting from 0, as the HF Trainer does).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"

namespace lathe::train {

// One trainable tensor: its f32 master values and gradient (same length).
struct ParamRef {
  std::string name;
  float* data = nullptr;  // (n)
  float* grad = nullptr;  // (n)
  int64_t n = 0;
  bool decay = true;      // weight decay applies (HF excludes biases and norm weights)
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update with learning rate `lr` to every parameter (the same list every call).
  virtual void Step(std::span<const ParamRef> params, double lr) = 0;
  virtual int64_t steps() const = 0;
  // Bytes of optimizer state per trainable parameter (for the memory plan).
  virtual double StateBytesPerParam() const = 0;
  // Runs Step's elementwise updates on `pool` (not owned; nullptr: the caller's thread). Every
  // element's update is independent, so the result is bit-identical for any thread count.
  virtual void SetPool(ThreadPool* pool) { (void)pool; }
};

class AdamW final : public Optimizer {
 public:
  AdamW(double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8, double weight_decay = 0.0)
      : b1_(beta1), b2_(beta2), eps_(eps), wd_(weight_decay) {}
  void Step(std::span<const ParamRef> params, double lr) override;
  int64_t steps() const override { return step_; }
  double StateBytesPerParam() const override { return 8; }
  void SetPool(ThreadPool* pool) override { pool_ = pool; }
  // First and second moments of parameter i (for checkpoints and tests).
  const std::vector<float>& m(size_t i) const { return m_[i]; }
  const std::vector<float>& v(size_t i) const { return v_[i]; }
  size_t state_count() const { return m_.size(); }
  // Checkpoint restore: the step count and moments of every parameter (in Step's list order).
  void Restore(int64_t steps, std::vector<std::vector<float>> m, std::vector<std::vector<float>> v) {
    step_ = steps;
    m_ = std::move(m);
    v_ = std::move(v);
  }

 private:
  double b1_, b2_, eps_, wd_;
  int64_t step_ = 0;
  std::vector<std::vector<float>> m_, v_;
  ThreadPool* pool_ = nullptr;
};

class Sgd final : public Optimizer {
 public:
  explicit Sgd(double weight_decay = 0.0) : wd_(weight_decay) {}
  void Step(std::span<const ParamRef> params, double lr) override;
  int64_t steps() const override { return step_; }
  double StateBytesPerParam() const override { return 0; }
  void set_steps(int64_t steps) { step_ = steps; }  // checkpoint restore (SGD has no other state)

 private:
  double wd_;
  int64_t step_ = 0;
};

// Scales all gradients so their global L2 norm is at most max_norm (coefficient
// max_norm / (norm + 1e-6), capped at 1); returns the norm before clipping. max_norm <= 0 only
// measures.
double ClipGradNorm(std::span<const ParamRef> params, double max_norm);

class LrSchedule {
 public:
  // type: linear | cosine | constant | constant_with_warmup.
  static Result<LrSchedule> Make(const std::string& type, double base_lr, int64_t warmup_steps, int64_t total_steps);
  // The learning rate of optimizer step `step` (0-based).
  double At(int64_t step) const;

 private:
  std::string type_;
  double base_ = 0;
  int64_t warmup_ = 0, total_ = 0;
};

// warmup_steps if > 0, else ceil(warmup_ratio * total_steps), as transformers' get_warmup_steps.
int64_t WarmupSteps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps);

}  // namespace lathe::train
