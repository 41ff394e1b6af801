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
