// SmolLM2-135M-Instruct (the real Q4_1 GGUF) against transformers, which dequantizes the same
// file to f32 (tools/ref/make_smollm2_fixture.py): prompt logits (top-20 at every position and
// the full last row) within the fixture's f32 tolerance and greedy ids exactly, with exact
// activations; with llama.cpp-style int8 activations, the fixture's looser bounds and, thanks to
// the exactly recomputed top logits, still the reference answer to the capital question.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/load_gguf.h"
#include "kernels/kernels.h"
#include "model/transformer.h"
#include "test_util.h"

namespace lathe::model {
namespace {

struct SmolFixture {
  std::unique_ptr<formats::SafetensorsFile> st;
  nlohmann::json manifest;
};

SmolFixture LoadFixture() {
  SmolFixture f;
  std::string dir = lathe::testing::SourceDir() + "/tests/golden/fixtures/";
  std::ifstream in(dir + "MANIFEST.json");
  f.manifest = nlohmann::json::parse(in)["fixtures"]["smollm2_135m_chat"];
  auto st = formats::SafetensorsFile::Open(dir + "smollm2_135m_chat/expected.safetensors");
  EXPECT_TRUE(st.ok()) << st.status().message();
  f.st = std::move(*st);
  return f;
}

std::vector<int64_t> Ints(const formats::SafetensorsFile& st, const std::string& name) {
  Tensor t = st.GetTensor(name).value();
  return std::vector<int64_t>(t.as<int64_t>(), t.as<int64_t>() + t.numel());
}
std::vector<float> Floats(const formats::SafetensorsFile& st, const std::string& name) {
  Tensor t = st.GetTensor(name).value();
  return std::vector<float>(t.as<float>(), t.as<float>() + t.numel());
}

class SmolLM2 : public ::testing::TestWithParam<bool> {};  // exact_activations

TEST_P(SmolLM2, MatchesTransformers) {
  const bool exact = GetParam();
  std::string path = lathe::testing::SmolLM2Path();
  LATHE_REQUIRE_FILE(path);
  SmolFixture fx = LoadFixture();
  auto g = formats::GgufFile::Open(path);
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto w = LoadGgufWeights(std::shared_ptr<formats::GgufFile>(std::move(*g)));
  ASSERT_TRUE(w.ok()) << w.status().message();
  ThreadPool pool(2);
  TransformerOptions opts;
  opts.exact_activations = exact;
  Transformer tf(*w, pool, opts);
  const int64_t V = w->config.vocab_size;
  const double atol = exact ? fx.manifest["tolerances"]["f32_activations"]["logits_atol"].get<double>()
                            : fx.manifest["tolerances"]["int8_activations"]["logits_atol"].get<double>();
  for (std::string p : {"capital", "story"}) {
    std::vector<int64_t> ids64 = Ints(*fx.st, p + ".input_ids");
    std::vector<int32_t> ids(ids64.begin(), ids64.end());
    std::vector<int64_t> top_ids = Ints(*fx.st, p + ".top20_ids");
    std::vector<float> top = Floats(*fx.st, p + ".top20_logits");
    KvCache cache(w->config, 1, (int64_t)ids.size() + 40);
    std::vector<float> lg;
    SeqInput in{0, ids, true};  // the prompt with f32 activations, as generate does
    ASSERT_TRUE(tf.Forward(cache, {&in, 1}, &lg).ok());
    double worst = 0;
    int top1_ok = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* row = &lg[t * V];
      for (int k = 0; k < 20; ++k) worst = std::max(worst, (double)std::fabs(row[top_ids[t * 20 + k]] - top[t * 20 + k]));
      top1_ok += (std::max_element(row, row + V) - row) == top_ids[t * 20];
    }
    EXPECT_LE(worst, atol) << p;
    if (exact) {
      EXPECT_EQ(top1_ok, (int)ids.size()) << p;
    }
    if (p == "capital") {
      std::vector<float> last = Floats(*fx.st, "capital.last_logits");
      double m = 0;
      for (int64_t v = 0; v < V; ++v) m = std::max(m, (double)std::fabs(lg[(ids.size() - 1) * V + v] - last[v]));
      EXPECT_LE(m, atol);
    }
    // int8 activations for the sampled tokens may legitimately flip the story's 0.0135-margin steps
    // (see MANIFEST); with the prompt in f32 (as generate and the engine do) and the refined head
    // the capital answer stays exact.
    if (!exact && p != "capital") continue;
    // Greedy continuation, token by token through the cache.
    std::vector<int64_t> want = Ints(*fx.st, p + ".greedy_ids");
    std::vector<int32_t> got;
    const float* row = &lg[(ids.size() - 1) * V];
    int32_t next = (int32_t)(std::max_element(row, row + V) - row);
    while (got.size() < want.size()) {
      got.push_back(next);
      if (got.size() == want.size()) break;
      SeqInput s{0, {&got.back(), 1}, false, 1};
      ASSERT_TRUE(tf.Forward(cache, {&s, 1}, &lg).ok());
      next = (int32_t)(std::max_element(lg.begin(), lg.end()) - lg.begin());
    }
    EXPECT_EQ(std::vector<int64_t>(got.begin(), got.end()), want) << p;
  }
}

// Activation precision follows the row's role, never its batch: prompt rows (not sampled_rows) go through
// the Q4_1 weights with f32 activations (int16 on AVX-512 VNNI, bf16 on other avx512_bf16 CPUs), sampled-token
// rows with int8 ones. A prompt alone equals
// the exact_activations model (1e-4), and equals itself (within f32 GEMM reordering) beside
// another sequence's decode row, whose int8 logits in turn equal that row alone bit for bit.
// (Alone vs the exact model: the same f32 layer matmuls; tf also refines its head's top logits.)
TEST(SmolLM2Rows, PromptRowsF32AndDecodeRowsInt8WhateverTheBatch) {  // f32: int16 / bf16 where the CPU has them
  std::string path = lathe::testing::SmolLM2Path();
  LATHE_REQUIRE_FILE(path);
  auto g = formats::GgufFile::Open(path);
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto w = LoadGgufWeights(std::shared_ptr<formats::GgufFile>(std::move(*g)));
  ASSERT_TRUE(w.ok()) << w.status().message();
  ThreadPool pool(2);
  Transformer tf(*w, pool);
  TransformerOptions exact_opts;
  exact_opts.exact_activations = true;
  Transformer tf_exact(*w, pool, exact_opts);
  const int64_t V = w->config.vocab_size;
  const std::vector<int32_t> prompt = {1, 9690, 198, 2683, 359, 253, 5356, 5646, 11, 1, 4093, 198, 1780, 314,
                                       260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198};
  const std::vector<int32_t> other = {1, 4093, 198, 28120, 253, 1345, 30};
  const int32_t next = 378;
  const int64_t n = (int64_t)prompt.size();

  std::vector<float> alone, alone_exact, alone_int8, decode_alone, mixed;
  {
    KvCache c(w->config, 1, 64);
    SeqInput in{0, prompt, true};
    ASSERT_TRUE(tf.Forward(c, {&in, 1}, &alone).ok());
    KvCache ce(w->config, 1, 64);
    SeqInput ine{0, prompt, true};
    ASSERT_TRUE(tf_exact.Forward(ce, {&ine, 1}, &alone_exact).ok());
    KvCache ci(w->config, 1, 64);
    SeqInput in8{0, prompt, true, n};
    ASSERT_TRUE(tf.Forward(ci, {&in8, 1}, &alone_int8).ok());
  }
  // Scalar tier (neither int16 nor the bf16 dot product): the same f32 layer matmuls; only the head's near-top
  // logits are refined (recomputed) in tf. With AVX2 / AVX-512 (kernels::MatMulInt16): int16 x blocks times the
  // weights' codes, measured 0.008 from the exact model (Xeon and Zen 3, Q4_1). With only the bf16 dot product
  // (kernels::MatMulBf16): bf16 x times bf16-rounded weights, 0.43. Both closer to the exact model than int8 prompt
  // rows (2.2), and each row's argmax unchanged.
  const bool int16 = kernels::MatMulInt16Takes(w->layers[0].wq);
  const bool bf16 = !int16 && kernels::MatMulBf16Rounds(w->layers[0].wq);
  double de = 0, d8e = 0;
  for (size_t i = 0; i < alone.size(); ++i) {
    de = std::max(de, (double)std::fabs(alone[i] - alone_exact[i]));
    d8e = std::max(d8e, (double)std::fabs(alone_int8[i] - alone_exact[i]));
  }
  std::printf("prompt rows vs the exact model, max |logit diff|: %s %.4g, int8 %.4g\n",
              int16 ? "int16" : bf16 ? "bf16" : "f32", de, d8e);
  if (int16 || bf16) {
    EXPECT_LT(de, int16 ? 0.05 : 0.6);
    EXPECT_LT(de, d8e);
    // Each row's argmax the exact model's, or (a near tie: bf16 rows on AMX tiles flip row 16, whose exact top two,
    // tokens 4649 and 260, are 0.031 apart) a token the exact model puts within 2 x de of its top; one such row.
    int flips = 0;
    for (int64_t i = 0; i < n; ++i) {
      auto row = [&](const std::vector<float>& v) { return v.begin() + i * V; };
      const int64_t a = std::max_element(row(alone), row(alone) + V) - row(alone);
      const int64_t e = std::max_element(row(alone_exact), row(alone_exact) + V) - row(alone_exact);
      if (a == e) continue;
      ++flips;
      std::printf("prompt row %lld: argmax %lld, the exact model's %lld (exact logits %.4f vs %.4f)\n", (long long)i,
                  (long long)a, (long long)e, row(alone_exact)[a], row(alone_exact)[e]);
      EXPECT_GE(row(alone_exact)[a], row(alone_exact)[e] - 2 * de)
          << "argmax of prompt row " << i << ": token " << a << " (exact logit " << row(alone_exact)[a] << ") vs "
          << e << " (" << row(alone_exact)[e] << ")";
    }
    EXPECT_LE(flips, 1) << "prompt rows whose argmax is not the exact model's";
  } else {
    EXPECT_LT(de, 1e-4);
  }
  double d8 = 0;
  for (size_t i = 0; i < alone.size(); ++i) d8 = std::max(d8, (double)std::fabs(alone[i] - alone_int8[i]));
  EXPECT_GT(d8, 1e-3) << "int8 prompt rows should differ from f32 / bf16 ones: is sampled_rows ignored?";
  {
    KvCache c(w->config, 1, 64);
    SeqInput in{0, other, false};
    std::vector<float> lg;
    ASSERT_TRUE(tf.Forward(c, {&in, 1}, &lg).ok());
    SeqInput step{0, {&next, 1}, false, 1};
    ASSERT_TRUE(tf.Forward(c, {&step, 1}, &decode_alone).ok());
  }
  KvCache c(w->config, 2, 64);
  std::vector<float> lg;
  SeqInput first{1, other, false};
  ASSERT_TRUE(tf.Forward(c, {&first, 1}, &lg).ok());
  std::vector<SeqInput> both = {{1, {&next, 1}, false, 1}, {0, prompt, true}};
  ASSERT_TRUE(tf.Forward(c, both, &mixed).ok());
  ASSERT_EQ((int64_t)mixed.size(), (1 + n) * V);
  EXPECT_EQ(std::vector<float>(mixed.begin(), mixed.begin() + V), decode_alone);
  double dp = 0;
  for (int64_t i = 0; i < n * V; ++i) dp = std::max(dp, (double)std::fabs(mixed[V + i] - alone[i]));
  std::printf("prompt rows beside a decode row vs alone, max |logit diff|: %.4g\n", dp);
  EXPECT_LT(dp, 1e-3);
  if (int16) {
    EXPECT_EQ(dp, 0.0) << "int16 prompt rows: one arithmetic per row whatever the batch";
  }
}

INSTANTIATE_TEST_SUITE_P(Activations, SmolLM2, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "exact" : "int8"; });

}  // namespace
}  // namespace lathe::model
