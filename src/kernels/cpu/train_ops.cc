// Public entry points of the training ops (train_ops.h): tier dispatch, the scalar tier, and the
// memory-bound ops (RoPE, embedding) that have one portable implementation for every tier.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "kernels/cpu/bf16_amx.h"
#include "kernels/cpu/train_dispatch.h"
#include "kernels/cpu/train_reference.h"
#include "kernels/kernels.h"
#include "kernels/train_ops.h"

namespace lathe::kernels {

namespace cpu {

namespace scalar {
namespace {

void RmsNormForward(float* out, float* rstd, const float* x, const float* w, int64_t T, int64_t C, float eps) {
  train_ref::RmsNormForward<float>(out, rstd, x, w, T, C, eps);
}
void RmsNormBackward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                     int64_t T, int64_t C) {
  train_ref::RmsNormBackward<float>(dx, dw, dout, x, w, rstd, T, C);
}
void SwiGluForward(float* out, const float* gate, const float* up, int64_t n) {
  train_ref::SwiGluForward<float>(out, gate, up, n);
}
void SwiGluBackward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  train_ref::SwiGluBackward<float>(dgate, dup, dout, gate, up, n);
}

void GemmTile(const float* a, const float* b, int64_t ldb, int64_t L, float* c, int64_t ldc, int mr, int nc) {
  float acc[kGemmTileR][kGemmTileC] = {};
  for (int64_t l = 0; l < L; ++l)
    for (int i = 0; i < kGemmTileR; ++i)
      for (int j = 0; j < kGemmTileC; ++j) acc[i][j] += a[l * kGemmTileR + i] * b[l * ldb + j];
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nc; ++j) c[i * ldc + j] += acc[i][j];
}

void GemmTileRows(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t L, float* c, int64_t ldc, int mr,
                  int nc, bool overwrite) {
  float acc[kGemmTileR][kGemmTileC] = {};
  for (int64_t l = 0; l < L; ++l)
    for (int i = 0; i < mr; ++i)
      for (int j = 0; j < kGemmTileC; ++j) acc[i][j] += a[i * lda + l] * b[l * ldb + j];
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nc; ++j) c[i * ldc + j] = (overwrite ? 0.0f : c[i * ldc + j]) + acc[i][j];
}

float LogSumExp(const float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp((double)x[i] - m);
  return m + (float)std::log(s);
}

void ExpShiftScale(float* x, int64_t n, float shift, float scale) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i] - shift) * scale;
}

float RowMax(const float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

float ExpShiftSum(float* x, int64_t n, float shift) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += (x[i] = std::exp(x[i] - shift));
  return s;
}

void SoftmaxGrad(float* ds, const float* p, int64_t n, float delta, float scale) {
  for (int64_t i = 0; i < n; ++i) ds[i] = p[i] * (ds[i] - delta) * scale;
}

void RoundBf16(float* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = BF16ToF32(F32ToBF16(x[i]));
}

void ToBf16(uint16_t* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = F32ToBF16(x[i]);
}

void FromBf16(float* out, const uint16_t* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = BF16ToF32(h[i]);
}

void PackStripT(float* bs, int64_t ldo, const float* src, int64_t ld, int64_t nl, int nj) {
  for (int64_t l = 0; l < nl; ++l)
    for (int j = 0; j < kGemmTileC; ++j) bs[l * ldo + j] = j < nj ? src[j * ld + l] : 0.0f;
}

void ColMax(float* m, const float* row, int64_t n) {
  for (int64_t j = 0; j < n; ++j) m[j] = std::max(m[j], row[j]);
}

void ColExpSum(float* s, const float* row, const float* m, int64_t n) {
  for (int64_t j = 0; j < n; ++j) s[j] += std::exp(row[j] - m[j]);
}

void ColExpScale(float* row, const float* shift, float scale, int64_t n) {
  for (int64_t j = 0; j < n; ++j) row[j] = std::exp(row[j] - shift[j]) * scale;
}

LATHE_NO_FP_CONTRACT void AdamWUpdate(float* p, float* m, float* v, const float* g, int64_t n, const AdamWCoefs& k) {
  const float one_b1 = 1.0f - k.b1, one_b2 = 1.0f - k.b2;
  for (int64_t j = 0; j < n; ++j) {
    p[j] *= k.decay;
    m[j] += (g[j] - m[j]) * one_b1;
    v[j] = v[j] * k.b2 + one_b2 * g[j] * g[j];
    const float denom = std::sqrt(v[j]) / k.bc2_sqrt + k.eps;
    p[j] -= k.step_size * (m[j] / denom);
  }
}

// GemmTileRows' arithmetic for one C element at a time: a chunk's products added in order from 0,
// then 0 + the first chunk (the overwrite store) and + each later one.
void ChainGemv(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const float* x, int64_t ldx, int m, int64_t K,
               int64_t inner, float* y, int64_t ldy) {
  auto at = [t](const uint8_t* row, int64_t l) {
    if (t == DType::kF32) return ((const float*)row)[l];
    const uint16_t h = ((const uint16_t*)row)[l];
    return t == DType::kBF16 ? BF16ToF32(h) : F16ToF32(h);
  };
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = w + r * rb;
    for (int i = 0; i < m; ++i) {
      const float* xi = x + i * ldx;
      float total = 0.0f;
      for (int64_t l0 = 0; l0 < K; l0 += inner) {
        float acc = 0.0f;
        for (int64_t l = l0; l < std::min(K, l0 + inner); ++l) acc += xi[l] * at(row, l);
        total = total + acc;
      }
      y[i * ldy + r] = total;
    }
  }
}

void StripGemv(DType t, const uint8_t* strips, int64_t n_strips, int64_t K, int64_t inner, const float* x,
               int64_t ldx, int m, float* y, int64_t ldy, int64_t n_cols) {
  const size_t el = t == DType::kF32 ? 4 : 2;
  auto at = [t](const uint8_t* p) {
    if (t == DType::kF32) return *(const float*)p;
    const uint16_t h = *(const uint16_t*)p;
    return t == DType::kBF16 ? BF16ToF32(h) : F16ToF32(h);
  };
  for (int64_t s = 0; s < n_strips; ++s) {
    const uint8_t* strip = strips + (size_t)s * K * kGemmTileC * el;
    for (int j = 0; j < kGemmTileC && s * kGemmTileC + j < n_cols; ++j) {
      for (int i = 0; i < m; ++i) {
        const float* xi = x + i * ldx;
        float total = 0.0f;
        for (int64_t l0 = 0; l0 < K; l0 += inner) {
          float acc = 0.0f;
          for (int64_t l = l0; l < std::min(K, l0 + inner); ++l) acc += xi[l] * at(strip + (l * kGemmTileC + j) * el);
          total = total + acc;
        }
        y[i * ldy + s * kGemmTileC + j] = total;
      }
    }
  }
}

}  // namespace

const TrainKernelTable& TrainTable() {
  static const TrainKernelTable t = [] {
    TrainKernelTable k = {IsaTier::kScalar, RmsNormForward, RmsNormBackward, SwiGluForward,
                          SwiGluBackward, GemmTile, GemmTileRows, LogSumExp, ExpShiftScale, RowMax,
                          ExpShiftSum, SoftmaxGrad, RoundBf16, PackStripT, ColMax, ColExpSum,
                          ColExpScale, AdamWUpdate};
    k.chain_gemv = ChainGemv;
    k.strip_gemv = StripGemv;
    k.to_bf16 = ToBf16;
    k.from_bf16 = FromBf16;
    return k;
  }();
  return t;
}

}  // namespace scalar

const TrainKernelTable& TrainKernelsFor(IsaTier tier) {
  switch (tier) {
    case IsaTier::kAvx512:
      return avx512::TrainTable();
    case IsaTier::kAvx2:
      return avx2::TrainTable();
    default:
      return scalar::TrainTable();
  }
}

const TrainKernelTable& TrainBest() {
  static const TrainKernelTable& t = TrainKernelsFor(BestIsaTier());
  return t;
}

}  // namespace cpu

void RmsNormForward(float* out, float* rstd, const float* x, const float* w, int64_t T, int64_t C, float eps) {
  cpu::TrainBest().rmsnorm_forward(out, rstd, x, w, T, C, eps);
}

void RmsNormBackward(float* dx, float* dw_accum, const float* dout, const float* x, const float* w,
                     const float* rstd, int64_t T, int64_t C) {
  cpu::TrainBest().rmsnorm_backward(dx, dw_accum, dout, x, w, rstd, T, C);
}

void SwiGluForward(float* out, const float* gate, const float* up, int64_t n) {
  cpu::TrainBest().swiglu_forward(out, gate, up, n);
}

void SwiGluBackward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  cpu::TrainBest().swiglu_backward(dgate, dup, dout, gate, up, n);
}

void RoundToBf16(float* out, const float* x, int64_t n) { cpu::TrainBest().round_bf16(out, x, n); }
void ToBf16(uint16_t* out, const float* x, int64_t n) { cpu::TrainBest().to_bf16(out, x, n); }
void FromBf16(float* out, const uint16_t* h, int64_t n) { cpu::TrainBest().from_bf16(out, h, n); }

void AdamWUpdate(float* p, float* m, float* v, const float* g, int64_t n, const AdamWCoefs& k) {
  cpu::TrainBest().adamw_update(p, m, v, g, n, k);
}

namespace {

// Rotation by +theta (sign 1) or its transpose (sign -1). Reads both elements of a pair before
// writing either, so out may alias x.
void RopeRotate(float* out, const float* x, const float* cos, const float* sin, int64_t T, int n_head,
                int head_dim, RopeLayout layout, float sign) {
  LATHE_CHECK(head_dim % 2 == 0);
  const int half = head_dim / 2;
  for (int64_t t = 0; t < T; ++t) {
    const float* ct = cos + t * half;
    const float* st = sin + t * half;
    for (int h = 0; h < n_head; ++h) {
      const int64_t base = (t * n_head + h) * (int64_t)head_dim;
      const float* xi = x + base;
      float* oi = out + base;
      if (layout == RopeLayout::kInterleaved) {
        for (int i = 0; i < half; ++i) {
          const float a = xi[2 * i], b = xi[2 * i + 1], c = ct[i], s = sign * st[i];
          oi[2 * i] = a * c - b * s;
          oi[2 * i + 1] = a * s + b * c;
        }
      } else {
        for (int i = 0; i < half; ++i) {
          const float a = xi[i], b = xi[i + half], c = ct[i], s = sign * st[i];
          oi[i] = a * c - b * s;
          oi[i + half] = a * s + b * c;
        }
      }
    }
  }
}

}  // namespace

void RopeForward(float* out, const float* x, const float* cos, const float* sin, int64_t T, int n_head,
                 int head_dim, RopeLayout layout) {
  RopeRotate(out, x, cos, sin, T, n_head, head_dim, layout, 1.0f);
}

void RopeBackward(float* dx, const float* dout, const float* cos, const float* sin, int64_t T, int n_head,
                  int head_dim, RopeLayout layout) {
  RopeRotate(dx, dout, cos, sin, T, n_head, head_dim, layout, -1.0f);
}

void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, int64_t T, int64_t C) {
  for (int64_t t = 0; t < T; ++t) std::memcpy(out + t * C, wte + (int64_t)tokens[t] * C, sizeof(float) * C);
}

void EmbeddingBackward(float* dwte_accum, const float* dout, const int32_t* tokens, int64_t T, int64_t C) {
  for (int64_t t = 0; t < T; ++t) {
    float* row = dwte_accum + (int64_t)tokens[t] * C;
    const float* d = dout + t * C;
    for (int64_t c = 0; c < C; ++c) row[c] += d[c];
  }
}

void LinearForward(ThreadPool& pool, float* y, const float* x, int64_t M, const Tensor& w, bool accumulate) {
  if (w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16) {
    cpu::MatMulForwardWith(cpu::TrainBest(), cpu::Best(), pool, y, x, M, w, accumulate);
    return;
  }
  LATHE_CHECK_MSG(!accumulate, "LinearForward: accumulate needs an f32/f16/bf16 weight, not %s", DTypeName(w.dtype));
  MatMul(pool, x, M, w, y, /*exact_activations=*/true);
}

void MatMulBackwardInput(ThreadPool& pool, float* dx, const float* dy, int64_t M, const Tensor& w, bool accumulate) {
  cpu::MatMulBackwardInputWith(cpu::TrainBest(), cpu::Best(), pool, dx, dy, M, w, accumulate);
}

void MatMulBackwardWeight(ThreadPool& pool, float* dw_accum, const float* dy, const float* x, int64_t M, int64_t N,
                          int64_t K) {
  cpu::MatMulBackwardWeightWith(cpu::TrainBest(), pool, dw_accum, dy, x, M, N, K);
}

bool LinearPlusFused(int64_t Kd, int64_t L, int64_t L2) { return cpu::PlusFusedWith(cpu::TrainBest(), Kd, L, L2); }

void LinearForwardPlus(ThreadPool& pool, float* y, const float* x, int64_t M, const Tensor& w, const float* x2,
                       const Tensor& w2, bool accumulate) {
  cpu::MatMulForwardPlusWith(cpu::TrainBest(), cpu::Best().mm, pool, y, x, M, w, x2, w2, accumulate);
}

void MatMulBackwardInputPlus(ThreadPool& pool, float* dx, const float* dy, int64_t M, const Tensor& w, const float* dy2,
                             const Tensor& w2, bool accumulate) {
  cpu::MatMulBackwardInputPlusWith(cpu::TrainBest(), cpu::Best(), pool, dx, dy, M, w, dy2, w2, accumulate);
}

bool LoraGradPair(ThreadPool& pool, float* dmid, float* dB, const float* dy, const float* smid, const Tensor& b,
                  int64_t M) {
  if (b.ndim() != 2 || b.dtype != DType::kF32) return false;
  return cpu::LoraGradPairWith(cpu::TrainBest(), pool, dmid, dB, dy, smid, (const float*)b.data, M, b.shape[0],
                               b.shape[1]);
}

bool LoraGradA(ThreadPool& pool, float* dA, const float* dmid, const float* x, int64_t M, int64_t K, int64_t r) {
  return cpu::LoraGradAWith(cpu::TrainBest(), pool, dA, dmid, x, M, K, r);
}

int64_t LoraGradPairFloats(int64_t out) { return cpu::TrainBest().lora_grad_pair ? 16 * out : 0; }

void LinearForwardBf16(ThreadPool& pool, float* y, const float* x, int64_t M, const Tensor& w, bool accumulate) {
  LATHE_CHECK(UsesBf16Dot() && w.ndim() == 2);
  cpu::avx512bf16::TrainForward(pool, y, x, M, w, accumulate);
}

void MatMulBackwardInputBf16(ThreadPool& pool, float* dx, const float* dy, int64_t M, const Tensor& w,
                             bool accumulate) {
  LATHE_CHECK(UsesBf16Dot() && w.ndim() == 2);
  cpu::avx512bf16::TrainBackwardInput(pool, dx, dy, M, w, accumulate);
}

void LinearForwardBf16Plus(ThreadPool& pool, float* y, const float* x, int64_t M, const Tensor& w, const float* x2,
                           const Tensor& w2, bool accumulate) {
  LATHE_CHECK(UsesBf16Dot() && w.ndim() == 2 && w2.ndim() == 2);
  cpu::avx512bf16::TrainForwardPlus(pool, y, x, M, w, x2, w2, accumulate);
}

void MatMulBackwardInputBf16Plus(ThreadPool& pool, float* dx, const float* dy, int64_t M, const Tensor& w,
                                 const float* dy2, const Tensor& w2, bool accumulate) {
  LATHE_CHECK(UsesBf16Dot() && w.ndim() == 2 && w2.ndim() == 2);
  cpu::avx512bf16::TrainBackwardInputPlus(pool, dx, dy, M, w, dy2, w2, accumulate);
}

void LoraForwardBf16(ThreadPool& pool, float* y, float* mid, const float* x, int64_t M, const Tensor& w,
                     const Tensor& a, const Tensor& b, const std::function<const float*(float*)>& second,
                     bool accumulate) {
  LATHE_CHECK(UsesBf16Dot() && w.ndim() == 2 && a.ndim() == 2 && b.ndim() == 2);
  cpu::avx512bf16::TrainLoraForward(pool, y, mid, x, M, w, a, b, second, accumulate);
}

void LoraBackwardInputBf16(ThreadPool& pool, float* dx, float* dmid, const float* dy, int64_t M, const Tensor& w,
                           const Tensor& b, const Tensor& a, const std::function<const float*(float*)>& second,
                           bool accumulate) {
  LATHE_CHECK(UsesBf16Dot() && w.ndim() == 2 && a.ndim() == 2 && b.ndim() == 2);
  cpu::avx512bf16::TrainLoraBackwardInput(pool, dx, dmid, dy, M, w, b, a, second, accumulate);
}

void MatMulBackwardWeightBf16(ThreadPool& pool, float* dw_accum, const float* dy, const float* x, int64_t M,
                              int64_t N, int64_t K) {
  LATHE_CHECK(UsesBf16Dot());
  cpu::avx512bf16::TrainBackwardWeight(pool, dw_accum, dy, x, M, N, K);
}

float CrossEntropyForward(ThreadPool& pool, const float* x, int64_t T, const Tensor& w_head, const int32_t* labels,
                          float normalizer, int64_t chunk_tokens, bool bf16) {
  return cpu::CrossEntropyWith(cpu::TrainBest(), cpu::Best(), pool, nullptr, nullptr, x, T, w_head, labels,
                               normalizer, 1.0f, chunk_tokens, nullptr, bf16 && UsesBf16Dot());
}

void PackForBackwardInput(ThreadPool& pool, const Tensor& w, PackedBackwardB* out) {
  LATHE_CHECK(w.ndim() == 2);
  out->N = w.shape[0];
  out->K = w.shape[1];
  out->data.resize((size_t)cpu::PackedBackwardInputFloats(out->N, out->K));
  cpu::PackForBackwardInputWith(cpu::TrainBest(), cpu::Best(), pool, w, out->data.data());
  out->src = w.data;
}

int64_t TrainGemmAPanelFloats(int64_t R, int64_t Kd, int64_t L, bool a_rows_contiguous, bool prepacked_b) {
  return cpu::GemmAPanelFloatsWith(cpu::TrainBest(), R, Kd, L, a_rows_contiguous, prepacked_b);
}

int64_t TrainGemmBPanelFloats(int64_t Kd, int64_t L, int64_t col_align) {
  return cpu::GemmBPanelFloatsWith(cpu::TrainBest(), Kd, L, col_align);
}

int64_t TrainGemmThreadFloats(int64_t max_inner, bool converts_w, int64_t col_align) {
  return cpu::GemmThreadFloats(cpu::TrainBest(), max_inner, converts_w, col_align);
}

void PackForBackwardInputBf16(ThreadPool& pool, const Tensor& w, PackedBackwardB* out) {
  LATHE_CHECK(UsesBf16Dot() && w.ndim() == 2 && w.dtype == DType::kBF16);
  out->N = w.shape[0];
  out->K = w.shape[1];
  out->data.clear();
  out->data.shrink_to_fit();
  out->pairs.resize((size_t)cpu::avx512bf16::PairStripsRowsDwords(out->N, out->K));
  cpu::avx512bf16::PackPairsAlongRows(pool, w, out->pairs.data());
  out->src = w.data;
}

int64_t PackedBackwardBPairBytes(int64_t N, int64_t K) { return cpu::avx512bf16::PairStripsRowsDwords(N, K) * 4; }

int64_t PackedBackwardBBytes(int64_t N, int64_t K) { return cpu::PackedBackwardInputFloats(N, K) * (int64_t)sizeof(float); }

float CrossEntropyBackward(ThreadPool& pool, float* dx, float* dw_head_accum, const float* x, int64_t T,
                           const Tensor& w_head, const int32_t* labels, float normalizer, float dloss,
                           int64_t chunk_tokens, const PackedBackwardB* packed_head, bool bf16,
                           HeadGradParts* head_grad_parts) {
  LATHE_CHECK(head_grad_parts == nullptr || dw_head_accum != nullptr || HeadGradCanWait(w_head, bf16));
  const float* packed = nullptr;
  const uint32_t* pairs = nullptr;
  if (packed_head) {
    LATHE_CHECK(packed_head->src == w_head.data && packed_head->N == w_head.shape[0] &&
                packed_head->K == w_head.shape[1]);
    if (!packed_head->pairs.empty()) {
      LATHE_CHECK_MSG(bf16 && UsesBf16Dot(), "CrossEntropyBackward: a head packed in bf16 pairs needs bf16 mode");
      pairs = packed_head->pairs.data();
    } else {
      packed = packed_head->data.data();
    }
  }
  return cpu::CrossEntropyWith(cpu::TrainBest(), cpu::Best(), pool, dx, dw_head_accum, x, T, w_head, labels,
                               normalizer, dloss, chunk_tokens, packed, bf16 && UsesBf16Dot(), pairs,
                               head_grad_parts);
}

bool HeadGradCanWait(const Tensor& w_head, bool bf16) {
  return bf16 && UsesBf16Dot() && w_head.ndim() == 2 && w_head.shape[1] % 2 == 0;
}

void AddHeadGrad(ThreadPool& pool, float* dw_head_accum, const HeadGradParts& parts) {
  int64_t a_off = 0, b_off = 0;
  for (int64_t n : parts.tokens) {  // each chunk's product, in order (as CrossEntropyBackward given dw)
    const int64_t np = (n + 1) / 2;
    cpu::avx512bf16::HeadWeightGradFromPairs(pool, dw_head_accum, np, parts.V, parts.C, parts.a.data() + a_off,
                                             parts.b.data() + b_off, parts.tiled);
    a_off += cpu::HeadGradBlockDwords(parts.V, np, parts.tiled);
    b_off += (parts.C + 15) / 16 * 16 * np;
  }
}

int64_t HeadGradPartsBytes(int64_t V, int64_t C, int64_t tokens, int64_t chunk_tokens) {
  if (chunk_tokens <= 0 || tokens <= 0) return 0;
  // The chunk CrossEntropyWith takes: at most the tokens themselves.
  const int64_t ct = std::min(chunk_tokens, tokens);
  int64_t a = 0, b = 0;
  cpu::HeadGradPartsDwords(V, C, tokens, ct, UsesBf16Dot() && cpu::avx512bf16::HeadGradTiled(ct), &a, &b);
  return 4 * (a + b);
}

void FlashAttentionForward(ThreadPool& pool, float* out, float* lse, const float* q, const float* k, const float* v,
                           const int32_t* segment_ids, int64_t T, int n_head, int n_kv_head, int head_dim,
                           float scale, int64_t window) {
  cpu::FlashAttentionForwardWith(cpu::TrainBest(), cpu::Best(), pool, out, lse, q, k, v, segment_ids, T, n_head,
                                 n_kv_head, head_dim, scale, window);
}

void FlashAttentionBackward(ThreadPool& pool, float* dq, float* dk, float* dv, const float* dout, const float* q,
                            const float* k, const float* v, const float* out, const float* lse,
                            const int32_t* segment_ids, int64_t T, int n_head, int n_kv_head, int head_dim,
                            float scale, int64_t window) {
  cpu::FlashAttentionBackwardWith(cpu::TrainBest(), cpu::Best(), pool, dq, dk, dv, dout, q, k, v, out, lse,
                                  segment_ids, T, n_head, n_kv_head, head_dim, scale, window);
}

void FlashAttentionForwardBf16(ThreadPool& pool, float* out, float* lse, const float* q, const float* k, const float* v,
                               const int32_t* segment_ids, int64_t T, int n_head, int n_kv_head, int head_dim,
                               float scale, int64_t window) {
  LATHE_CHECK(UsesBf16Dot());
  cpu::avx512bf16::FlashAttentionForward(cpu::TrainBest(), pool, out, lse, q, k, v, segment_ids, T, n_head, n_kv_head,
                                         head_dim, scale, window);
}

void FlashAttentionBackwardBf16(ThreadPool& pool, float* dq, float* dk, float* dv, const float* dout, const float* q,
                                const float* k, const float* v, const float* out, const float* lse,
                                const int32_t* segment_ids, int64_t T, int n_head, int n_kv_head, int head_dim,
                                float scale, int64_t window) {
  LATHE_CHECK(UsesBf16Dot());
  cpu::avx512bf16::FlashAttentionBackward(cpu::TrainBest(), cpu::Best(), pool, dq, dk, dv, dout, q, k, v, out, lse,
                                          segment_ids, T, n_head, n_kv_head, head_dim, scale, window);
}

int64_t FlashAttentionBf16Bytes(int64_t T, int n_head, int n_kv_head, int head_dim) {
  return cpu::avx512bf16::FlashAttentionPairsBytes(T, n_head, n_kv_head, head_dim);
}

}  // namespace lathe::kernels
