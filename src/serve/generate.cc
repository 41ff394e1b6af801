// Single-sequence generation loop with streaming and stop handling.
#include "serve/generate.h"

#include <algorithm>
#include <chrono>

namespace lathe::serve {

std::string StopStringMatcher::Push(const std::string& text, bool* stopped) {
  *stopped = false;
  held_ += text;
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    if (s.empty()) continue;
    size_t at = held_.find(s);
    if (at != std::string::npos) first = std::min(first, at);
  }
  if (first != std::string::npos) {
    *stopped = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Keep the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - (s.empty() ? 0 : 1), held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::Flush() {
  std::string out;
  out.swap(held_);
  return out;
}

Result<GenerateResult> Generate(model::Transformer& tf, model::KvCache& cache, int slot,
                                const tokenizer::Tokenizer& tok, std::span<const int32_t> prompt,
                                const GenerateOptions& options,
                                const std::function<bool(const std::string&)>& on_text) {
  using Clock = std::chrono::steady_clock;
  LATHE_RETURN_IF_ERROR(options.sampling.Validate());
  if (prompt.empty()) return Status::Error("empty prompt: nothing to condition on (add BOS)");
  GenerateResult res;
  res.prompt_tokens = (int64_t)prompt.size();
  if (cache.length(slot) >= (int64_t)prompt.size()) cache.Truncate(slot, (int64_t)prompt.size() - 1);
  int64_t cached = cache.length(slot);
  if ((int64_t)prompt.size() + options.max_tokens > cache.max_len()) {
    return Status::Error(StrFormat("prompt (%zu tokens) + max_tokens (%d) exceeds the context length %lld",
                                   prompt.size(), options.max_tokens, (long long)cache.max_len()));
  }
  const int64_t vocab = tf.config().vocab_size;
  Sampler sampler(options.sampling);
  sampler.AddPrompt(prompt);
  tokenizer::StreamDecoder decoder(tok);
  // Text generated right after BOS starts a document: SentencePiece drops its leading space.
  if (prompt.back() == tok.bos_id()) decoder.Push(prompt.back());
  StopStringMatcher stops(options.stop);
  std::vector<float> logits;
  auto t0 = Clock::now();
  model::SeqInput in{slot, prompt.subspan(cached), false};  // prompt rows: f32 activations
  LATHE_RETURN_IF_ERROR(tf.Forward(cache, std::span<const model::SeqInput>(&in, 1), &logits));
  auto t1 = Clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  const auto& stop_ids = tok.stop_ids();
  res.finish_reason = "length";
  bool keep_going = true, grammar_done = false;
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    res.text += s;
    if (on_text && !on_text(s)) keep_going = false;
  };
  for (int i = 0; i < options.max_tokens && keep_going; ++i) {
    int32_t id = sampler.Sample(logits.data(), vocab);
    res.ids.push_back(id);
    if (options.stop_at_eos && std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) {
      res.finish_reason = "stop";
      break;
    }
    bool stopped = false;
    emit(stops.Push(decoder.Push(id), &stopped));
    if (stopped) {
      res.finish_reason = "stop";
      break;
    }
    if (sampler.GrammarFinished()) {  // structured output complete: nothing may follow
      res.finish_reason = "stop";
      grammar_done = true;
      break;
    }
    if (i + 1 == options.max_tokens) break;
    model::SeqInput step{slot, std::span<const int32_t>(&res.ids.back(), 1), false, 1};  // a sampled token
    LATHE_RETURN_IF_ERROR(tf.Forward(cache, std::span<const model::SeqInput>(&step, 1), &logits));
  }
  if (res.finish_reason != "stop" || !keep_going || grammar_done) {
    bool stopped = false;
    emit(stops.Push(decoder.Flush(), &stopped));
    if (!stopped) emit(stops.Flush());
  }
  res.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return res;
}

}  // namespace lathe::serve
