// Multi-LoRA serving: requests for the base model and two PEFT adapters (the lora / rslora
// fixtures over the random llama fixture) run batched in the same engine steps, and each equals
// greedy generation alone with its own adapter; the prefix cache never shares K/V across adapters.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "model/load_hf.h"
#include "model/lora.h"
#include "serve/engine.h"
#include "engine_test_util.h"
#include "test_util.h"

namespace lathe::serve {
namespace {

std::string Fixtures() { return lathe::testing::SourceDir() + "/tests/golden/fixtures/"; }

using engine_test::GreedyAlone;

TEST(EngineLora, MixedAdaptersBatchedEqualAlone) {
  auto w = model::LoadHfModelDir(Fixtures() + "llama_gqa_tied/model");
  ASSERT_TRUE(w.ok()) << w.status().message();
  auto a1 = model::LoadPeftAdapter(Fixtures() + "lora_llama_gqa_tied/adapter", w->config);
  auto a2 = model::LoadPeftAdapter(Fixtures() + "rslora_llama_gqa_tied/adapter", w->config);
  ASSERT_TRUE(a1.ok() && a2.ok());
  const model::LoraAdapter* adapters[3] = {nullptr, a1->get(), a2->get()};
  ThreadPool pool(2);
  const int kTokens = 12;
  // The same prompts for every adapter (block size 4, so full blocks are cached): with a prefix
  // cache keyed only by tokens, the adapters would read each other's K/V.
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p = {1, 17, 33, 49, 65, 81, 97, 113};
    for (int j = 0; j < 2 + 3 * i; ++j) p.push_back(3 + (i * 41 + j * 13) % 250);
    prompts.push_back(p);
  }
  Engine engine(*w, pool, EngineConfig{256, 4, 512, 64, 128});
  std::map<int64_t, std::vector<int32_t>> got;
  std::map<int64_t, std::pair<int, size_t>> which;  // id -> (adapter, prompt)
  auto submit = [&](int a, size_t i) {
    RequestOptions o;
    o.sampling.temperature = 0;
    o.max_tokens = kTokens;
    o.adapter = adapters[a];
    o.adapter_key = a;  // 0 = base
    auto id =
        engine.AddRequest(prompts[i], o, [&](const TokenEvent& e) { got[e.request_id].push_back(e.token); });
    ASSERT_TRUE(id.ok()) << id.status().message();
    which[*id] = {a, i};
  };
  // Wave 1: base only, so its blocks are cached; wave 2: every adapter interleaved, all batched.
  for (size_t i = 0; i < prompts.size(); ++i) submit(0, i);
  while (engine.Step()) {
  }
  const int64_t steps_before = engine.stats().steps;
  for (size_t i = 0; i < prompts.size(); ++i)
    for (int a = 0; a < 3; ++a) submit(a, i);
  while (engine.Step()) {
  }
  // 12 requests in one batch: prefill step + kTokens - 1 decode steps.
  EXPECT_EQ(engine.stats().steps - steps_before, kTokens);
  EXPECT_GT(engine.stats().prefix_hits, 0);  // the base requests of wave 2 reused wave 1
  std::map<std::pair<int, size_t>, std::vector<int32_t>> alone;
  for (auto& [id, key] : which) {
    if (!alone.count(key))
      alone[key] = GreedyAlone(*w, pool, prompts[key.second], kTokens, adapters[key.first]);
    EXPECT_EQ(got[id], alone[key]) << "adapter " << key.first << " prompt " << key.second;
  }
  // The adapters change the outputs (otherwise the test would prove nothing).
  EXPECT_NE(alone[std::make_pair(0, size_t{3})], alone[std::make_pair(1, size_t{3})]);
  EXPECT_NE(alone[std::make_pair(1, size_t{3})], alone[std::make_pair(2, size_t{3})]);
  EXPECT_EQ(engine.stats().blocks_used, 0);

  RequestOptions bad;
  bad.adapter = adapters[1];  // no key
  EXPECT_FALSE(engine.AddRequest(prompts[0], bad, nullptr).ok());
}

}  // namespace
}  // namespace lathe::serve
