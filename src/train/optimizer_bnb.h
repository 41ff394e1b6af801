// bitsandbytes-style AdamW: 8-bit blockwise states (adamw_8bit) and paged states
// (paged_adamw_8bit, paged_adamw_32bit), with bitsandbytes' CPU semantics, plus the factory that
// picks an Optimizer from TrainConfig::optim.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/optimizer.h"
#include "train/paged_state.h"
#include "train/train_config.h"

namespace lathe::train {

// AdamW as bitsandbytes.optim.AdamW8bit / PagedAdamW8bit / PagedAdamW (32-bit) run it on CPU:
//  - 8-bit: m and v blockwise-quantized with bitsandbytes' dynamic maps (signed for m, unsigned for
//    v), block size 256 (bitsandbytes 0.50 Optimizer2State.init_state: `blocksize = 256` for the
//    blockwise state on every device; its CPU kernel _optimizer_update_8bit_blockwise_cpu too), an f32
//    absmax per block, f32 math per block: 2 bytes/param + 8 bytes per 256. Tensors with fewer than
//    min_8bit_size = 4096 elements keep 32-bit state, as bitsandbytes does.
//  - 32-bit state updates use bitsandbytes' 32-bit formula (eps scaled by sqrt(1 - beta2^t)).
//  - paged: the states live in a PagedStatePool (file-backed, resident cap); the math is identical
//    (states processed in chunks of whole quantization blocks), so results equal the unpaged run.
class BnbAdamW final : public Optimizer {
 public:
  struct Options {
    int bits = 8;  // 8 or 32
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
    int64_t min_8bit_size = 4096;
    std::unique_ptr<PagedStatePool> pool;  // null: states in ordinary memory
  };
  explicit BnbAdamW(Options o);
  // Allocates the states for `params` (the list every Step gets): call before the first Step so a
  // paged pool that cannot be created or sized (disk full) is an error, not an abort. Step calls
  // it itself when it was not called.
  Status Prepare(std::span<const ParamRef> params);
  void Step(std::span<const ParamRef> params, double lr) override;
  int64_t steps() const override { return step_; }
  double StateBytesPerParam() const override { return opt_.bits == 8 ? 2.0 + 8.0 / kBlock : 8.0; }
  // Bytes of state actually held (codes + absmax or f32 moments), for the memory plan and tests.
  size_t StateBytes() const { return state_bytes_; }
  const PagedStatePool* pool() const { return opt_.pool.get(); }
  PagedStatePool* mutable_pool() { return opt_.pool.get(); }

  // Parameter i's state (dequantized to f32 for 8-bit), for tests and checkpoints.
  std::vector<float> M(size_t i) const;
  std::vector<float> V(size_t i) const;
  bool Is8Bit(size_t i) const { return st_[i].q; }
  const uint8_t* MCodes(size_t i) const { return st_[i].mq; }
  const uint8_t* VCodes(size_t i) const { return st_[i].vq; }
  const float* MAbsmax(size_t i) const { return st_[i].ma; }
  const float* VAbsmax(size_t i) const { return st_[i].va; }

  // The raw state (for checkpoints): per parameter, its buffers in a fixed order (8-bit: m codes,
  // v codes, m absmax, v absmax; 32-bit: m, v) as writable byte spans. Saving these bytes and
  // steps(), then restoring them into a Prepare()d optimizer over the same parameter list, resumes
  // bit-identically. REQUIRES Prepare() (or a Step()).
  struct RawBuffer {
    std::string name;  // "<param index>.m_codes", ".v_codes", ".m_absmax", ".v_absmax", ".m", ".v"
    uint8_t* data;
    size_t bytes;
  };
  std::vector<RawBuffer> RawState();
  void set_steps(int64_t steps) { step_ = steps; }

  static constexpr int64_t kBlock = 256;
  // Elements per paging chunk (whole blocks): 2^16 elements = 128 KiB of 8-bit or 512 KiB of f32 state.
  static constexpr int64_t kChunk = 1 << 16;

 private:
  struct State {
    int64_t n = 0;
    bool q = false;
    uint8_t *mq = nullptr, *vq = nullptr;  // 8-bit codes
    float *ma = nullptr, *va = nullptr;    // 8-bit absmax per block
    float *m = nullptr, *v = nullptr;      // 32-bit moments
  };
  Status Allocate(std::span<const ParamRef> params);

  Options opt_;
  int64_t step_ = 0;
  std::vector<State> st_;
  std::vector<float> heap_;          // unpaged 32-bit moments and absmax
  std::vector<uint8_t> heap_codes_;  // unpaged 8-bit codes
  size_t state_bytes_ = 0;
  Status status_;
};

// The optimizer TrainConfig::optim names: adamw_torch / adamw_hf -> AdamW, sgd -> Sgd,
// adamw_8bit / paged_adamw_8bit / paged_adamw_32bit -> BnbAdamW (betas 0.9 / 0.999, eps 1e-8, the
// config's weight_decay). Paged states go to a temp file in output_dir (else $TMPDIR, else /tmp)
// with optim_resident_mb as the resident cap (0 = no cap). Errors name the key.
Result<std::unique_ptr<Optimizer>> MakeOptimizer(const TrainConfig& config);

}  // namespace lathe::train
