// `convert` round trips: stories260K (f32) -> each dtype: metadata and shapes kept, the
// quantized weights equal quantizing the originals, and the converted model's logits stay close
// to the original's (quantization error only).
#include "tools/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "formats/gguf.h"
#include "kernels/kernels.h"
#include "model/load_gguf.h"
#include "model/transformer.h"
#include "test_util.h"

namespace lathe::tools {
namespace {

std::vector<float> Logits(const std::string& path, const std::vector<int32_t>& ids) {
  auto g = formats::GgufFile::Open(path);
  EXPECT_TRUE(g.ok()) << g.status().message();
  auto w = model::LoadGgufWeights(std::shared_ptr<formats::GgufFile>(std::move(*g)));
  EXPECT_TRUE(w.ok()) << w.status().message();
  ThreadPool pool(1);
  model::Transformer tf(*w, pool);
  model::KvCache cache(w->config, 1, 64);
  std::vector<float> lg;
  model::SeqInput in{0, ids, true};
  EXPECT_TRUE(tf.Forward(cache, {&in, 1}, &lg).ok());
  return lg;
}

TEST(Convert, Stories260KToEveryDtype) {
  std::string src = lathe::testing::SharedPath("models/stories260K/stories260K.gguf");
  LATHE_REQUIRE_FILE(src);
  std::vector<int32_t> ids = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315};
  std::vector<float> ref = Logits(src, ids);
  auto in = formats::GgufFile::Open(src);
  ASSERT_TRUE(in.ok());
  ThreadPool pool(2);
  // Relative logit error allowed per dtype: the weights' own quantization error, propagated.
  // stories260K's rows are 64 and 172 wide: the K-quant mixes fall back to 32-block types and f16.
  struct Want { const char* target; double rel; };
  for (Want want : {Want{"f32", 0}, Want{"f16", 2e-3}, Want{"bf16", 2e-2}, Want{"q8_0", 2e-2}, Want{"q4_1", 0.15},
                    Want{"q4_0", 0.2}, Want{"q5_0", 0.1}, Want{"q5_1", 0.1}, Want{"q4_k_m", 0.1}}) {
    auto target = ParseConvertTarget(want.target);
    ASSERT_TRUE(target.ok()) << target.status().message();
    std::string out = ::testing::TempDir() + "/conv_" + want.target + ".gguf";
    auto st = ConvertGguf(src, out, *target, pool);
    ASSERT_TRUE(st.ok()) << st.status().message();
    auto g = formats::GgufFile::Open(out);
    ASSERT_TRUE(g.ok()) << g.status().message();
    EXPECT_EQ((*g)->GetInt("general.file_type").value(), target->file_type);
    EXPECT_EQ((*g)->Find("tokenizer.ggml.tokens")->strings.size(), 512u);
    EXPECT_EQ((*g)->tensors().size(), (*in)->tensors().size());
    std::vector<ConvertTensor> descs;
    for (const auto& ti : (*in)->tensors()) descs.push_back({ti.name, ti.shape, ti.dtype});
    std::vector<DType> planned = PlanConvertedDTypes(*target, descs, {"llama", 5, 8, 4});
    for (size_t i = 0; i < descs.size(); ++i) {
      const auto* o = (*g)->FindTensor(descs[i].name);
      ASSERT_NE(o, nullptr) << descs[i].name;
      EXPECT_EQ(o->shape, descs[i].shape);
      EXPECT_EQ(o->dtype, planned[i]) << descs[i].name;
    }
    // A quantized matrix equals quantizing the original rows.
    Tensor orig = (*in)->GetTensor("blk.0.ffn_up.weight").value();
    Tensor conv = (*g)->GetTensor("blk.0.ffn_up.weight").value();
    std::vector<uint8_t> expect(conv.nbytes());
    int64_t K = orig.shape[1];
    for (int64_t r = 0; r < orig.shape[0]; ++r) {
      kernels::QuantizeRow(conv.dtype, orig.as<float>() + r * K, K, expect.data() + r * conv.row_bytes());
    }
    EXPECT_EQ(0, std::memcmp(expect.data(), conv.data, conv.nbytes())) << want.target;
    std::vector<float> got = Logits(out, ids);
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      num += (got[i] - ref[i]) * (got[i] - ref[i]);
      den += ref[i] * ref[i];
    }
    EXPECT_LE(std::sqrt(num / den), want.rel) << want.target;
    if (want.rel == 0) {
      EXPECT_EQ(got, ref);
    }
    std::remove(out.c_str());
  }
}

TEST(Convert, RejectsBadRequests) {
  std::string src = lathe::testing::SharedPath("models/stories260K/stories260K.gguf");
  LATHE_REQUIRE_FILE(src);
  ThreadPool pool(1);
  ConvertTarget q8 = ParseConvertTarget("Q8_0").value();
  EXPECT_FALSE(ConvertGguf(src, src, q8, pool).ok());
  auto bad = ParseConvertTarget("iq4_xs");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("q4_k_m"), std::string::npos) << bad.status().message();
  EXPECT_EQ(ParseConvertTarget("q4_k").value().name, "q4_k_m");  // llama-quantize's alias
  auto missing = ConvertGguf("/nonexistent.gguf", ::testing::TempDir() + "/x.gguf", q8, pool);
  EXPECT_NE(missing.status().message().find("/nonexistent.gguf"), std::string::npos);
}

}  // namespace
}  // namespace lathe::tools
