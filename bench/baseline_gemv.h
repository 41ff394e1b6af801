// Baseline and machine-limit probes for bench/kernels_bench.cc: naive auto-vectorized f32 matmul
// over a dequantized copy, and a one-core DRAM-read measurement (the FMA peak: core/cpu.h).
#pragma once

#include <cstdint>

namespace lathe::bench {

// y(M, N) = x(M, K) . w(N, K)^T, single-threaded.
void BaselineMatMulF32(const float* x, int64_t M, const float* w, int64_t N, int64_t K, float* y);

}  // namespace lathe::bench

namespace lathe::bench {

// Read bandwidth of one core summing a buffer much larger than the caches, GB/s.
double MeasureReadBandwidthGBs();

}  // namespace lathe::bench
