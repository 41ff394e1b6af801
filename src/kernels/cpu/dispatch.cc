// Public kernel entry points (kernels.h): pick the best ISA tier once and forward to its table.
#include "kernels/cpu/dispatch.h"

#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/reference.h"
#include "kernels/kernels.h"

namespace lathe::kernels {

namespace cpu {
void RoundKvScalar(DType t, const float* x, int64_t n, uint16_t* out) {
  constexpr float kMax = 65504.0f;  // f16's largest finite value
  if (t == DType::kF16) {
    for (int64_t i = 0; i < n; ++i) out[i] = F32ToF16(x[i] > kMax ? kMax : x[i] < -kMax ? -kMax : x[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = F32ToBF16(x[i]);
  }
}
}  // namespace cpu

namespace cpu {

const KernelTable& KernelsFor(IsaTier tier) {
  switch (tier) {
    case IsaTier::kAvx512:
      return avx512::Table();
    case IsaTier::kAvx2:
      return avx2::Table();
    default:
      return scalar::Table();
  }
}

const KernelTable& Best() {
  static const KernelTable& t = KernelsFor(BestIsaTier());
  return t;
}

}  // namespace cpu

void MatMul(ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y, bool exact_activations) {
  cpu::MatMulWith(cpu::Best().mm, pool, x, M, w, y, exact_activations);
}

void MatMulBf16(ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y) {
  cpu::MatMulBf16With(cpu::Best().mm, pool, x, M, w, y);
}

bool MatMulBf16Rounds(const Tensor& w) {
  return cpu::Bf16DequantTakes(cpu::Best().mm, w);
}

void MatMulInt16(ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y) {
  cpu::MatMulInt16With(cpu::Best().mm, pool, x, M, w, y);
}

void MatMulRows(ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y, std::span<const RowRun> runs) {
  cpu::MatMulRowsWith(cpu::Best().mm, pool, x, M, w, y, runs);
}

void MatMulRowsShared(ThreadPool& pool, const float* x, int64_t M, std::span<const Tensor* const> ws,
                      std::span<float* const> ys, std::span<const RowRun> runs) {
  cpu::MatMulRowsSharedWith(cpu::Best().mm, pool, x, M, ws, ys, runs);
}

bool Int16PromptRowsDefault() {
  static const bool on = [] {
    // Where vdpbf16ps runs at its own rate (AMD Zen 4 / 5: twice the f32 FMA rate, as many multiply-adds per
    // instruction as the int16 form's two vpdpbusd passes take) the bf16 rows need no per-block float work:
    // SmolLM2 pp512 on Zen 5 1410-1460 vs 1190-1270 tok/s for the int16 rows (Q4_1 / Q8_0 / Q4_K_M, 1 thread,
    // bench/RESULTS.md). Where it runs on FMAs (Intel) or is absent (AVX2) the int16 rows are the faster form, except
    // where the bf16 rows run on AMX tiles (UsesAmxBf16: Xeons from Sapphire Rapids on).
    return !(UsesBf16Dot() && (!Bf16PairsOnFma() || UsesAmxBf16()));
  }();
  return on;
}

bool Int16PromptRows() {
  static const bool on = [] {  // the default only when not forced: it times vdpbf16ps against FMAs (Bf16PairsOnFma)
    const std::optional<bool> forced = EnvSwitch("LATHE_INT16_PROMPT");
    return forced ? *forced : Int16PromptRowsDefault();
  }();
  return on;
}

bool MatMulInt16Takes(const Tensor& w) { return Int16PromptRows() && cpu::Int16Takes(cpu::Best().mm, w); }

void MatMulShared(ThreadPool& pool, const float* x, int64_t M, std::span<const Tensor* const> ws,
                  std::span<float* const> ys, bool exact_activations) {
  cpu::MatMulSharedWith(cpu::Best().mm, pool, x, M, ws, ys, exact_activations);
}

size_t StripWeightBytes(DType t, int64_t N, int64_t K) {
  // BF16 rows padded to an even K (the pair strips' layout; the plain one leaves the pad unused).
  const int64_t k = t == DType::kBF16 ? (K + 1) / 2 * 2 : K;
  return (size_t)((N + 15) / 16) * 16 * (size_t)k * (t == DType::kF32 ? 4 : 2);
}

StripWeight PackStripWeight(ThreadPool& pool, const Tensor& w, void* out, bool bf16_dot) {
  if (bf16_dot && w.dtype == DType::kBF16) return cpu::PackStripWeightWith(cpu::Best().mm, pool, w, out);
  // The plain strips are the same bytes on every tier (a transpose): packed with the AVX2 table where the CPU has
  // it, asked of cpuid afresh, so that loading a model does not fix the tier its products will take (Best()).
  cpu::MatMulKernels mm =
      cpu::KernelsFor(DetectCpuFeatures().HasAvx2Tier() ? IsaTier::kAvx2 : IsaTier::kScalar).mm;
  mm.bf16_strips = nullptr;
  return cpu::PackStripWeightWith(mm, pool, w, out);
}

void MatMulStrips(ThreadPool& pool, const float* x, int64_t M, const StripWeight& w, float* y) {
  cpu::MatMulStripsWith(cpu::Best().mm, pool, x, M, w, y);
}

void MatMulStripsShared(ThreadPool& pool, const float* x, int64_t M, std::span<const StripWeight* const> ws,
                        std::span<float* const> ys) {
  cpu::MatMulStripsSharedWith(cpu::Best().mm, pool, x, M, ws, ys);
}

void DequantizeRows(const Tensor& w, int64_t row_begin, int64_t n_rows, float* out) {
  const int64_t K = w.shape.back();
  if (IsPackedQuant(w.dtype)) {
    quant::DequantPackedBlock(quant::QuantKernelsFor(BestIsaTier()), w, row_begin, n_rows, 0, K, out, K);
    return;
  }
  const size_t rb = w.row_bytes();
  cpu::Best().mm.dequant_rows(w.dtype, (const uint8_t*)w.data + row_begin * rb, rb, n_rows, K, out, K);
}

// Kept scalar: it must stay bit-identical to ggml's quantize_row_*_ref, and it is not hot.
void QuantizeRow(DType t, const float* x, int64_t n, void* out) { ref::QuantizeRow(t, x, n, out); }

void RmsNorm(const float* x, const float* w, float* out, int64_t T, int64_t C, float eps) {
  cpu::Best().rms_norm(x, w, out, T, C, eps);
}

void SiluMul(float* gate, const float* up, int64_t n) { cpu::Best().silu_mul(gate, up, n); }

float Dot(const float* a, const float* b, int64_t n) { return cpu::Best().dot(a, b, n); }

void Axpy(float* y, float a, const float* x, int64_t n) { cpu::Best().axpy(y, a, x, n); }

void Softmax(float* x, int64_t n) { cpu::Best().softmax(x, n); }
int64_t Argmax(const float* x, int64_t n) { return cpu::Best().argmax(x, n); }

void RoundKv(DType t, const float* x, int64_t n, void* out) {
  if (t == DType::kF32) {
    std::memcpy(out, x, n * sizeof(float));
    return;
  }
  LATHE_CHECK_MSG(t == DType::kF16 || t == DType::kBF16, "KV cache dtype %s: expected f32, f16 or bf16", DTypeName(t));
  const cpu::KernelTable& kt = cpu::Best();
  (kt.round_kv ? kt.round_kv : cpu::RoundKvScalar)(t, x, n, (uint16_t*)out);
}

void Attention(ThreadPool& pool, const float* q, int64_t q_stride, const float* k, const float* v,
               int64_t kv_stride, int64_t T, int64_t pos0, int n_head, int n_kv_head, int head_dim,
               float scale, float* out, int64_t out_stride) {
  cpu::AttentionWith(cpu::Best(), pool, q, q_stride, k, v, kv_stride, T, pos0, n_head, n_kv_head, head_dim,
                     scale, out, out_stride);
}

void GroupAttention(const float* q, int group, const float* k, const float* v, const int64_t* off,
                    int64_t n_pos, int head_dim, float scale, float* out, float* scores) {
  cpu::GroupAttentionWith(cpu::Best(), q, group, k, v, DType::kF32, off, n_pos, head_dim, scale, out, scores);
}

void GroupAttentionRows(const float* q, int64_t q_stride, int64_t n_tok, int group, const float* k, const float* v,
                        const int64_t* off, int64_t n_pos0, int head_dim, float scale, float* out,
                        int64_t out_stride, float* scores, int64_t window) {
  cpu::GroupAttentionRowsWith(cpu::Best(), q, q_stride, n_tok, group, k, v, DType::kF32, off, n_pos0, head_dim,
                              scale, out, out_stride, scores, window);
}

void GroupAttention(const float* q, int group, const void* k, const void* v, DType kv, const int64_t* off,
                    int64_t n_pos, int head_dim, float scale, float* out, float* scores) {
  cpu::GroupAttentionWith(cpu::Best(), q, group, k, v, kv, off, n_pos, head_dim, scale, out, scores);
}

void GroupAttentionRows(const float* q, int64_t q_stride, int64_t n_tok, int group, const void* k, const void* v,
                        DType kv, const int64_t* off, int64_t n_pos0, int head_dim, float scale, float* out,
                        int64_t out_stride, float* scores, int64_t window) {
  cpu::GroupAttentionRowsWith(cpu::Best(), q, q_stride, n_tok, group, k, v, kv, off, n_pos0, head_dim, scale, out,
                              out_stride, scores, window);
}

}  // namespace lathe::kernels
