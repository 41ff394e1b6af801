// Shared by the engine tests: the stories260K weights, and greedy generation of one request alone through the
// plain (non-paged) Transformer, the reference the batched paged engine must equal token for token.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <memory>

#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "model/load_gguf.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "test_util.h"

namespace lathe::serve::engine_test {

// stories260K's weights (the shared GGUF), for tests that guard with LATHE_REQUIRE_FILE.
inline std::unique_ptr<model::ModelWeights> Stories() {
  auto g = formats::GgufFile::Open(lathe::testing::SharedPath("models/stories260K/stories260K.gguf"));
  EXPECT_TRUE(g.ok());
  auto w = model::LoadGgufWeights(std::shared_ptr<formats::GgufFile>(std::move(*g)));
  EXPECT_TRUE(w.ok());
  return std::make_unique<model::ModelWeights>(std::move(*w));
}

// n greedy tokens after `ids`, with `adapter` applied when non-null.
// kv: the cache's element type; int8_prompt: TransformerOptions::int8_prompt_rows.
inline std::vector<int32_t> GreedyAlone(const model::ModelWeights& w, ThreadPool& pool, std::vector<int32_t> ids,
                                        int n, const model::LoraAdapter* adapter = nullptr,
                                        DType kv = DType::kF32, bool int8_prompt = false) {
  model::TransformerOptions o;
  o.adapter = adapter;
  o.int8_prompt_rows = int8_prompt;
  model::Transformer tf(w, pool, o);
  model::KvCache cache(w.config, 1, (int64_t)ids.size() + n + 1, /*block_size=*/16, kv);
  std::vector<float> lg;
  std::vector<int32_t> out;
  model::SeqInput in{0, ids, false};
  EXPECT_TRUE(tf.Forward(cache, {&in, 1}, &lg).ok());
  for (int i = 0; i < n; ++i) {
    out.push_back((int32_t)(std::max_element(lg.begin(), lg.end()) - lg.begin()));
    model::SeqInput s{0, {&out.back(), 1}, false, 1};  // sampled: int8 rows, as the engine's
    EXPECT_TRUE(tf.Forward(cache, {&s, 1}, &lg).ok());
  }
  return out;
}

}  // namespace lathe::serve::engine_test
