// The CPU op kernels the model calls. Each op has a scalar reference (kernels/cpu/reference.h)
// and may have AVX2 / AVX-512 paths chosen at run time (core/cpu.h); all paths agree with the
// reference within the per-op error limits in tests/ops.
// Shapes in PyTorch order, row-major. Pointers must not alias unless stated.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace lathe::kernels {

// y(M, N) = x(M, K) . W(N, K)^T, with W = w in its stored dtype (f32, f16, bf16, q8_0, q4_0,
// q4_1); K = w.shape[1], N = w.shape[0]. Runs on `pool` (must not be called from inside a
// ParallelFor of the same pool). Never materializes a dequantized W (the prefill path dequantizes
// a few rows at a time into a per-thread buffer).
// Accuracy: for a block-quantized W, x is quantized to int8 blocks of 32 (as llama.cpp does), ~0.6 %
// relative error vs the f32 reference, unless exact_activations (then, and for float W, f32
// arithmetic; only the summation order differs; MatMulInt16 / MatMulBf16 are the prompt rows' int16 / bf16
// forms). With int8 x, every row of y is identical to that
// row computed alone (M = 1), for any M: batch composition does not change a row (AVX2 and AVX-512:
// the GEMV up to 16 rows and the int8 GEMM above; scalar: the batched GEMV at every M).
// Reuses per-thread scratch buffers: no heap allocation after the first call at a given size.
void MatMul(ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y,
            bool exact_activations = false);

// Prompt rows of a block-quantized W (Q8_0, Q4_*, Q5_*, K-quants) on CPUs with the bf16 dot product
// (UsesBf16Dot, core/cpu.h): y = bf16(x) . bf16(W)^T with f32 sums (x and each dequantized weight rounded
// to bf16, as a BF16 model's prompt rows round x), W dequantized a few strips at a time; a row's result
// does not depend on M. Elsewhere (other CPUs, float or packed-quant W) MatMul(..., exact_activations =
// true). MatMulBf16Rounds(w): whether this W takes the bf16 arithmetic here.
void MatMulBf16(ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y);
bool MatMulBf16Rounds(const Tensor& w);

// Prompt rows of Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q4_K / Q5_K weights on the AVX2 and AVX-512 tiers: x quantized to
// int16 per block of 32 (cpu::BlockQ16X: ~2^-16 of the block's amax per element) times W's integer codes, exact
// int32 block sums (AVX-512 VNNI: the int8 dot-product instructions in two passes; AVX2: vpmaddwd on the codes
// widened to int16), one fma per block: the int8 GEMM's arithmetic with 256x finer x, the same bits on both tiers,
// more multiply-adds per cycle than the f32 FMA path. A row's result does not depend on M.
// MatMulInt16Takes(w): whether this CPU and w take it (else MatMulBf16 / MatMul(..., true)): Int16PromptRows() and
// a weight the tier's int16 GEMM has.
void MatMulInt16(ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y);
bool MatMulInt16Takes(const Tensor& w);
// Whether prompt rows take the int16 form on this CPU: yes unless vdpbf16ps runs at its own rate (UsesBf16Dot() and
// not Bf16PairsOnFma(): AMD Zen 4 / 5) or the bf16 rows run on AMX tiles (UsesAmxBf16), where the bf16 rows
// (MatMulBf16) are faster. LATHE_INT16_PROMPT=0 / 1
// forces one (A/B runs, tests); Int16PromptRowsDefault() is the policy's choice whatever the variable says.
bool Int16PromptRows();
bool Int16PromptRowsDefault();
// A step's rows in runs of one precision: sampled rows (int16 = false) take MatMul's int8 activations, prompt
// rows MatMulInt16's int16 ones, every row with the bits it gets in those calls; where both kinds are present
// they share one pass over W. REQUIRES MatMulInt16Takes(w) and the runs' n_rows to add up to M.
struct RowRun {
  int64_t n_rows = 0;
  bool int16 = false;
};
void MatMulRows(ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y, std::span<const RowRun> runs);
// MatMulRows for weights that share x (each MatMulInt16Takes): bit for bit one call per weight, x quantized once.
void MatMulRowsShared(ThreadPool& pool, const float* x, int64_t M, std::span<const Tensor* const> ws,
                      std::span<float* const> ys, std::span<const RowRun> runs);

// ys[i](M, N_i) = x(M, K) . ws[i](N_i, K)^T for weights that share x (q/k/v, gate/up): bit for bit
// the results of one MatMul per weight. Where every one of those calls would take the M = 1 GEMV
// path, they run as one pool job instead (x quantized once, the weights' rows split together), so
// the small matrices do not each pay a dispatch and a short, half-parallel memory stream.
void MatMulShared(ThreadPool& pool, const float* x, int64_t M, std::span<const Tensor* const> ws,
                  std::span<float* const> ys, bool exact_activations = false);

// A float weight W (N, K) (f32, f16 or bf16) repacked for y = x . W^T: 16-row strips, each stored
// l-major (strip s's element (l, j) = W(16 s + j, l) at element (s * K + l) * 16 + j; rows past N zero),
// in W's dtype. Decode reads a strip as one sequential stream with no transposes, and the GEMM takes
// f32 strips as its packed operand (nothing packed per call).
// BF16 weights on CPUs with avx512_bf16 are packed in pair strips instead (bf16_pairs: strip s's
// element pair (2p, 2p + 1) of row 16 s + j as one dword at (s * Kp + p) * 16 + j, Kp = (K + 1) / 2, an odd
// K's last pair zero-padded) and multiplied with vdpbf16ps: x rounded to bf16, the arithmetic of
// cpu::Bf16PairsReference, the same for every M (a row's result still does not depend on its batch).
struct StripWeight {
  DType dtype = DType::kF32;
  int64_t N = 0, K = 0;
  const void* data = nullptr;
  bool bf16_pairs = false;
};
size_t StripWeightBytes(DType t, int64_t N, int64_t K);
// Packs w (2-D, f32 / f16 / bf16) into out (StripWeightBytes bytes) and returns the view of it.
// bf16_dot = false keeps a BF16 W in plain strips (f32 arithmetic, x not rounded) on any CPU.
StripWeight PackStripWeight(ThreadPool& pool, const Tensor& w, void* out, bool bf16_dot = true);
// y(M, N) = x(M, K) . W^T from the strips, every element with the training GEMM's arithmetic (one
// FMA chain per inner chunk, chunks added in order: LinearForward on the unpacked W gives the same
// bits), whatever M: a row's result does not depend on what it is batched with (below
// cpu::kStripGemvMaxM rows the strip GEMV, from it on the GEMM).
void MatMulStrips(ThreadPool& pool, const float* x, int64_t M, const StripWeight& w, float* y);
// ys[i](M, N_i) = x(M, K) . ws[i]^T for strip weights that share x (q / k / v, gate / up): bit for bit one
// MatMulStrips per weight; prompt rows of plain strips pack x for the GEMM once for all of them.
void MatMulStripsShared(ThreadPool& pool, const float* x, int64_t M, std::span<const StripWeight* const> ws,
                        std::span<float* const> ys);

// out(n_rows, K) = dequantize(w[row_begin : row_begin + n_rows]) for a 2-D w of any dtype.
void DequantizeRows(const Tensor& w, int64_t row_begin, int64_t n_rows, float* out);

// Quantizes n floats (n a multiple of the block size) into t's layout, GGML-compatible rounding.
void QuantizeRow(DType t, const float* x, int64_t n, void* out);

// out(T, C) = x / sqrt(mean(x^2) + eps) * w, per row. out may alias x.
void RmsNorm(const float* x, const float* w, float* out, int64_t T, int64_t C, float eps);

// gate(n) = silu(gate) * up, in place.
void SiluMul(float* gate, const float* up, int64_t n);

// Dot product and y += a * x.
float Dot(const float* a, const float* b, int64_t n);
void Axpy(float* y, float a, const float* x, int64_t n);

// In-place softmax over n values (max-subtracted).
void Softmax(float* x, int64_t n);

// The index std::max_element(x, x + n) returns: the first of the largest values (n >= 1, n < 2^31; a NaN
// never compares larger, and a NaN x[0] stays the answer). Greedy sampling and the logit refinement over
// the vocabulary.
int64_t Argmax(const float* x, int64_t n);

// n floats rounded to a KV cache's element type t (f32: copied; f16: round to nearest even, saturating at
// +-65504 instead of overflowing to inf, NaN as sign | 0x7e00; bf16: round to nearest even, NaN quieted),
// written to out (n elements of t). Every tier gives the scalar form's bits.
void RoundKv(DType t, const float* x, int64_t n, void* out);

// Causal multi-head attention with grouped-query KV heads, for T query tokens at positions
// pos0 .. pos0 + T - 1 attending to key/value positions 0 .. (own position):
//   out[t, h] = sum_s softmax_s(scale * q[t, h] . k[s, g]) v[s, g],  g = h / (n_head / n_kv_head).
// q: (T, n_head, head_dim), rows q_stride floats apart; k, v: (pos0 + T, n_kv_head, head_dim), rows
// kv_stride floats apart (the KV cache, already holding the T new tokens); out: (T, n_head,
// head_dim), rows out_stride floats apart. REQUIRES n_head % n_kv_head == 0. Runs on `pool` over
// (token, head) pairs; out must not alias q, k or v.
void Attention(ThreadPool& pool, const float* q, int64_t q_stride, const float* k, const float* v,
               int64_t kv_stride, int64_t T, int64_t pos0, int n_head, int n_kv_head, int head_dim,
               float scale, float* out, int64_t out_stride);

// One token's attention over a paged KV cache: `group` query heads sharing one KV head,
//   out[h] = sum_p softmax_p(scale * q[h] . k_p) v_p,  p < n_pos,  k_p = k + off[p], v_p = v + off[p]
// (off from the block table; K and V share the layout). q, out: group * head_dim floats; scores:
// n_pos floats of scratch. Single-threaded (callers parallelize over sequences and heads); the
// result depends only on these arguments, not on any batch.
void GroupAttention(const float* q, int group, const float* k, const float* v, const int64_t* off,
                    int64_t n_pos, int head_dim, float scale, float* out, float* scores);

// GroupAttention for n_tok consecutive tokens of one sequence: token t (query heads at
// q + t * q_stride, output at out + t * out_stride) attends to positions [lo, n_pos0 + t], lo = 0,
// or with a sliding window (window > 0) lo = max(0, n_pos0 + t + 1 - window). Each token's result
// is bit-identical to GroupAttention over off + lo with n_pos = n_pos0 + t + 1 - lo; while lo = 0
// the K/V rows are walked in position blocks shared by all the tokens (prefill). scores: n_tok *
// group * (n_pos0 + n_tok) floats of scratch.
void GroupAttentionRows(const float* q, int64_t q_stride, int64_t n_tok, int group, const float* k, const float* v,
                        const int64_t* off, int64_t n_pos0, int head_dim, float scale, float* out,
                        int64_t out_stride, float* scores, int64_t window = 0);

// GroupAttention / GroupAttentionRows over a KV cache of dtype kv: f32, f16 or bf16 elements (k, v
// point at them; off counts elements). Each element is widened to f32 exactly and the arithmetic is
// the f32 form's, so the result equals the f32 call on the widened values, bit for bit.
void GroupAttention(const float* q, int group, const void* k, const void* v, DType kv, const int64_t* off,
                    int64_t n_pos, int head_dim, float scale, float* out, float* scores);
void GroupAttentionRows(const float* q, int64_t q_stride, int64_t n_tok, int group, const void* k, const void* v,
                        DType kv, const int64_t* off, int64_t n_pos0, int head_dim, float scale, float* out,
                        int64_t out_stride, float* scores, int64_t window = 0);

}  // namespace lathe::kernels
