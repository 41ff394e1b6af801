// Chunked cross-entropy (CrossEntropyForward/Backward) on the scalar, AVX2 and AVX-512 tiers, 1
// and 2 threads, several head dtypes and chunk sizes, against a double reference over the full logits
// and against double finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/reference.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/train_dispatch.h"
#include "kernels/train_ops.h"
#include "ops_test_util.h"
#include "train_test_util.h"

namespace lathe::kernels {
namespace {

using testing::Dequantized;
using testing::FiniteDiffGrad;
using testing::MakeWeight;
using testing::RandomVec;
using testing::RelErr;
using testing::ToDouble;

// Float logits (C-term dot products) and the polynomial exp vs double: ~1e-7 typical.
constexpr double kXentRefLimit = 5e-6;
constexpr double kXentFdLimit = 2e-6;

// Double reference: full (T, V) logits. Returns the loss; fills dx and adds into dw.
double RefCrossEntropy(const std::vector<double>& x, const std::vector<double>& w, const std::vector<int32_t>& labels,
                       int64_t T, int64_t V, int64_t C, double normalizer, double dloss, std::vector<double>* dx,
                       std::vector<double>* dw) {
  double loss = 0;
  if (dx) dx->assign(T * C, 0.0);
  std::vector<double> l(V);
  for (int64_t t = 0; t < T; ++t) {
    if (labels[t] == kIgnoreLabel) continue;
    double m = -1e300;
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += x[t * C + c] * w[v * C + c];
      l[v] = s;
      m = std::max(m, s);
    }
    double se = 0;
    for (int64_t v = 0; v < V; ++v) se += std::exp(l[v] - m);
    const double lse = m + std::log(se);
    loss += lse - l[labels[t]];
    if (!dx) continue;
    for (int64_t v = 0; v < V; ++v) {
      const double g = (std::exp(l[v] - lse) - (v == labels[t] ? 1.0 : 0.0)) * dloss / normalizer;
      for (int64_t c = 0; c < C; ++c) {
        (*dx)[t * C + c] += g * w[v * C + c];
        if (dw) (*dw)[v * C + c] += g * x[t * C + c];
      }
    }
  }
  return loss / normalizer;
}

class TrainXent : public ::testing::TestWithParam<std::tuple<IsaTier, int>> {};

// The loss's transient chunk buffer (cpu::TransientFloats): zero-filled, every float writable and read back,
// 2 MiB aligned once it spans 2 MiB (where huge pages can back it), plain below that, empty at 0.
TEST(TransientFloats, ZeroFilledWritableAndAlignedForHugePages) {
  for (size_t n : {(size_t)0, (size_t)1, (size_t)1000, (size_t)(512 * 1024), (size_t)(128 * 49152 + 7)}) {
    cpu::TransientFloats b(n);
    ASSERT_EQ(b.size(), n);
    if (n == 0) continue;
    ASSERT_NE(b.data(), nullptr);
    if (n * sizeof(float) >= (2u << 20)) {
      EXPECT_EQ((uintptr_t)b.data() % (2u << 20), 0u) << n;
    }
    for (size_t i = 0; i < n; i += 997) EXPECT_EQ(b[i], 0.0f) << i;
    EXPECT_EQ(b[n - 1], 0.0f);
    for (size_t i = 0; i < n; ++i) b[i] = (float)(i % 1024);
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += b[i];
    double want = 0;
    for (size_t i = 0; i < n; ++i) want += (double)(i % 1024);
    EXPECT_EQ(sum, want) << n;
  }
}

TEST_P(TrainXent, MatchesReference) {
  const auto [tier, threads] = GetParam();
  LATHE_REQUIRE_TIER(tier);
  const cpu::TrainKernelTable& tk = cpu::TrainKernelsFor(tier);
  const cpu::KernelTable& kt = cpu::KernelsFor(tier);
  ThreadPool pool(threads);
  const int64_t T = 37, C = 64, V = 301;
  std::vector<int32_t> labels(T);
  for (int64_t t = 0; t < T; ++t) labels[t] = t % 3 == 1 ? kIgnoreLabel : (int32_t)((t * 97 + 5) % V);
  int n_valid = 0;
  for (int32_t y : labels) n_valid += y != kIgnoreLabel;
  const std::vector<float> x = RandomVec(T * C, 40, 8.0f);  // peaked softmax (|logits| up to ~10)
  const std::vector<double> xd = ToDouble(x);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kQ4_1}) {
    const testing::TestWeight w = MakeWeight(dt, V, C, 41);
    const std::vector<double> wd = Dequantized(w.t);
    std::vector<double> ref_dx, ref_dw(V * C, 0.0);
    const double ref_loss = RefCrossEntropy(xd, wd, labels, T, V, C, n_valid, 0.7, &ref_dx, &ref_dw);
    for (int64_t chunk : {1, 8, 128}) {
      const std::string where = std::string(DTypeName(dt)) + " chunk " + std::to_string(chunk);
      const float loss_f = cpu::CrossEntropyWith(tk, kt, pool, nullptr, nullptr, x.data(), T, w.t, labels.data(),
                                                 (float)n_valid, 1.0f, chunk);
      EXPECT_LE(std::fabs(loss_f - ref_loss) / ref_loss, kXentRefLimit) << where;
      std::vector<float> dx(T * C, 99.0f), dw(V * C, 0.0f);
      const float loss_b = cpu::CrossEntropyWith(tk, kt, pool, dx.data(), dw.data(), x.data(), T, w.t,
                                                 labels.data(), (float)n_valid, 0.7f, chunk);
      EXPECT_LE(std::fabs(loss_b - ref_loss) / ref_loss, kXentRefLimit) << where;
      EXPECT_LE(RelErr(dx, ref_dx), kXentRefLimit) << where;
      EXPECT_LE(RelErr(dw, ref_dw), kXentRefLimit) << where;
      for (int64_t t = 0; t < T; ++t) {
        if (labels[t] != kIgnoreLabel) continue;
        ASSERT_EQ(dx[t * C], 0.0f) << t;
      }
      // A frozen head packed once (PackForBackwardInputWith, what TrainModel keeps) gives the same bits.
      std::vector<float> packed(cpu::PackedBackwardInputFloats(V, C), 7.0f), dxp(T * C, 99.0f);
      cpu::PackForBackwardInputWith(tk, kt, pool, w.t, packed.data());
      const float loss_p = cpu::CrossEntropyWith(tk, kt, pool, dxp.data(), nullptr, x.data(), T, w.t, labels.data(),
                                                 (float)n_valid, 0.7f, chunk, packed.data());
      EXPECT_EQ(loss_p, loss_b) << where;
      EXPECT_EQ(dxp, dx) << where << " packed head";
    }
  }
}

TEST_P(TrainXent, AllIgnoredGivesZero) {
  const auto [tier, threads] = GetParam();
  LATHE_REQUIRE_TIER(tier);
  ThreadPool pool(threads);
  const int64_t T = 4, C = 32, V = 7;
  const testing::TestWeight w = MakeWeight(DType::kF32, V, C, 42);
  const std::vector<float> x = RandomVec(T * C, 43);
  const std::vector<int32_t> labels(T, kIgnoreLabel);
  std::vector<float> dx(T * C, 5.0f), dw(V * C, 1.0f);
  const float loss = cpu::CrossEntropyWith(cpu::TrainKernelsFor(tier), cpu::KernelsFor(tier), pool, dx.data(),
                                           dw.data(), x.data(), T, w.t, labels.data(), 1.0f, 1.0f, 2);
  EXPECT_EQ(loss, 0.0f);
  EXPECT_EQ(dx, std::vector<float>(T * C, 0.0f));
  EXPECT_EQ(dw, std::vector<float>(V * C, 1.0f));
}

TEST_P(TrainXent, BackwardMatchesFiniteDifferences) {
  const auto [tier, threads] = GetParam();
  LATHE_REQUIRE_TIER(tier);
  ThreadPool pool(threads);
  const int64_t T = 5, C = 6, V = 11;
  const std::vector<int32_t> labels = {3, kIgnoreLabel, 0, 10, 3};
  const testing::TestWeight w = MakeWeight(DType::kF32, V, C, 44);
  const std::vector<float> x = RandomVec(T * C, 45, 20.0f);
  const std::vector<double> xd = ToDouble(x), wd = Dequantized(w.t);
  const double norm = 3.5, dloss = 1.3;
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
    return dloss * RefCrossEntropy(xx, ww, labels, T, V, C, norm, 1.0, nullptr, nullptr);
  };
  const auto fd_dx = FiniteDiffGrad(xd, [&](const std::vector<double>& v) { return loss(v, wd); });
  const auto fd_dw = FiniteDiffGrad(wd, [&](const std::vector<double>& v) { return loss(xd, v); });
  std::vector<float> dx(T * C), dw(V * C, 0.0f);
  cpu::CrossEntropyWith(cpu::TrainKernelsFor(tier), cpu::KernelsFor(tier), pool, dx.data(), dw.data(), x.data(), T,
                        w.t, labels.data(), (float)norm, (float)dloss, 2);
  EXPECT_LE(RelErr(dx, fd_dx), kXentFdLimit);
  EXPECT_LE(RelErr(dw, fd_dw), kXentFdLimit);
}

INSTANTIATE_TEST_SUITE_P(TiersThreads, TrainXent,
                         ::testing::Combine(::testing::Values(IsaTier::kScalar, IsaTier::kAvx2, IsaTier::kAvx512),
                                            ::testing::Values(1, 2)),
                         [](const ::testing::TestParamInfo<std::tuple<IsaTier, int>>& info) {
                           return std::string(IsaTierName(std::get<0>(info.param))) + "_t" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace lathe::kernels
