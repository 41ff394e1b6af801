// MatMul driver shared by all ISA tiers: picks GEMV (decode) or panel (prefill), blocks for the
// caches and splits the work over the pool. The tier supplies the inner kernels (dispatch.h).
#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/train_dispatch.h"

namespace lathe::kernels::cpu {

namespace {

// Weight bytes per task of the batched GEMV (M > 1, block types): fits L2 with the x rows.
constexpr int64_t kGemvBlockBytes = 64 * 1024;

// x(M, K) quantized for the int8 GEMV into the caller's per-thread scratch (K % 32 == 0).
const BlockQ8X* QuantizeX(const MatMulKernels& k, const float* x, int64_t M, int64_t K) {
  LATHE_CHECK(K % 32 == 0);
  static thread_local std::vector<BlockQ8X> xq_buf;
  const int64_t nb = K / 32;
  BlockQ8X* xq = Scratch(xq_buf, (size_t)(M * nb));
  for (int64_t m = 0; m < M; ++m) k.quantize_x(x + m * K, K, xq + m * nb);
  return xq;
}

// Rows per GEMV chunk: a few chunks per thread so 2-3 threads balance even when one is slowed by
// another process; a multiple of 4 rows (when there is more than one chunk), so the 4-row kernels
// see the same row groups whatever the thread count.
int64_t GemvGrain(int64_t threads, int64_t n_rows) {
  int64_t grain = threads == 1 ? n_rows : (n_rows + threads * 4 - 1) / (threads * 4);
  grain = std::max<int64_t>(grain, 16);
  if (grain < n_rows) grain = (grain + 3) / 4 * 4;
  return grain;
}

void Gemv(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y) {
  const int64_t N = w.shape[0], K = w.shape[1];
  const size_t rb = w.row_bytes();
  const uint8_t* wd = (const uint8_t*)w.data;
  const void* xa = x;
  size_t x_row_elems = (size_t)K;  // in units of the x element type below
  if (IsQuantized(w.dtype)) {
    xa = QuantizeX(k, x, M, K);
    x_row_elems = (size_t)(K / 32);
  }
  const bool quant = IsQuantized(w.dtype);
  if (quant && M > 1) {
    // Batched decode: weight rows in blocks of ~kGemvBlockBytes, all x rows (gemv_exact_m per call,
    // each with the M = 1 arithmetic) run against a block while it is hot in L2, so W streams from
    // memory once per call. Blocks start at multiples of 4 rows (like every GEMV chunk), so each
    // row of y is bit-identical to the same row computed alone.
    const int64_t rows = std::max<int64_t>(4, kGemvBlockBytes / (int64_t)rb / 4 * 4);
    const int64_t g = std::clamp<int64_t>(k.gemv_exact_m, 1, 4);  // x rows per kernel call
    const int64_t n_blocks = (N + rows - 1) / rows;
    pool.ParallelFor(
        n_blocks, 1,
        [&](int64_t b, int64_t e, int) {
          for (int64_t blk = b; blk < e; ++blk) {
            const int64_t n0 = blk * rows, nr = std::min(rows, N - n0);
            for (int64_t m = 0; m < M; m += g) {
              const int64_t mm = std::min(g, M - m);
              k.gemv(w.dtype, wd + n0 * rb, rb, nr, (const BlockQ8X*)xa + m * x_row_elems, mm, K,
                     y + m * N + n0, N);
            }
          }
        },
        2.0 * M * N * K);
    return;
  }
  pool.ParallelFor(N, GemvGrain(pool.size(), N), [&](int64_t b, int64_t e, int) {
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int64_t mm = std::min<int64_t>(4, M - m0);
      const void* xp = quant ? (const void*)((const BlockQ8X*)xa + m0 * x_row_elems)
                             : (const void*)((const float*)xa + m0 * x_row_elems);
      k.gemv(w.dtype, wd + b * rb, rb, e - b, xp, mm, K, y + m0 * N + b, N);
    }
  }, 2.0 * M * N * K);
}

// The int8 GEMM for block types: runs of int8 (sampled) and int16 (prompt) rows of Q8_0 / Q4_* / Q5_* (int16
// rows alone: also Q4_K / Q5_K) through k.qgemm_runs (every table with a qgemm has it). Each row quantized once by
// its kind (Q8_0's int8 dot starts with it), tasks = weight row
// blocks (whole 16-row units: the AVX-512 kernel's zmm of rows, the last may hold 4-12; ~kGemvBlockBytes at
// most, a multiple of the thread count where N allows) x blocks of ~kXBlockBytes of quantized rows, every task
// one kernel call over the runs it meets, so the step's rows share one unpacked pass of W. The N % 4 tail
// rows: int8 rows through gemv (their M = 1 kernel, gemv_exact_m rows per call), int16 rows through the GEMM.
// RowsGemm's x: each row quantized by its kind (the caller's thread-local buffers, valid until its next call).
struct QuantizedRows {
  const int64_t* slot = nullptr;  // each row's index in the array of its kind: >= 0 int8, < 0 int16 (-1 - index)
  const BlockQ8X* x8 = nullptr;
  const BlockQ16X* x16 = nullptr;
  const int32_t* starts = nullptr;  // Q8_0's int8 dot starts of the int8 rows (with_starts)
};
QuantizedRows QuantizeRows(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, int64_t K,
                           std::span<const RowRun> runs, bool with_starts) {
  const int64_t nb = K / 32;
  static thread_local std::vector<int64_t> slot_buf;
  int64_t* slot = Scratch(slot_buf, (size_t)M);
  int64_t n8 = 0, n16 = 0, r = 0;
  for (const RowRun& run : runs)
    for (int64_t i = 0; i < run.n_rows; ++i, ++r) slot[r] = run.int16 ? -1 - n16++ : n8++;
  LATHE_CHECK(r == M);
  static thread_local std::vector<BlockQ8X> x8_buf;
  static thread_local std::vector<BlockQ16X> x16_buf;
  static thread_local std::vector<int32_t> start_buf;
  BlockQ8X* x8 = n8 ? Scratch(x8_buf, (size_t)(n8 * nb)) : nullptr;
  BlockQ16X* x16 = n16 ? Scratch(x16_buf, (size_t)(n16 * nb)) : nullptr;
  int32_t* starts = n8 && with_starts && k.x_starts ? Scratch(start_buf, (size_t)(n8 * nb)) : nullptr;
  pool.ParallelFor(M, 16, [&](int64_t b, int64_t e, int) {
    for (int64_t m = b; m < e; ++m) {
      if (slot[m] >= 0) {
        k.quantize_x(x + m * K, K, x8 + slot[m] * nb);
        if (starts) k.x_starts(x8 + slot[m] * nb, nb, starts + slot[m] * nb);
      } else {
        k.quantize_x16(x + m * K, K, x16 + (-1 - slot[m]) * nb);
      }
    }
  });
  return QuantizedRows{slot, x8, x16, starts};
}

void RowsGemmOn(const MatMulKernels& k, ThreadPool& pool, const QuantizedRows& qx, int64_t M, const Tensor& w,
                float* y) {
  const int64_t N = w.shape[0], K = w.shape[1], nb = K / 32;
  LATHE_CHECK(K % 32 == 0 && k.qgemm_runs);
  const size_t rb = w.row_bytes();
  const uint8_t* wd = (const uint8_t*)w.data;
  const int64_t* slot = qx.slot;
  const BlockQ8X* x8 = qx.x8;
  const BlockQ16X* x16 = qx.x16;
  // Q8_0's starts where the quantized rows carry them (another dtype's product ignores them).
  const int32_t* starts = w.dtype == DType::kQ8_0 ? qx.starts : nullptr;
  int64_t n8 = 0, n16 = 0;
  for (int64_t m = 0; m < M; ++m) (slot[m] >= 0 ? n8 : n16)++;
  const int64_t n4 = N / 4 * 4, n_units = (n4 + 15) / 16, P = pool.size();
  const int64_t units = std::max<int64_t>(1, std::min(kGemvBlockBytes / (int64_t)rb / 16, (n_units + P - 1) / P));
  int64_t n_wblocks = std::max<int64_t>(1, (n_units + units - 1) / units);
  n_wblocks = std::min(std::max<int64_t>(1, n_units), (n_wblocks + P - 1) / P * P);
  const auto wblock_row = [&](int64_t b) { return std::min(n4, b * n_units / n_wblocks * 16); };
  const int64_t row_bytes = (int64_t)((n8 * sizeof(BlockQ8X) + n16 * sizeof(BlockQ16X)) * nb / M);
  int64_t mb = std::max<int64_t>(4, kXBlockBytes / std::max<int64_t>(1, row_bytes) / 4 * 4);
  const int64_t n_mblocks = (M + mb - 1) / mb;
  mb = ((M + n_mblocks - 1) / n_mblocks + 3) / 4 * 4;
  // Rows [m0, m1) against weight rows [n0, n0 + nr): the runs they meet, kMaxQRuns per kernel call.
  const auto gemm = [&](int64_t m0, int64_t m1, int64_t n0, int64_t nr, bool int16_only) {
    QRun qr[kMaxQRuns];
    int n = 0;
    for (int64_t a = m0; a < m1;) {
      const bool is16 = slot[a] < 0;
      int64_t b = a + 1;
      while (b < m1 && (slot[b] < 0) == is16) ++b;
      if (is16 || !int16_only) {
        QRun& q = qr[n++];
        q = QRun{};
        if (is16) {
          q.x16 = x16 + (-1 - slot[a]) * nb;
        } else {
          q.x8 = x8 + slot[a] * nb;
          q.xstart8 = starts ? starts + slot[a] * nb : nullptr;
        }
        q.m = b - a;
        q.y = y + a * N + n0;
        q.ldy = N;
      }
      if (n == kMaxQRuns || (b == m1 && n > 0)) {
        k.qgemm_runs(w.dtype, wd + n0 * rb, rb, nr, qr, n, K);
        n = 0;
      }
      a = b;
    }
  };
  const int64_t tail_tasks = n4 < N ? n_mblocks : 0;
  pool.ParallelFor(n_mblocks * n_wblocks + tail_tasks, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) {
      if (t >= n_mblocks * n_wblocks) {  // the last N % 4 weight rows
        const int64_t m0 = (t - n_mblocks * n_wblocks) * mb, m1 = std::min(M, m0 + mb);
        if (m0 >= m1) continue;
        gemm(m0, m1, n4, N - n4, /*int16_only=*/true);
        const int64_t g = std::clamp<int64_t>(k.gemv_exact_m, 1, 4);
        for (int64_t m = m0; m < m1;) {
          if (slot[m] < 0) {
            ++m;
            continue;
          }
          int64_t c = 1;  // consecutive int8 rows (consecutive slots), at most g
          while (c < g && m + c < m1 && slot[m + c] == slot[m] + c) ++c;
          k.gemv(w.dtype, wd + n4 * rb, rb, N - n4, x8 + slot[m] * nb, c, K, y + m * N + n4, N);
          m += c;
        }
        continue;
      }
      const int64_t m0 = (t / n_wblocks) * mb, m1 = std::min(M, m0 + mb);
      const int64_t n0 = wblock_row(t % n_wblocks), nr = wblock_row(t % n_wblocks + 1) - n0;
      if (m0 < m1 && nr > 0) gemm(m0, m1, n0, nr, /*int16_only=*/false);
    }
  }, 2.0 * M * N * K);
}

void RowsGemm(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y,
              std::span<const RowRun> runs) {
  LATHE_CHECK(w.shape[1] % 32 == 0 && k.qgemm_runs);
  RowsGemmOn(k, pool, QuantizeRows(k, pool, x, M, w.shape[1], runs, w.dtype == DType::kQ8_0), M, w, y);
}

// W rows per ChainGemv block: every x row (4 per kernel call) runs over a block while it is in L1 / L2.
constexpr int64_t kChainRows = 64;

// Block-type products with f32 activations below kChainGemvMaxM rows: tk.chain_gemv over W's rows,
// dequantized kChainRows rows at a time into a per-thread buffer (f32 / f16 / bf16 W would be read as
// stored), each element the GEMM's arithmetic (MatMulForwardMm), whatever M.
void ChainGemv(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y) {
  const TrainKernelTable& tk = TrainKernelsFor(k.tier);
  const int64_t N = w.shape[0], K = w.shape[1], inner = GemmInnerChunk(K);
  const DType t = w.dtype;
  const bool native = t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
  const size_t rb = w.row_bytes();
  const uint8_t* wd = (const uint8_t*)w.data;
  pool.ParallelFor(N, GemvGrain(pool.size(), N), [&](int64_t b, int64_t e, int) {
    static thread_local std::vector<float> rows_buf;
    float* rows = native ? nullptr : Scratch(rows_buf, (size_t)(kChainRows * K));
    for (int64_t r0 = b; r0 < e; r0 += kChainRows) {
      const int64_t nr = std::min(kChainRows, e - r0);
      const uint8_t* src = wd + r0 * rb;
      size_t src_rb = rb;
      DType st = t;
      if (!native) {
        k.dequant_rows(t, src, rb, nr, K, rows, K);
        src = (const uint8_t*)rows;
        src_rb = sizeof(float) * K;
        st = DType::kF32;
      }
      for (int64_t m0 = 0; m0 < M; m0 += 4)
        tk.chain_gemv(st, src, src_rb, nr, x + m0 * K, K, (int)std::min<int64_t>(4, M - m0), K, inner,
                      y + m0 * N + r0, N);
    }
  }, 2.0 * M * N * K);
}

void Prefill(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y) {
  const int64_t N = w.shape[0], K = w.shape[1];
  const size_t rb = w.row_bytes();
  const uint8_t* wd = (const uint8_t*)w.data;
  const int64_t tm = k.tile_m, pr = k.panel_rows;
  int64_t mc = kXBlockBytes / (K * 4);
  mc = std::max<int64_t>(tm, mc / tm * tm);
  // Fewer, evenly sized M blocks instead of one short remainder block.
  const int64_t n_mblocks = (M + mc - 1) / mc;
  mc = ((M + n_mblocks - 1) / n_mblocks + tm - 1) / tm * tm;
  const int64_t rows_per_task = (kPrefillRowsPerTask + pr - 1) / pr * pr;
  const int64_t n_groups = (N + rows_per_task - 1) / rows_per_task;
  const bool direct = w.dtype == DType::kF32;
  const int64_t ldw = (K + 15) / 16 * 16;
  pool.ParallelFor(n_mblocks * n_groups, 1, [&](int64_t b, int64_t e, int) {
    static thread_local std::vector<float> panel_buf;
    float* panel = direct ? nullptr : Scratch(panel_buf, (size_t)(pr * ldw));
    for (int64_t t = b; t < e; ++t) {
      const int64_t mb = t / n_groups, g = t % n_groups;
      const int64_t m0 = mb * mc, m1 = std::min(M, m0 + mc);
      if (m0 >= m1) continue;
      const int64_t n_end = std::min(N, (g + 1) * rows_per_task);
      for (int64_t n0 = g * rows_per_task; n0 < n_end; n0 += pr) {
        const int64_t nr = std::min<int64_t>(pr, n_end - n0);
        if (direct) {
          k.panel(x + m0 * K, K, m1 - m0, (const float*)(wd + n0 * rb), K, nr, K, y + m0 * N + n0, N);
        } else {
          k.dequant_rows(w.dtype, wd + n0 * rb, rb, nr, K, panel, ldw);
          k.panel(x + m0 * K, K, m1 - m0, panel, ldw, nr, K, y + m0 * N + n0, N);
        }
      }
    }
  }, 2.0 * M * N * K);
}

}  // namespace

void MatMulWith(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w,
                float* y, bool exact_activations) {
  LATHE_CHECK(w.ndim() == 2);
  if (M <= 0 || w.shape[0] == 0) return;
  if (IsPackedQuant(w.dtype)) {  // NF4/FP4/int8 whole-weight buffers (kernels/quant.h)
    // The packed-quant kernels of the tier `k` belongs to (the AVX-512 table is only passed in on
    // CPUs that have it).
    quant::PackedMatMul(quant::QuantKernelsFor(k.tier), k, pool, x, M, w, y);
    return;
  }
  // The GEMV kernels quantize x to int8 for block-quantized weights; the panel path keeps f32. With
  // int8 activations every row gets its M = 1 arithmetic whatever M (results independent of the
  // batch): the tier's int8 GEMM from k.qgemm_min_m rows where it has one, else the batched GEMV.
  const bool quant = IsQuantized(w.dtype);
  if (quant && !exact_activations) {
    if (k.qgemm && M >= k.qgemm_min_m && !IsKQuant(w.dtype)) {  // the tiers' qgemm: Q8_0, Q4_*, Q5_*
      const RowRun run{M, false};
      RowsGemm(k, pool, x, M, w, y, {&run, 1});
    } else {
      Gemv(k, pool, x, M, w, y);
    }
  } else if (!quant && M < kGemvMaxM) {
    Gemv(k, pool, x, M, w, y);
  } else if (!quant) {
    Prefill(k, pool, x, M, w, y);
  } else if (M < kChainGemvMaxM) {
    ChainGemv(k, pool, x, M, w, y);
  } else {
    MatMulForwardMm(TrainKernelsFor(k.tier), k, pool, y, x, M, w);
  }
}

bool Bf16DequantTakes(const MatMulKernels& k, const Tensor& w) {
  return k.bf16_dequant && IsQuantized(w.dtype) && !IsPackedQuant(w.dtype);
}

void MatMulBf16With(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w,
                    float* y) {
  LATHE_CHECK(w.ndim() == 2);
  if (Bf16DequantTakes(k, w)) {
    k.bf16_dequant(k, pool, x, M, w, y);
  } else {
    MatMulWith(k, pool, x, M, w, y, /*exact_activations=*/true);
  }
}

bool Int16Takes(const MatMulKernels& k, const Tensor& w) {
  const DType t = w.dtype;
  return k.qgemm_runs && w.ndim() == 2 && w.shape[1] % 32 == 0 &&
         (t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_0 || t == DType::kQ5_1 ||
          ((t == DType::kQ4_K || t == DType::kQ5_K) && w.shape[1] % 256 == 0));
}

void MatMulRowsWith(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y,
                    std::span<const RowRun> runs) {
  LATHE_CHECK(Int16Takes(k, w));
  if (M <= 0 || w.shape[0] == 0) return;
  bool any16 = false, any8 = false;
  for (const RowRun& run : runs) {
    if (run.n_rows <= 0) continue;
    (run.int16 ? any16 : any8) = true;
  }
  if (!any16) {  // sampled rows only: MatMul's int8 path (the GEMV below qgemm_min_m rows)
    MatMulWith(k, pool, x, M, w, y);
    return;
  }
  if (IsKQuant(w.dtype) && any8) {  // K-quant sampled rows keep the K-quant GEMV's arithmetic: a call per run
    const int64_t N = w.shape[0], K = w.shape[1];
    int64_t r = 0;
    for (const RowRun& run : runs) {
      if (run.n_rows > 0) MatMulRowsWith(k, pool, x + r * K, run.n_rows, w, y + r * N, {&run, 1});
      r += run.n_rows;
    }
    return;
  }
  RowsGemm(k, pool, x, M, w, y, runs);
}

void MatMulRowsSharedWith(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M,
                          std::span<const Tensor* const> ws, std::span<float* const> ys, std::span<const RowRun> runs) {
  LATHE_CHECK(ws.size() == ys.size());
  bool any16 = false, any8 = false;
  for (const RowRun& run : runs) {
    if (run.n_rows <= 0) continue;
    (run.int16 ? any16 : any8) = true;
  }
  // x quantized once where every weight would take RowsGemm with the same K (not the K-quants' per-run calls).
  bool share = any16 && M > 0 && !ws.empty();
  bool q8 = false;
  for (const Tensor* w : ws) {
    LATHE_CHECK(Int16Takes(k, *w));
    share = share && w->shape[1] == ws[0]->shape[1] && w->shape[0] > 0 && !(IsKQuant(w->dtype) && any8);
    q8 = q8 || w->dtype == DType::kQ8_0;
  }
  if (!share) {
    for (size_t i = 0; i < ws.size(); ++i) MatMulRowsWith(k, pool, x, M, *ws[i], ys[i], runs);
    return;
  }
  LATHE_CHECK(ws[0]->shape[1] % 32 == 0 && k.qgemm_runs);
  const QuantizedRows qx = QuantizeRows(k, pool, x, M, ws[0]->shape[1], runs, q8);
  for (size_t i = 0; i < ws.size(); ++i) RowsGemmOn(k, pool, qx, M, *ws[i], ys[i]);
}

void MatMulInt16With(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y) {
  const RowRun run{M, true};
  MatMulRowsWith(k, pool, x, M, w, y, {&run, 1});
}

StripWeight PackStripWeightWith(const MatMulKernels& k, ThreadPool& pool, const Tensor& w, void* out) {
  LATHE_CHECK(w.ndim() == 2);
  const DType t = w.dtype;
  LATHE_CHECK(t == DType::kF32 || t == DType::kF16 || t == DType::kBF16);
  const int64_t N = w.shape[0], K = w.shape[1], n_strips = (N + 15) / 16;
  const size_t rb = w.row_bytes();
  const uint8_t* wd = (const uint8_t*)w.data;
  if (t == DType::kBF16 && k.bf16_strips) {  // pair strips for vdpbf16ps (only tables on CPUs with it have them)
    avx512bf16::PackPairStrips(pool, w, (uint32_t*)out);
    return StripWeight{t, N, K, out, /*bf16_pairs=*/true};
  }
  if (t == DType::kF32) {  // the tier's strip transposes (8 x 8 blocks in registers)
    const TrainKernelTable& tk = TrainKernelsFor(k.tier);
    pool.ParallelFor(n_strips, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t s = b; s < e; ++s)
        tk.pack_strip_t((float*)out + s * K * 16, 16, (const float*)(wd + s * 16 * rb), K, K,
                        (int)std::min<int64_t>(16, N - 16 * s));
    }, 2.0 * N * K);
  } else {
    pool.ParallelFor(n_strips, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t s = b; s < e; ++s) {
        uint16_t* o = (uint16_t*)out + s * K * 16;
        const int nj = (int)std::min<int64_t>(16, N - 16 * s);
        for (int j = 0; j < 16; ++j) {
          const uint16_t* row = j < nj ? (const uint16_t*)(wd + (16 * s + j) * rb) : nullptr;
          for (int64_t l = 0; l < K; ++l) o[l * 16 + j] = row ? row[l] : 0;
        }
      }
    }, 2.0 * N * K);
  }
  return StripWeight{t, N, K, out};
}

void MatMulStripsWith(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M, const StripWeight& w,
                      float* y) {
  if (M <= 0 || w.N <= 0) return;
  if (w.bf16_pairs) {
    LATHE_CHECK_MSG(k.bf16_strips, "bf16 pair strips need a kernel table with avx512_bf16 (packed by another)");
    k.bf16_strips(pool, x, M, (const uint32_t*)w.data, w.N, w.K, y);
    return;
  }
  const TrainKernelTable& tk = TrainKernelsFor(k.tier);
  if (M >= kStripGemvMaxM) {
    MatMulForwardStrips(tk, k, pool, y, x, M, w.dtype, w.data, w.N, w.K);
    return;
  }
  const int64_t n_strips = (w.N + 15) / 16, inner = GemmInnerChunk(w.K);
  const size_t strip_bytes = (size_t)w.K * 16 * (w.dtype == DType::kF32 ? 4 : 2);
  const uint8_t* sd = (const uint8_t*)w.data;
  // Tasks of whole strips; within a task, blocks of 8 strips (L2-sized) run every group of 4 x rows. Up to
  // 4 x rows (one group) reuse nothing: a task's strips go in one call (streamed in long runs).
  const int64_t block = M <= 4 ? n_strips : 8;
  const int64_t per = M <= 4 ? 2 : 4;  // tasks per thread
  const int64_t grain = std::max<int64_t>(1, (n_strips + per * pool.size() - 1) / (per * pool.size()));
  pool.ParallelFor(n_strips, pool.size() == 1 ? n_strips : grain, [&](int64_t b, int64_t e, int) {
    for (int64_t s0 = b; s0 < e; s0 += block) {
      const int64_t ns = std::min(block, e - s0);
      const int64_t n_cols = std::min(w.N - 16 * s0, 16 * ns);
      for (int64_t m0 = 0; m0 < M; m0 += 4)
        tk.strip_gemv(w.dtype, sd + s0 * strip_bytes, ns, w.K, inner, x + m0 * w.K, w.K,
                      (int)std::min<int64_t>(4, M - m0), y + m0 * w.N + 16 * s0, w.N, n_cols);
    }
  }, 2.0 * M * w.N * w.K);
}

void MatMulStripsSharedWith(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M,
                            std::span<const StripWeight* const> ws, std::span<float* const> ys) {
  LATHE_CHECK(ws.size() == ys.size());
  bool gemm = M >= kStripGemvMaxM && !ws.empty() && ws.size() <= 4;
  for (const StripWeight* w : ws) gemm = gemm && !w->bf16_pairs && w->K == ws[0]->K && w->N > 0;
  if (!gemm) {
    for (size_t i = 0; i < ws.size(); ++i) MatMulStripsWith(k, pool, x, M, *ws[i], ys[i]);
    return;
  }
  StripsProduct ps[4];
  for (size_t i = 0; i < ws.size(); ++i) ps[i] = {ws[i]->dtype, ws[i]->data, ws[i]->N, ys[i]};
  MatMulForwardStripsShared(TrainKernelsFor(k.tier), k, pool, x, M, ws[0]->K,
                            std::span<const StripsProduct>(ps, ws.size()));
}

void Bf16PairsReference(const float* x, int64_t M, const Tensor& w, float* y) {
  LATHE_CHECK(w.ndim() == 2 && w.dtype == DType::kBF16);
  const int64_t N = w.shape[0], K = w.shape[1], Kp = (K + 1) / 2, chunk = Bf16PairsChunk(Kp);
  const uint16_t* wd = (const uint16_t*)w.data;
  std::vector<float> xr((size_t)(2 * Kp));
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t l = 0; l < 2 * Kp; ++l) xr[l] = l < K ? BF16ToF32(F32ToBF16(x[i * K + l])) : 0.0f;
    for (int64_t n = 0; n < N; ++n) {
      const uint16_t* row = wd + n * K;
      auto wv = [&](int64_t l) { return l < K ? BF16ToF32(row[l]) : 0.0f; };
      float total = 0.0f;
      for (int64_t p0 = 0; p0 < Kp; p0 += chunk) {
        float acc = 0.0f;
        for (int64_t p = p0; p < std::min(Kp, p0 + chunk); ++p) {
          acc = std::fma(xr[2 * p + 1], wv(2 * p + 1), acc);
          acc = std::fma(xr[2 * p], wv(2 * p), acc);
        }
        total = p0 == 0 ? acc : total + acc;
      }
      y[i * N + n] = total;
    }
  }
}

void MatMulSharedWith(const MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M,
                      std::span<const Tensor* const> ws, std::span<float* const> ys, bool exact_activations) {
  LATHE_CHECK(ws.size() == ys.size());
  // One job only where each weight would take the GEMV path at M = 1 (Gemv above), with one K.
  bool one_job = M == 1 && !ws.empty();
  bool any_quant = false;
  int64_t total = 0;
  for (const Tensor* w : ws) {
    LATHE_CHECK(w->ndim() == 2);
    const bool quant = IsQuantized(w->dtype);
    one_job = one_job && !IsPackedQuant(w->dtype) && !(quant && exact_activations) &&
              w->shape[1] == ws[0]->shape[1] && w->shape[0] > 0;
    any_quant = any_quant || quant;
    total += w->shape[0];
  }
  if (!one_job) {
    for (size_t i = 0; i < ws.size(); ++i) MatMulWith(k, pool, x, M, *ws[i], ys[i], exact_activations);
    return;
  }
  const int64_t K = ws[0]->shape[1];
  const BlockQ8X* xq = any_quant ? QuantizeX(k, x, 1, K) : nullptr;
  // Chunks sized as Gemv sizes them, for the rows of all the weights together (one task per weight
  // where the job stays on the caller: fewer, longer kernel calls); each starts at a multiple of 4
  // rows of its weight, so every row of y is what MatMul gives it.
  struct Task {
    int w;
    int64_t r0, r1;
  };
  static thread_local std::vector<Task> task_buf;  // the caller's; workers read it through `tasks`
  std::vector<Task>& tasks = task_buf;
  tasks.clear();
  const double work = 2.0 * total * K;
  const int64_t grain = work < ThreadPool::kMinParallelWork ? total : GemvGrain(pool.size(), total);
  for (size_t i = 0; i < ws.size(); ++i) {
    for (int64_t r = 0; r < ws[i]->shape[0]; r += grain) tasks.push_back({(int)i, r, std::min(ws[i]->shape[0], r + grain)});
  }
  pool.ParallelFor((int64_t)tasks.size(), 1, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) {
      const Task& task = tasks[t];
      const Tensor& w = *ws[task.w];
      const size_t rb = w.row_bytes();
      const void* xp = IsQuantized(w.dtype) ? (const void*)xq : (const void*)x;
      k.gemv(w.dtype, (const uint8_t*)w.data + task.r0 * rb, rb, task.r1 - task.r0, xp, 1, K, ys[task.w] + task.r0,
             w.shape[0]);
    }
  }, work);
}

}  // namespace lathe::kernels::cpu
