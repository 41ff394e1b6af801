// stories260K (a real pretrained TinyStories model) against the float64 reference in
// ../shared/models/stories260K/reference: greedy tokens exactly, top-5 logits within 1e-4, with the
// float weights in strips (the default) and as stored.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "formats/gguf.h"
#include "model/load_gguf.h"
#include "model/transformer.h"
#include "test_util.h"

namespace lathe::model {
namespace {

using lathe::testing::SharedPath;

nlohmann::json LoadReference() {
  std::ifstream in(SharedPath("models/stories260K/reference/stories260K_reference.json"));
  return nlohmann::json::parse(in);
}

int32_t Argmax(const float* v, int64_t n) { return (int32_t)(std::max_element(v, v + n) - v); }

// Greedy decode one token at a time through the KV cache, from `prompt`, to `total` tokens.
std::vector<int32_t> Greedy(Transformer& tf, std::vector<int32_t> prompt, size_t total) {
  KvCache cache(tf.config(), 1, (int64_t)total);
  std::vector<float> logits;
  std::vector<int32_t> out = prompt;
  SeqInput in{0, std::span<const int32_t>(prompt), false};
  EXPECT_TRUE(tf.Forward(cache, std::span<const SeqInput>(&in, 1), &logits).ok());
  while (out.size() < total) {
    int32_t next = Argmax(logits.data(), tf.config().vocab_size);
    out.push_back(next);
    if (out.size() == total) break;
    SeqInput step{0, std::span<const int32_t>(&out.back(), 1), false};
    EXPECT_TRUE(tf.Forward(cache, std::span<const SeqInput>(&step, 1), &logits).ok());
  }
  return out;
}

class Stories260K : public ::testing::TestWithParam<int> {};

TEST_P(Stories260K, GgufGreedyAndLogitsMatchReference) {
  std::string path = SharedPath("models/stories260K/stories260K.gguf");
  LATHE_REQUIRE_FILE(path);
  auto g = formats::GgufFile::Open(path);
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto w = LoadGgufWeights(std::shared_ptr<formats::GgufFile>(std::move(*g)));
  ASSERT_TRUE(w.ok()) << w.status().message();
  ThreadPool pool(GetParam());
  nlohmann::json ref = LoadReference();
  // The float weights repacked in strips (the default) and read as stored: both match the reference.
  for (bool strips : {true, false}) {
    SCOPED_TRACE(strips ? "strip weights" : "weights as stored");
    TransformerOptions opts;
    opts.strip_float_weights = strips;
    Transformer tf(*w, pool, opts);

    std::vector<int32_t> want = ref["greedy_from_bos"]["tokens"].get<std::vector<int32_t>>();
    EXPECT_EQ(Greedy(tf, {1}, want.size()), want);
    for (const auto& p : ref["greedy_prompts"]) {
      std::vector<int32_t> pw = p["tokens"].get<std::vector<int32_t>>();
      EXPECT_EQ(Greedy(tf, p["prompt_ids_with_bos"].get<std::vector<int32_t>>(), pw.size()), pw) << p["prompt"];
    }

    // All-position logits in one prefill call.
    std::vector<int32_t> ids = ref["logits_check"]["input_ids"].get<std::vector<int32_t>>();
    KvCache cache(tf.config(), 1, 64);
    std::vector<float> logits;
    SeqInput in{0, std::span<const int32_t>(ids), true};
    ASSERT_TRUE(tf.Forward(cache, std::span<const SeqInput>(&in, 1), &logits).ok());
    int64_t V = tf.config().vocab_size;
    for (const auto& pp : ref["logits_check"]["per_position"]) {
      int pos = pp["pos"];
      const float* row = &logits[pos * V];
      std::vector<int> order(V);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + 5, order.end(), [&](int a, int b) { return row[a] > row[b]; });
      for (int k = 0; k < 5; ++k) {
        EXPECT_EQ(order[k], pp["top5_ids"][k].get<int>()) << "pos " << pos << " rank " << k;
        EXPECT_NEAR(row[pp["top5_ids"][k].get<int>()], pp["top5_logits"][k].get<double>(), 1e-4) << "pos " << pos;
      }
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += row[v];
      EXPECT_NEAR(sum, pp["logit_sum"].get<double>(), 1e-2) << "pos " << pos;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, Stories260K, ::testing::Values(1, 2));

}  // namespace
}  // namespace lathe::model
