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
#include "model/transformer.h"
#include "test_util.h"

namespace lathe::model {
namespace {

struct Fixture {
  std::unique_ptr<formats::SafetensorsFile> st;
  nlohmann::json manifest;
};

Fixture LoadFixture() {
  Fixture f;
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
  Fixture fx = LoadFixture();
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
    SeqInput in{0, ids, true};
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
    if (!exact) {
      // MANIFEST int8_activations: top-5 overlap >= 3 of 5 at every prompt position, no greedy
      // requirement. int8 inputs to every matmul on the block-quantized weights (prefill included)
      // flip `capital`'s first answer token (a documented 0.08 near tie) and `story` after 22 of 32
      // greedy tokens (its smallest margin is 0.0135).
      for (size_t t = 0; t < ids.size(); ++t) {
        const float* row = &lg[t * V];
        std::vector<int32_t> order(V);
        for (int64_t v = 0; v < V; ++v) order[v] = (int32_t)v;
        std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                          [&](int32_t a, int32_t b) { return row[a] > row[b]; });
        int overlap = 0;
        for (int i = 0; i < 5; ++i)
          for (int j = 0; j < 5; ++j) overlap += order[i] == top_ids[t * 20 + j];
        EXPECT_GE(overlap, 3) << p << " position " << t;
      }
      continue;
    }
    // Greedy continuation, token by token through the cache.
    std::vector<int64_t> want = Ints(*fx.st, p + ".greedy_ids");
    std::vector<int32_t> got;
    const float* row = &lg[(ids.size() - 1) * V];
    int32_t next = (int32_t)(std::max_element(row, row + V) - row);
    while (got.size() < want.size()) {
      got.push_back(next);
      if (got.size() == want.size()) break;
      SeqInput s{0, {&got.back(), 1}, false};
      ASSERT_TRUE(tf.Forward(cache, {&s, 1}, &lg).ok());
      next = (int32_t)(std::max_element(lg.begin(), lg.end()) - lg.begin());
    }
    EXPECT_EQ(std::vector<int64_t>(got.begin(), got.end()), want) << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Activations, SmolLM2, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "exact" : "int8"; });

}  // namespace
}  // namespace lathe::model
