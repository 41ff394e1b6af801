// Baseline and machine-limit probes for bench/kernels_bench.cc: naive auto-vectorized f32 matmul
// over a dequantized copy, and one-core FMA-peak and DRAM-read measurements.
#pragma once

#include <cstdint>

namespace lathe::bench {

// y(M, N) = x(M, K) . w(N, K)^T, single-threaded.
void BaselineMatMulF32(const float* x, int64_t M, const float* w, int64_t N, int64_t K, float* y);

}  // namespace lathe::bench

namespace lathe::bench {

// Peak f32 FMA throughput of one core with 256-bit FMAs (12 independent chains), GFLOP/s.
double MeasurePeakFmaGflops();
// Read bandwidth of one core summing a buffer much larger than the caches, GB/s.
double MeasureReadBandwidthGBs();

}  // namespace lathe::bench
