// Per-ISA kernel tables (scalar, AVX2, AVX-512) behind the public entry points in kernels.h.
// Tests call a tier's table directly so every path is exercised on a CPU that has it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "core/cpu.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/kernels.h"

namespace lathe::kernels::cpu {

// One row of activations quantized for the integer GEMV: 32 int8 values, scale d, and
// s = d * sum(qs) (the term Q4_0's offset and Q4_1's min multiply). Internal layout, not GGUF.
struct BlockQ8X {
  float d;
  float s;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8X) == 40);

// One row of activations quantized to int16 for prompt rows (MatMulKernels::qgemm_runs): per 32-element block
// the codes c = round(x / d) in [-kQ16Max, kQ16Max], d = amax / kQ16Max; csum = sum(c), s = d * csum (the Q4
// offset / min term). ~2^-16 of the block's amax per element: 128x finer than bf16 x near the amax. The codes'
// 64 bytes are laid out for the tier whose quantize_x16 wrote them (its qgemm_runs reads them): AVX-512 as two
// int8 halves c = 256 * hi + lo (lo in [-128, 127], hi in [-127, 127]) for vpdpbusd's two passes; AVX2 as the
// int16 c itself for vpmaddwd. Internal layout.
constexpr int32_t kQ16Max = 127 * 256 + 127;
struct BlockQ16X {
  float d;
  float s;
  int32_t csum;
  int32_t pad;
  union {
    struct {
      int8_t hi[32];
      int8_t lo[32];
    };
    int16_t c[32];
  };
};
static_assert(sizeof(BlockQ16X) == 80);

// One run of quantized x rows for MatMulKernels::qgemm_runs: m int8 rows (x8; xstart8, Q8_0 only: per (row,
// block) -128 * the sum of the row's codes, or null to have the kernel compute them) or m int16 rows (x16);
// y[i * ldy + r] gets row i's product with weight row r.
struct QRun {
  const BlockQ8X* x8 = nullptr;
  const int32_t* xstart8 = nullptr;
  const BlockQ16X* x16 = nullptr;
  int64_t m = 0;
  float* y = nullptr;
  int64_t ldy = 0;
};
constexpr int kMaxQRuns = 8;

// Block-quantized weights (every GGML block type) use the int8 GEMV up to this M (batched decode) on
// tiers whose MatMulKernels::qgemm_min_m does not say otherwise: weight blocks stay hot in L2 while all
// x rows run over them with the per-row arithmetic of M = 1 (MatMulKernels::gemv_exact_m rows per
// call), so a row's result does not depend on M. Measured (bench batch/q8_0, 1536x576, 1 thread, AVX2,
// Zen 3 loaded): vs the panel path M=4 114 vs 182 us, M=8 206 vs 265-294, M=16 426 vs 431 (tie), M=32
// 972 vs 825-1000.
constexpr int64_t kGemvQuantMaxM = 16;

// The building blocks one ISA tier provides; MatMulWith (matmul.cc) does blocking and threading.
struct MatMulKernels {
  // Quantizes x (K floats, K % 32 == 0) into K / 32 blocks.
  void (*quantize_x)(const float* x, int64_t K, BlockQ8X* out);
  // y[i * ldy + r] = dot(W row r, x row i) for r < n_rows, i < m (1 <= m <= 4).
  // W rows start at w, rb bytes apart, dtype t. x is BlockQ8X (m rows of K / 32 blocks) for the
  // block types and f32 (m rows of K) otherwise.
  void (*gemv)(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const void* x, int64_t m, int64_t K,
               float* y, int64_t ldy);
  // out(n_rows, K), row stride ldo floats = dequantized W rows.
  void (*dequant_rows)(DType t, const uint8_t* w, size_t rb, int64_t n_rows, int64_t K, float* out,
                       int64_t ldo);
  // y(m_rows, n_rows) (row stride ldy) = x(m_rows, K) (stride ldx) . w(n_rows, K)^T (stride ldw),
  // n_rows <= panel_rows. f32 FMA, the prefill workhorse.
  void (*panel)(const float* x, int64_t ldx, int64_t m_rows, const float* w, int64_t ldw, int64_t n_rows,
                int64_t K, float* y, int64_t ldy);
  int panel_rows;  // weight rows per panel call (the kernel's register tile width)
  int tile_m;      // x rows per register tile (M blocks are rounded to a multiple of this)
  // Largest m for which gemv on block types gives every x row bit-for-bit its m = 1 result (the
  // batched GEMV groups x rows by this); 0 or 1 = one row per call.
  int gemv_exact_m = 1;
  // Register-blocked int8 GEMM for Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 (null where a tier has none; the
  // K-quants take the batched GEMV at every M): y[i * ldy + r] for
  // i < m (any m), r < n_rows (n_rows % 4 == 0), each with exactly the arithmetic gemv gives that
  // x row alone, so results do not depend on m or on the other rows.
  void (*qgemm)(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t m, int64_t K,
                float* y, int64_t ldy) = nullptr;
  // The int8 GEMM's arithmetic over runs of int8 and int16 x rows (QRun) at once, each pass of weight rows
  // unpacked once for all of them: a step's sampled rows (int8) and prompt rows (int16, MatMulRowsWith) share
  // W's stream. For int16 rows T is the exact int32 dot of the weight codes and x's int16 codes. Any n_rows
  // (1..N) and m per run, except that the AVX2 tier's int8 runs (its qgemm) need n_rows % 4 == 0; a row's
  // result does not depend on the other rows. K % 32 == 0. The AVX2 and
  // AVX-512 tiers give int16 rows the same bits (vpmaddwd on int16 codes, vpdpbusd on their two bytes); the
  // scalar tier has none.
  void (*qgemm_runs)(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const QRun* runs, int n_runs,
                     int64_t K) = nullptr;
  void (*quantize_x16)(const float* x, int64_t K, BlockQ16X* out) = nullptr;
  // out[i] = -128 * the sum of x[i]'s codes for i < n (QRun::xstart8); set with qgemm_runs.
  void (*x_starts)(const BlockQ8X* x, int64_t n, int32_t* out) = nullptr;
  // qgemm takes the rows from this M on (the batched GEMV below it): where the two cross on this tier
  // (AVX2: kGemvQuantMaxM + 1; AVX-512's VNNI GEMM: 8, measured in qgemm_avx512.cc).
  int64_t qgemm_min_m = kGemvQuantMaxM + 1;
  // y(M, N) = bf16(x) . W^T for BF16 weights in pair strips (StripWeight::bf16_pairs) with vdpbf16ps,
  // threads included; the arithmetic of Bf16PairsReference (AMX's where UsesAmxBf16). Only on the AVX-512 table of CPUs with
  // avx512_bf16 (null elsewhere: PackStripWeightWith then keeps the f32-arithmetic strips).
  void (*bf16_strips)(ThreadPool& pool, const float* x, int64_t M, const uint32_t* strips, int64_t N, int64_t K,
                      float* y) = nullptr;
  // y(M, N) = bf16(x) . bf16(W)^T for a block-quantized W (every GGML type), W dequantized a few strips at a
  // time (dequant_rows of the table k) and each value rounded to bf16: Bf16PairsReference's arithmetic on
  // the rounded W, the same for every M. Set and null with bf16_strips; MatMulBf16With uses it.
  void (*bf16_dequant)(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w,
                       float* y) = nullptr;
  IsaTier tier = IsaTier::kScalar;  // the tier these kernels belong to (its packed-quant kernels go with them)
};

struct KernelTable {
  IsaTier tier;
  MatMulKernels mm;
  void (*rms_norm)(const float* x, const float* w, float* out, int64_t T, int64_t C, float eps);
  void (*silu_mul)(float* gate, const float* up, int64_t n);
  float (*dot)(const float* a, const float* b, int64_t n);
  void (*axpy)(float* y, float a, const float* x, int64_t n);
  void (*softmax)(float* x, int64_t n);
  int64_t (*argmax)(const float* x, int64_t n);  // kernels::Argmax
  // kernels::RoundKv for t = f16 / bf16; null: the scalar form (RoundKvScalar).
  void (*round_kv)(DType t, const float* x, int64_t n, uint16_t* out) = nullptr;
  // GroupAttention (kernels.h) for the head sizes a tier specializes; false = not handled (the
  // generic form in attention.cc runs instead). Null on tiers without one.
  // K / V elements of dtype kv (f32, f16 or bf16: kv_elem.h).
  bool (*group_attend)(const float* q, int group, const void* k, const void* v, DType kv, const int64_t* off,
                       int64_t n_pos, int head_dim, float scale, float* out, float* scores) = nullptr;
  // GroupAttentionRows (kernels.h) for the head sizes a tier specializes; false = not handled (one
  // GroupAttentionWith per token instead). Null on tiers without one.
  bool (*group_attend_rows)(const float* q, int64_t q_stride, int64_t n_tok, int group, const void* k,
                            const void* v, DType kv, const int64_t* off, int64_t n_pos0, int head_dim, float scale,
                            float* out, int64_t out_stride, float* scores) = nullptr;
};

// The table for a tier. REQUIRES the CPU to support it (GetCpuFeatures()).
const KernelTable& KernelsFor(IsaTier tier);
// The table for BestIsaTier().
const KernelTable& Best();

// y(M, N) = x(M, K) . W(N, K)^T with one tier's kernels. Block-quantized weights without
// exact_activations take int8 activations for any M, every row with its M = 1 arithmetic: the GEMV
// kernels below k.qgemm_min_m rows, from it the int8 GEMM (k.qgemm) where the tier has one, else
// the batched GEMV. Float weights use the GEMV kernels for M < kGemvMaxM, the dot-product panel for
// the rest (one per-row arithmetic: a float row's result does not depend on M). Float-weight crossover,
// measured (bench batch/*, 1536x576 on Zen 3): from M = 4 the panel path wins for every dtype (e.g. f32
// M=4 101 vs 157 us); at M = 2 GEMV is 1.5-2x faster. Block types with exact_activations (prompt rows)
// take f32 activations with the training GEMM's arithmetic (per element one FMA chain per inner chunk,
// the chunks added in order; W dequantized): below kChainGemvMaxM rows straight from W's rows
// (TrainKernelTable::chain_gemv), from it on through the GEMM (MatMulForwardMm), so there too a row's
// result does not depend on M (chunked prefill, prefix caching).
void MatMulWith(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w,
                float* y, bool exact_activations = false);
constexpr int64_t kGemvMaxM = 4;
constexpr int64_t kChainGemvMaxM = 20;
// kernels::MatMulBf16 with one tier's kernels: k.bf16_dequant for block-quantized W where the table has it,
// else MatMulWith(..., exact_activations = true).
void MatMulBf16With(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y);
// Whether MatMulBf16With takes k.bf16_dequant for w (kernels::MatMulBf16Rounds).
bool Bf16DequantTakes(const MatMulKernels& k, const Tensor& w);
// kernels::MatMulRows with one tier's kernels: REQUIRES Int16Takes(k, w) (k.qgemm_runs and a Q8_0 / Q4_* / Q5_*
// w, or Q4_K / Q5_K: their int16 rows through qgemm_runs, their int8 rows through MatMulWith). MatMulInt16With: all M rows
// int16.
void MatMulRowsWith(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y,
                    std::span<const RowRun> runs);
// MatMulRowsWith for weights that share x (q / k / v, gate / up), bit for bit: x's rows quantized once for all of
// them where every weight takes the int8 GEMM's runs with the same K.
void MatMulRowsSharedWith(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M,
                          std::span<const Tensor* const> ws, std::span<float* const> ys, std::span<const RowRun> runs);
void MatMulInt16With(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y);
bool Int16Takes(const MatMulKernels& k, const Tensor& w);
// kernels::MatMulStrips / PackStripWeight with one tier's kernels (matmul.cc).
void MatMulStripsWith(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const StripWeight& w,
                      float* y);
void MatMulStripsSharedWith(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M,
                            std::span<const StripWeight* const> ws, std::span<float* const> ys);
StripWeight PackStripWeightWith(const MatMulKernels& k, ThreadPool& pool, const Tensor& w, void* out);
constexpr int64_t kStripGemvMaxM = 20;
// The inner chunks of the bf16 pair arithmetic (MatMulKernels::bf16_strips): Kp pairs in one chunk up to
// 384 (K = 768), longer ones in equal chunks of at most 384 pairs, multiples of 8.
inline int64_t Bf16PairsChunk(int64_t Kp) {
  const int64_t n = (Kp + 383) / 384;
  return n <= 1 ? Kp : ((Kp + n - 1) / n + 7) / 8 * 8;
}
// The scalar definition of MatMulKernels::bf16_strips for a BF16 w (N, K): x rounded to bf16 (F32ToBF16),
// per output element and inner chunk (Bf16PairsChunk pairs) one chain over the pairs p,
// acc = (acc + x[2p+1] w[2p+1]) + x[2p] w[2p] (products exact, each add rounded), the chunks added in
// order (the first stored). What vdpbf16ps computes (denormals aside: it flushes them).
void Bf16PairsReference(const float* x, int64_t M, const Tensor& w, float* y);
// kernels::MatMulShared with one tier's kernels.
void MatMulSharedWith(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M,
                      std::span<const Tensor* const> ws, std::span<float* const> ys, bool exact_activations = false);
// From MatMulKernels::qgemm_min_m rows, block-quantized weights (without exact_activations) go through
// MatMulKernels::qgemm where the tier has one (AVX2, and AVX-512's VNNI kernel): int8 x
// rows, each row bit-identical to its M = 1 result; the scalar tier keeps the batched GEMV, so there
// too a decode row's logits never depend on the batch size.

// kernels::Attention with one tier's Dot/Softmax/Axpy (attention.cc).
void AttentionWith(const KernelTable& kt, ThreadPool& pool, const float* q, int64_t q_stride, const float* k,
                   const float* v, int64_t kv_stride, int64_t T, int64_t pos0, int n_head, int n_kv_head,
                   int head_dim, float scale, float* out, int64_t out_stride);

// kernels::GroupAttention with one tier's kernels: kt.group_attend where it handles head_dim, else
// Dot / Softmax / Axpy per position.
// K / V of dtype kv (f32, f16, bf16); the float overload is kv = f32.
void GroupAttentionWith(const KernelTable& kt, const float* q, int group, const void* k, const void* v, DType kv,
                        const int64_t* off, int64_t n_pos, int head_dim, float scale, float* out,
                        float* scores);
inline void GroupAttentionWith(const KernelTable& kt, const float* q, int group, const float* k, const float* v,
                               const int64_t* off, int64_t n_pos, int head_dim, float scale, float* out,
                               float* scores) {
  GroupAttentionWith(kt, q, group, k, v, DType::kF32, off, n_pos, head_dim, scale, out, scores);
}

// kernels::GroupAttentionRows with one tier's kernels: kt.group_attend_rows for the tokens whose
// window starts at position 0 where it handles head_dim, else GroupAttentionWith per token.
void GroupAttentionRowsWith(const KernelTable& kt, const float* q, int64_t q_stride, int64_t n_tok, int group,
                            const void* k, const void* v, DType kv, const int64_t* off, int64_t n_pos0,
                            int head_dim, float scale, float* out, int64_t out_stride, float* scores,
                            int64_t window = 0);
inline void GroupAttentionRowsWith(const KernelTable& kt, const float* q, int64_t q_stride, int64_t n_tok, int group,
                                   const float* k, const float* v, const int64_t* off, int64_t n_pos0, int head_dim,
                                   float scale, float* out, int64_t out_stride, float* scores, int64_t window = 0) {
  GroupAttentionRowsWith(kt, q, q_stride, n_tok, group, k, v, DType::kF32, off, n_pos0, head_dim, scale, out,
                         out_stride, scores, window);
}

// kernels::RoundKv's definition for f16 / bf16, one element at a time (the other tiers' reference).
void RoundKvScalar(DType t, const float* x, int64_t n, uint16_t* out);

namespace scalar {
const KernelTable& Table();
}
namespace avx2 {
// The AVX2 table in the form for this CPU (Splits256BitOps()), or in the one asked for: the split
// (128-bit) and the full-width int8 kernels are one arithmetic, bit-identical on any AVX2 CPU.
const KernelTable& Table();
const KernelTable& Table(bool split);
// KernelTable::group_attend / group_attend_rows (attention_avx2.cc); the AVX-512 table uses them too.
// Declared here, not in avx2_util.h: that header's inline helpers must never be compiled into a
// file built with other flags (one definition would win at link time for every tier).
bool GroupAttend(const float* q, int group, const void* k, const void* v, DType kv, const int64_t* off,
                 int64_t n_pos, int head_dim, float scale, float* out, float* scores);
// KernelTable::round_kv (ops_avx2.cc); the AVX-512 table uses it too.
void RoundKv(DType t, const float* x, int64_t n, uint16_t* out);
bool GroupAttendRows(const float* q, int64_t q_stride, int64_t n_tok, int group, const void* k, const void* v,
                     DType kv, const int64_t* off, int64_t n_pos0, int head_dim, float scale, float* out,
                     int64_t out_stride, float* scores);
// MatMulKernels::gemv for the IsExtQuant block types (quant_ext_avx2.cc; the AVX-512 table runs
// every block type through the AVX2 table). Each row's result is the same for any m (1..4).
void ExtQuantGemv(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const BlockQ8X* x, int64_t m, int64_t K,
                  float* y, int64_t ldy);
// One row of an IsExtQuant type dequantized, bit-identical to ref::DequantizeRow.
void ExtQuantDequantRow(DType t, const uint8_t* row, int64_t K, float* out);
}
namespace avx512bf16 {
// MatMulKernels::bf16_strips (bf16dot_avx512bf16.cc). REQUIRES avx512_bf16.
void StripsMatMul(ThreadPool& pool, const float* x, int64_t M, const uint32_t* strips, int64_t N, int64_t K,
                  float* y);
// MatMulKernels::bf16_dequant (bf16dot_avx512bf16.cc). REQUIRES avx512_bf16.
void DequantMatMul(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y);
// kernels::LinearForwardBf16 / MatMulBackwardInputBf16 / MatMulBackwardWeightBf16 (bf16dot_avx512bf16.cc).
void TrainForward(ThreadPool& pool, float* y, const float* x, int64_t M, const Tensor& w, bool accumulate);
void TrainBackwardInput(ThreadPool& pool, float* dx, const float* dy, int64_t M, const Tensor& w, bool accumulate);
void TrainBackwardWeight(ThreadPool& pool, float* dw, const float* dy, const float* x, int64_t M, int64_t N,
                         int64_t K);
// kernels::LinearForwardBf16Plus / MatMulBackwardInputBf16Plus.
void TrainForwardPlus(ThreadPool& pool, float* y, const float* x, int64_t M, const Tensor& w, const float* x2,
                      const Tensor& w2, bool accumulate);
void TrainBackwardInputPlus(ThreadPool& pool, float* dx, const float* dy, int64_t M, const Tensor& w,
                            const float* dy2, const Tensor& w2, bool accumulate);
// kernels::LoraForwardBf16 / LoraBackwardInputBf16.
void TrainLoraForward(ThreadPool& pool, float* y, float* mid, const float* x, int64_t M, const Tensor& w,
                      const Tensor& a, const Tensor& b, const std::function<const float*(float*)>& second,
                      bool accumulate);
void TrainLoraBackwardInput(ThreadPool& pool, float* dx, float* dmid, const float* dy, int64_t M, const Tensor& w,
                            const Tensor& b, const Tensor& a, const std::function<const float*(float*)>& second,
                            bool accumulate);
// The loss's logits^T (V, n) = W . x^T for a head W (V, C) in any dtype, C even (x rounded to bf16 as packed): a
// bf16 W read in place; an f32 W's rows rounded to bf16 pairs as they are read, another dtype dequantized 64 rows
// per task first (the same bits as the bf16 copy of its values).
void HeadLogitsT(ThreadPool& pool, float* logits_t, const Tensor& w, const float* x, int64_t n);
// The loss's head gradient dw (V, C) += dyT . x over every chunk of a call, dyT (V, n) (rounded to bf16 as packed),
// x (n, C), in two halves: each chunk's operand pairs into the call's A (V rows of `pairs` dwords, the chunk's
// (n + 1) / 2 from pair `offset` on) and B (C / 16 strips of `pairs` x 16 dwords: the chunk's at B + 16 offset),
// then one product over all `pairs` (one pass over dw where per-chunk products made one a chunk). tiled (AMX, every
// chunk's offset a multiple of 16: HeadGradTiled): A in the AMX tile order (amx::TiledDwords(V, pairs) dwords).
bool HeadGradTiled(int64_t chunk_tokens);
void HeadWeightGradPairs(ThreadPool& pool, const float* dy_t, const float* x, int64_t n, int64_t V, int64_t C,
                         uint32_t* a, int64_t offset, uint32_t* b, int64_t pairs, bool tiled);
void HeadWeightGradFromPairs(ThreadPool& pool, float* dw, int64_t pairs, int64_t V, int64_t C, const uint32_t* a,
                             const uint32_t* b, bool tiled);
// dx (n, C) = dy . W from dyT (V, n) (rounded to bf16 as packed) and W's pairs along V (PackPairsAlongRows).
// a_buf: where dy's pairs go (HeadBackwardInputADwords(n, V) dwords), else a buffer of the calling thread's.
int64_t HeadBackwardInputADwords(int64_t n, int64_t V);
void HeadBackwardInputT(ThreadPool& pool, float* dx, const float* dy_t, int64_t n, int64_t V, int64_t C,
                        const uint32_t* w_pairs, uint32_t* a_buf = nullptr);
// The same product for a W (V, C) not packed beforehand, bf16, f32 (rounded as paired) or (dequantized first,
// then rounded) any other dtype: W's rows go into pairs one inner chunk
// (Bf16PairsChunk of the (V + 1) / 2 pairs) at a time, into a per-thread buffer of C x chunk dwords, and each
// chunk's product is added in order: the chains and sums of HeadBackwardInputT on PackPairsAlongRows(W), bit
// for bit, without the V x C / 2 dword copy (QLoRA / 8-bit base runs and a trained head keep none).
void HeadBackwardInputTRows(ThreadPool& pool, float* dx, const float* dy_t, int64_t n, const Tensor& w,
                            uint32_t* a_buf = nullptr);
// A bf16 W (N, K) as pair strips along K (kernels::StripWeight::bf16_pairs, MatMulKernels::bf16_strips's operand).
void PackPairStrips(ThreadPool& pool, const Tensor& w, uint32_t* out);
// A bf16 W (N, K) as pairs along N: 16-column strips of (N + 1) / 2 dwords (PairStripsRowsDwords(N, K)).
void PackPairsAlongRows(ThreadPool& pool, const Tensor& w, uint32_t* out);
inline int64_t PairStripsRowsDwords(int64_t N, int64_t K) { return (K + 15) / 16 * 16 * ((N + 1) / 2); }
// KernelTable::group_attend_rows / group_attend of the AVX-512 table where UsesBf16Dot and not Bf16PairsOnFma
// (attention_avx512bf16.cc):
// a bf16 KV cache (head sizes 32, 64, 96, 128) on vdpbf16ps, q and the probabilities rounded to bf16, each row's
// result independent of the call's other rows (a prompt token's equals its decode step's); every other cache
// dtype and head size through avx512::GroupAttendRows / avx2::GroupAttend.
bool GroupAttendRows(const float* q, int64_t q_stride, int64_t n_tok, int group, const void* k, const void* v,
                     DType kv, const int64_t* off, int64_t n_pos0, int head_dim, float scale, float* out,
                     int64_t out_stride, float* scores);
bool GroupAttend(const float* q, int group, const void* k, const void* v, DType kv, const int64_t* off,
                 int64_t n_pos, int head_dim, float scale, float* out, float* scores);
}
namespace avx512 {
const KernelTable& Table();
// KernelTable::group_attend_rows of the AVX-512 table (attention_avx512.cc): bit-identical to
// avx2::GroupAttendRows (and so, per token, to avx2::GroupAttend); head sizes 32..128 (even 8-float
// chunk counts) with zmm kernels, the others through the AVX2 one.
bool GroupAttendRows(const float* q, int64_t q_stride, int64_t n_tok, int group, const void* k, const void* v,
                     DType kv, const int64_t* off, int64_t n_pos0, int head_dim, float scale, float* out,
                     int64_t out_stride, float* scores);
}

}  // namespace lathe::kernels::cpu
