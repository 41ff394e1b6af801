// Throughput of the training attention and chunked cross-entropy at SmolLM2-135M sizes (T = 2048,
// 9 query / 3 KV heads of 64, vocab 49152, C = 576). Only with LATHE_PERF=1; prints, asserts nothing
// about speed. Times are process CPU time (this box is shared: wall time follows the load).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/train_ops.h"
#include "ops_test_util.h"

namespace lathe::kernels {
namespace {

using testing::RandomVec;

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Best of reps runs (after one warm-up) on process CPU time (all threads' CPU for threads > 1).
template <typename F>
double BestSeconds(const F& f, int reps) {
  f();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = CpuSeconds();
    f();
    best = std::min(best, CpuSeconds() - t0);
  }
  return best;
}

TEST(TrainPerf, Attention) {
  if (!std::getenv("LATHE_PERF")) GTEST_SKIP() << "set LATHE_PERF=1";
  const int H = 9, KV = 3, D = 64;
  // T = 2048 whole and as four packed samples of 512; T = 512 is one row of the bench's 512-token batches.
  for (const int64_t T : {(int64_t)2048, (int64_t)512}) {
    const std::vector<float> q = RandomVec(T * H * D, 1), k = RandomVec(T * KV * D, 2),
                             v = RandomVec(T * KV * D, 3), g = RandomVec(T * H * D, 4);
    std::vector<float> out(T * H * D), lse(T * H), dq(T * H * D), dk(T * KV * D), dv(T * KV * D);
    std::vector<int32_t> seg(T);
    for (int64_t t = 0; t < T; ++t) seg[t] = (int32_t)(t / 512);  // packed samples of 512
    // Causal QK^T and PV: 2 * (T^2 / 2) * D * 2 per head.
    const double fwd_flop = 2.0 * T * T * D * H;
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      for (const int32_t* sp : {(const int32_t*)nullptr, (const int32_t*)seg.data()}) {
        if (sp && T == 512) continue;
        const double frac = sp ? 0.25 : 1.0;  // share of the causal triangle that is computed
        const double tf = BestSeconds(
            [&] { FlashAttentionForward(pool, out.data(), lse.data(), q.data(), k.data(), v.data(), sp, T, H, KV, D,
                                        0.125f); }, 2);
        const double tb = BestSeconds(
            [&] { FlashAttentionBackward(pool, dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(),
                                         v.data(), out.data(), lse.data(), sp, T, H, KV, D, 0.125f); }, 2);
        std::printf("attention threads=%d T=%lld%s forward %.1f ms (%.1f GFLOP/s)  backward %.1f ms (%.1f GFLOP/s "
                    "at 2.5x fwd) CPU\n", threads, (long long)T, sp ? " 4x512 packed" : "", tf * 1e3,
                    frac * fwd_flop / tf * 1e-9, tb * 1e3, 2.5 * frac * fwd_flop / tb * 1e-9);
      }
    }
  }
}

TEST(TrainPerf, CrossEntropy) {
  if (!std::getenv("LATHE_PERF")) GTEST_SKIP() << "set LATHE_PERF=1";
  const int64_t V = 49152, C = 576, Tx = 512;
  const std::vector<float> x = RandomVec(Tx * C, 6);
  std::vector<int32_t> labels(Tx);
  for (int64_t t = 0; t < Tx; ++t) labels[t] = (int32_t)((t * 7919) % V);
  std::vector<float> dx(Tx * C);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const testing::TestWeight w = testing::MakeWeight(dt, V, C, 5);
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      const double tf =
          BestSeconds([&] { CrossEntropyForward(pool, x.data(), Tx, w.t, labels.data(), (float)Tx); }, 1);
      const double tb = BestSeconds(
          [&] { CrossEntropyBackward(pool, dx.data(), nullptr, x.data(), Tx, w.t, labels.data(), (float)Tx); }, 1);
      const double mm = 2.0 * Tx * V * C;
      std::printf("cross-entropy %s head T=%lld V=%lld C=%lld threads=%d forward %.0f ms (%.1f GFLOP/s)  "
                  "backward(dx) %.0f ms (%.1f GFLOP/s) CPU\n", DTypeName(dt), (long long)Tx, (long long)V,
                  (long long)C, threads, tf * 1e3, mm / tf * 1e-9, tb * 1e3, 2 * mm / tb * 1e-9);
    }
  }
}

}  // namespace
}  // namespace lathe::kernels
