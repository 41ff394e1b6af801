// Generate: the single-sequence decoding loop used by `lathe generate` and `lathe chat`:
// prefill the prompt into a KV-cache slot, then sample token by token, streaming complete UTF-8
// text, until max_tokens, an end-of-sequence token, or a stop string.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/transformer.h"
#include "serve/sampler.h"
#include "tokenizer/tokenizer.h"

namespace lathe::serve {

struct GenerateOptions {
  int max_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings; the text is cut before the first match
  bool stop_at_eos = true;        // stop on the tokenizer's stop ids
};

struct GenerateResult {
  std::vector<int32_t> ids;    // generated ids (the stop token included when one ended it)
  std::string text;            // generated text (stop token and stop string excluded)
  std::string finish_reason;   // "stop" (eos or stop string) or "length"
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t prompt_tokens = 0;
};

// Continues the sequence in `slot` (whose cache may already hold a prefix of `prompt`: only the
// tokens past cache.length(slot) are prefilled, so a chat reuses its history). `on_text`
// receives streamed text pieces; returning false stops generation.
Result<GenerateResult> Generate(model::Transformer& tf, model::KvCache& cache, int slot,
                                const tokenizer::Tokenizer& tok, std::span<const int32_t> prompt,
                                const GenerateOptions& options,
                                const std::function<bool(const std::string&)>& on_text = nullptr);

// Holds back streamed text that could still become a stop string; reports a match.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds text; returns the part safe to emit now. Sets *stopped when a stop string completed
  // (the returned text then ends right before it).
  std::string Push(const std::string& text, bool* stopped);
  std::string Flush();  // the held-back tail, at the end of generation

 private:
  std::vector<std::string> stops_;
  std::string held_;
};

}  // namespace lathe::serve
