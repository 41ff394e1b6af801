// Sampler: turns one row of logits into a token id: logit bias, repetition / frequency / presence
// penalties, temperature, top-k, top-p, min-p, then a draw from a seeded RNG (or argmax when temperature 0).
// Each request owns its Sampler, so results depend only on its seed, never on batch composition.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "serve/grammar.h"

namespace lathe::serve {

struct SamplingParams {
  float temperature = 1.0f;        // 0 = greedy
  int top_k = 0;                   // 0 = off
  float top_p = 1.0f;              // 1 = off
  float min_p = 0.0f;              // 0 = off
  float repetition_penalty = 1.0f; // HF-style: logit / p if > 0 else * p, for tokens in prompt or output
  float frequency_penalty = 0.0f;  // OpenAI-style: - f * count(token in output)
  float presence_penalty = 0.0f;   // OpenAI-style: - p * [token in output]
  uint64_t seed = 0;
  bool has_seed = false;           // without a seed, one is drawn from std::random_device
  // OpenAI's logit_bias: added to these tokens' logits before anything else (-100 bans a token in
  // practice, +100 forces it); ids at or above the vocabulary size are skipped.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // Structured outputs: only tokens that keep the text a prefix of this grammar's language are drawn (after
  // the bias and penalties, before temperature and truncation). Null: unconstrained.
  std::shared_ptr<const CompiledGrammar> grammar;
  // A lazy grammar (tool_choice "auto"): the text is free until it contains this string, and the grammar then
  // constrains what follows it (the grammar's bytes start right after the trigger). Empty: the grammar applies from
  // the first token.
  std::string grammar_trigger;
  // The trigger counts only at the start of the text (after blanks), and the grammar's text starts with it: the
  // text is either a sentence of the grammar (it begins with the trigger) or free (it does not). Llama 3's tool
  // calls: a reply that begins with "{" is a call.
  bool grammar_trigger_at_start = false;
  // The trigger is a control token (Mistral's [TOOL_CALLS]), which is no text a grammar sees: the grammar starts
  // once grammar_trigger_token is drawn. The server sets the id from the trigger's text when this is set.
  bool grammar_trigger_is_token = false;
  int32_t grammar_trigger_token = -1;
  // A reasoning model's think block (`lathe serve --reasoning-parser`), as vLLM runs structured outputs: a reply
  // whose first token begins with reasoning_start (reasoning models have the tag as one token, Qwen3's <think>) is
  // free text up to reasoning_end, and the grammar (lazy or not) starts after it, blanks first; any other reply is
  // the grammar's from its first token (which may be the grammar's or open the block). Empty: the grammar holds the
  // whole reply. Only with a grammar.
  std::string reasoning_start, reasoning_end;
  // The reply starts inside the think block (the prompt opened it, or vLLM's deepseek_r1): free up to reasoning_end.
  bool reasoning_open = false;
  // Returns an error naming the field when a value is out of range.
  Status Validate() const;
};

struct TokenLogprob {
  int32_t id;
  float logprob;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Registers prompt tokens (for repetition_penalty); call once before sampling.
  void AddPrompt(std::span<const int32_t> prompt);
  // Samples from `logits` (modified in place by penalties and temperature) and records the
  // token as generated. If logprobs is not null, fills the chosen token's log-probability under
  // the model's raw distribution followed by the top `n_top` alternatives.
  int32_t Sample(float* logits, int64_t vocab, int n_top = 0, std::vector<TokenLogprob>* logprobs = nullptr);
  const SamplingParams& params() const { return params_; }
  // With a grammar: the text drawn so far is complete and nothing may follow (the request is done).
  bool GrammarFinished() const { return matcher_ && matcher_->Finished(); }
  // A lazy grammar's trigger has appeared (always true without a trigger once a grammar is given).
  bool GrammarActive() const { return matcher_ != nullptr && gate_ != Gate::kUndecided; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int> output_counts_;
  std::vector<int32_t> seen_;             // prompt + output tokens (for repetition penalty)
  std::vector<uint8_t> seen_mask_;
  std::vector<std::pair<float, int32_t>> cand_;  // scratch
  std::vector<double> probs_;                    // scratch: the sorted prefix's exp(logit / T - max)
  std::unique_ptr<GrammarMatcher> matcher_;      // with a grammar
  std::vector<uint8_t> allowed_;                 // scratch: the grammar's mask
  std::string untriggered_;  // a lazy grammar before its trigger: the text's tail that may still hold its start
  bool lazy_ = false;        // waiting for the trigger
  // Where the reply stands with a reasoning gate (SamplingParams::reasoning_start): kUndecided before its first
  // token, kReasoning inside the think block, kAfter between reasoning_end and the grammar's first text (blanks),
  // kNone once the grammar (or the lazy grammar's wait) has taken over, or without a gate.
  enum class Gate : uint8_t { kNone, kUndecided, kReasoning, kAfter };
  Gate gate_ = Gate::kNone;
  std::string gate_text_;  // kReasoning: the text's tail that may hold reasoning_end's start
  // A lazy grammar: records a drawn token's bytes; when the trigger appears, starts the matcher on what follows it.
  void WatchForTrigger(int32_t token);
  void WatchText(std::string_view bytes);
  // The gate's mask (in allowed_, logits of the rest set to -inf); false when it allows nothing.
  bool MaskGate(float* logits, int64_t vocab);
  // Advances the gate over the drawn token.
  void GateAccept(int32_t token);
  // Text inside the think block: looks for reasoning_end.
  void ReasoningText(std::string_view bytes);
  // The reasoning is over; `rest` is the text after reasoning_end.
  void EndReasoning(std::string_view rest);
  // Ends the wait: the grammar starts on `text` (dropped, with the grammar, when it refuses it).
  void StartGrammar(std::string_view text);
  // Sets the logits of the tokens the grammar does not allow to -inf; false when it allows none.
  bool MaskByGrammar(float* logits, int64_t vocab);
  // The same for the tokens allowed_ does not hold.
  bool ApplyMask(float* logits, int64_t vocab);
};

// Log-softmax of one logit row at `id` and the top-n (id, logprob) pairs.
void ComputeLogprobs(const float* logits, int64_t vocab, int32_t id, int n_top, std::vector<TokenLogprob>* out);

}  // namespace lathe::serve
