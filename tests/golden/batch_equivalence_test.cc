// Batched forward over several sequences (different lengths, different cache slots, mixed
// prefill and decode) gives bit for bit the logits of running each sequence alone (stories260K is
// f32: the float GEMV and the prefill panel share one per-row arithmetic, so no row depends on M).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "formats/gguf.h"
#include "model/load_gguf.h"
#include "model/transformer.h"
#include "test_util.h"

namespace lathe::model {
namespace {

using lathe::testing::SharedPath;

// stories260K's weights, or null after a test failure naming what did not load.
std::unique_ptr<ModelWeights> LoadStories(const std::string& path) {
  auto g = formats::GgufFile::Open(path);
  if (!g.ok()) {
    ADD_FAILURE() << g.status().message();
    return nullptr;
  }
  auto w = LoadGgufWeights(std::shared_ptr<formats::GgufFile>(std::move(*g)));
  if (!w.ok()) {
    ADD_FAILURE() << w.status().message();
    return nullptr;
  }
  return std::make_unique<ModelWeights>(std::move(*w));
}

double MaxAbsDiff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, (double)std::fabs(a[i] - b[i]));
  return m;
}

// Tests over stories260K's weights (w_), skipped without the file.
template <typename Base>
class StoriesTest : public Base {
 protected:
  void SetUp() override {
    const std::string path = SharedPath("models/stories260K/stories260K.gguf");
    LATHE_REQUIRE_FILE(path);
    w_ = LoadStories(path);
    ASSERT_TRUE(w_);
  }
  std::unique_ptr<ModelWeights> w_;
};
using BatchEquivalence = StoriesTest<::testing::Test>;
// For every KV cache dtype: its 16-bit caches round each row the same way whatever the batch.
using BatchEquivalenceKv = StoriesTest<::testing::TestWithParam<DType>>;

TEST_P(BatchEquivalenceKv, Stories260KMixedBatchEqualsOneAtATime) {
  const DType kv = GetParam();
  ThreadPool pool(2);
  Transformer tf(*this->w_, pool);
  const int64_t V = tf.config().vocab_size;
  std::vector<std::vector<int32_t>> prompts = {
      {1, 403, 407, 261, 378}, {1, 376, 298}, {1, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317}};
  std::vector<int32_t> next = {432, 315, 426};  // one decode token each afterwards

  // Alone: prefill (all logits) then one decode step.
  std::vector<std::vector<float>> alone_prefill, alone_decode;
  for (size_t s = 0; s < prompts.size(); ++s) {
    KvCache cache(tf.config(), 1, 32, 16, kv);
    std::vector<float> lg;
    SeqInput in{0, prompts[s], true};
    ASSERT_TRUE(tf.Forward(cache, {&in, 1}, &lg).ok());
    alone_prefill.push_back(lg);
    SeqInput step{0, {&next[s], 1}, false};
    ASSERT_TRUE(tf.Forward(cache, {&step, 1}, &lg).ok());
    alone_decode.push_back(lg);
  }

  // Together: sequence 1 prefills first alone; then one batch mixes the decode step of 1 with
  // the prefills of 0 and 2 (slots in a different order than the batch order).
  KvCache cache(tf.config(), 3, 32, 16, kv);
  std::vector<float> lg;
  SeqInput first{1, prompts[1], true};
  ASSERT_TRUE(tf.Forward(cache, {&first, 1}, &lg).ok());
  EXPECT_EQ(MaxAbsDiff(lg.data(), alone_prefill[1].data(), (int64_t)lg.size()), 0.0);
  std::vector<SeqInput> mixed = {{2, prompts[0], true}, {1, {&next[1], 1}, false}, {0, prompts[2], true}};
  ASSERT_TRUE(tf.Forward(cache, mixed, &lg).ok());
  int64_t n0 = (int64_t)prompts[0].size(), n2 = (int64_t)prompts[2].size();
  ASSERT_EQ((int64_t)lg.size(), (n0 + 1 + n2) * V);
  EXPECT_EQ(MaxAbsDiff(lg.data(), alone_prefill[0].data(), n0 * V), 0.0);
  EXPECT_EQ(MaxAbsDiff(lg.data() + n0 * V, alone_decode[1].data(), V), 0.0);
  EXPECT_EQ(MaxAbsDiff(lg.data() + (n0 + 1) * V, alone_prefill[2].data(), n2 * V), 0.0);
  // Then decode steps for 0 and 2 together.
  std::vector<SeqInput> dec = {{0, {&next[2], 1}, false}, {2, {&next[0], 1}, false}};
  ASSERT_TRUE(tf.Forward(cache, dec, &lg).ok());
  EXPECT_EQ(MaxAbsDiff(lg.data(), alone_decode[2].data(), V), 0.0);
  EXPECT_EQ(MaxAbsDiff(lg.data() + V, alone_decode[0].data(), V), 0.0);
}

INSTANTIATE_TEST_SUITE_P(KvDTypes, BatchEquivalenceKv, ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(DTypeName(i.param)); });

// A 16-bit KV cache against the f32 one on the same tokens (a 40-token prefill, then 40 decode steps):
// the logits move by the rounding of K / V only (f16: 11 significant bits, bf16: 8), and they do move
// (the cache really holds 16-bit values); the greedy continuation is the f32 cache's.
TEST_F(BatchEquivalence, SixteenBitKvCacheStaysCloseToF32) {
  ThreadPool pool(2);
  Transformer tf(*this->w_, pool);
  const int64_t V = tf.config().vocab_size;
  std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426};
  auto run = [&](DType kv, std::vector<float>* all, std::vector<int32_t>* greedy) {
    KvCache cache(tf.config(), 1, 128, 16, kv);
    std::vector<float> lg;
    SeqInput in{0, prompt, true};
    ASSERT_TRUE(tf.Forward(cache, {&in, 1}, &lg).ok());
    *all = lg;
    int32_t tok = (int32_t)(std::max_element(lg.end() - V, lg.end()) - (lg.end() - V));
    for (int i = 0; i < 40; ++i) {
      greedy->push_back(tok);
      SeqInput step{0, {&tok, 1}, false};
      ASSERT_TRUE(tf.Forward(cache, {&step, 1}, &lg).ok());
      all->insert(all->end(), lg.begin(), lg.end());
      tok = (int32_t)(std::max_element(lg.begin(), lg.end()) - lg.begin());
    }
  };
  std::vector<float> ref, got;
  std::vector<int32_t> ref_ids, got_ids;
  run(DType::kF32, &ref, &ref_ids);
  for (DType kv : {DType::kF16, DType::kBF16}) {
    got.clear();
    got_ids.clear();
    run(kv, &got, &got_ids);
    ASSERT_EQ(got.size(), ref.size());
    const double d = MaxAbsDiff(got.data(), ref.data(), (int64_t)ref.size());
    std::printf("%s KV: max |logit - f32 cache's| = %.3g\n", DTypeName(kv), d);
    EXPECT_GT(d, 0.0) << DTypeName(kv);
    EXPECT_LT(d, kv == DType::kF16 ? 0.05 : 0.4) << DTypeName(kv);  // ~3x the 0.015 / 0.12 measured
    EXPECT_EQ(got_ids, ref_ids) << DTypeName(kv);
  }
}

TEST_F(BatchEquivalence, ScatteredBlockTablesEqualContiguous) {
  ThreadPool pool(2);
  Transformer tf(*this->w_, pool);
  const int64_t V = tf.config().vocab_size;
  std::vector<int32_t> ids = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338};
  KvCache cache(tf.config(), 1, 32, /*block_size=*/4);
  std::vector<float> want, got;
  SeqInput in{0, ids, true};
  ASSERT_TRUE(tf.Forward(cache, {&in, 1}, &want).ok());
  // Blocks 9, 2, 7, 0, 5 of a 10-block store with block size 4, filled in two chunks (chunked
  // prefill), then block 2's content copied to block 3 and the table pointed there (CoW).
  KvBlockStore store(tf.config(), 10, 4);
  std::vector<int32_t> table = {9, 2, 7, 0, 5};
  PagedSeqInput a{std::span<const int32_t>(ids).first(6), 0, table, true};
  ASSERT_TRUE(tf.ForwardPaged(store, {&a, 1}, &got).ok());
  EXPECT_LT(MaxAbsDiff(got.data(), want.data(), 6 * V), 1e-5);
  store.CopyBlock(2, 3);
  table[1] = 3;
  PagedSeqInput b{std::span<const int32_t>(ids).subspan(6), 6, table, true};
  ASSERT_TRUE(tf.ForwardPaged(store, {&b, 1}, &got).ok());
  EXPECT_LT(MaxAbsDiff(got.data(), want.data() + 6 * V, (int64_t)(ids.size() - 6) * V), 1e-5);
  // A table too short for the tokens is an error, not an out-of-bounds write.
  std::vector<int32_t> short_table = {1};
  PagedSeqInput c{ids, 0, short_table, false};
  EXPECT_FALSE(tf.ForwardPaged(store, {&c, 1}, &got).ok());
}

TEST_F(BatchEquivalence, ErrorsNameTheProblem) {
  ThreadPool pool(1);
  Transformer tf(*this->w_, pool);
  KvCache cache(tf.config(), 1, 4);
  std::vector<float> lg;
  std::vector<int32_t> bad = {1, 9999};
  SeqInput in{0, bad, false};
  Status st = tf.Forward(cache, {&in, 1}, &lg);
  EXPECT_NE(st.message().find("9999"), std::string::npos) << st.message();
  std::vector<int32_t> longer = {1, 2, 3, 4, 5};
  SeqInput in2{0, longer, false};
  st = tf.Forward(cache, {&in2, 1}, &lg);
  EXPECT_NE(st.message().find("context"), std::string::npos) << st.message();
  EXPECT_EQ(cache.length(0), 0);  // nothing was written on error
}

}  // namespace
}  // namespace lathe::model
