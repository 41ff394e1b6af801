// Trainer batching: padding collation (labels -100, segment ids), HF step counting (epochs,
// max_steps, accumulation) and the seed-derived epoch order.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "train/batching.h"

namespace lathe::train {
namespace {

TokenizedSample Sample(std::vector<int32_t> ids, std::vector<int32_t> labels, std::vector<int32_t> seg = {}) {
  TokenizedSample s;
  s.input_ids = std::move(ids);
  s.labels = std::move(labels);
  s.segment_ids = seg.empty() ? std::vector<int32_t>(s.input_ids.size(), 0) : std::move(seg);
  return s;
}

TEST(TrainerCollate, PadsToLongestWithIgnoredLabels) {
  std::vector<TokenizedSample> s = {Sample({1, 5, 6}, {-100, 5, 6}),
                                    Sample({1, 7, 8, 9, 2}, {-100, -100, 8, 9, 2}),
                                    Sample({1, 3}, {-100, 3})};
  std::vector<int64_t> idx = {2, 0, 1};
  Batch b = Collate(s, idx, /*pad_id=*/0);
  EXPECT_EQ(b.B, 3);
  EXPECT_EQ(b.T, 5);
  EXPECT_EQ(b.input_ids, (std::vector<int32_t>{1, 3, 0, 0, 0, 1, 5, 6, 0, 0, 1, 7, 8, 9, 2}));
  EXPECT_EQ(b.labels,
            (std::vector<int32_t>{-100, 3, -100, -100, -100, -100, 5, 6, -100, -100, -100, -100, 8, 9, 2}));
  EXPECT_TRUE(b.segment_ids.empty());  // no row packs several samples
  EXPECT_EQ(b.target_tokens, 1 + 2 + 3);
  EXPECT_EQ(b.real_tokens, 2 + 3 + 5);
}

TEST(TrainerCollate, FirstLabelOfARowIsNeverATarget) {
  // pt samples carry labels == input_ids, including position 0, which nothing predicts.
  std::vector<TokenizedSample> s = {Sample({4, 5, 6}, {4, 5, 6})};
  std::vector<int64_t> idx = {0};
  EXPECT_EQ(Collate(s, idx, 0).target_tokens, 2);
}

TEST(TrainerCollate, PackedRowsKeepSegmentsAndPaddingGetsItsOwn) {
  std::vector<TokenizedSample> s = {Sample({1, 2, 3, 4, 5}, {-100, 2, -100, 4, 5}, {0, 0, 1, 1, 1}),
                                    Sample({1, 2, 3}, {-100, 2, 3}, {0, 0, 0})};
  std::vector<int64_t> idx = {0, 1};
  Batch b = Collate(s, idx, 9);
  ASSERT_EQ(b.segment_ids.size(), 10u);
  EXPECT_EQ(b.segment_ids, (std::vector<int32_t>{0, 0, 1, 1, 1, 0, 0, 0, 1, 1}));
  EXPECT_EQ(b.input_ids[8], 9);
  EXPECT_EQ(b.labels[8], -100);
}

TEST(TrainerSteps, EpochsRoundUpPartialAccumulation) {
  // 10 samples, batch 3 -> 4 micro-batches; accum 3 -> 2 steps per epoch (the last uses 1).
  StepPlan p = PlanSteps(10, 3, 3, 3.0, -1);
  EXPECT_EQ(p.micro_batches_per_epoch, 4);
  EXPECT_EQ(p.steps_per_epoch, 2);
  EXPECT_EQ(p.total_steps, 6);
  EXPECT_DOUBLE_EQ(p.num_train_epochs, 3.0);
}

TEST(TrainerSteps, FractionalEpochsCeil) {
  EXPECT_EQ(PlanSteps(100, 1, 1, 0.25, -1).total_steps, 25);
  EXPECT_EQ(PlanSteps(10, 1, 1, 0.3, -1).total_steps, 3);  // 0.3 * 10 is 2.9999999999999996 in double
  EXPECT_EQ(PlanSteps(10, 1, 4, 1.5, -1).total_steps, 5);  // ceil(1.5 * 3) = 5
}

TEST(TrainerSteps, MaxStepsWinsAndCountsEpochs) {
  StepPlan p = PlanSteps(10, 2, 1, 3.0, 12);
  EXPECT_EQ(p.steps_per_epoch, 5);
  EXPECT_EQ(p.total_steps, 12);
  EXPECT_DOUBLE_EQ(p.num_train_epochs, 3.0);  // ceil(12 / 5)
  EXPECT_EQ(PlanSteps(10, 2, 1, 3.0, 5).num_train_epochs, 1.0);
}

TEST(TrainerSteps, AccumulationDividesSteps) {
  EXPECT_EQ(PlanSteps(64, 4, 1, 1, -1).total_steps, 16);
  EXPECT_EQ(PlanSteps(64, 4, 4, 1, -1).total_steps, 4);
  EXPECT_EQ(PlanSteps(64, 4, 5, 1, -1).total_steps, 4);  // ceil(16 / 5)
}

TEST(TrainerEpochOrder, DeterministicPermutationPerEpoch) {
  auto a = EpochMicroBatches(50, 4, 42, 0);
  auto b = EpochMicroBatches(50, 4, 42, 0);
  auto c = EpochMicroBatches(50, 4, 42, 1);
  auto d = EpochMicroBatches(50, 4, 43, 0);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  ASSERT_EQ(a.size(), 13u);
  EXPECT_EQ(a.back().size(), 2u);
  std::set<int64_t> all;
  for (auto& mb : a) all.insert(mb.begin(), mb.end());
  EXPECT_EQ(all.size(), 50u);
  EXPECT_EQ(*all.begin(), 0);
  EXPECT_EQ(*all.rbegin(), 49);
  // The order does not depend on the batch size: batch 1 sees the same sequence.
  auto one = EpochMicroBatches(50, 1, 42, 0);
  std::vector<int64_t> flat_a, flat_one;
  for (auto& mb : a) flat_a.insert(flat_a.end(), mb.begin(), mb.end());
  for (auto& mb : one) flat_one.insert(flat_one.end(), mb.begin(), mb.end());
  EXPECT_EQ(flat_a, flat_one);
}

// group_by_length: transformers' LengthGroupedSampler over the epoch's own permutation. With 1000 samples and batch 4
// a megabatch is 50 x 4 = 200 samples: each holds the same samples as that slice of the plain order, sorted longest
// first, except that the longest sample of all opens the epoch (swapped with the first megabatch's head).
TEST(TrainerEpochOrder, GroupByLengthSortsWithinMegabatches) {
  const int64_t n = 1000, bs = 4;
  std::vector<int64_t> lengths(n);
  for (int64_t i = 0; i < n; ++i) lengths[i] = 16 + (i * 7919) % 1000;  // 16 .. 1015, all distinct
  auto flat = [](const std::vector<std::vector<int64_t>>& mbs) {
    std::vector<int64_t> out;
    for (const auto& mb : mbs) out.insert(out.end(), mb.begin(), mb.end());
    return out;
  };
  const std::vector<int64_t> plain = flat(EpochMicroBatches(n, bs, 42, 3));
  const auto grouped_mbs = EpochMicroBatches(n, bs, 42, 3, &lengths);
  const std::vector<int64_t> grouped = flat(grouped_mbs);
  EXPECT_EQ(grouped, flat(EpochMicroBatches(n, bs, 42, 3, &lengths)));  // deterministic
  ASSERT_EQ(grouped.size(), (size_t)n);
  const int64_t longest = std::max_element(lengths.begin(), lengths.end()) - lengths.begin();
  EXPECT_EQ(grouped[0], longest);
  const int64_t mega = 200;
  size_t swapped = 0;  // where the longest sample's megabatch starts
  for (int64_t p = 0; p < n; p += mega) {
    std::vector<int64_t> a(plain.begin() + p, plain.begin() + p + mega), b(grouped.begin() + p, grouped.begin() + p + mega);
    if (std::find(a.begin(), a.end(), longest) != a.end()) swapped = (size_t)p;
    for (int64_t k = 1; k + 1 < mega; ++k) EXPECT_GE(lengths[b[k]], lengths[b[k + 1]]) << p << " " << k;
  }
  // Undo the swap: every megabatch then holds its slice of the plain order.
  std::vector<int64_t> undone = grouped;
  std::swap(undone[0], undone[swapped]);
  for (int64_t p = 0; p < n; p += mega) {
    std::set<int64_t> a(plain.begin() + p, plain.begin() + p + mega), b(undone.begin() + p, undone.begin() + p + mega);
    EXPECT_EQ(a, b) << p;
    int64_t top = 0;
    for (int64_t i : b) top = std::max(top, lengths[i]);
    EXPECT_EQ(lengths[undone[p]], top) << p;  // each megabatch opens with its longest
  }
  // Padding: tokens computed (B x longest per micro-batch) come down to near the real ones.
  auto padded = [&](const std::vector<std::vector<int64_t>>& mbs) {
    int64_t t = 0;
    for (const auto& mb : mbs) {
      int64_t m = 0;
      for (int64_t i : mb) m = std::max(m, lengths[i]);
      t += m * (int64_t)mb.size();
    }
    return t;
  };
  int64_t real = 0;
  for (int64_t l : lengths) real += l;
  const int64_t before = padded(EpochMicroBatches(n, bs, 42, 3)), after = padded(grouped_mbs);
  EXPECT_GT(before, real * 13 / 10);  // random batches of 4 over 16..1015 pad ~50%
  EXPECT_LT(after, real * 103 / 100);
  // Few samples: at least one batch per megabatch (min(n / (4 bs), 50) = 0 -> 1): sorted batch by batch.
  std::vector<int64_t> few = {5, 9, 1, 7, 3, 8};
  const auto small = EpochMicroBatches(6, 2, 1, 0, &few);
  EXPECT_EQ(few[small[0][0]], 9);
  for (const auto& mb : small) {
    ASSERT_EQ(mb.size(), 2u);
    if (&mb != &small[0]) {
      EXPECT_GE(few[mb[0]], few[mb[1]]);
    }
  }
}

}  // namespace
}  // namespace lathe::train
