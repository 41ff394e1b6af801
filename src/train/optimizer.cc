// AdamW, SGD, gradient clipping and LR schedules.
#include "train/optimizer.h"

#include <cmath>

#include "kernels/train_ops.h"

namespace lathe::train {

namespace {
constexpr int64_t kPoolGrain = 1 << 15;  // elements per chunk of a pooled update
}  // namespace

void AdamW::Step(std::span<const ParamRef> params, double lr) {
  if (m_.empty()) {
    for (const ParamRef& p : params) {
      m_.emplace_back(p.n, 0.0f);
      v_.emplace_back(p.n, 0.0f);
    }
  }
  ++step_;
  // torch.optim.AdamW (single-tensor path), in f32 like torch with f32 params.
  const float b1 = (float)b1_, b2 = (float)b2_;
  const double bc1 = 1.0 - std::pow(b1_, (double)step_);
  const double bc2 = 1.0 - std::pow(b2_, (double)step_);
  const float step_size = (float)(lr / bc1);
  const float bc2_sqrt = (float)std::sqrt(bc2);
  const float eps = (float)eps_;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamRef& p = params[i];
    float* m = m_[i].data();
    float* v = v_[i].data();
    const kernels::AdamWCoefs k{p.decay ? (float)(1.0 - lr * wd_) : 1.0f, b1, b2, step_size, bc2_sqrt, eps};
    auto update = [&](int64_t b, int64_t e, int) { kernels::AdamWUpdate(p.data + b, m + b, v + b, p.grad + b, e - b, k); };
    if (pool_ && p.n >= 2 * kPoolGrain) {
      pool_->ParallelFor(p.n, kPoolGrain, update);
    } else {
      update(0, p.n, 0);
    }
  }
}

void Sgd::Step(std::span<const ParamRef> params, double lr) {
  ++step_;
  for (const ParamRef& p : params) {
    const float wd = p.decay ? (float)wd_ : 0.0f;
    for (int64_t j = 0; j < p.n; ++j) p.data[j] -= (float)lr * (p.grad[j] + wd * p.data[j]);
  }
}

double ClipGradNorm(std::span<const ParamRef> params, double max_norm) {
  double ss = 0;
  for (const ParamRef& p : params)
    for (int64_t j = 0; j < p.n; ++j) ss += (double)p.grad[j] * p.grad[j];
  double norm = std::sqrt(ss);
  if (max_norm > 0) {
    float coef = (float)(max_norm / (norm + 1e-6));
    if (coef < 1.0f) {
      for (const ParamRef& p : params)
        for (int64_t j = 0; j < p.n; ++j) p.grad[j] *= coef;
    }
  }
  return norm;
}

Result<LrSchedule> LrSchedule::Make(const std::string& type, double base_lr, int64_t warmup, int64_t total) {
  if (type != "linear" && type != "cosine" && type != "constant" && type != "constant_with_warmup") {
    return Status::Error("lr_scheduler_type '" + type + "' is not one of linear, cosine, constant, constant_with_warmup");
  }
  if (total < 1 || warmup < 0) return Status::Error("the schedule needs total steps >= 1 and warmup >= 0");
  LrSchedule s;
  s.type_ = type;
  s.base_ = base_lr;
  s.warmup_ = warmup;
  s.total_ = total;
  return s;
}

double LrSchedule::At(int64_t step) const {
  if (type_ == "constant") return base_;
  if (step < warmup_) return base_ * (double)step / (double)std::max<int64_t>(1, warmup_);
  if (type_ == "constant_with_warmup") return base_;
  double progress = (double)(step - warmup_) / (double)std::max<int64_t>(1, total_ - warmup_);
  if (type_ == "linear") return base_ * std::max(0.0, (double)(total_ - step) / (double)std::max<int64_t>(1, total_ - warmup_));
  return base_ * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * 0.5 * 2.0 * progress)));  // cosine, 0.5 cycles
}

int64_t WarmupSteps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps) {
  return warmup_steps > 0 ? warmup_steps : (int64_t)std::ceil(total_steps * warmup_ratio);
}

}  // namespace lathe::train
