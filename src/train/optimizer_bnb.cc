// bitsandbytes-style 8-bit / paged AdamW (optimizer_bnb.h) and the optimizer factory.
#include "train/optimizer_bnb.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/check.h"
#include "kernels/cpu/quant.h"

namespace lathe::train {

BnbAdamW::BnbAdamW(Options o) : opt_(std::move(o)) { LATHE_CHECK(opt_.bits == 8 || opt_.bits == 32); }

Status BnbAdamW::Prepare(std::span<const ParamRef> params) {
  if (!st_.empty()) return status_;
  status_ = Allocate(params);
  return status_;
}

Status BnbAdamW::Allocate(std::span<const ParamRef> params) {
  st_.resize(params.size());
  size_t floats = 0, codes = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    State& s = st_[i];
    s.n = params[i].n;
    s.q = opt_.bits == 8 && s.n >= opt_.min_8bit_size;
    const int64_t nb = (s.n + kBlock - 1) / kBlock;
    if (s.q) {
      codes += 2 * (size_t)s.n;
      floats += 2 * (size_t)nb;
    } else {
      floats += 2 * (size_t)s.n;
    }
  }
  state_bytes_ = codes + 4 * floats;
  auto carve = [&](size_t bytes, uint8_t** heap_cursor) -> void* {
    if (opt_.pool) return opt_.pool->Carve(bytes);
    void* p = *heap_cursor;
    *heap_cursor += (bytes + 63) / 64 * 64;
    return p;
  };
  uint8_t *fcur = nullptr, *ccur = nullptr;
  if (opt_.pool) {
    // Each region 64-byte aligned: at most 64 bytes of padding per region.
    LATHE_RETURN_IF_ERROR(opt_.pool->Map(state_bytes_ + 64 * 4 * params.size() + 64));
  } else {
    heap_.assign(floats + 16 * 4 * params.size(), 0.0f);
    heap_codes_.assign(codes + 64 * 2 * params.size() + 64, 0);
    fcur = (uint8_t*)((((uintptr_t)heap_.data()) + 63) / 64 * 64);
    ccur = (uint8_t*)((((uintptr_t)heap_codes_.data()) + 63) / 64 * 64);
  }
  for (State& s : st_) {
    const int64_t nb = (s.n + kBlock - 1) / kBlock;
    if (s.q) {
      s.mq = (uint8_t*)carve(s.n, &ccur);
      s.vq = (uint8_t*)carve(s.n, &ccur);
      s.ma = (float*)carve(4 * nb, &fcur);
      s.va = (float*)carve(4 * nb, &fcur);
    } else {
      s.m = (float*)carve(4 * s.n, &fcur);
      s.v = (float*)carve(4 * s.n, &fcur);
    }
  }
  // Fresh 8-bit states dequantize to 0: code of 0.0 in each map with absmax 0 (any code works with
  // absmax 0; bitsandbytes starts from zeros codes and zero absmax too).
  return Status::Ok();
}

void BnbAdamW::Step(std::span<const ParamRef> params, double lr) {
  if (st_.empty())
    LATHE_CHECK_MSG(Prepare(params).ok(), "BnbAdamW: %s (call Prepare() first to get the error)",
                    status_.message().c_str());
  LATHE_CHECK(params.size() == st_.size());
  ++step_;
  const float b1 = (float)opt_.beta1, b2 = (float)opt_.beta2, eps = (float)opt_.eps;
  const float one_m_b1 = (float)(1.0 - opt_.beta1), one_m_b2 = (float)(1.0 - opt_.beta2);
  const double c1 = 1.0 - std::pow(opt_.beta1, (double)step_);
  const double c2 = std::sqrt(1.0 - std::pow(opt_.beta2, (double)step_));
  const float* qmap1 = kernels::quant::DynamicMapSigned();
  const float* qmap2 = kernels::quant::DynamicMapUnsigned();
  std::vector<float> mbuf, vbuf;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamRef& p = params[i];
    State& s = st_[i];
    LATHE_CHECK(p.n == s.n);
    const float decay = (p.decay && opt_.weight_decay > 0) ? (float)(1.0 - lr * opt_.weight_decay) : 1.0f;
    for (int64_t c0 = 0; c0 < s.n; c0 += kChunk) {
      const int64_t cn = std::min(kChunk, s.n - c0);
      float* w = p.data + c0;
      const float* g = p.grad + c0;
      if (s.q) {
        // bitsandbytes _optimizer_update_8bit_blockwise_cpu ("adam"), f32 tensor ops in its order.
        const int64_t b0 = c0 / kBlock, nb = (cn + kBlock - 1) / kBlock;
        mbuf.resize(cn);
        vbuf.resize(cn);
        kernels::quant::DequantizeBlockwise8(qmap1, s.mq + c0, s.ma + b0, cn, kBlock, mbuf.data());
        kernels::quant::DequantizeBlockwise8(qmap2, s.vq + c0, s.va + b0, cn, kBlock, vbuf.data());
        const float c2f = (float)c2, step = (float)(-lr / c1);
        for (int64_t j = 0; j < cn; ++j) {
          float m = mbuf[j] * b1;
          m = std::fma(g[j], one_m_b1, m);  // torch add_(alpha) vectorizes as fmadd
          float v = vbuf[j] * b2;
          v = v + one_m_b2 * g[j] * g[j];  // addcmul_
          mbuf[j] = m;
          vbuf[j] = v;
          const float denom = std::sqrt(v) / c2f + eps;
          float pw = w[j] * decay;
          w[j] = pw + step * m / denom;  // addcdiv_
        }
        kernels::quant::QuantizeBlockwise8(qmap1, mbuf.data(), cn, kBlock, s.mq + c0, s.ma + b0);
        kernels::quant::QuantizeBlockwise8(qmap2, vbuf.data(), cn, kBlock, s.vq + c0, s.va + b0);
        if (opt_.pool) {
          opt_.pool->Used(s.mq + c0, cn);
          opt_.pool->Used(s.vq + c0, cn);
          opt_.pool->Used(s.ma + b0, 4 * nb);
          opt_.pool->Used(s.va + b0, 4 * nb);
        }
      } else {
        // bitsandbytes _optimizer_update_32bit_cpu ("adam").
        float* m = s.m + c0;
        float* v = s.v + c0;
        const float c2f = (float)c2, step = (float)(-lr * c2 / c1), eps_c2 = (float)(opt_.eps * c2);
        for (int64_t j = 0; j < cn; ++j) {
          m[j] = std::fma(g[j], one_m_b1, m[j] * b1);
          v[j] = v[j] * b2 + one_m_b2 * g[j] * g[j];
          const float upd = m[j] / (std::sqrt(v[j]) + eps_c2);
          w[j] = std::fma(upd, step, w[j] * decay);
        }
        (void)c2f;
        if (opt_.pool) {
          opt_.pool->Used(m, 4 * cn);
          opt_.pool->Used(v, 4 * cn);
        }
      }
    }
  }
}

std::vector<BnbAdamW::RawBuffer> BnbAdamW::RawState() {
  LATHE_CHECK(!st_.empty());
  std::vector<RawBuffer> out;
  for (size_t i = 0; i < st_.size(); ++i) {
    const State& s = st_[i];
    const std::string p = std::to_string(i);
    const size_t nb = (size_t)((s.n + kBlock - 1) / kBlock);
    if (s.q) {
      out.push_back({p + ".m_codes", s.mq, (size_t)s.n});
      out.push_back({p + ".v_codes", s.vq, (size_t)s.n});
      out.push_back({p + ".m_absmax", (uint8_t*)s.ma, 4 * nb});
      out.push_back({p + ".v_absmax", (uint8_t*)s.va, 4 * nb});
    } else {
      out.push_back({p + ".m", (uint8_t*)s.m, 4 * (size_t)s.n});
      out.push_back({p + ".v", (uint8_t*)s.v, 4 * (size_t)s.n});
    }
  }
  return out;
}

std::vector<float> BnbAdamW::M(size_t i) const {
  const State& s = st_[i];
  std::vector<float> out((size_t)s.n);
  if (s.q) {
    kernels::quant::DequantizeBlockwise8(kernels::quant::DynamicMapSigned(), s.mq, s.ma, s.n, kBlock,
                                         out.data());
  } else {
    std::copy(s.m, s.m + s.n, out.begin());
  }
  return out;
}

std::vector<float> BnbAdamW::V(size_t i) const {
  const State& s = st_[i];
  std::vector<float> out((size_t)s.n);
  if (s.q) {
    kernels::quant::DequantizeBlockwise8(kernels::quant::DynamicMapUnsigned(), s.vq, s.va, s.n, kBlock,
                                         out.data());
  } else {
    std::copy(s.v, s.v + s.n, out.begin());
  }
  return out;
}

Result<std::unique_ptr<Optimizer>> MakeOptimizer(const TrainConfig& c) {
  const std::string& o = c.optim;
  if (o == "adamw_torch" || o == "adamw_hf" || o == "adamw_torch_fused") {
    return std::unique_ptr<Optimizer>(new AdamW(0.9, 0.999, 1e-8, c.weight_decay));
  }
  if (o == "sgd") return std::unique_ptr<Optimizer>(new Sgd(c.weight_decay));
  if (o != "adamw_8bit" && o != "paged_adamw_8bit" && o != "paged_adamw_32bit") {
    return Status::Error(
        "key 'optim': '" + o +
        "' is not one of adamw_torch, adamw_hf, adamw_torch_fused, adamw_8bit, paged_adamw_8bit, paged_adamw_32bit, sgd");
  }
  if (c.optim_resident_mb < 0) return Status::Error("key 'optim_resident_mb' must be >= 0");
  BnbAdamW::Options opt;
  opt.bits = o == "paged_adamw_32bit" ? 32 : 8;
  opt.weight_decay = c.weight_decay;
  if (o.rfind("paged_", 0) == 0) {
    std::string dir = c.output_dir;
    if (dir.empty() || access(dir.c_str(), W_OK) != 0) {
      const char* t = std::getenv("TMPDIR");
      dir = t && *t ? t : "/tmp";
    }
    auto pool = PagedStatePool::Create(dir, (size_t)c.optim_resident_mb << 20);
    if (!pool.ok()) return pool.status().WithContext("key 'optim': " + o);
    opt.pool = std::move(*pool);
  }
  return std::unique_ptr<Optimizer>(new BnbAdamW(std::move(opt)));
}

}  // namespace lathe::train
