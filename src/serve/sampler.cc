// Sampler implementation.
#include "serve/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/strings.h"
#include "kernels/kernels.h"

namespace lathe::serve {

Status SamplingParams::Validate() const {
  if (!(temperature >= 0) || !std::isfinite(temperature)) return Status::Error("temperature must be >= 0");
  if (top_k < 0) return Status::Error("top_k must be >= 0 (0 disables it)");
  if (!(top_p > 0 && top_p <= 1)) return Status::Error("top_p must be in (0, 1]");
  if (!(min_p >= 0 && min_p <= 1)) return Status::Error("min_p must be in [0, 1]");
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty)) {
    return Status::Error("repetition_penalty must be > 0");
  }
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2)) return Status::Error("frequency_penalty must be in [-2, 2]");
  if (!(presence_penalty >= -2 && presence_penalty <= 2)) return Status::Error("presence_penalty must be in [-2, 2]");
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0) return Status::Error(StrFormat("logit_bias: token id %d is negative", id));
    if (!(bias >= -100 && bias <= 100)) return Status::Error(StrFormat("logit_bias[%d] must be in [-100, 100]", id));
  }
  return Status::Ok();
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  rng_.seed(params.has_seed ? params.seed : std::random_device{}());
  if (params.grammar && params.grammar_trigger.empty()) {
    matcher_ = std::make_unique<GrammarMatcher>(params.grammar->grammar, params.grammar->vocab, params.grammar->cache);
  }
  lazy_ = params.grammar && !params.grammar_trigger.empty();
  if (params.grammar && !params.reasoning_start.empty() && !params.reasoning_end.empty()) {
    gate_ = params.reasoning_open ? Gate::kReasoning : Gate::kUndecided;
  }
}

void Sampler::WatchForTrigger(int32_t token) {
  if (params_.grammar_trigger_is_token) {
    if (token == params_.grammar_trigger_token) StartGrammar("");
    return;
  }
  const GrammarVocab& vocab = *params_.grammar->vocab;
  if (token < 0 || token >= vocab.size() || !vocab.is_text(token)) return;
  WatchText(vocab.bytes(token));
}

void Sampler::WatchText(std::string_view bytes) {
  untriggered_ += bytes;
  const std::string& trigger = params_.grammar_trigger;
  if (params_.grammar_trigger_at_start) {
    untriggered_.erase(0, std::min(untriggered_.size(), untriggered_.find_first_not_of(" \t\r\n")));
    const size_t k = std::min(untriggered_.size(), trigger.size());
    if (untriggered_.compare(0, k, trigger, 0, k) != 0) {  // the text does not begin with it: free from now on
      lazy_ = false;
      untriggered_.clear();
      return;
    }
    if (untriggered_.size() >= trigger.size()) StartGrammar(untriggered_);
    return;
  }
  const size_t at = untriggered_.find(trigger);
  if (at == std::string::npos) {
    // Keep only what may be the trigger's beginning.
    if (untriggered_.size() >= trigger.size()) untriggered_.erase(0, untriggered_.size() - (trigger.size() - 1));
    return;
  }
  // The token may carry text past the trigger: the grammar's first bytes.
  StartGrammar(std::string_view(untriggered_).substr(at + trigger.size()));
}

void Sampler::StartGrammar(std::string_view text) {
  lazy_ = false;
  auto m = std::make_unique<GrammarMatcher>(params_.grammar->grammar, params_.grammar->vocab, params_.grammar->cache);
  // Text the grammar refuses leaves the rest unconstrained (the caller's parser then reads it as free text).
  if (m->AcceptBytes(text)) matcher_ = std::move(m);
  untriggered_.clear();
}

namespace {

bool IsBlankText(const std::string& b) { return !b.empty() && b.find_first_not_of(" \t\r\n") == std::string::npos; }

}  // namespace

bool Sampler::MaskGate(float* logits, int64_t vocab) {
  const GrammarVocab& gv = *params_.grammar->vocab;
  const int32_t n = (int32_t)std::min<int64_t>(vocab, gv.size());
  matcher_->AllowedTokens(&allowed_);
  if (gate_ == Gate::kUndecided) {
    // The first token: the grammar's, or one that opens the think block.
    const std::string& start = params_.reasoning_start;
    for (int32_t i = 0; i < n && i < (int32_t)allowed_.size(); ++i) {
      if (!allowed_[i] && gv.bytes(i).compare(0, start.size(), start) == 0) allowed_[i] = 1;
    }
  } else {  // kAfter: the grammar's first tokens, or blanks
    for (int32_t i = 0; i < n && i < (int32_t)allowed_.size(); ++i) {
      if (!allowed_[i] && gv.is_text(i) && IsBlankText(gv.bytes(i))) allowed_[i] = 1;
    }
  }
  return ApplyMask(logits, vocab);
}

void Sampler::GateAccept(int32_t token) {
  const GrammarVocab& gv = *params_.grammar->vocab;
  if (token < 0 || token >= gv.size()) return;
  const std::string& b = gv.bytes(token);
  switch (gate_) {
    case Gate::kNone:
      return;
    case Gate::kUndecided: {
      const std::string& start = params_.reasoning_start;
      if (b.compare(0, start.size(), start) == 0) {  // the think block is open: free text
        gate_ = Gate::kReasoning;
        matcher_.reset();
        ReasoningText(std::string_view(b).substr(start.size()));
        return;
      }
      // No think block: the grammar has the reply from its first token.
      gate_ = Gate::kNone;
      if (lazy_) {
        WatchForTrigger(token);
      } else if (!matcher_->AcceptToken(token)) {
        matcher_.reset();  // (not reached: the mask allowed the token)
      }
      return;
    }
    case Gate::kReasoning:
      ReasoningText(b);
      return;
    case Gate::kAfter:
      if (matcher_->AcceptToken(token)) {
        gate_ = Gate::kNone;
      } else if (!IsBlankText(b)) {  // a draw the mask refused: the rest is free
        gate_ = Gate::kNone;
        matcher_.reset();
      }
      return;
  }
}

void Sampler::ReasoningText(std::string_view bytes) {
  gate_text_ += bytes;
  const std::string& end = params_.reasoning_end;
  const size_t at = gate_text_.find(end);
  if (at == std::string::npos) {  // keep what may be reasoning_end's beginning
    if (gate_text_.size() >= end.size()) gate_text_.erase(0, gate_text_.size() - (end.size() - 1));
    return;
  }
  const std::string rest = gate_text_.substr(at + end.size());
  gate_text_.clear();
  EndReasoning(rest);
}

void Sampler::EndReasoning(std::string_view rest) {
  if (lazy_) {  // the lazy grammar's wait starts now
    gate_ = Gate::kNone;
    if (!params_.grammar_trigger_is_token) WatchText(rest);
    return;
  }
  const size_t k = rest.find_first_not_of(" \t\r\n");
  if (k == std::string_view::npos) {
    gate_ = Gate::kAfter;
    matcher_ = std::make_unique<GrammarMatcher>(params_.grammar->grammar, params_.grammar->vocab, params_.grammar->cache);
    return;
  }
  gate_ = Gate::kNone;
  StartGrammar(rest.substr(k));
}

bool Sampler::MaskByGrammar(float* logits, int64_t vocab) {
  matcher_->AllowedTokens(&allowed_);
  return ApplyMask(logits, vocab);
}

bool Sampler::ApplyMask(float* logits, int64_t vocab) {
  const int64_t n = std::min<int64_t>(vocab, (int64_t)allowed_.size());
  bool any = false;
  for (int64_t i = 0; i < n; ++i) {
    if (allowed_[i]) {
      any = true;
    } else {
      logits[i] = -std::numeric_limits<float>::infinity();
    }
  }
  for (int64_t i = n; i < vocab; ++i) logits[i] = -std::numeric_limits<float>::infinity();  // padded rows
  return any;
}

void Sampler::AddPrompt(std::span<const int32_t> prompt) { seen_.insert(seen_.end(), prompt.begin(), prompt.end()); }

void ComputeLogprobs(const float* logits, int64_t vocab, int32_t id, int n_top, std::vector<TokenLogprob>* out) {
  float mx = logits[kernels::Argmax(logits, vocab)];
  double s = 0;
  for (int64_t i = 0; i < vocab; ++i) s += std::exp((double)logits[i] - mx);
  float lse = mx + (float)std::log(s);
  out->clear();
  out->push_back({id, logits[id] - lse});
  if (n_top <= 0) return;
  std::vector<int32_t> idx(vocab);
  for (int64_t i = 0; i < vocab; ++i) idx[i] = (int32_t)i;
  int k = (int)std::min<int64_t>(n_top, vocab);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int i = 0; i < k; ++i) out->push_back({idx[i], logits[idx[i]] - lse});
}

int32_t Sampler::Sample(float* logits, int64_t vocab, int n_top, std::vector<TokenLogprob>* logprobs) {
  const SamplingParams& p = params_;
  std::vector<float> raw;
  if (logprobs) raw.assign(logits, logits + vocab);
  for (const auto& [t, bias] : p.logit_bias)
    if (t >= 0 && t < vocab) logits[t] += bias;
  // Penalties.
  if (p.repetition_penalty != 1.0f) {
    seen_mask_.assign(vocab, 0);
    for (int32_t t : seen_) {
      if (t < 0 || t >= vocab || seen_mask_[t]) continue;
      seen_mask_[t] = 1;
      logits[t] = logits[t] > 0 ? logits[t] / p.repetition_penalty : logits[t] * p.repetition_penalty;
    }
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    for (const auto& [t, n] : output_counts_) {
      if (t >= 0 && t < vocab) logits[t] -= p.frequency_penalty * n + p.presence_penalty;
    }
  }
  int32_t chosen = -1;
  bool accepted = false;  // the grammar has taken `chosen` already
  // Nothing allowed (a grammar's dead end: a schema no text satisfies): end the text.
  const auto end_text = [&] {
    const auto& ends = params_.grammar->vocab->end_ids();
    return ends.empty() ? 0 : ends[0];
  };
  // A reasoning gate masks while the reply may still become (or has just ended) its think block; none inside it,
  // nor before a lazy grammar's wait.
  const bool gated = gate_ != Gate::kNone;
  const bool gate_masks = gate_ == Gate::kAfter || (gate_ == Gate::kUndecided && !lazy_);
  if (gated) {
    if (gate_masks && !MaskGate(logits, vocab)) chosen = end_text();
  } else if (matcher_) {
    // Greedy: the best token is usually allowed, and trying it alone costs microseconds; otherwise (and
    // always when drawing) the whole mask, so the draw is over the allowed tokens' renormalized probabilities.
    if (p.temperature == 0.0f) {
      const int32_t best = (int32_t)kernels::Argmax(logits, vocab);
      if (matcher_->AcceptToken(best)) {
        chosen = best;
        accepted = true;
      }
    }
    if (chosen < 0 && !MaskByGrammar(logits, vocab)) chosen = end_text();
  }
  if (chosen >= 0) {
    // decided by the grammar above
  } else if (p.temperature == 0.0f) {
    chosen = (int32_t)kernels::Argmax(logits, vocab);
  } else {
    // Candidates in descending order of logit / temperature (ties: lower id first); k and p truncate, then
    // softmax at temperature. Only the prefix of that order that the truncation and the draw reach is sorted
    // (sorted_to: the next best candidates selected, then sorted), not the whole vocabulary: a full sort of
    // 49152 candidates cost ~3 ms a token. The arithmetic over the sorted prefix is that of a full sort.
    cand_.resize(vocab);
    float top = -std::numeric_limits<float>::infinity();  // a local (the lambdas below see mx): a register
    std::pair<float, int32_t>* c = cand_.data();
    const float temp = p.temperature;
    for (int64_t i = 0; i < vocab; ++i) {
      const float v = logits[i] / temp;
      c[i] = {v, (int32_t)i};
      top = v > top ? v : top;
    }
    const float mx = top;
    auto cmp = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    int64_t n = vocab, sorted = 0;
    probs_.clear();
    // Extends the sorted prefix cand_[0, sorted) to at least m candidates (at most n) and their probabilities.
    auto sorted_to = [&](int64_t m) {
      m = std::min(m, n);
      if (m <= sorted) return;
      if (m - sorted <= 1024) {  // a heap of the few best in one pass over the rest
        std::partial_sort(cand_.begin() + sorted, cand_.begin() + m, cand_.begin() + n, cmp);
      } else {
        if (m < n) std::nth_element(cand_.begin() + sorted, cand_.begin() + m, cand_.begin() + n, cmp);
        std::sort(cand_.begin() + sorted, cand_.begin() + m, cmp);
      }
      for (int64_t i = sorted; i < m; ++i) probs_.push_back(std::exp((double)cand_[i].first - mx));
      sorted = m;
    };
    double sum = 0;
    if (p.top_k > 0 && p.top_k < n) {
      sorted_to(p.top_k);  // the best top_k of the whole vocabulary, sorted
      n = p.top_k;
      for (int64_t i = 0; i < n; ++i) sum += probs_[i];
    } else {
      for (int64_t i = 0; i < vocab; ++i) sum += std::exp((double)cand_[i].first - mx);  // id order
      sorted_to(64);
    }
    const auto grow = [&] { sorted_to(std::max<int64_t>(64, 4 * sorted)); };
    int64_t keep = n;
    if (p.top_p < 1.0f) {
      double cum = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (i == sorted) grow();
        cum += probs_[i] / sum;
        if (cum >= p.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    if (p.min_p > 0.0f) {
      // probs[0] is the largest; drop tokens below min_p * max probability.
      int64_t k = 1;
      while (k < keep) {
        if (k == sorted) grow();
        if (!(probs_[k] >= p.min_p * probs_[0])) break;
        ++k;
      }
      keep = k;
    }
    double total = 0;
    if (keep == n && sorted < n) {
      total = sum;  // every candidate kept: the sum above
    } else {
      for (int64_t i = 0; i < keep; ++i) total += probs_[i];
    }
    std::uniform_real_distribution<double> u(0.0, total);
    double r = u(rng_);
    chosen = -1;
    double acc = 0;
    for (int64_t i = 0; i < keep; ++i) {
      if (i == sorted) grow();
      acc += probs_[i];
      if (r < acc) {
        chosen = cand_[i].second;
        break;
      }
    }
    if (chosen < 0) {  // r at the very top of the range (rounding): the last kept candidate
      sorted_to(keep);
      chosen = cand_[keep - 1].second;
    }
  }
  if (gated) {
    // As below: a draw at the very top of its range may land on a masked token; the best allowed one instead.
    if (gate_masks && (chosen >= (int64_t)allowed_.size() || !allowed_[chosen])) {
      chosen = (int32_t)kernels::Argmax(logits, vocab);
    }
    GateAccept(chosen);
  } else {
    if (matcher_ && !accepted && !matcher_->AcceptToken(chosen)) {
      // Only a draw at the very top of its range can land on a masked (zero-probability) token: take the best
      // allowed one instead.
      const int32_t best = (int32_t)kernels::Argmax(logits, vocab);
      if (matcher_->AcceptToken(best)) chosen = best;
    }
    if (lazy_) WatchForTrigger(chosen);
  }
  if (logprobs) ComputeLogprobs(raw.data(), vocab, chosen, n_top, logprobs);
  output_counts_[chosen]++;
  seen_.push_back(chosen);
  return chosen;
}

}  // namespace lathe::serve
