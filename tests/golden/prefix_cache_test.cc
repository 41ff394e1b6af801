// Prefix caching through the real forward: a request that reuses another's cached blocks (and a
// forked sample that copies a shared block before writing) gets the same logits as computing
// everything from scratch (stories260K).
#include <gtest/gtest.h>

#include <cmath>

#include "formats/gguf.h"
#include "model/load_gguf.h"
#include "serve/kv_cache_manager.h"
#include "test_util.h"

namespace lathe::serve {
namespace {

double MaxAbs(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, (double)std::fabs(a[i] - b[i]));
  return m;
}

TEST(PrefixCache, ReusedBlocksGiveSameLogits) {
  std::string path = lathe::testing::SharedPath("models/stories260K/stories260K.gguf");
  LATHE_REQUIRE_FILE(path);
  auto g = formats::GgufFile::Open(path);
  ASSERT_TRUE(g.ok());
  auto w = model::LoadGgufWeights(std::shared_ptr<formats::GgufFile>(std::move(*g)));
  ASSERT_TRUE(w.ok());
  ThreadPool threads(2);
  model::Transformer tf(*w, threads);
  const int64_t V = w->config.vocab_size;
  std::vector<int32_t> a = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315};
  std::vector<int32_t> b = {1, 403, 407, 261, 378, 432, 383, 286, 500, 17, 42};  // shares 8 tokens

  // Reference: b from scratch.
  model::KvCache fresh(w->config, 1, 32);
  std::vector<float> want;
  model::SeqInput in{0, b, true};
  ASSERT_TRUE(tf.Forward(fresh, {&in, 1}, &want).ok());

  BlockPool pool(32, 4);
  model::KvBlockStore store(w->config, 32, 4);
  KvCacheManager m(pool, store);
  auto first = m.Allocate(1, a, 0);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(*first, 0);
  std::vector<float> lg;
  model::PagedSeqInput pa{a, 0, m.BlockTable(1), false};
  ASSERT_TRUE(tf.ForwardPaged(store, {&pa, 1}, &lg).ok());
  m.MarkComputed(1, a, (int64_t)a.size());
  m.Free(1);  // a is done; its full blocks stay cached
  auto computed = m.Allocate(2, b, 0);
  ASSERT_TRUE(computed.ok());
  ASSERT_EQ(*computed, 8);
  ASSERT_TRUE(m.PrepareWrite(2, 8, (int64_t)b.size()));
  model::PagedSeqInput pb{std::span<const int32_t>(b).subspan(8), 8, m.BlockTable(2), true};
  ASSERT_TRUE(tf.ForwardPaged(store, {&pb, 1}, &lg).ok());
  EXPECT_LT(MaxAbs(lg.data(), want.data() + 8 * V, 3 * V), 1e-5);

  // Fork b after its prompt; each sample appends a different token into the shared last block.
  m.Fork(2, 3);
  std::vector<int32_t> b2 = b, b3 = b;
  b2.push_back(7);
  b3.push_back(9);
  for (auto [seq, toks] : {std::pair<int64_t, std::vector<int32_t>*>{2, &b2}, {3, &b3}}) {
    ASSERT_TRUE(m.Reserve(seq, (int64_t)toks->size()));
    ASSERT_TRUE(m.PrepareWrite(seq, (int64_t)b.size(), (int64_t)toks->size()));
  }
  std::vector<model::PagedSeqInput> both = {{std::span<const int32_t>(b2).subspan(b.size()), (int64_t)b.size(), m.BlockTable(2), false},
                                            {std::span<const int32_t>(b3).subspan(b.size()), (int64_t)b.size(), m.BlockTable(3), false}};
  ASSERT_TRUE(tf.ForwardPaged(store, both, &lg).ok());
  for (int k = 0; k < 2; ++k) {
    const auto& full = k == 0 ? b2 : b3;
    model::KvCache solo(w->config, 1, 32);
    std::vector<float> ref;
    model::SeqInput s{0, full, false};
    ASSERT_TRUE(tf.Forward(solo, {&s, 1}, &ref).ok());
    EXPECT_LT(MaxAbs(lg.data() + k * V, ref.data(), V), 1e-5) << "sample " << k;
  }
}

}  // namespace
}  // namespace lathe::serve
