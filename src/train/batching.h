// Micro-batches and step counting as the HF Trainer does them: a seed-derived sample order per
// epoch, micro-batches padded to their longest sample, gradient_accumulation_steps micro-batches
// per optimizer step, and the number of optimizer steps a run takes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "train/dataset.h"

namespace lathe::train {

// One padded micro-batch, row-major (B, T).
struct Batch {
  std::vector<int32_t> input_ids;    // (B, T); padding = pad_id
  std::vector<int32_t> labels;       // (B, T); padding = kIgnoreIndex
  std::vector<int32_t> segment_ids;  // (B, T), or empty when no row packs several samples
  int64_t B = 0, T = 0;
  int64_t target_tokens = 0;  // labels != kIgnoreIndex at positions >= 1 (what the loss sums over)
  int64_t real_tokens = 0;    // tokens before padding
};

// Pads samples[indices[i]] to the longest of them. Padded positions get pad_id, label
// kIgnoreIndex and a segment id one past the row's last (so they never join a real segment).
// Segment ids are kept only when some row holds more than one segment.
// REQUIRES: indices non-empty, each in range.
Batch Collate(std::span<const TokenizedSample> samples, std::span<const int64_t> indices, int32_t pad_id);

// How many optimizer steps a run takes.
struct StepPlan {
  int64_t micro_batches_per_epoch = 0;  // ceil(samples / batch_size)
  int64_t steps_per_epoch = 0;          // ceil(micro_batches_per_epoch / grad_accum)
  int64_t total_steps = 0;              // max_steps if > 0, else ceil(epochs * steps_per_epoch)
  double num_train_epochs = 0;  // epochs the run covers (ceil(total / steps_per_epoch) with max_steps)
};
StepPlan PlanSteps(int64_t num_samples, int64_t batch_size, int64_t grad_accum, double num_train_epochs,
                   int64_t max_steps);

// The micro-batches of one epoch: a permutation of [0, n) derived from (seed, epoch) only, cut
// into consecutive groups of batch_size (the last may be shorter).
// With `lengths` (one per sample: group_by_length), the order is the HF Trainer's LengthGroupedSampler's: the
// permutation is cut into megabatches of min(n / (4 batch_size), 50) x batch_size samples (at least one batch),
// each sorted longest first (ties in permutation order), and the longest sample's megabatch head swapped to the
// front, so samples of similar length share a micro-batch and little is padded.
std::vector<std::vector<int64_t>> EpochMicroBatches(int64_t n, int64_t batch_size, uint64_t seed,
                                                    int64_t epoch, const std::vector<int64_t>* lengths = nullptr);

}  // namespace lathe::train
