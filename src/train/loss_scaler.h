// LossScaler: fp16 dynamic loss scaling with torch.cuda.amp.GradScaler's defaults (init_scale
// 2^16, growth_factor 2, backoff_factor 0.5, growth_interval 2000).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include "train/optimizer.h"

namespace lathe::train {

class LossScaler {
 public:
  double scale = 65536.0;
  int64_t growth_tracker = 0;  // clean steps since the last change
  int64_t skipped_steps = 0;
  static constexpr int64_t kGrowthInterval = 2000;

  // Multiplies every gradient by f32(1 / scale) (as GradScaler.unscale_) and returns whether all
  // are finite (and the loss is).
  bool Unscale(std::span<const ParamRef> params, double loss) const {
    const float inv = (float)(1.0 / scale);
    bool finite = std::isfinite(loss);
    for (const ParamRef& p : params) {
      for (int64_t i = 0; i < p.n; ++i) {
        p.grad[i] *= inv;
        finite = finite && std::isfinite(p.grad[i]);
      }
    }
    return finite;
  }
  // GradScaler.update: inf/nan -> backoff and count a skipped step; else grow after the interval.
  void Update(bool finite) {
    if (!finite) {
      scale *= 0.5;
      growth_tracker = 0;
      skipped_steps++;
    } else if (++growth_tracker == kGrowthInterval) {
      scale *= 2.0;
      growth_tracker = 0;
    }
  }
};

}  // namespace lathe::train
