// Sampler: greedy, truncation rules, penalties, seeded reproducibility and the sampled
// distribution against the softmax it should follow.
#include "serve/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "model/loader.h"
#include "test_util.h"

namespace lathe::serve {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.0f, 0.5f, -1.0f, 2.5f}; }

int32_t Draw(const SamplingParams& p) {
  Sampler s(p);
  auto l = Logits();
  return s.Sample(l.data(), (int64_t)l.size());
}

TEST(Sampler, GreedyPicksArgmax) {
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(Draw(p), 1);
}

TEST(Sampler, TopKRestrictsSupport) {
  SamplingParams p;
  p.top_k = 2;
  std::set<int32_t> seen;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    p.seed = seed;
    p.has_seed = true;
    seen.insert(Draw(p));
  }
  EXPECT_EQ(seen, (std::set<int32_t>{1, 5}));
}

TEST(Sampler, TopPAndMinP) {
  // softmax of Logits(): p(1)=.42, p(5)=.26, p(2)=.155 ... top_p 0.6 keeps {1, 5}.
  SamplingParams p;
  p.top_p = 0.6f;
  std::set<int32_t> seen;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    p.seed = seed;
    p.has_seed = true;
    seen.insert(Draw(p));
  }
  EXPECT_EQ(seen, (std::set<int32_t>{1, 5}));
  SamplingParams m;
  m.min_p = 0.5f;  // keeps tokens with prob >= 0.5 * max: exp(-0.5)=.61 -> {1, 5}; exp(-1)=.37 -> not 2
  seen.clear();
  for (uint64_t seed = 0; seed < 300; ++seed) {
    m.seed = seed;
    m.has_seed = true;
    seen.insert(Draw(m));
  }
  EXPECT_EQ(seen, (std::set<int32_t>{1, 5}));
}

TEST(Sampler, DistributionFollowsSoftmaxAtTemperature) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 42;
  p.has_seed = true;
  Sampler s(p);
  auto base = Logits();
  std::vector<double> want(base.size());
  double z = 0;
  for (size_t i = 0; i < base.size(); ++i) z += want[i] = std::exp(base[i] / 0.7);
  std::vector<int> counts(base.size());
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    // No penalties: the sampler's history does not affect later draws.
    auto l = base;
    counts[s.Sample(l.data(), (int64_t)l.size())]++;
  }
  for (size_t i = 0; i < base.size(); ++i) {
    double pr = want[i] / z;
    double sd = std::sqrt(n * pr * (1 - pr));
    EXPECT_NEAR(counts[i], n * pr, 5 * sd + 1) << "token " << i;
  }
}

// The truncation and draw over a fully sorted vocabulary (what the sampler did before it sorted only the prefix
// it reaches): candidates by logit / T descending (ties: lower id), top_k, softmax against the max in double,
// top_p by the running share, min_p against the top probability, a draw over the kept mass in that order.
int32_t FullSortDraw(const std::vector<float>& logits, const SamplingParams& p, std::mt19937_64& rng) {
  std::vector<std::pair<float, int32_t>> c(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) c[i] = {logits[i] / p.temperature, (int32_t)i};
  auto cmp = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::sort(c.begin(), c.end(), cmp);
  int64_t n = (int64_t)c.size();
  if (p.top_k > 0 && p.top_k < n) n = p.top_k;
  std::vector<double> pr(n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += pr[i] = std::exp((double)c[i].first - c[0].first);
  int64_t keep = n;
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (int64_t i = 0; i < n; ++i)
      if ((cum += pr[i] / sum) >= p.top_p) {
        keep = i + 1;
        break;
      }
  }
  if (p.min_p > 0.0f) {
    int64_t k = 1;
    while (k < keep && pr[k] >= p.min_p * pr[0]) ++k;
    keep = k;
  }
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += pr[i];
  const double r = std::uniform_real_distribution<double>(0.0, total)(rng);
  double acc = 0;
  for (int64_t i = 0; i < keep; ++i)
    if (r < (acc += pr[i])) return c[i].second;
  return c[keep - 1].second;
}

// The sampler sorts only the prefix its truncation and draw reach (a full sort of a 49152 vocabulary cost ~3 ms a
// token); it draws the very tokens the full sort does, seed for seed, over a vocabulary of SmolLM2's size with
// peaked and flat logits, repeated values (ties), every truncation alone and together.
TEST(Sampler, PrefixSortDrawsWhatAFullSortDraws) {
  const int64_t V = 49152;
  std::mt19937 gen(9);
  for (float spread : {1.0f, 4.0f}) {
    std::vector<float> logits(V);
    std::normal_distribution<float> nd(0.0f, spread);
    for (auto& x : logits) x = std::round(nd(gen) * 64.0f) / 64.0f;  // many equal logits: ties by id
    for (int c = 0; c < 6; ++c) {
      SamplingParams p;
      p.temperature = c == 5 ? 0.6f : 1.0f;
      if (c == 1) p.top_p = 0.9f;
      if (c == 2) p.top_k = 50;
      if (c == 3) p.min_p = 0.05f;
      if (c == 4) p.top_k = 2000, p.top_p = 0.5f, p.min_p = 0.01f;
      if (c == 5) p.top_p = 0.95f;
      p.seed = 100 + c;
      p.has_seed = true;
      Sampler s(p);
      std::mt19937_64 ref_rng(p.seed);
      for (int draw = 0; draw < 40; ++draw) {
        std::vector<float> l = logits;
        l[(size_t)(draw * 7919) % V] += 3.0f;  // a different top each draw
        const int32_t want = FullSortDraw(l, p, ref_rng);
        ASSERT_EQ(s.Sample(l.data(), V), want) << "spread " << spread << " case " << c << " draw " << draw;
      }
    }
  }
}

TEST(Sampler, SeedReproducible) {
  SamplingParams p;
  p.seed = 7;
  p.has_seed = true;
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) {
    auto la = Logits(), lb = Logits();
    ASSERT_EQ(a.Sample(la.data(), 6), b.Sample(lb.data(), 6));
  }
}

TEST(Sampler, Penalties) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;  // token 1: 3 -> 1.5 < 2.5 (token 5)
  Sampler s(p);
  std::vector<int32_t> prompt = {1};
  s.AddPrompt(prompt);
  auto l = Logits();
  EXPECT_EQ(s.Sample(l.data(), 6), 5);
  SamplingParams f;
  f.temperature = 0;
  f.presence_penalty = 1.0f;  // after emitting 1 once, 3 - 1 = 2 < 2.5 -> 5
  Sampler t(f);
  auto l1 = Logits();
  EXPECT_EQ(t.Sample(l1.data(), 6), 1);
  auto l2 = Logits();
  EXPECT_EQ(t.Sample(l2.data(), 6), 5);
}

// logit_bias moves the choice (greedy and sampled), is applied before the penalties, skips ids past
// the vocabulary, and leaves the reported logprobs those of the model.
TEST(Sampler, LogitBias) {
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{1, -100.0f}};  // ban the argmax (3.0): 2.5 (token 5) wins
  EXPECT_EQ(Draw(p), 5);
  p.logit_bias = {{4, 100.0f}, {99, 100.0f}};  // force token 4 (-1.0); id 99 is outside 6 tokens
  EXPECT_EQ(Draw(p), 4);
  p.temperature = 1.0f;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    p.seed = seed;
    p.has_seed = true;
    EXPECT_EQ(Draw(p), 4) << seed;
  }
  // Bias first, then the HF repetition penalty on the biased logits of seen tokens 1, 3, 5:
  // token 1: 3 - 3 = 0 (stays 0), token 3: (0.5 + 1) / 2 = 0.75, token 5: 2.5 / 2 = 1.25; unseen
  // token 2 (2.0) wins.
  SamplingParams r;
  r.temperature = 0;
  r.repetition_penalty = 2.0f;
  r.logit_bias = {{1, -3.0f}, {3, 1.0f}};
  Sampler s(r);
  std::vector<int32_t> prompt = {1, 3, 5};
  s.AddPrompt(prompt);
  auto l = Logits();
  std::vector<TokenLogprob> lp;
  EXPECT_EQ(s.Sample(l.data(), 6, 1, &lp), 2);
  EXPECT_FLOAT_EQ(l[1], 0.0f);
  EXPECT_FLOAT_EQ(l[3], 0.75f);
  std::vector<TokenLogprob> raw;
  auto l0 = Logits();
  ComputeLogprobs(l0.data(), 6, 2, 1, &raw);
  ASSERT_EQ(lp.size(), raw.size());
  EXPECT_FLOAT_EQ(lp[0].logprob, raw[0].logprob);
  EXPECT_EQ(lp[1].id, 1);  // the model's own top token, though biased down
  SamplingParams bad;
  bad.logit_bias = {{3, 150.0f}};
  EXPECT_NE(bad.Validate().message().find("logit_bias"), std::string::npos);
  bad.logit_bias = {{-1, 1.0f}};
  EXPECT_NE(bad.Validate().message().find("logit_bias"), std::string::npos);
}

TEST(Sampler, LogprobsAreNormalized) {
  auto l = Logits();
  std::vector<TokenLogprob> lp;
  ComputeLogprobs(l.data(), 6, 2, 6, &lp);
  ASSERT_EQ(lp.size(), 7u);
  EXPECT_EQ(lp[0].id, 2);
  EXPECT_EQ(lp[1].id, 1);
  double s = 0;
  for (int i = 1; i < 7; ++i) s += std::exp(lp[i].logprob);
  EXPECT_NEAR(s, 1.0, 1e-5);
}

TEST(Sampler, ValidateNamesTheField) {
  SamplingParams p;
  p.top_p = 0;
  EXPECT_NE(p.Validate().message().find("top_p"), std::string::npos);
  p = {};
  p.temperature = -1;
  EXPECT_NE(p.Validate().message().find("temperature"), std::string::npos);
}

}  // namespace
}  // namespace lathe::serve

namespace lathe::serve {
namespace {

// Structured outputs: a vocabulary of digits, words and an end token under the grammar "one to four digits, then
// ' ok'": every token drawn is one the grammar allows, the draw's distribution is the softmax renormalized over
// the allowed tokens, and greedy takes the best allowed token.
std::shared_ptr<const CompiledGrammar> DigitsGrammar() {
  auto g = Grammar::Parse("root ::= [0-9]{1,4} \" ok\"\n");
  EXPECT_TRUE(g.ok()) << g.status().message();
  std::vector<std::string> pieces = {"1", "2", "34", "5678", " ok", " o", "k", "x", "</s>"};
  std::vector<uint8_t> text(pieces.size(), 1);
  text.back() = 0;
  return std::make_shared<const CompiledGrammar>(
      CompiledGrammar{g.value(), std::make_shared<GrammarVocab>(pieces, text, std::vector<int32_t>{8})});
}

TEST(SamplerGrammar, DrawsOnlyAllowedTokensAndFinishes) {
  auto grammar = DigitsGrammar();
  for (uint64_t seed = 0; seed < 50; ++seed) {
    SamplingParams p;
    p.temperature = 1.5f;
    p.seed = seed;
    p.has_seed = true;
    p.grammar = grammar;
    Sampler s(p);
    GrammarMatcher check(grammar->grammar, grammar->vocab);
    std::string text;
    for (int step = 0; step < 10 && !s.GrammarFinished(); ++step) {
      std::vector<float> l = {0.5f, 0.2f, 1.0f, 2.0f, 0.1f, 0.3f, 0.4f, 3.0f, 2.5f};  // "x" and </s> most likely
      const int32_t t = s.Sample(l.data(), (int64_t)l.size());
      ASSERT_TRUE(check.AcceptToken(t)) << "seed " << seed << " step " << step << " token " << t;
      if (t == 8) break;
      text += grammar->vocab->bytes(t);
    }
    EXPECT_TRUE(check.Complete()) << text;
    EXPECT_EQ(text.substr(text.size() - 3), " ok") << text;
  }
}

TEST(SamplerGrammar, DistributionIsRenormalizedOverAllowed) {
  auto grammar = DigitsGrammar();
  // At the start only "1", "2", "34", "5678" are allowed: probabilities e^l / sum over those four.
  const std::vector<float> base = {0.5f, 0.2f, 1.0f, 2.0f, 0.1f, 0.3f, 0.4f, 3.0f, 2.5f};
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    SamplingParams p;
    p.seed = (uint64_t)i;
    p.has_seed = true;
    p.grammar = grammar;
    Sampler s(p);
    auto l = base;
    counts[s.Sample(l.data(), (int64_t)l.size())]++;
  }
  double z = 0;
  for (int t = 0; t < 4; ++t) z += std::exp((double)base[t]);
  for (int t = 0; t < 4; ++t) {
    const double expect = std::exp((double)base[t]) / z;
    EXPECT_NEAR(counts[t] / (double)n, expect, 0.015) << "token " << t;
  }
  EXPECT_EQ(counts.size(), 4u);
}

TEST(SamplerGrammar, GreedyTakesBestAllowed) {
  auto grammar = DigitsGrammar();
  SamplingParams p;
  p.temperature = 0;
  p.grammar = grammar;
  Sampler s(p);
  std::vector<float> l = {0.5f, 0.2f, 1.0f, 2.0f, 0.1f, 0.3f, 0.4f, 3.0f, 2.5f};
  EXPECT_EQ(s.Sample(l.data(), (int64_t)l.size()), 3);  // "5678": "x" and </s> are not allowed yet
  l = {0.5f, 0.2f, 1.0f, 2.0f, 0.1f, 0.3f, 0.4f, 3.0f, 2.5f};
  EXPECT_EQ(s.Sample(l.data(), (int64_t)l.size()), 5);  // a fifth digit is too many: " o" beats " ok"
  EXPECT_FALSE(s.GrammarFinished());
  l = {0.5f, 0.2f, 1.0f, 2.0f, 0.1f, 0.3f, 0.4f, 3.0f, 2.5f};
  EXPECT_EQ(s.Sample(l.data(), (int64_t)l.size()), 6);  // "k", the only token allowed
  EXPECT_TRUE(s.GrammarFinished());
}

// Greedy draws where each step's favourite token gets logit 5 and `second` 4 (the rest 0), until the grammar is
// finished; `active` says whether the grammar was on at the end.
std::vector<int32_t> DrawFavourites(const SamplingParams& p, int64_t vocab, const std::vector<int32_t>& favourite,
                                    int32_t second, bool* active = nullptr) {
  Sampler s(p);
  std::vector<int32_t> out;
  for (int32_t f : favourite) {
    std::vector<float> l((size_t)vocab, 0.0f);
    l[(size_t)f] = 5.0f;
    l[(size_t)second] = std::max(l[(size_t)second], 4.0f);
    out.push_back(s.Sample(l.data(), vocab));
    if (s.GrammarFinished()) break;
  }
  if (active) *active = s.GrammarActive();
  return out;
}

TEST(SamplerGrammar, LazyGrammarStartsAfterItsTrigger) {
  // Tokens: free text, the trigger split over two tokens, and a token that carries the trigger's end with the
  // grammar's first byte. Before the trigger nothing is masked; after it only the grammar's text (then the end).
  auto g = Grammar::Parse("root ::= \"ab\"");
  ASSERT_TRUE(g.ok());
  auto compiled = std::make_shared<CompiledGrammar>();
  compiled->grammar = g.value();
  compiled->vocab = std::make_shared<GrammarVocab>(std::vector<std::string>{"hi", "<t", "t>", "t>a", "a", "b", "c", ""},
                                                   std::vector<uint8_t>{1, 1, 1, 1, 1, 1, 1, 0}, std::vector<int32_t>{7});
  SamplingParams p;
  p.temperature = 0;
  p.grammar = compiled;
  p.grammar_trigger = "<tt>";
  bool active = false;
  // Free text first ("c" second best everywhere): "c" and "hi" are taken as they are.
  EXPECT_EQ(DrawFavourites(p, 8, {6, 0, 6}, 6, &active), (std::vector<int32_t>{6, 0, 6}));
  EXPECT_FALSE(active);
  // "<t" + "t>": the grammar starts; "c" is refused then, "a" then "b" and the grammar is finished.
  EXPECT_EQ(DrawFavourites(p, 8, {1, 2, 6, 6, 6}, 6, &active), (std::vector<int32_t>{1, 2, 4, 5}));
  EXPECT_TRUE(active);
  // "<t" + "t>a": the token's "a" is the grammar's first byte, so only "b" may follow.
  EXPECT_EQ(DrawFavourites(p, 8, {1, 3, 4, 6}, 6), (std::vector<int32_t>{1, 3, 5}));
}

TEST(SamplerGrammar, TriggerAtStartHoldsTheWholeReply) {
  // The grammar is the reply's text itself once it begins with the trigger "<t" (blanks before it are free); a
  // reply that begins otherwise is free throughout.
  auto g = Grammar::Parse("root ::= \"<tab\"");
  ASSERT_TRUE(g.ok());
  auto compiled = std::make_shared<CompiledGrammar>();
  compiled->grammar = g.value();
  compiled->vocab = std::make_shared<GrammarVocab>(std::vector<std::string>{" ", "<", "t", "a", "b", "c", "<tx", ""},
                                                   std::vector<uint8_t>{1, 1, 1, 1, 1, 1, 1, 0}, std::vector<int32_t>{7});
  SamplingParams p;
  p.temperature = 0;
  p.grammar = compiled;
  p.grammar_trigger = "<t";
  p.grammar_trigger_at_start = true;
  auto run = [&](const std::vector<int32_t>& favourite) { return DrawFavourites(p, 8, favourite, 5); };  // "c" second
  EXPECT_EQ(run({0, 1, 2, 5, 5, 5}), (std::vector<int32_t>{0, 1, 2, 3, 4}));  // " <t" then only "a", "b"
  EXPECT_EQ(run({5, 1, 2, 5}), (std::vector<int32_t>{5, 1, 2, 5}));           // "c" first: free
  EXPECT_EQ(run({1, 5, 1}), (std::vector<int32_t>{1, 5, 1}));                 // "<c": not the trigger: free
  EXPECT_EQ(run({6, 3}), (std::vector<int32_t>{6, 3}));                       // "<tx": the grammar refuses it: free
}

TEST(SamplerGrammar, TokenTriggerStartsTheGrammarAfterThatToken) {
  // Mistral's [TOOL_CALLS]: a control token (not text the grammar sees) starts the grammar once drawn; text that
  // spells it out does not.
  auto g = Grammar::Parse("root ::= \" [\" \"a\"");
  ASSERT_TRUE(g.ok());
  auto compiled = std::make_shared<CompiledGrammar>();
  compiled->grammar = g.value();
  compiled->vocab = std::make_shared<GrammarVocab>(
      std::vector<std::string>{"hi", "[TOOL_CALLS]", " [", "a", "[TOOL_CALLS]", "c", ""},
      std::vector<uint8_t>{1, 0, 1, 1, 1, 1, 0}, std::vector<int32_t>{6});
  SamplingParams p;
  p.temperature = 0;
  p.grammar = compiled;
  p.grammar_trigger = "[TOOL_CALLS]";
  p.grammar_trigger_is_token = true;
  p.grammar_trigger_token = 1;
  bool active = false;
  // "c" second best; after token 1 only " [" then "a".
  EXPECT_EQ(DrawFavourites(p, 7, {0, 1, 5, 5, 5}, 5, &active), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_TRUE(active);
  // The same text as a plain token: free.
  EXPECT_EQ(DrawFavourites(p, 7, {0, 4, 5, 5}, 5, &active), (std::vector<int32_t>{0, 4, 5, 5}));
  EXPECT_FALSE(active);
}

// A reasoning gate (SamplingParams::reasoning_start/end, `--reasoning-parser`): a think block at the reply's start is
// free text, and the grammar takes the reply after it, blanks first; a reply that opens otherwise is the grammar's.
std::shared_ptr<CompiledGrammar> ThinkVocabGrammar(const char* gbnf) {
  auto g = Grammar::Parse(gbnf);
  EXPECT_TRUE(g.ok());
  auto compiled = std::make_shared<CompiledGrammar>();
  compiled->grammar = g.value();
  compiled->vocab = std::make_shared<GrammarVocab>(
      std::vector<std::string>{"<think>", "<", "think>", "</think>", "hmm", "{", "}", "\n\n", "x", "", "<tool_call>",
                               "</think>{"},
      std::vector<uint8_t>{1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1}, std::vector<int32_t>{9});
  return compiled;
}

// Greedy, the grammar "{}" on that vocabulary, gated by <think> ... </think>.
SamplingParams GatedParams() {
  SamplingParams p;
  p.temperature = 0;
  p.grammar = ThinkVocabGrammar("root ::= \"{}\"");
  p.reasoning_start = "<think>";
  p.reasoning_end = "</think>";
  return p;
}

TEST(SamplerGrammar, ReasoningGateFreesTheThinkBlockAndConstrainsTheAnswer) {
  SamplingParams p = GatedParams();
  bool active = false;
  // "{" is second best everywhere. "<think>", then free text ("x" too), "</think>", a blank, and then the grammar:
  // "x" is refused for "{", then only "}" may follow.
  EXPECT_EQ(DrawFavourites(p, 12, {0, 4, 8, 3, 7, 8, 8, 8}, 5, &active),
            (std::vector<int32_t>{0, 4, 8, 3, 7, 5, 6}));
  EXPECT_TRUE(active);
  // The grammar's first text in the token that closes the block.
  EXPECT_EQ(DrawFavourites(p, 12, {0, 11, 8}, 5), (std::vector<int32_t>{0, 11, 6}));
  // No think block: the grammar from the first token ("x" neither is the grammar's nor opens the block).
  EXPECT_EQ(DrawFavourites(p, 12, {8, 8, 8}, 5), (std::vector<int32_t>{5, 6}));
  // Only a token that begins with the whole tag opens the block (a model that spells it out is no reasoning
  // model): "<" is refused.
  EXPECT_EQ(DrawFavourites(p, 12, {1, 2, 8}, 5), (std::vector<int32_t>{5, 6}));
  // The prompt opened the block (reasoning_open): free from the first token up to "</think>".
  p.reasoning_open = true;
  EXPECT_EQ(DrawFavourites(p, 12, {4, 8, 3, 8, 8}, 5), (std::vector<int32_t>{4, 8, 3, 5, 6}));
  p.reasoning_open = false;
  // Without the gate the grammar holds the whole reply: "<think>" is refused.
  p.reasoning_start.clear();
  EXPECT_EQ(DrawFavourites(p, 12, {0, 8, 8}, 5), (std::vector<int32_t>{5, 6}));
}

TEST(SamplerGrammar, ReasoningGateHoldsBackALazyGrammarsTrigger) {
  // tool_choice "auto": the trigger inside the think block is reasoning; after it, the trigger starts the grammar.
  SamplingParams p = GatedParams();
  p.grammar_trigger = "<tool_call>";
  bool active = true;
  EXPECT_EQ(DrawFavourites(p, 12, {0, 10, 8, 3, 7, 8}, 5, &active), (std::vector<int32_t>{0, 10, 8, 3, 7, 8}));
  EXPECT_FALSE(active);
  EXPECT_EQ(DrawFavourites(p, 12, {0, 10, 8, 3, 10, 8, 8}, 5, &active),
            (std::vector<int32_t>{0, 10, 8, 3, 10, 5, 6}));
  EXPECT_TRUE(active);
  // No think block: the trigger (which begins like "<think>") starts the grammar at once.
  EXPECT_EQ(DrawFavourites(p, 12, {10, 8, 8}, 5, &active), (std::vector<int32_t>{10, 5, 6}));
  EXPECT_TRUE(active);
  // The trigger's first character, then free text: no grammar.
  EXPECT_EQ(DrawFavourites(p, 12, {1, 8, 8}, 5, &active), (std::vector<int32_t>{1, 8, 8}));
  EXPECT_FALSE(active);
}

TEST(SamplerGrammar, ReasoningGateOnQwen3sVocabulary) {
  // Qwen3's tokenizer: "<think>" and "</think>" are single text tokens, so its replies open the gate.
  auto tok = model::LoadTokenizer(lathe::testing::SharedPath("models/qwen3-tokenizer/tokenizer.json"));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  auto one = [&](const char* text) {
    const auto ids = (*tok)->Encode(text, /*add_bos=*/false, /*parse_special=*/true);
    EXPECT_EQ(ids.size(), 1u) << text;
    return ids.empty() ? -1 : ids[0];
  };
  const int32_t open = one("<think>"), close = one("</think>"), blank = one("\n\n"), x = one("x"), lb = one("{"),
                rb = one("}");
  auto g = Grammar::Parse("root ::= \"{\" \"}\"");
  ASSERT_TRUE(g.ok());
  auto compiled = std::make_shared<CompiledGrammar>();
  compiled->grammar = g.value();
  compiled->vocab = GrammarVocab::FromTokenizer(**tok);
  SamplingParams p;
  p.temperature = 0;
  p.grammar = compiled;
  p.reasoning_start = "<think>";
  p.reasoning_end = "</think>";
  const int64_t vocab = compiled->vocab->size();
  EXPECT_EQ(DrawFavourites(p, vocab, {open, x, close, blank, x, x, x}, lb),
            (std::vector<int32_t>{open, x, close, blank, lb, rb}));
  p.reasoning_start.clear();  // without the gate the tag is refused
  EXPECT_EQ(DrawFavourites(p, vocab, {open, x, x}, lb), (std::vector<int32_t>{lb, rb}));
}

}  // namespace
}  // namespace lathe::serve
