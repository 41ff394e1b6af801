// Collation, epoch order and step counting for the Trainer.
#include "train/batching.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/check.h"

namespace lathe::train {

Batch Collate(std::span<const TokenizedSample> samples, std::span<const int64_t> indices, int32_t pad_id) {
  LATHE_CHECK(!indices.empty());
  Batch b;
  b.B = (int64_t)indices.size();
  bool packed = false;
  for (int64_t i : indices) {
    LATHE_CHECK(i >= 0 && i < (int64_t)samples.size());
    const TokenizedSample& s = samples[i];
    b.T = std::max<int64_t>(b.T, (int64_t)s.input_ids.size());
    for (size_t t = 1; t < s.segment_ids.size() && !packed; ++t)
      packed = s.segment_ids[t] != s.segment_ids[0];
  }
  b.input_ids.assign(b.B * b.T, pad_id);
  b.labels.assign(b.B * b.T, kIgnoreIndex);
  if (packed) b.segment_ids.assign(b.B * b.T, 0);
  for (int64_t r = 0; r < b.B; ++r) {
    const TokenizedSample& s = samples[indices[r]];
    int64_t n = (int64_t)s.input_ids.size();
    LATHE_CHECK(s.labels.size() == s.input_ids.size());
    std::copy(s.input_ids.begin(), s.input_ids.end(), b.input_ids.begin() + r * b.T);
    std::copy(s.labels.begin(), s.labels.end(), b.labels.begin() + r * b.T);
    b.real_tokens += n;
    // Token t predicts labels[t + 1]: a row's first label is never a target.
    for (int64_t t = 1; t < n; ++t) b.target_tokens += s.labels[t] != kIgnoreIndex;
    if (packed) {
      int32_t last = 0;
      for (int64_t t = 0; t < n; ++t) {
        last = (size_t)t < s.segment_ids.size() ? s.segment_ids[t] : last;
        b.segment_ids[r * b.T + t] = last;
      }
      std::fill(b.segment_ids.begin() + r * b.T + n, b.segment_ids.begin() + (r + 1) * b.T, last + 1);
    }
  }
  return b;
}

StepPlan PlanSteps(int64_t num_samples, int64_t batch_size, int64_t grad_accum, double num_train_epochs,
                   int64_t max_steps) {
  LATHE_CHECK(num_samples > 0 && batch_size > 0 && grad_accum > 0);
  StepPlan p;
  p.micro_batches_per_epoch = (num_samples + batch_size - 1) / batch_size;
  p.steps_per_epoch = (p.micro_batches_per_epoch + grad_accum - 1) / grad_accum;
  if (max_steps > 0) {
    p.total_steps = max_steps;
    p.num_train_epochs = (double)((max_steps + p.steps_per_epoch - 1) / p.steps_per_epoch);
  } else {
    // The product is rounded first so that e.g. 0.3 * 10 (2.9999999999999996) gives 3 steps.
    double x = num_train_epochs * (double)p.steps_per_epoch;
    double r = std::round(x);
    p.total_steps = std::fabs(x - r) < 1e-9 ? (int64_t)r : (int64_t)std::ceil(x);
    p.num_train_epochs = num_train_epochs;
  }
  return p;
}

std::vector<std::vector<int64_t>> EpochMicroBatches(int64_t n, int64_t batch_size, uint64_t seed,
                                                    int64_t epoch, const std::vector<int64_t>* lengths) {
  LATHE_CHECK(n > 0 && batch_size > 0);
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  // Own Fisher-Yates over mt19937_64 (std::shuffle's output differs between standard libraries).
  std::seed_seq seq{(uint32_t)seed, (uint32_t)(seed >> 32), (uint32_t)epoch,
                    (uint32_t)((uint64_t)epoch >> 32), 0x6c617468u};
  std::mt19937_64 rng(seq);
  for (int64_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng() % (uint64_t)i]);
  if (lengths) {  // transformers' get_length_grouped_indices
    LATHE_CHECK((int64_t)lengths->size() == n);
    const int64_t mult = std::max<int64_t>(1, std::min<int64_t>(n / (batch_size * 4), 50));
    const int64_t mega = mult * batch_size;
    auto longer = [&](int64_t a, int64_t b) { return (*lengths)[a] > (*lengths)[b]; };
    size_t longest_mega = 0;
    for (int64_t p = 0; p < n; p += mega) {
      std::stable_sort(order.begin() + p, order.begin() + std::min(n, p + mega), longer);
      if ((*lengths)[order[p]] > (*lengths)[order[longest_mega]]) longest_mega = (size_t)p;  // first maximum
    }
    std::swap(order[0], order[longest_mega]);
  }
  std::vector<std::vector<int64_t>> out;
  for (int64_t p = 0; p < n; p += batch_size) {
    out.emplace_back(order.begin() + p, order.begin() + std::min(n, p + batch_size));
  }
  return out;
}

}  // namespace lathe::train
