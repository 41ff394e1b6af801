// `lathe bench structured`: what grammar-constrained decoding (structured outputs) costs. One stream decodes a
// chat answer under a JSON schema, then the same number of tokens unconstrained, in the same run; greedy (the
// best token checked alone) and sampled (a full mask every token). Also the mask walk itself over the model's
// vocabulary, cold (no cache), at states inside and between JSON values.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/thread_pool.h"
#include "model/transformer.h"
#include "serve/generate.h"
#include "serve/grammar.h"
#include "server/json_schema.h"
#include "tokenizer/chat_template.h"

namespace lathe::cli {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kDefaultSchema = R"({"type": "object", "properties": {
  "name": {"type": "string"}, "species": {"enum": ["cat", "dog", "bird"]}, "age": {"type": "integer"},
  "toys": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
  "owner": {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
            "required": ["name", "city"]}},
  "required": ["name", "species", "age", "toys", "owner"]})";

}  // namespace

int RunBenchStructured(int argc, char** argv) {
  Args args("bench structured", "lathe bench structured -m MODEL [-t N] [--json-schema JSON] [-r ROUNDS]");
  AddModelFlags(args);
  args.Flag("-p,--prompt", "the user message", "Describe a pet and its owner as JSON.");
  args.Flag("--json-schema", "the schema (inline JSON; default: a pet with an owner)");
  args.Flag("-n,--n-predict", "at most this many tokens per answer", "256");
  args.Flag("-r,--rounds", "rounds; the best of each is kept", "3");
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return Fail("bench structured", st);
  if (args.help_requested()) {
    std::printf("%s", args.Help().c_str());
    return 0;
  }
  auto lm = LoadModelFromArgs(args);
  if (!lm.ok()) return Fail("bench structured", lm.status());
  const tokenizer::Tokenizer& tok = *(*lm)->tokenizer;
  auto rounds = args.Int("rounds");
  auto n_predict = args.Int("n-predict");
  if (!rounds.ok() || *rounds < 1 || !n_predict.ok() || *n_predict < 1) {
    return Fail("bench structured", Status::Error("--rounds and --n-predict must be positive integers"));
  }
  const std::string schema_text = args.Has("json-schema") ? args.Get("json-schema") : kDefaultSchema;
  auto schema = nlohmann::ordered_json::parse(schema_text, nullptr, false);
  if (schema.is_discarded()) return Fail("bench structured", Status::Error("--json-schema: not valid JSON"));
  auto gbnf = server::JsonSchemaToGbnf(schema);
  if (!gbnf.ok()) return Fail("bench structured", gbnf.status().WithContext("--json-schema"));
  auto grammar = serve::Grammar::Parse(gbnf.value());
  if (!grammar.ok()) return Fail("bench structured", grammar.status());
  auto vocab = serve::GrammarVocab::FromTokenizer(tok);

  tokenizer::ChatTemplate tmpl = tokenizer::ChatTemplate::Detect(tok.chat_template());
  std::vector<tokenizer::ChatMessage> msgs = {{"user", args.Get("prompt")}};
  std::vector<int32_t> prompt =
      tok.Encode(tmpl.Apply(msgs, true), tok.add_bos() && !tmpl.text_has_bos(), /*parse_special=*/true);
  ThreadPool pool(ThreadsFromArgs(args));
  model::Transformer tf((*lm)->weights, pool, {});
  model::KvCache cache(tf.config(), 1, (int64_t)prompt.size() + *n_predict + 1, 16, DType::kF16);

  std::printf("lathe bench structured: %s, %d thread(s), vocabulary %d, prompt %zu tokens, best of %lld rounds\n",
              (*lm)->path.c_str(), ThreadsFromArgs(args), tok.vocab_size(), prompt.size(), (long long)*rounds);
  // One decode: tokens and decode tok/s (the first token comes from the prefill's logits).
  auto run = [&](bool constrained, bool greedy, int max_tokens, std::shared_ptr<serve::GrammarMaskCache> mask_cache,
                 std::string* text) -> std::pair<size_t, double> {
    cache.Clear(0);
    serve::GenerateOptions o;
    o.max_tokens = max_tokens;
    o.stop_at_eos = constrained;
    o.sampling.temperature = greedy ? 0.0f : 0.8f;
    o.sampling.seed = 7;
    o.sampling.has_seed = true;
    if (constrained) {
      o.sampling.grammar =
          std::make_shared<const serve::CompiledGrammar>(serve::CompiledGrammar{grammar.value(), vocab, std::move(mask_cache)});
    }
    auto r = serve::Generate(tf, cache, 0, tok, prompt, o);
    if (!r.ok()) {
      std::fprintf(stderr, "lathe bench structured: %s\n", r.status().message().c_str());
      std::exit(1);
    }
    if (text) *text = r->text;
    const size_t n = r->ids.size();
    return {n, n > 1 ? (n - 1) / r->decode_seconds : 0.0};
  };

  // A schema's first request fills its mask cache (cold); later requests with the same schema find their states'
  // masks there (warm: the server shares one cache per grammar).
  std::printf("\n| sampling | unconstrained tok/s | constrained, cold cache | ratio | constrained, warm cache | ratio | "
              "tokens | walks cold / warm |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (bool greedy : {true, false}) {
    double best_cold = 0, best_warm = 0, best_u = 0;
    size_t tokens = 0, walks_cold = 0, walks_warm = 0;
    std::string text;
    for (int64_t k = 0; k < *rounds; ++k) {
      auto mask_cache = std::make_shared<serve::GrammarMaskCache>();
      auto [n, cold] = run(true, greedy, (int)*n_predict, mask_cache, &text);
      walks_cold = mask_cache->misses();
      auto [n2, warm] = run(true, greedy, (int)*n_predict, mask_cache, nullptr);
      walks_warm = mask_cache->misses() - walks_cold;
      auto [nu, tpu] = run(false, greedy, (int)n, nullptr, nullptr);
      tokens = n;
      best_cold = std::max(best_cold, cold);
      best_warm = std::max(best_warm, warm);
      best_u = std::max(best_u, tpu);
      (void)n2;
      (void)nu;
    }
    std::printf("| %s | %.1f | %.1f | %.2fx | %.1f | %.2fx | %zu | %zu / %zu |\n", greedy ? "greedy" : "temperature 0.8",
                best_u, best_cold, best_cold / best_u, best_warm, best_warm / best_u, tokens, walks_cold, walks_warm);
  }

  // The mask walk alone (no cache) at states along the greedy answer: inside a string most tokens pass.
  std::string answer;
  run(true, true, (int)*n_predict, nullptr, &answer);
  serve::GrammarMatcher m(grammar.value(), vocab);
  std::vector<uint8_t> mask;
  double total = 0, worst = 0;
  int states = 0;
  for (size_t i = 0; i <= answer.size(); ++i) {
    const auto t0 = Clock::now();
    m.ComputeAllowedTokens(&mask);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    total += ms;
    worst = std::max(worst, ms);
    ++states;
    if (i < answer.size() && !m.AcceptBytes(answer.substr(i, 1))) break;
  }
  std::printf("\nmask walk without a cache over %d tokens, at each of %d states (one per byte of the greedy answer): "
              "mean %.2f ms, worst %.2f ms\n", tok.vocab_size(), states, total / states, worst);
  return 0;
}

}  // namespace lathe::cli
