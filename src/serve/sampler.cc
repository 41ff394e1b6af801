// Sampler implementation.
#include "serve/sampler.h"

#include <algorithm>
#include <cmath>

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
  int32_t chosen;
  if (p.temperature == 0.0f) {
    chosen = (int32_t)kernels::Argmax(logits, vocab);
  } else {
    // Candidates sorted by logit (descending); k and p truncate, then softmax at temperature.
    cand_.resize(vocab);
    for (int64_t i = 0; i < vocab; ++i) cand_[i] = {logits[i] / p.temperature, (int32_t)i};
    auto cmp = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    int64_t n = vocab;
    if (p.top_k > 0 && p.top_k < n) {
      std::partial_sort(cand_.begin(), cand_.begin() + p.top_k, cand_.end(), cmp);
      n = p.top_k;
    } else {
      std::sort(cand_.begin(), cand_.end(), cmp);
    }
    float mx = cand_[0].first;
    std::vector<double> probs(n);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += probs[i] = std::exp((double)cand_[i].first - mx);
    int64_t keep = n;
    if (p.top_p < 1.0f) {
      double cum = 0;
      for (int64_t i = 0; i < n; ++i) {
        cum += probs[i] / sum;
        if (cum >= p.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    if (p.min_p > 0.0f) {
      // probs[0] is the largest; drop tokens below min_p * max probability.
      int64_t k = 1;
      while (k < keep && probs[k] >= p.min_p * probs[0]) ++k;
      keep = k;
    }
    double total = 0;
    for (int64_t i = 0; i < keep; ++i) total += probs[i];
    std::uniform_real_distribution<double> u(0.0, total);
    double r = u(rng_);
    chosen = cand_[keep - 1].second;
    double acc = 0;
    for (int64_t i = 0; i < keep; ++i) {
      acc += probs[i];
      if (r < acc) {
        chosen = cand_[i].second;
        break;
      }
    }
  }
  if (logprobs) ComputeLogprobs(raw.data(), vocab, chosen, n_top, logprobs);
  output_counts_[chosen]++;
  seen_.push_back(chosen);
  return chosen;
}

}  // namespace lathe::serve
