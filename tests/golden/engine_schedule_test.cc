// The engine's step policy on stories260K (Engine::Step driven by hand, EngineStats' last-step
// composition read after each step): decode rows first and never starved, prompt tokens capped by
// max_prefill_tokens_with_decode while the step decodes (their blocks reserved chunk by chunk), the
// whole budget for prompts when nothing decodes, preemption under the cap — with greedy outputs
// still equal to one request at a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "engine_test_util.h"
#include "formats/gguf.h"
#include "model/load_gguf.h"
#include "serve/engine.h"
#include "test_util.h"

namespace lathe::serve {
namespace {

using engine_test::GreedyAlone;
using engine_test::Stories;

// A prompt of n tokens: BOS, then ids from a seed (distinct prompts share no cached block).
std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> p = {1};
  for (int j = 1; j < n; ++j) p.push_back(260 + (seed * 53 + j * 17) % 200);
  return p;
}

EngineConfig Config(int64_t n_blocks, int64_t budget, int64_t cap) {
  EngineConfig c;
  c.n_blocks = n_blocks;
  c.block_size = 4;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = 64;
  c.max_model_len = 512;
  c.max_prefill_tokens_with_decode = cap;
  c.prefill_tokens_per_decode_row = 0;  // the fixed cap (PromptCapGrowsWithDecodeRows sets it)
  return c;
}

// Requests added to an engine, with every token they got and the prompt they were given.
struct Driver {
  Engine& engine;
  std::map<int64_t, std::vector<int32_t>> prompts, got;
  std::map<int64_t, int> max_tokens;
  std::map<int64_t, bool> finished;

  int64_t Add(std::vector<int32_t> prompt, int n) {
    RequestOptions o;
    o.sampling.temperature = 0;
    o.max_tokens = n;
    auto id = engine.AddRequest(prompt, o, [this](const TokenEvent& e) {
      got[e.request_id].push_back(e.token);
      if (e.finished) finished[e.request_id] = true;
    });
    EXPECT_TRUE(id.ok()) << id.status().message();
    prompts[*id] = std::move(prompt);
    max_tokens[*id] = n;
    return *id;
  }
  // Requests that have their first token and are not finished: each must decode one row next step.
  std::vector<int64_t> Decoding() const {
    std::vector<int64_t> d;
    for (const auto& [id, p] : prompts) {
      auto g = got.find(id);
      if (g != got.end() && !g->second.empty() && !finished.count(id)) d.push_back(id);
    }
    return d;
  }
  // One step; checks the policy with roomy blocks (no preemption): every decoding request gets
  // exactly one token, and prompt tokens stay within `cap` while decode rows run.
  void StepChecked(int64_t cap) {
    const std::vector<int64_t> decoding = Decoding();
    std::map<int64_t, size_t> before;
    for (int64_t id : decoding) before[id] = got[id].size();
    ASSERT_TRUE(engine.Step());
    const EngineStats s = engine.stats();
    EXPECT_EQ(s.last_step_decode_rows, (int64_t)decoding.size());
    for (int64_t id : decoding) EXPECT_EQ(got[id].size(), before[id] + 1) << "request " << id << " starved";
    if (s.last_step_decode_rows > 0 && cap > 0) {
      EXPECT_LE(s.last_step_prefill_tokens, cap);
    }
  }
  void ExpectGreedy(const model::ModelWeights& w, ThreadPool& pool) {
    for (const auto& [id, p] : prompts) {
      EXPECT_EQ(got[id], GreedyAlone(w, pool, p, max_tokens[id])) << "request " << id;
      EXPECT_TRUE(finished[id]) << "request " << id;
    }
  }
};

TEST(EngineSchedule, PromptTokensCappedWhileDecodingAndDecodeRowsNeverStarve) {
  LATHE_REQUIRE_FILE(lathe::testing::SharedPath("models/stories260K/stories260K.gguf"));
  auto w = Stories();
  ThreadPool pool(2);
  const int64_t kCap = 8;
  Engine engine(*w, pool, Config(512, 64, kCap));
  Driver d{engine, {}, {}, {}, {}};
  // Four short prompts, nothing decoding: one step computes all of them (20 tokens, the whole budget
  // is open).
  for (int i = 0; i < 4; ++i) d.Add(Prompt(5, i), 40);
  d.StepChecked(kCap);
  EXPECT_EQ(engine.stats().last_step_prefill_tokens, 20);
  ASSERT_EQ(d.Decoding().size(), 4u);
  // A 60- and a 30-token prompt arrive while the four decode: 8 prompt tokens per step, the first
  // prompt's first token after ceil(60 / 8) = 8 steps, the second's after ceil(90 / 8) = 12.
  const int64_t a = d.Add(Prompt(60, 7), 4), b = d.Add(Prompt(30, 8), 4);
  int first_a = 0, first_b = 0;
  for (int step = 1; step <= 12; ++step) {
    d.StepChecked(kCap);
    const EngineStats s = engine.stats();
    EXPECT_EQ(s.last_step_prefill_tokens, step < 12 ? kCap : 90 - 11 * kCap) << "step " << step;
    // Blocks hold computed tokens: less than one partly filled block per running sequence (the
    // prompts reserve their blocks chunk by chunk, not all 15 + 8 at arrival).
    EXPECT_LT(s.blocks_used * 4 - s.tokens_stored, 4 * s.running) << "step " << step;
    if (!first_a && !d.got[a].empty()) first_a = step;
    if (!first_b && !d.got[b].empty()) first_b = step;
  }
  EXPECT_EQ(first_a, 8);
  EXPECT_EQ(first_b, 12);
  for (int steps = 0; engine.Step(); ++steps) ASSERT_LT(steps, 1000);
  d.ExpectGreedy(*w, pool);
  EXPECT_EQ(engine.stats().blocks_used, 0);
}

// prefill_tokens_per_decode_row: with many decode rows the cap rises to that many prompt tokens
// per row (so arrivals keep pace with many streams); with few, the fixed cap stays the floor.
TEST(EngineSchedule, PromptCapGrowsWithDecodeRows) {
  LATHE_REQUIRE_FILE(lathe::testing::SharedPath("models/stories260K/stories260K.gguf"));
  auto w = Stories();
  ThreadPool pool(2);
  EngineConfig cfg = Config(1024, 256, 8);
  cfg.prefill_tokens_per_decode_row = 4;
  Engine engine(*w, pool, cfg);
  Driver d{engine, {}, {}, {}, {}};
  for (int i = 0; i < 6; ++i) d.Add(Prompt(5, 40 + i), 30);
  d.StepChecked(0);  // nothing decodes yet: all 30 prompt tokens at once
  EXPECT_EQ(engine.stats().last_step_prefill_tokens, 30);
  ASSERT_EQ(d.Decoding().size(), 6u);
  // Six decode rows: max(8, 4 x 6) = 24 prompt tokens per step for a 100-token arrival.
  const int64_t a = d.Add(Prompt(100, 9), 3);
  for (int step = 1; step <= 4; ++step) {
    d.StepChecked(24);
    EXPECT_EQ(engine.stats().last_step_decode_rows, 6);
    EXPECT_EQ(engine.stats().last_step_prefill_tokens, 24) << "step " << step;
  }
  EXPECT_TRUE(d.got[a].empty());
  d.StepChecked(24);  // 4 x 24 = 96, the last 4 tokens now: its first token
  EXPECT_EQ(engine.stats().last_step_prefill_tokens, 4);
  EXPECT_EQ(d.got[a].size(), 1u);
  // One decode row left: the floor of 8 applies (4 x 1 < 8).
  Engine one(*w, pool, cfg);
  Driver o{one, {}, {}, {}, {}};
  o.Add(Prompt(5, 60), 30);
  o.StepChecked(0);
  o.Add(Prompt(40, 61), 3);
  o.StepChecked(8);
  EXPECT_EQ(one.stats().last_step_prefill_tokens, 8);
  for (int steps = 0; engine.Step(); ++steps) ASSERT_LT(steps, 1000);
  for (int steps = 0; one.Step(); ++steps) ASSERT_LT(steps, 1000);
  d.ExpectGreedy(*w, pool);
  o.ExpectGreedy(*w, pool);
}

TEST(EngineSchedule, PromptsTakeTheWholeBudgetWhenNothingDecodes) {
  LATHE_REQUIRE_FILE(lathe::testing::SharedPath("models/stories260K/stories260K.gguf"));
  auto w = Stories();
  ThreadPool pool(2);
  Engine engine(*w, pool, Config(512, 64, 8));
  Driver d{engine, {}, {}, {}, {}};
  // Two 40-token prompts: the first step runs 64 prompt tokens (40 + 24), not the cap's 8.
  const int64_t a = d.Add(Prompt(40, 1), 3), b = d.Add(Prompt(40, 2), 3);
  d.StepChecked(8);
  EXPECT_EQ(engine.stats().last_step_prefill_tokens, 64);
  EXPECT_EQ(engine.stats().last_step_decode_rows, 0);
  EXPECT_EQ(d.got[a].size(), 1u);
  EXPECT_TRUE(d.got[b].empty());
  // Now `a` decodes, so the rest of `b` (16 tokens) goes 8 at a time.
  d.StepChecked(8);
  EXPECT_EQ(engine.stats().last_step_prefill_tokens, 8);
  d.StepChecked(8);
  EXPECT_EQ(engine.stats().last_step_prefill_tokens, 8);
  EXPECT_EQ(d.got[b].size(), 1u);
  for (int steps = 0; engine.Step(); ++steps) ASSERT_LT(steps, 1000);
  d.ExpectGreedy(*w, pool);

  // A lone 60-token prompt on a fresh engine: one step, its first token at once.
  Engine lone(*w, pool, Config(512, 64, 8));
  Driver l{lone, {}, {}, {}, {}};
  const int64_t c = l.Add(Prompt(60, 3), 2);
  l.StepChecked(8);
  EXPECT_EQ(lone.stats().last_step_prefill_tokens, 60);
  EXPECT_EQ(l.got[c].size(), 1u);
}

TEST(EngineSchedule, CapZeroLetsPromptsFillTheBudgetBesideDecodes) {
  LATHE_REQUIRE_FILE(lathe::testing::SharedPath("models/stories260K/stories260K.gguf"));
  auto w = Stories();
  ThreadPool pool(2);
  Engine engine(*w, pool, Config(512, 64, 0));
  Driver d{engine, {}, {}, {}, {}};
  for (int i = 0; i < 4; ++i) d.Add(Prompt(5, i), 10);
  d.StepChecked(0);
  // 4 decode rows + the first 60 of a 70-token prompt: the step's whole budget of 64.
  const int64_t a = d.Add(Prompt(70, 9), 3);
  d.StepChecked(0);
  EXPECT_EQ(engine.stats().last_step_decode_rows, 4);
  EXPECT_EQ(engine.stats().last_step_prefill_tokens, 60);
  d.StepChecked(0);
  EXPECT_EQ(engine.stats().last_step_prefill_tokens, 10);
  EXPECT_EQ(d.got[a].size(), 1u);
  for (int steps = 0; engine.Step(); ++steps) ASSERT_LT(steps, 1000);
  d.ExpectGreedy(*w, pool);
}

// Too few blocks for everything: sequences are preempted and recomputed, and the cap still holds
// for every step that decodes (recomputation counts as prompt work); outputs stay greedy-exact.
TEST(EngineSchedule, PreemptionUnderTheCap) {
  LATHE_REQUIRE_FILE(lathe::testing::SharedPath("models/stories260K/stories260K.gguf"));
  auto w = Stories();
  ThreadPool pool(2);
  const int64_t kCap = 6;
  Engine engine(*w, pool, Config(24, 64, kCap));
  Driver d{engine, {}, {}, {}, {}};
  for (int i = 0; i < 10; ++i) d.Add(Prompt(6 + 3 * i, 20 + i), 24);
  int steps = 0;
  while (engine.Step()) {
    ASSERT_LT(++steps, 5000);
    const EngineStats s = engine.stats();
    if (s.last_step_decode_rows > 0) {
      EXPECT_LE(s.last_step_prefill_tokens, kCap) << "step " << steps;
    }
  }
  EXPECT_GT(engine.stats().preemptions, 0);
  d.ExpectGreedy(*w, pool);
  EXPECT_EQ(engine.stats().blocks_used, 0);
}

}  // namespace
}  // namespace lathe::serve
