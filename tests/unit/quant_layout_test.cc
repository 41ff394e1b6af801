// Packed quantized weight layouts (core/dtype.h): resident bytes per parameter of a SmolLM2-135M
// layer set from the buffer sizes; LATHE_PERF=1 also prints the real RSS growth of quantizing it.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "monitor/memory.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/quant.h"

namespace lathe {
namespace {

struct W {
  int64_t rows, cols;
};
// One SmolLM2-135M decoder layer (dim 576, 9 heads / 3 KV heads of 64, FFN 1536), x 30 layers.
std::vector<W> SmolLM2Layers() {
  std::vector<W> w;
  for (int l = 0; l < 30; ++l) {
    for (W x : {W{576, 576}, W{192, 576}, W{192, 576}, W{576, 576}, W{1536, 576}, W{1536, 576}, W{576, 1536}})
      w.push_back(x);
  }
  return w;
}

double BytesPerParam(DType t) {
  size_t bytes = 0, params = 0;
  for (const W& w : SmolLM2Layers()) {
    bytes += PackedQuantBytes(t, w.rows, w.cols);
    params += (size_t)(w.rows * w.cols);
  }
  return (double)bytes / (double)params;
}

TEST(QuantLayout, SmolLM2BytesPerParam) {
  const double nf4_dq = BytesPerParam(DType::kNF4DQ), nf4 = BytesPerParam(DType::kNF4);
  const double i8 = BytesPerParam(DType::kI8Row);
  std::printf("SmolLM2-135M layers: nf4_dq %.4f, nf4 %.4f, i8_row %.4f bytes/param\n", nf4_dq, nf4, i8);
  EXPECT_LE(nf4_dq, 0.53);
  EXPECT_LE(i8, 1.05);
  EXPECT_GT(nf4, nf4_dq);  // f32 absmax (0.0625 / param) vs u8 + second level
  // Exact for one weight: header + codes + u8 absmax + f32 absmax2, sections 64-byte aligned.
  EXPECT_EQ(PackedQuantBytes(DType::kNF4DQ, 576, 576),
            64u + 165888u + 5184u + 128u);  // 21 absmax2 (84 B) padded
  EXPECT_EQ(PackedQuantBytes(DType::kI8Row, 576, 576), 64u + 331776u + 2304u);
  // Tensor::nbytes() of a packed weight: exact for 4-bit, 4 bytes per extra row short for i8_row.
  EXPECT_EQ((Tensor{nullptr, DType::kNF4DQ, {576, 576}}.nbytes()), PackedQuantBytes(DType::kNF4DQ, 576, 576));
  EXPECT_EQ((Tensor{nullptr, DType::kFP4, {192, 576}}.nbytes()), PackedQuantBytes(DType::kFP4, 192, 576));
  const Tensor i8t{nullptr, DType::kI8Row, {576, 576}};
  EXPECT_LE(PackedQuantBytes(DType::kI8Row, 576, 576) - i8t.nbytes(), 4u * 575 + 64);
}

TEST(QuantLayout, DTypeNamesAndPackedPredicates) {
  for (const char* n : {"nf4", "fp4", "nf4_dq", "fp4_dq", "i8_row"}) {
    DType t;
    ASSERT_TRUE(ParseDType(n, &t)) << n;
    EXPECT_TRUE(IsPackedQuant(t));
    EXPECT_EQ(std::string(DTypeName(t)), n);
  }
  EXPECT_FALSE(IsPackedQuant(DType::kQ4_1));
  EXPECT_TRUE(IsDoubleQuant(DType::kFP4DQ));
  EXPECT_FALSE(IsPacked4Bit(DType::kI8Row));
}

TEST(QuantLayout, PerfRssOfQuantizedLayers) {
  if (!std::getenv("LATHE_PERF")) GTEST_SKIP() << "set LATHE_PERF=1";
  // 6 layers (a fifth of the model) to keep the f32 source small; RSS counts the packed buffers.
  std::vector<W> ws = SmolLM2Layers();
  ws.resize(6 * 7);
  std::vector<float> src(1536 * 576, 0.02f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = (float)((i * 2654435761u) % 1000) * 1e-4f - 0.05f;
  for (DType t : {DType::kNF4DQ, DType::kI8Row}) {
    size_t params = 0;
    malloc_trim(0);
    const size_t before = monitor::ProcessRssBytes();
    std::vector<kernels::PackedWeight> keep;
    for (const W& w : ws) {
      auto pw = kernels::QuantizeWeight(Tensor{src.data(), DType::kF32, {w.rows, w.cols}}, t);
      ASSERT_TRUE(pw.ok());
      keep.push_back(std::move(*pw));
      params += (size_t)(w.rows * w.cols);
      malloc_trim(0);  // hand back QuantizeWeight's f32 scratch so RSS counts the kept buffers
    }
    const size_t after = monitor::ProcessRssBytes();
    std::printf("%s: RSS +%.2f MB for %.2f M params = %.3f bytes/param (buffers %.3f)\n", DTypeName(t),
                (after - before) / 1e6, params / 1e6, (double)(after - before) / params, BytesPerParam(t));
  }
}

}  // namespace
}  // namespace lathe
