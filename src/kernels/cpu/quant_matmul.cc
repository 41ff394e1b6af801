// MatMul drivers for packed quantized weights (NF4/FP4[+DQ], LLM.int8): decode GEMV on the
// stored codes, prefill through dequantized panels (a few rows per thread, never the whole W).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/scratch.h"
#include "kernels/quant.h"

namespace lathe::kernels::quant {

namespace {

// Same blocking as the dense prefill path (matmul.cc), from scratch.h.
using cpu::kPrefillRowsPerTask;
using cpu::kXBlockBytes;
using cpu::Scratch;

void Gemv4(const QuantKernels& qk, ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y) {
  const int64_t N = w.shape[0], K = w.shape[1], nb = K / kQuant4Block;
  const QuantHeader* h = (const QuantHeader*)w.data;
  const uint8_t* codes = (const uint8_t*)w.data + h->codes_offset;
  const float* code16 = CodeBook(w.dtype);
  const bool dq = IsDoubleQuant(w.dtype);
  const float* absmax = dq ? nullptr : (const float*)((const uint8_t*)w.data + h->absmax_offset);
  const int64_t threads = pool.size();
  int64_t grain = threads == 1 ? N : (N + threads * 4 - 1) / (threads * 4);
  grain = std::max<int64_t>(grain, 16);
  pool.ParallelFor(N, grain, [&](int64_t b, int64_t e, int) {
    static thread_local std::vector<float> am_buf;
    // The whole range at once: gemv4 permutes x once per call and DQ absmax decodes in one pass.
    const float* am = absmax ? absmax + b * nb : nullptr;
    if (dq) {
      float* buf = Scratch(am_buf, (size_t)((e - b) * nb));
      BlockAbsmax(w, b * nb, (e - b) * nb, buf);
      am = buf;
    }
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int64_t mm = std::min<int64_t>(4, M - m0);
      qk.gemv4(codes + b * (K / 2), code16, am, e - b, K, x + m0 * K, mm, y + m0 * N + b, N);
    }
  });
}

void Prefill(const QuantKernels& qk, const cpu::MatMulKernels& k, ThreadPool& pool, const float* x, int64_t M,
             const Tensor& w, float* y) {
  const int64_t N = w.shape[0], K = w.shape[1];
  const int64_t tm = k.tile_m, pr = k.panel_rows;
  int64_t mc = kXBlockBytes / (K * 4);
  mc = std::max<int64_t>(tm, mc / tm * tm);
  const int64_t n_mblocks = (M + mc - 1) / mc;
  mc = ((M + n_mblocks - 1) / n_mblocks + tm - 1) / tm * tm;
  const int64_t rows_per_task = (kPrefillRowsPerTask + pr - 1) / pr * pr;
  const int64_t n_groups = (N + rows_per_task - 1) / rows_per_task;
  const int64_t ldw = (K + 15) / 16 * 16;
  pool.ParallelFor(n_mblocks * n_groups, 1, [&](int64_t b, int64_t e, int) {
    static thread_local std::vector<float> panel_buf;
    float* panel = Scratch(panel_buf, (size_t)(pr * ldw));
    for (int64_t t = b; t < e; ++t) {
      const int64_t mb = t / n_groups, g = t % n_groups;
      const int64_t m0 = mb * mc, m1 = std::min(M, m0 + mc);
      if (m0 >= m1) continue;
      const int64_t n_end = std::min(N, (g + 1) * rows_per_task);
      for (int64_t n0 = g * rows_per_task; n0 < n_end; n0 += pr) {
        const int64_t nr = std::min<int64_t>(pr, n_end - n0);
        DequantPackedBlock(qk, w, n0, nr, 0, K, panel, ldw);
        k.panel(x + m0 * K, K, m1 - m0, panel, ldw, nr, K, y + m0 * N + n0, N);
      }
    }
  });
}

}  // namespace

void Int8DecomposedMatMul(const QuantKernels& qk, ThreadPool& pool, const float* x, int64_t M,
                          const Tensor& w, float* y, float threshold) {
  const int64_t N = w.shape[0], K = w.shape[1];
  const QuantHeader* h = (const QuantHeader*)w.data;
  const int8_t* wq = (const int8_t*)((const uint8_t*)w.data + h->codes_offset);
  const float* wam = (const float*)((const uint8_t*)w.data + h->absmax_offset);
  // Outlier columns: any row of x with |x| >= threshold (bitsandbytes int8_vectorwise_quant).
  static thread_local std::vector<int64_t> cols_buf;
  static thread_local std::vector<int8_t> xq_buf;
  static thread_local std::vector<float> xs_buf;
  cols_buf.clear();
  for (int64_t k = 0; k < K; ++k) {
    bool out = false;
    for (int64_t m = 0; m < M && !out; ++m) out = std::fabs(x[m * K + k]) >= threshold;
    if (out) cols_buf.push_back(k);
  }
  const int64_t Kp = (K + 31) / 32 * 32;  // int8 rows padded with zeros for the 32-wide dot
  int8_t* xq = Scratch(xq_buf, (size_t)(M * Kp));
  float* xs = Scratch(xs_buf, (size_t)M);
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    float amax = 0;
    for (int64_t k = 0; k < K; ++k) {
      const float a = std::fabs(xr[k]);
      if (a < threshold) amax = std::max(amax, a);
    }
    xs[m] = amax;
    const float s = amax == 0 ? 0.0f : 127.0f / amax;
    int8_t* q = xq + m * Kp;
    for (int64_t k = 0; k < K; ++k)
      q[k] = std::fabs(xr[k]) >= threshold ? 0 : (int8_t)std::nearbyint(xr[k] * s);
    for (int64_t c : cols_buf) q[c] = 0;
    for (int64_t k = K; k < Kp; ++k) q[k] = 0;
  }
  const std::vector<int64_t>& cols = cols_buf;
  const bool padded = Kp != K;
  pool.ParallelFor(N, 16, [&](int64_t b, int64_t e, int) {
    static thread_local std::vector<int8_t> wrow_buf;
    for (int64_t r = b; r < e; ++r) {
      const int8_t* wr = wq + r * K;
      if (padded) {  // rows of an odd K: copy into a zero-padded row
        int8_t* tmp = Scratch(wrow_buf, (size_t)Kp);
        std::copy(wr, wr + K, tmp);
        std::fill(tmp + K, tmp + Kp, (int8_t)0);
        wr = tmp;
      }
      const float ws = wam[r] / 127.0f;
      for (int64_t m = 0; m < M; ++m) {
        const int32_t acc = qk.dot_i8(xq + m * Kp, wr, Kp);
        float out = (float)acc * (xs[m] / 127.0f) * ws;
        const float* xr = x + m * K;
        for (int64_t c : cols) out += xr[c] * ((float)wq[r * K + c] * ws);
        y[m * N + r] = out;
      }
    }
  });
}

void PackedMatMul(const QuantKernels& qk, const cpu::MatMulKernels& k, ThreadPool& pool, const float* x,
                  int64_t M, const Tensor& w, float* y) {
  LATHE_CHECK(w.ndim() == 2 && IsPackedQuant(w.dtype));
  if (M <= 0 || w.shape[0] == 0) return;
  if (M < cpu::kGemvMaxM) {
    if (w.dtype == DType::kI8Row) {
      Int8DecomposedMatMul(qk, pool, x, M, w, y, kInt8OutlierThreshold);
    } else {
      Gemv4(qk, pool, x, M, w, y);
    }
  } else {
    Prefill(qk, k, pool, x, M, w, y);
  }
}

}  // namespace lathe::kernels::quant
