// Per-ISA tables for the training ops (train_ops.h). Tests call a tier's table and the *With
// drivers directly so the scalar and AVX2 paths are both exercised on one machine.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "core/cpu.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/train_ops.h"

namespace lathe::kernels::cpu {

// Multiplies and adds stay separate in a function so marked (GCC contracts them into FMAs in files
// built with -mfma; clang does not fuse across intrinsic calls). For kernels whose tiers must give
// the same bits as the scalar one.
#if defined(__GNUC__) && !defined(__clang__)
#define LATHE_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define LATHE_NO_FP_CONTRACT
#endif

// GEMM register tile shared by every tier, so packing and blocking live once in train_matmul.cc.
constexpr int kGemmTileR = 6;   // rows of C per tile
constexpr int kGemmTileC = 16;  // columns of C per tile
// Whether the f32 GEMM's panel path splits its inner chunks into L1-sized sub-chunks (train_matmul.cc says why: on
// Intel's cores); LATHE_GEMM_SUBCHUNKS=0 / 1 forces one (the op tests run both). GemmSubChunksDefault(): the CPU's
// own choice whatever the variable says.
bool GemmSubChunks();
bool GemmSubChunksDefault();

struct TrainKernelTable {
  IsaTier tier;
  void (*rmsnorm_forward)(float* out, float* rstd, const float* x, const float* w, int64_t T, int64_t C,
                          float eps);
  void (*rmsnorm_backward)(float* dx, float* dw, const float* dout, const float* x, const float* w,
                           const float* rstd, int64_t T, int64_t C);
  void (*swiglu_forward)(float* out, const float* gate, const float* up, int64_t n);
  void (*swiglu_backward)(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                          int64_t n);
  // c[i * ldc + j] += sum_l a[l * kGemmTileR + i] * b[l * ldb + j] for i < mr, j < nc.
  // a: (L, kGemmTileR) packed panel; b: kGemmTileC floats per l, ldb floats apart (kGemmTileC for a
  // packed strip, a row stride to read a row-major matrix in place). All 16 floats of every b row are
  // read (padding lanes may hold anything).
  void (*gemm_tile)(const float* a, const float* b, int64_t ldb, int64_t L, float* c, int64_t ldc, int mr, int nc);
  // The same with A read in place from rows lda floats apart: c[i * ldc + j] (+)= sum_l a[i * lda + l]
  // * b[l * ldb + j] for i < mr, j < nc (rows >= mr are not read); overwrite stores instead of adding.
  void (*gemm_tile_rows)(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t L, float* c,
                         int64_t ldc, int mr, int nc, bool overwrite);
  // log(sum_i exp(x[i])), max-subtracted. n >= 1.
  float (*logsumexp)(const float* x, int64_t n);
  // x[i] = exp(x[i] - shift) * scale.
  void (*exp_shift_scale)(float* x, int64_t n, float shift, float scale);
  // Attention row helpers. row_max: max of x[0..n), n >= 1. exp_shift_sum: x[i] = exp(x[i] - shift),
  // returns their sum. softmax_grad: ds[i] = p[i] * (ds[i] - delta) * scale.
  float (*row_max)(const float* x, int64_t n);
  float (*exp_shift_sum)(float* x, int64_t n, float shift);
  void (*softmax_grad)(float* ds, const float* p, int64_t n, float delta, float scale);
  // out[i] = BF16ToF32(F32ToBF16(x[i])) bit for bit (round to nearest even, NaN -> quiet NaN).
  void (*round_bf16)(float* out, const float* x, int64_t n);
  // One kGemmTileC-column B strip of a transposed source (the forward's W^T): bs[l * ldo + j] =
  // src[j * ld + l] for l < nl, j < nj, and 0 for nj <= j < 16. 1 <= nj <= 16, ldo >= 16 (16: a plain
  // strip; the panel tile's width: one strip of an interleaved micro-panel).
  void (*pack_strip_t)(float* bs, int64_t ldo, const float* src, int64_t ld, int64_t nl, int nj);
  // Column-wise softmax helpers over a row of a (V, n) logits^T chunk (train_xent.cc), one lane per
  // column: col_max: m[j] = max(m[j], row[j]); col_exp_sum: s[j] += exp(row[j] - m[j]);
  // col_exp_scale: row[j] = exp(row[j] - shift[j]) * scale. j < n.
  void (*col_max)(float* m, const float* row, int64_t n);
  void (*col_exp_sum)(float* s, const float* row, const float* m, int64_t n);
  void (*col_exp_scale)(float* row, const float* shift, float scale, int64_t n);
  // AdamWUpdate (train_ops.h), n elements.
  void (*adamw_update)(float* p, float* m, float* v, const float* g, int64_t n, const AdamWCoefs& k);
  // gemm_tile / gemm_tile_rows two strips wide (null on tiers without them: GemmStrips below then
  // calls the one-strip kernels): columns 0-15 from b, 16-31 from b2, 16 < nc <= 32. Every C element
  // gets the same FMAs in the same order as in the one-strip kernels of the AVX2 tier.
  void (*gemm_tile2)(const float* a, const float* b, const float* b2, int64_t ldb, int64_t L, float* c, int64_t ldc,
                     int mr, int nc) = nullptr;
  void (*gemm_tile_rows2)(const float* a, int64_t lda, const float* b, const float* b2, int64_t ldb, int64_t L,
                          float* c, int64_t ldc, int mr, int nc, bool overwrite) = nullptr;
  // A larger register tile over a packed A micro-panel of panel_rows rows (null / 0 on tiers without
  // one; the GEMM driver then runs the 6 x 16 tiles): c[i * ldc + j] (+)= sum_l a[l * panel_rows + i] *
  // B(l, j) for i < mr <= panel_rows, j < nc <= panel_cols, B(l, j) = b[(j / 16) * stride + l * ldb +
  // j % 16] (16-column strips, whole strips read: padding lanes may hold anything); overwrite stores
  // instead of adding. Per C element the FMAs and their order are those of gemm_tile, so the driver's
  // results do not depend on which kernel ran. A chain split over several calls (l ranges in order):
  // pin (non-null) starts the sums from a partial tile instead of zero, pout (non-null) stores them
  // there instead of into c; a partial tile is panel_rows x panel_cols floats (row i at i * panel_cols),
  // stored and reloaded as is, so the split gives the bits of one call.
  void (*gemm_panel)(const float* a, const float* b, int64_t stride, int64_t ldb, int64_t L, float* c, int64_t ldc,
                     int mr, int nc, bool overwrite, const float* pin, float* pout) = nullptr;
  // gemm_panel with A's rows read in place (row i at a + i * lda; rows past mr alias row mr - 1 and are
  // not stored), for the products the driver does not pack A for (fewer than kPanelMinCols columns).
  void (*gemm_panel_rows)(const float* a, int64_t lda, const float* b, int64_t stride, int64_t ldb, int64_t L,
                          float* c, int64_t ldc, int mr, int nc, bool overwrite, const float* pin,
                          float* pout) = nullptr;
  // out[l * panel_rows + i] = a[i * lda + l] for i < mr, l < nl; 0 for mr <= i < panel_rows.
  void (*pack_panel_rows)(float* out, const float* a, int64_t lda, int64_t nl, int mr) = nullptr;
  int panel_rows = 0;
  int panel_cols = 0;
  // The forward's product for a few x rows straight from W's rows (decode; MatMulWith below the GEMM's
  // rows): y[i * ldy + r] = sum over W's inner chunks of `inner` columns (GemmInnerChunk(K)), in order,
  // of one chain per chunk over l of x[i * ldx + l] * W(r, l), for r < n_rows, i < m (1 <= m <= 4);
  // W rows at w, rb bytes apart, dtype t in {f32, f16, bf16}. Per element the same multiplies, adds and
  // their order as the GEMM driver's y = x W^T (MatMulForwardWith) on the same tier, so a row's result
  // does not depend on how many rows went with it or which path took them.
  void (*chain_gemv)(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const float* x, int64_t ldx, int m,
                     int64_t K, int64_t inner, float* y, int64_t ldy) = nullptr;
  // The same products from W packed in 16-row strips (kernels::StripWeight: strip s's element (l, j) =
  // W(16 s + j, l) at ((s * K + l) * 16 + j) elements from `strips`, dtype t in {f32, f16, bf16}): one
  // sequential stream per strip, no transposes. y[i * ldy + 16 s + j] for 16 s + j < n_cols,
  // s < n_strips, i < m (1 <= m <= 4); the GEMM's arithmetic per element, as chain_gemv.
  void (*strip_gemv)(DType t, const uint8_t* strips, int64_t n_strips, int64_t K, int64_t inner, const float* x,
                     int64_t ldx, int m, float* y, int64_t ldy, int64_t n_cols) = nullptr;
  // LoRA's two rank-r products over dy in one pass (1 <= r <= 16; null on tiers without it): dmid (M, r) = dy . B,
  // one chain per chunk of out_chunk columns of dy, the chunks' sums added in order (MatMulBackwardInput's bits with
  // B (out, r) as its W), and dB (out, r) += dy^T . smid, one chain per chunk of tok_chunk tokens, each added to dB
  // as 0 + chain (MatMulBackwardWeight's few-rows bits). acc: out x 16 floats of scratch.
  void (*lora_grad_pair)(float* dmid, float* dB, const float* dy, const float* smid, const float* B, int64_t M,
                         int64_t out, int r, int64_t out_chunk, int64_t tok_chunk, float* acc) = nullptr;
  // LoRA's dA (r, K) += dmid^T . x for x's columns [k0, k1) (1 <= r <= 16; null on tiers without it), x read in
  // place (M rows, K floats apart): one chain per chunk of tok_chunk tokens, each added to dA (MatMulBackwardWeight's
  // few-rows bits).
  void (*lora_grad_a)(float* dA, const float* dmid, const float* x, int64_t M, int64_t K, int r, int64_t k0, int64_t k1,
                      int64_t tok_chunk) = nullptr;
  // out[i] = F32ToBF16(x[i]) / out[i] = BF16ToF32(h[i]) bit for bit (kernels::ToBf16 / FromBf16).
  void (*to_bf16)(uint16_t* out, const float* x, int64_t n) = nullptr;
  void (*from_bf16)(float* out, const uint16_t* h, int64_t n) = nullptr;
};

// c(mr, nc) (+)= a tile times the B strips covering columns [0, nc) (strip s at b + s * stride, rows
// ldb apart): two strips per call where the tier has gemm_tile2, else one (same results either way).
inline void GemmStrips(const TrainKernelTable& tk, const float* a, const float* b, int64_t stride, int64_t ldb,
                       int64_t L, float* c, int64_t ldc, int mr, int64_t nc) {
  int64_t j0 = 0, s = 0;
  if (tk.gemm_tile2)
    for (; j0 + kGemmTileC < nc; j0 += 2 * kGemmTileC, s += 2)
      tk.gemm_tile2(a, b + s * stride, b + (s + 1) * stride, ldb, L, c + j0, ldc, mr,
                    (int)std::min<int64_t>(2 * kGemmTileC, nc - j0));
  for (; j0 < nc; j0 += kGemmTileC, ++s)
    tk.gemm_tile(a, b + s * stride, ldb, L, c + j0, ldc, mr, (int)std::min<int64_t>(kGemmTileC, nc - j0));
}

// The same with A's rows read in place (gemm_tile_rows).
inline void GemmStripsRows(const TrainKernelTable& tk, const float* a, int64_t lda, const float* b, int64_t stride,
                           int64_t ldb, int64_t L, float* c, int64_t ldc, int mr, int64_t nc, bool overwrite) {
  int64_t j0 = 0, s = 0;
  if (tk.gemm_tile_rows2)
    for (; j0 + kGemmTileC < nc; j0 += 2 * kGemmTileC, s += 2)
      tk.gemm_tile_rows2(a, lda, b + s * stride, b + (s + 1) * stride, ldb, L, c + j0, ldc, mr,
                         (int)std::min<int64_t>(2 * kGemmTileC, nc - j0), overwrite);
  for (; j0 < nc; j0 += kGemmTileC, ++s)
    tk.gemm_tile_rows(a, lda, b + s * stride, ldb, L, c + j0, ldc, mr, (int)std::min<int64_t>(kGemmTileC, nc - j0),
                      overwrite);
}

// The table for a tier. REQUIRES CPU support.
const TrainKernelTable& TrainKernelsFor(IsaTier tier);
const TrainKernelTable& TrainBest();

// MatMulBackwardInput / MatMulBackwardWeight with one tier's tables (train_matmul.cc).
// packed: w already packed by PackForBackwardInputWith (then nothing is packed per call; the result is
// bit-identical), or nullptr.
void MatMulBackwardInputWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dx,
                             const float* dy, int64_t M, const Tensor& w, bool accumulate,
                             const float* packed = nullptr);
// W (N, K), any dtype MatMulBackwardInputWith takes, as f32 16-column strips over all N rows (the B
// operand of dX = dY . W for every call): PackedBackwardInputFloats(N, K) floats at out.
int64_t PackedBackwardInputFloats(int64_t N, int64_t K);
// The same product with dY given transposed: dx (M, K) = dyT^T . W, dyT (N, M) (the loss's logits^T
// chunk). Each dx element sums the same products in the same order as MatMulBackwardInputWith would.
void MatMulBackwardInputTWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dx,
                              const float* dyT, int64_t M, const Tensor& w, bool accumulate,
                              const float* packed = nullptr);
void PackForBackwardInputWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, const Tensor& w,
                              float* out);
// The floats the calling thread's shared GEMM panels hold (their high-water marks: A's micro-panels and B's
// panels, which the caller packs and the pool's threads read), for tests that the memory plan's bounds
// (GemmAPanelFloatsWith / GemmBPanelFloatsWith) cover what the GEMM takes.
struct GemmSharedFloats {
  int64_t a = 0, b = 0;
};
GemmSharedFloats GemmSharedPanelFloats();
// TrainGemmAPanelFloats (train_ops.h) for one tier's table.
int64_t GemmAPanelFloatsWith(const TrainKernelTable& tk, int64_t R, int64_t Kd, int64_t L, bool a_rows_contiguous,
                             bool prepacked_b);
// TrainGemmBPanelFloats / TrainGemmThreadFloats (train_ops.h).
int64_t GemmBPanelFloatsWith(const TrainKernelTable& tk, int64_t Kd, int64_t L, int64_t col_align);
int64_t GemmThreadFloats(const TrainKernelTable& tk, int64_t max_inner, bool converts_w, int64_t col_align);
// y (=, or += with accumulate) x . W^T (M x N) for W (N, K) in f32 / f16 / bf16 or a GGML block type
// (dequantized into the packed strips) through the same GEMM (train_matmul.cc).
void MatMulForwardWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* y,
                       const float* x, int64_t M, const Tensor& w, bool accumulate = false);
void MatMulForwardMm(const TrainKernelTable& tk, const MatMulKernels& mm, ThreadPool& pool, float* y,
                     const float* x, int64_t M, const Tensor& w, bool accumulate = false);
// y = x . W^T (M x N) from W in 16-row strips (kernels::StripWeight) through the same GEMM: f32 strips
// are its packed B as they are, f16 / bf16 ones converted a panel at a time. Bit-identical to
// MatMulForwardWith on the unpacked W.
void MatMulForwardStrips(const TrainKernelTable& tk, const MatMulKernels& mm, ThreadPool& pool, float* y,
                         const float* x, int64_t M, DType t, const void* strips, int64_t N, int64_t K);
// The "plus" products (train_ops.h LinearForwardPlus / MatMulBackwardInputPlus) with one tier's tables: y (M, N)
// (=, +=) x . W^T + x2 . W2^T and dx (M, K) (=, +=) dy . W + dy2 . W2, one GEMM over the inner dimensions
// concatenated (each C element one chain per inner chunk of the total). W2 f32. REQUIRES PlusFusedWith(tk, Kd, L,
// L2) (Kd the output columns, L W's inner dimension, L2 W2's): the panel path, and L + L2 in as many inner chunks
// as L alone.
bool PlusFusedWith(const TrainKernelTable& tk, int64_t Kd, int64_t L, int64_t L2);
void MatMulForwardPlusWith(const TrainKernelTable& tk, const MatMulKernels& mm, ThreadPool& pool, float* y,
                           const float* x, int64_t M, const Tensor& w, const float* x2, const Tensor& w2,
                           bool accumulate = false);
void MatMulBackwardInputPlusWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dx,
                                 const float* dy, int64_t M, const Tensor& w, const float* dy2, const Tensor& w2,
                                 bool accumulate = false);
// MatMulForwardStrips for several W sharing x (q / k / v, gate / up), bit for bit: where the products' plans
// pack x the same way (one round, one superblock: prompt runs of the models lathe serves), x is packed once
// for all of them instead of once per product.
struct StripsProduct {
  DType t;
  const void* strips;
  int64_t N;
  float* y;  // (M, N)
};
void MatMulForwardStripsShared(const TrainKernelTable& tk, const MatMulKernels& mm, ThreadPool& pool, const float* x,
                               int64_t M, int64_t K, std::span<const StripsProduct> ws);
// LoRA's dmid = dy . B and dB += dy^T . smid (B, dB: (out, r) f32) through tk.lora_grad_pair where it runs (the tier
// has it, 1 <= r <= 16, out above the few-rows bound, a 1-thread pool: a worker's), bit for bit the separate
// MatMulBackwardInputWith / MatMulBackwardWeightWith; false (nothing written) where it does not.
bool LoraGradPairWith(const TrainKernelTable& tk, ThreadPool& pool, float* dmid, float* dB, const float* dy,
                      const float* smid, const float* B, int64_t M, int64_t out, int64_t r);
// LoRA's dA (r, K) += dmid^T . x (dmid (M, r), x (M, K)) through tk.lora_grad_a where it runs (1 <= r <= 16), bit for
// bit MatMulBackwardWeightWith(dA, dmid, x, M, r, K); false (nothing written) where it does not.
bool LoraGradAWith(const TrainKernelTable& tk, ThreadPool& pool, float* dA, const float* dmid, const float* x,
                   int64_t M, int64_t K, int64_t r);
// The length of the inner chunks the GEMM driver sums an inner dimension L in (each chunk one FMA chain
// per C element, the chunks added in order): L itself up to 768, longer ones in equal chunks.
int64_t GemmInnerChunk(int64_t L);
void MatMulBackwardWeightWith(const TrainKernelTable& tk, ThreadPool& pool, float* dw, const float* dy,
                              const float* x, int64_t M, int64_t N, int64_t K);
// dw (N, K) += dyT . x with dY given transposed, dyT (N, M): dyT's rows are read in place.
void MatMulBackwardWeightTWith(const TrainKernelTable& tk, ThreadPool& pool, float* dw, const float* dyT,
                               const float* x, int64_t M, int64_t N, int64_t K);

// CrossEntropyForward / CrossEntropyBackward with one tier's tables (train_xent.cc). Forward when
// dx is null (dw must be null too).
// bf16_dot (REQUIRES UsesBf16Dot(); taken where C is even): the head's logits, dx and (dw given) its gradient
// on vdpbf16ps, the head rounded to bf16 whatever its dtype (avx512bf16::HeadLogitsT; dx from packed_pairs, the
// avx512bf16::PackPairsAlongRows of w_head, else HeadBackwardInputTRows; dw one product per chunk from its operand
// pairs, avx512bf16::HeadWeightGradPairs). head_grad_parts (bf16_dot): with dw, the storage of one chunk's
// pairs; with dw null, every chunk's pairs kept there for kernels::AddHeadGrad (the same products in the same
// order, so the same bits).
int64_t HeadGradBlockDwords(int64_t V, int64_t pairs, bool tiled);  // a chunk's A pairs in HeadGradParts::a
// HeadGradParts::a and ::b's dwords for `tokens` labelled tokens in chunks of ct.
void HeadGradPartsDwords(int64_t V, int64_t C, int64_t tokens, int64_t ct, bool tiled, int64_t* a, int64_t* b);
float CrossEntropyWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dx, float* dw,
                       const float* x, int64_t T, const Tensor& w_head, const int32_t* labels, float normalizer,
                       float dloss, int64_t chunk_tokens, const float* packed_head = nullptr, bool bf16_dot = false,
                       const uint32_t* packed_pairs = nullptr, HeadGradParts* head_grad_parts = nullptr);

// FlashAttentionForward / Backward with one tier's tables (train_attention.cc).
void FlashAttentionForwardWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* out,
                               float* lse, const float* q, const float* k, const float* v, const int32_t* seg,
                               int64_t T, int n_head, int n_kv_head, int head_dim, float scale,
                               int64_t window = 0);
void FlashAttentionBackwardWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dq,
                                float* dk, float* dv, const float* dout, const float* q, const float* k,
                                const float* v, const float* out, const float* lse, const int32_t* seg, int64_t T,
                                int n_head, int n_kv_head, int head_dim, float scale, int64_t window = 0);
namespace avx512bf16 {
// kernels::FlashAttentionForwardBf16 / BackwardBf16 with the train table tk's row helpers
// (train_attention_avx512bf16.cc). REQUIRES avx512_bf16.
void FlashAttentionForward(const TrainKernelTable& tk, ThreadPool& pool, float* out, float* lse, const float* q,
                           const float* k, const float* v, const int32_t* seg, int64_t T, int n_head, int n_kv_head,
                           int head_dim, float scale, int64_t window = 0);
void FlashAttentionBackward(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dq, float* dk,
                            float* dv, const float* dout, const float* q, const float* k, const float* v,
                            const float* out, const float* lse, const int32_t* seg, int64_t T, int n_head,
                            int n_kv_head, int head_dim, float scale, int64_t window = 0);
// Bytes of the operand pairs one backward call packs (the forward packs fewer).
int64_t FlashAttentionPairsBytes(int64_t T, int n_head, int n_kv_head, int head_dim);
}  // namespace avx512bf16

namespace scalar {
const TrainKernelTable& TrainTable();
}
namespace avx2 {
const TrainKernelTable& TrainTable();
// pack_panel_rows for 8-row panels (the AVX-512 table's; AVX2 code, so any tier with AVX2 may call it).
void PackPanelRows8(float* out, const float* a, int64_t lda, int64_t nl, int mr);
// TrainKernelTable::strip_gemv on ymm registers (two 8-lane halves per strip).
void StripGemv(DType t, const uint8_t* strips, int64_t n_strips, int64_t K, int64_t inner, const float* x,
               int64_t ldx, int m, float* y, int64_t ldy, int64_t n_cols);
// TrainKernelTable::chain_gemv on ymm registers (8 W rows per block).
void ChainGemv(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const float* x, int64_t ldx, int m, int64_t K,
               int64_t inner, float* y, int64_t ldy);
}
namespace avx512 {
// The AVX2 table with the two-strip GEMM tiles and an 8 x 48 panel tile on zmm registers.
const TrainKernelTable& TrainTable();
}

}  // namespace lathe::kernels::cpu
