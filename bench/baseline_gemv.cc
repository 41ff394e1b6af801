// The benchmark baseline: a plain f32 matmul over an already dequantized W, written the obvious
// way and left to the compiler (-O3 -mavx2 -mfma -ffast-math, set in CMakeLists.txt).
#include "baseline_gemv.h"

#include <algorithm>

namespace lathe::bench {

void BaselineMatMulF32(const float* x, int64_t M, const float* w, int64_t N, int64_t K, float* y) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += w[n * K + k] * x[m * K + k];
      y[m * N + n] = s;
    }
  }
}

}  // namespace lathe::bench

#include <chrono>
#include <vector>

namespace lathe::bench {

double MeasurePeakFmaGflops() {
  typedef float V8 __attribute__((vector_size(32)));
  V8 a0 = V8{} + 1, a1 = V8{} + 2, a2 = V8{} + 3, a3 = V8{} + 4, a4 = V8{} + 5, a5 = V8{} + 6;
  V8 a6 = V8{} + 7, a7 = V8{} + 8, a8 = V8{} + 9, a9 = V8{} + 10, a10 = V8{} + 11, a11 = V8{} + 12;
  const V8 m = V8{} + 0.999999f, c = V8{} + 1e-7f;
  const int64_t iters = 50'000'000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < iters; ++it) {
    a0 = a0 * m + c, a1 = a1 * m + c, a2 = a2 * m + c, a3 = a3 * m + c, a4 = a4 * m + c, a5 = a5 * m + c;
    a6 = a6 * m + c, a7 = a7 * m + c, a8 = a8 * m + c, a9 = a9 * m + c, a10 = a10 * m + c, a11 = a11 * m + c;
    // Keeps the 12 chains in registers and live (no reassociation, no store/reload).
    __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
    __asm__ volatile("" : "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile float sink = (a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11)[0];
  (void)sink;
  return (double)iters * 12 * 8 * 2 / s * 1e-9;
}

double MeasureReadBandwidthGBs() {
  const size_t n = (size_t)256 << 20 >> 2;  // 256 MiB of floats
  std::vector<float> buf(n, 1.0f);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    float s = 0;
    for (size_t i = 0; i < n; ++i) s += buf[i];
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    volatile float sink = s;
    (void)sink;
    best = std::max(best, n * 4.0 / sec * 1e-9);
  }
  return best;
}

}  // namespace lathe::bench
