// Public kernel entry points. For now they thread the scalar reference over the pool; the
// AVX2/AVX-512 paths and run-time dispatch replace these bodies.
#include <cmath>

#include "core/check.h"
#include "kernels/cpu/reference.h"
#include "kernels/kernels.h"

namespace lathe::kernels {

void MatMul(ThreadPool& pool, const float* x, int64_t M, const Tensor& w, float* y) {
  LATHE_CHECK(w.ndim() == 2);
  int64_t N = w.shape[0], K = w.shape[1];
  size_t rb = w.row_bytes();
  pool.ParallelFor(N, 16, [&](int64_t b, int64_t e, int) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = b; n < e; ++n)
        y[m * N + n] = ref::DotRow(w.dtype, (const uint8_t*)w.data + n * rb, x + m * K, K);
  });
}

void DequantizeRows(const Tensor& w, int64_t row_begin, int64_t n_rows, float* out) {
  int64_t K = w.shape.back();
  size_t rb = w.row_bytes();
  for (int64_t r = 0; r < n_rows; ++r)
    ref::DequantizeRow(w.dtype, (const uint8_t*)w.data + (row_begin + r) * rb, K, out + r * K);
}

void QuantizeRow(DType t, const float* x, int64_t n, void* out) { ref::QuantizeRow(t, x, n, out); }

void RmsNorm(const float* x, const float* w, float* out, int64_t T, int64_t C, float eps) {
  ref::RmsNorm(x, w, out, T, C, eps);
}

void SiluMul(float* gate, const float* up, int64_t n) { ref::SiluMul(gate, up, n); }

float Dot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void Axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void Softmax(float* x, int64_t n) { ref::Softmax(x, n); }

}  // namespace lathe::kernels
