// Training ops for `lathe train`: forward functions that save what their backward needs, and the
// matching explicit backward (llm.c style, no autograd). Scalar references: kernels/cpu/train_reference.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"

namespace lathe::kernels {

// Conventions: shapes in PyTorch order, row-major, contiguous. A backward that takes `*_accum`
// adds into it (the caller zeroes it once per step); every other output is overwritten. Output
// pointers must not alias inputs unless stated. Functions without a pool run on the caller.

// ---- RMSNorm ----
// out = x * rstd * w, rstd[t] = 1 / sqrt(mean_c(x[t, c]^2) + eps).
void RmsNormForward(float* out,       // (T, C)
                    float* rstd,      // (T) saved for the backward
                    const float* x,   // (T, C)
                    const float* w,   // (C)
                    int64_t T, int64_t C, float eps);
void RmsNormBackward(float* dx,           // (T, C) overwritten
                     float* dw_accum,     // (C) += sum_t dout * x * rstd
                     const float* dout,   // (T, C)
                     const float* x,      // (T, C)
                     const float* w,      // (C)
                     const float* rstd,   // (T) from RmsNormForward
                     int64_t T, int64_t C);

// ---- SwiGLU ----  out = silu(gate) * up, silu(g) = g * sigmoid(g).
void SwiGluForward(float* out,         // (n)   may alias gate or up
                   const float* gate,  // (n)
                   const float* up,    // (n)
                   int64_t n);
void SwiGluBackward(float* dgate,       // (n) overwritten; may alias dout
                    float* dup,         // (n) overwritten
                    const float* dout,  // (n)
                    const float* gate,  // (n)
                    const float* up,    // (n)
                    int64_t n);

// ---- bf16 rounding (mixed precision matmul inputs) ----
// out[i] = BF16ToF32(F32ToBF16(x[i])): round to nearest even, NaN stays NaN. out may alias x.
void RoundToBf16(float* out, const float* x, int64_t n);
// bf16 copies of saved activations (bf16 mode keeps q / k / v / attention output / gate / up that way):
// out[i] = F32ToBF16(x[i]) (round to nearest even, NaN -> quiet NaN), and back, exactly: out[i] = BF16ToF32(h[i]).
void ToBf16(uint16_t* out, const float* x, int64_t n);
void FromBf16(float* out, const uint16_t* h, int64_t n);

// ---- AdamW ----
// torch.optim.AdamW's single-tensor f32 update of n elements, element by element in torch's order:
// p *= decay; m += (g - m) * (1 - b1) (lerp); v = v * b2 + (1 - b2) * g * g;
// p -= step_size * (m / (sqrt(v) / bc2_sqrt + eps)). Every tier gives the same bits (no FMA
// contraction; sqrt and division are correctly rounded in each).
struct AdamWCoefs {
  float decay, b1, b2, step_size, bc2_sqrt, eps;
};
void AdamWUpdate(float* p, float* m, float* v, const float* g, int64_t n, const AdamWCoefs& k);

// ---- RoPE ----
// kInterleaved rotates pairs (x[2i], x[2i+1]) (Meta llama, llama2.c); kHalfSplit rotates
// (x[i], x[i + D/2]) (Hugging Face rotate_half). Pair i of token t uses angle cos[t, i], sin[t, i]:
// the tables hold one row per token, so packed samples just restart their positions.
enum class RopeLayout { kInterleaved, kHalfSplit };
void RopeForward(float* out,         // (T, n_head, head_dim) may alias x
                 const float* x,     // (T, n_head, head_dim)
                 const float* cos,   // (T, head_dim / 2)
                 const float* sin,   // (T, head_dim / 2)
                 int64_t T, int n_head, int head_dim, RopeLayout layout);
// The transpose rotation (angle -theta). dx may alias dout.
void RopeBackward(float* dx,          // (T, n_head, head_dim)
                  const float* dout,  // (T, n_head, head_dim)
                  const float* cos,   // (T, head_dim / 2)
                  const float* sin,   // (T, head_dim / 2)
                  int64_t T, int n_head, int head_dim, RopeLayout layout);

// ---- Token embedding ----
void EmbeddingForward(float* out,            // (T, C)
                      const int32_t* tokens, // (T) in [0, V)
                      const float* wte,      // (V, C)
                      int64_t T, int64_t C);
// Scatter-add: dwte[tokens[t]] += dout[t]. Repeated tokens accumulate.
void EmbeddingBackward(float* dwte_accum,       // (V, C)
                       const float* dout,       // (T, C)
                       const int32_t* tokens,   // (T) in [0, V)
                       int64_t T, int64_t C);

// ---- Linear layer y = x . W^T (kernels::MatMul) ----
// y = x . W^T for the trainer: f32/f16/bf16 W through the training GEMM (W packed once per call for
// all M rows; also fast for the skinny LoRA shapes, K or N = rank), other dtypes through MatMul
// with exact activations. y is overwritten, or added to with accumulate (f32/f16/bf16 W only).
void LinearForward(ThreadPool& pool,
                   float* y,          // (M, N)
                   const float* x,    // (M, K)
                   int64_t M,
                   const Tensor& w,   // (N, K)
                   bool accumulate = false);
// dx = dy . W with W read in its stored dtype (f32, f16, bf16, q8_0, q4_0, q4_1): one GEMM panel of
// W (at most 768 x 768) is dequantized at a time into a per-thread buffer, never the whole matrix.
// REQUIRES K % 32 == 0 for the block-quantized dtypes. dx is overwritten unless accumulate.
void MatMulBackwardInput(ThreadPool& pool,
                         float* dx,         // (M, K)
                         const float* dy,   // (M, N)
                         int64_t M,
                         const Tensor& w,   // (N, K) any dtype
                         bool accumulate = false);
// dw += dy^T . x, f32.
void MatMulBackwardWeight(ThreadPool& pool,
                          float* dw_accum,   // (N, K)
                          const float* dy,   // (M, N)
                          const float* x,    // (M, K)
                          int64_t M, int64_t N, int64_t K);

// bf16 mixed precision's products on vdpbf16ps, for CPUs where UsesBf16Dot() (core/cpu.h): every operand
// is taken as bf16 (f32 arrays must hold bf16 values, as the trainer's rounded activations and
// gradients do; an f32 W is rounded to bf16 as it is packed, as torch's autocast casts it). Per element
// the pair arithmetic of cpu::Bf16PairsReference over the inner dimension (x W^T: K; dY W: N; dY^T X:
// M): f32 sums of the exact bf16 products, pairs odd element first. REQUIRES UsesBf16Dot(). W f32 or bf16
// (read in place), or any dtype DequantizeRows reads (f16, GGUF blocks, NF4 / FP4 / int8 bases): dequantized
// 16 rows at a time into a per-thread buffer and rounded as packed, the bits of the same call on
// bf16(dequantized W) as a BF16 tensor.
void LinearForwardBf16(ThreadPool& pool, float* y, const float* x, int64_t M, const Tensor& w,
                       bool accumulate = false);
void MatMulBackwardInputBf16(ThreadPool& pool, float* dx, const float* dy, int64_t M, const Tensor& w,
                             bool accumulate = false);
void MatMulBackwardWeightBf16(ThreadPool& pool, float* dw_accum, const float* dy, const float* x, int64_t M,
                              int64_t N, int64_t K);
// Two products summed in one: y (M, N) (=, +=) x . W^T + x2 . W2^T (W (N, K), W2 (N, K2)) and dx (M, K)
// (=, +=) dy . W + dy2 . W2 (W (N, K), W2 (N2, K)), the inner dimensions concatenated (x's pairs then x2's;
// each output one pair chain over both, chunked by Bf16PairsChunk of the total): LoRA's rank-r update
// (x2 = scale * x A^T, W2 = B; dy2 = scale * dy B, W2 = A) inside the base product, with no second pass
// over y or dx. REQUIRES UsesBf16Dot(); W, W2 as in LinearForwardBf16.
void LinearForwardBf16Plus(ThreadPool& pool, float* y, const float* x, int64_t M, const Tensor& w, const float* x2,
                           const Tensor& w2, bool accumulate = false);
void MatMulBackwardInputBf16Plus(ThreadPool& pool, float* dx, const float* dy, int64_t M, const Tensor& w,
                                 const float* dy2, const Tensor& w2, bool accumulate = false);
// A LoRA linear without dropout, its rank-r product and the fused one over a single packing of x (dy):
// forward mid (M, r) = x . A^T, then y (=, +=) x . W^T + second(mid) . B^T; backward dmid (M, r) = dy . B,
// then dx (=, +=) dy . W + second(dmid) . A. second(mid) gives the rank-r operand (LoRA: scale * the
// rounded mid; may rewrite mid in place). Bits: mid of LinearForwardBf16 (dmid of MatMulBackwardInputBf16),
// y of LinearForwardBf16Plus on second(mid) (dx of MatMulBackwardInputBf16Plus). REQUIRES UsesBf16Dot();
// W (N, K), A (r, K), B (N, r) as in LinearForwardBf16.
void LoraForwardBf16(ThreadPool& pool, float* y, float* mid, const float* x, int64_t M, const Tensor& w,
                     const Tensor& a, const Tensor& b, const std::function<const float*(float*)>& second,
                     bool accumulate = false);
void LoraBackwardInputBf16(ThreadPool& pool, float* dx, float* dmid, const float* dy, int64_t M, const Tensor& w,
                           const Tensor& b, const Tensor& a, const std::function<const float*(float*)>& second,
                           bool accumulate = false);

// The same two products summed in one in f32 (the training GEMM): y (M, N) (=, +=) x . W^T + x2 . W2^T and dx (M, K)
// (=, +=) dy . W + dy2 . W2, W2 f32, the inner dimensions concatenated (x's then x2's, each output one FMA chain per
// inner chunk of the total): LoRA's rank-r update inside the base product in f32 mode, with no second pass over
// y or dx (the pass that product costs is most of it: its inner dimension is the rank). Only where
// LinearPlusFused(output columns, W's inner dimension, W2's) holds: CPUs with the GEMM's panel tile (AVX-512), W
// f32 / f16 / bf16 for the forward (any dtype MatMulBackwardInput takes for the input gradient), and no more
// inner chunks than W's alone; elsewhere the caller runs the two products.
bool LinearPlusFused(int64_t Kd, int64_t L, int64_t L2);
void LinearForwardPlus(ThreadPool& pool, float* y, const float* x, int64_t M, const Tensor& w, const float* x2,
                       const Tensor& w2, bool accumulate = false);
void MatMulBackwardInputPlus(ThreadPool& pool, float* dx, const float* dy, int64_t M, const Tensor& w, const float* dy2,
                             const Tensor& w2, bool accumulate = false);

// LoRA's backward over dy (M, out) in f32: dmid (M, r) = dy . B and dB (out, r) += dy^T . smid in one pass over dy,
// bit for bit MatMulBackwardInput(dmid, dy, B) and MatMulBackwardWeight(dB, dy, smid). Runs where the CPU's kernels
// have it (AVX-512), 1 <= r <= 16 and the pool has one thread (a row-group worker's); returns false (nothing
// written) elsewhere, and the caller runs the two products. LoraGradPairFloats: its scratch per thread (floats).
bool LoraGradPair(ThreadPool& pool, float* dmid, float* dB, const float* dy, const float* smid, const Tensor& b,
                  int64_t M);
int64_t LoraGradPairFloats(int64_t out);
// LoRA's dA (r, K) += dmid^T . x in f32 with x read in place (no packed copy), bit for bit MatMulBackwardWeight(dA,
// dmid, x, M, r, K). Runs where the CPU's kernels have it (AVX-512) and 1 <= r <= 16; false (nothing written)
// elsewhere.
bool LoraGradA(ThreadPool& pool, float* dA, const float* dmid, const float* x, int64_t M, int64_t K, int64_t r);

// A weight W (N, K) that does not change between calls (a frozen output head), packed once as the
// B operand of dX = dY . W: MatMulBackwardInput / CrossEntropyBackward given it skip re-packing W on
// every call and return bit-identical results. f32 whatever W's dtype: ~4 * N * K bytes.
struct PackedBackwardB {
  std::vector<float> data;
  // Instead of data, for a bf16 W where UsesBf16Dot(): W as bf16 pairs along N (16-column strips of
  // (N + 1) / 2 dwords), the B operand of the loss's dx on vdpbf16ps (CrossEntropyBackward with bf16).
  std::vector<uint32_t> pairs;
  const void* src = nullptr;  // w.data it was packed from (nullptr: empty)
  int64_t N = 0, K = 0;
};
void PackForBackwardInput(ThreadPool& pool, const Tensor& w, PackedBackwardB* out);
int64_t PackedBackwardBBytes(int64_t N, int64_t K);
// The pairs form (REQUIRES UsesBf16Dot(), w bf16): half the bytes of the f32 one.
void PackForBackwardInputBf16(ThreadPool& pool, const Tensor& w, PackedBackwardB* out);
int64_t PackedBackwardBPairBytes(int64_t N, int64_t K);

// Floats of the A micro-panels the calling thread packs for one training GEMM with this process's
// kernels (0 on tiers without a panel tile; at most 1 Mi): C (R x Kd) = A (R x L) . B, A's rows
// contiguous (the forward and input gradient) or not (the weight gradient, A = dY^T); prepacked_b:
// B given packed (the frozen head's input gradient). For the memory plan.
int64_t TrainGemmAPanelFloats(int64_t R, int64_t Kd, int64_t L, bool a_rows_contiguous, bool prepacked_b);
// Floats of the B panels the calling thread packs for such a GEMM, C (. x Kd) over an inner dimension
// L, whichever path takes it (0 when B comes prepacked; at most 1 Mi); col_align: the quantization
// block of a W whose columns are B's (the input gradient through a quantized weight), else 1.
int64_t TrainGemmBPanelFloats(int64_t Kd, int64_t L, int64_t col_align);
// Floats of each thread's own GEMM buffers at most (few-rows strips, A tiles, converted B panels and
// W rows, split chunks' partial tiles) over products whose inner dimensions and rows are at most max_inner;
// converts_w: some W is not f32
// (f16 / bf16 / quantized) and is converted panel by panel, its columns aligned to col_align.
int64_t TrainGemmThreadFloats(int64_t max_inner, bool converts_w, int64_t col_align);

// ---- Cross-entropy over the output head ----
// logits[t] = x[t] . W_head^T is computed chunk_tokens rows at a time and never stored whole.
// Tokens with labels[t] == kIgnoreLabel are skipped entirely (no logits computed for them).
// loss = sum over the other t of (logsumexp(logits[t]) - logits[t, labels[t]]) / normalizer.
// REQUIRES labels[t] in [0, V) or kIgnoreLabel; normalizer > 0.
constexpr int32_t kIgnoreLabel = -100;
float CrossEntropyForward(ThreadPool& pool,
                          const float* x,          // (T, C) final hidden states (after the norm)
                          int64_t T,
                          const Tensor& w_head,    // (V, C) any dtype MatMul takes
                          const int32_t* labels,   // (T)
                          float normalizer, int64_t chunk_tokens = 128, bool bf16 = false);
struct HeadGradParts;  // below
// Recomputes each chunk's logits, so it needs nothing saved from the forward, and returns the same
// loss: one call per training step is enough. dx = dloss * d loss / d x (overwritten, zero rows
// for ignored tokens); dw_head_accum += dloss * d loss / d W_head when not null.
float CrossEntropyBackward(ThreadPool& pool,
                           float* dx,                // (T, C)
                           float* dw_head_accum,     // (V, C) f32 or nullptr
                           const float* x,           // (T, C)
                           int64_t T,
                           const Tensor& w_head,     // (V, C)
                           const int32_t* labels,    // (T)
                           float normalizer, float dloss = 1.0f, int64_t chunk_tokens = 128,
                           const PackedBackwardB* packed_head = nullptr,  // of w_head, or nullptr
                           bool bf16 = false,
                           HeadGradParts* head_grad_parts = nullptr);  // see below
// The loss's head gradient on the bf16 path (HeadGradCanWait(w_head, bf16): any head dtype, C even) is one product
// per chunk from the chunk's bf16 pairs (the softmax gradient's and x's), added into dw_head_accum in chunk order.
// head_grad_parts with dw_head_accum given: the storage of one chunk's pairs (reused call after call; null: the
// call's own). With dw_head_accum null: the call returns the loss and dx and keeps every chunk's pairs there;
// AddHeadGrad then adds the same products in the same order (the bits of the direct call). For full fine-tuning
// on several row-group workers, which add into the head's gradient in group order: a group's dx never waits for
// the earlier groups' losses. (The f32 path would keep 4 bytes per logit.) Holds (V + C rounded up to 16) x 2
// bytes per labelled token (HeadGradPartsBytes); one chunk's: ~12.6 MB for SmolLM2 at 128 tokens.
struct HeadGradParts {
  std::vector<uint32_t> a, b;   // each chunk's dlogits^T pairs (V x n/2) and x pairs (C/16 strips x n/2), one block
                                // after another
  std::vector<int64_t> tokens;  // each chunk's token count
  int64_t V = 0, C = 0;
  bool tiled = false;           // a in the AMX tiles' order (V rounded to 32 rows, the pairs to 16)
};
bool HeadGradCanWait(const Tensor& w_head, bool bf16);
void AddHeadGrad(ThreadPool& pool, float* dw_head_accum, const HeadGradParts& parts);
// Bytes of HeadGradParts for `tokens` labelled tokens in chunks of chunk_tokens (tiled where the CPU's products would
// keep a in tile order).
int64_t HeadGradPartsBytes(int64_t V, int64_t C, int64_t tokens, int64_t chunk_tokens);
// bf16 (bf16 mixed precision, where UsesBf16Dot(); C even): the head's logits on vdpbf16ps, its values rounded to
// bf16 (a bf16 head as stored; f32 rows rounded as they are read, other dtypes dequantized first: the bits of a
// bf16 copy, as autocast casts it), x rounded to bf16 and the pair arithmetic over C (Bf16PairsReference);
// dw_head from the softmax gradient rounded to bf16 (pairs over the tokens); dx from pairs over the vocabulary
// (packed_head's pairs, else the head's rows paired a chunk at a time). The softmax stays f32.

// ---- Causal grouped-query attention for training (flash style) ----
// out[t, h] = sum_s softmax_s(scale * q[t, h] . k[s, g]) v[s, g] over s <= t with
// segment_ids[s] == segment_ids[t] (all s <= t when segment_ids is null) and, with a sliding
// window (window > 0), s > t - window; g = h / (n_head / n_kv_head).
// Tiled online softmax: no T x T matrix is ever stored; the forward saves only out and the
// per-row logsumexp, and the backward recomputes scores tile by tile in one pass (tasks of a query
// head and a run of key tiles fixed by T; per-task gradient parts summed in a fixed order, so the
// result does not depend on the thread count).
// REQUIRES n_head % n_kv_head == 0; tensors contiguous. Runs on `pool`.
void FlashAttentionForward(ThreadPool& pool,
                           float* out,                  // (T, n_head, head_dim)
                           float* lse,                  // (T, n_head) saved for the backward
                           const float* q,              // (T, n_head, head_dim)
                           const float* k,              // (T, n_kv_head, head_dim)
                           const float* v,              // (T, n_kv_head, head_dim)
                           const int32_t* segment_ids,  // (T) or nullptr
                           int64_t T, int n_head, int n_kv_head, int head_dim, float scale, int64_t window = 0);
// dq, dk, dv are overwritten.
void FlashAttentionBackward(ThreadPool& pool,
                            float* dq,                   // (T, n_head, head_dim)
                            float* dk,                   // (T, n_kv_head, head_dim)
                            float* dv,                   // (T, n_kv_head, head_dim)
                            const float* dout,           // (T, n_head, head_dim)
                            const float* q,              // (T, n_head, head_dim)
                            const float* k,              // (T, n_kv_head, head_dim)
                            const float* v,              // (T, n_kv_head, head_dim)
                            const float* out,            // (T, n_head, head_dim) from the forward
                            const float* lse,            // (T, n_head) from the forward
                            const int32_t* segment_ids,  // (T) or nullptr
                            int64_t T, int n_head, int n_kv_head, int head_dim, float scale, int64_t window = 0);
// bf16 mixed precision (REQUIRES UsesBf16Dot()): the same attention with its six products on vdpbf16ps,
// as autocast runs SDPA on bf16 q / k / v: q, k, v and dout rounded to bf16 (round to nearest even), the
// probabilities P and the score gradient dS rounded to bf16 before the products that take them, every
// product summed in f32; scores scaled in f32 after their product; the softmax and the outputs stay f32, the
// backward's row term is delta = bf16(dout) . out (the dO the products take, so a row's dS sums to zero).
// Same tasks and order as the f32 form: the result does not depend on the thread count.
void FlashAttentionForwardBf16(ThreadPool& pool, float* out, float* lse, const float* q, const float* k, const float* v,
                               const int32_t* segment_ids, int64_t T, int n_head, int n_kv_head, int head_dim,
                               float scale, int64_t window = 0);
void FlashAttentionBackwardBf16(ThreadPool& pool, float* dq, float* dk, float* dv, const float* dout, const float* q,
                                const float* k, const float* v, const float* out, const float* lse,
                                const int32_t* segment_ids, int64_t T, int n_head, int n_kv_head, int head_dim,
                                float scale, int64_t window = 0);
// Bytes of the bf16 operand pairs the calling thread keeps for one backward call (its per-call packs).
int64_t FlashAttentionBf16Bytes(int64_t T, int n_head, int n_kv_head, int head_dim);
// The training attention's key tiles (128 keys) and the backward's runs of them (at most 4, fixed by T: the
// tasks and the dQ partials, one per run after the first).
constexpr int64_t kAttentionKeyTile = 128;
constexpr int64_t kAttentionBackwardRuns = 4;
inline int64_t AttentionBackwardRuns(int64_t T) {
  return std::min<int64_t>((T + kAttentionKeyTile - 1) / kAttentionKeyTile, kAttentionBackwardRuns);
}
// Grouped heads (n_head > n_kv_head) on threads enough for it: the backward's tasks are (run, kv head), their
// query heads' key tiles summed in head order as each ends; else (run, head) tasks into per-head dK / dV
// (n_head x T x head_dim floats each, the calling thread's) summed per kv head at the end. The same bits.
inline bool AttentionBackwardByGroup(int64_t T, int n_head, int n_kv_head, int threads) {
  return n_head > n_kv_head && AttentionBackwardRuns(T) * n_kv_head >= 4 * (int64_t)std::max(threads, 1);
}
// Floats of dK / dV the backward keeps: each pool thread's key tiles (2 x 128 x head_dim per head of its task)
// + the calling thread's per-head parts; the memory plan's figure.
inline int64_t AttentionBackwardKeyFloats(int64_t T, int n_head, int n_kv_head, int head_dim, int threads) {
  const bool grouped = AttentionBackwardByGroup(T, n_head, n_kv_head, threads);
  const int64_t heads_per_task = grouped ? n_head / n_kv_head : 1;
  const int64_t parts = n_head > n_kv_head && !grouped ? 2 * (int64_t)n_head * T * head_dim : 0;
  return (int64_t)std::max(threads, 1) * 2 * heads_per_task * kAttentionKeyTile * head_dim + parts;
}

}  // namespace lathe::kernels
