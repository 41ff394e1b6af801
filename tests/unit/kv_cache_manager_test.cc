// BlockPool (ref counts, LRU eviction, prefix hashes) and KvCacheManager (prefix reuse, the last
// prompt token always computed, copy-on-write after fork, freeing everything at once).
#include "serve/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "model/transformer.h"

namespace lathe::serve {
namespace {

TEST(BlockPool, RefCountsAndLruEviction) {
  BlockPool pool(3, 4);
  int32_t a = pool.Allocate(), b = pool.Allocate(), c = pool.Allocate();
  EXPECT_EQ(pool.Allocate(), -1);  // exhausted, no crash
  std::vector<int32_t> t = {1, 2, 3, 4};
  uint64_t h = BlockHash(0, t, 0);
  pool.Register(b, h);
  pool.Retain(b);
  pool.Release(b);
  EXPECT_EQ(pool.ref_count(b), 1);
  pool.Release(a);  // freed first
  pool.Release(b);  // freed second, still cached
  pool.Release(c);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.num_cached(), 1);
  // A lookup revives the cached free block.
  EXPECT_EQ(pool.Lookup(h), b);
  EXPECT_EQ(pool.ref_count(b), 1);
  EXPECT_EQ(pool.num_free(), 2);
  pool.Release(b);  // now most recently freed: order a, c, b
  EXPECT_EQ(pool.Allocate(), a);
  EXPECT_EQ(pool.Allocate(), c);
  EXPECT_EQ(pool.num_cached(), 1);
  EXPECT_EQ(pool.Allocate(), b);  // evicts b's prefix
  EXPECT_EQ(pool.num_cached(), 0);
  EXPECT_EQ(pool.Lookup(h), -1);
  EXPECT_EQ(pool.queries(), 2);
  EXPECT_EQ(pool.hits(), 1);
}

TEST(BlockPool, HashChainsAndExtraKey) {
  std::vector<int32_t> t = {5, 6, 7, 8};
  EXPECT_NE(BlockHash(0, t, 0), BlockHash(0, t, 1));  // another adapter
  EXPECT_NE(BlockHash(0, t, 0), BlockHash(BlockHash(0, t, 0), t, 0));  // another position
  EXPECT_EQ(BlockHash(3, t, 9), BlockHash(3, t, 9));
}

model::ModelConfig TinyConfig() {
  model::ModelConfig c;
  c.n_layers = 2;
  c.dim = 8;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 4;
  return c;
}

// The store's layout as the attention reads it: position (block, offset) of KV head h at element
// HeadOffset(h) + PosOffset(block, offset) of the layer, each head's slice of a block one contiguous run of
// block_size * head_dim elements; Write / ReadK / ReadV / CopyBlock agree with it, every dtype.
TEST(KvBlockStore, HeadMajorBlocksAsTheAttentionReadsThem) {
  model::ModelConfig c;
  c.n_layers = 3;
  c.n_heads = 6;
  c.n_kv_heads = 3;
  c.head_dim = 8;
  const int64_t kv_dim = c.kv_dim(), bs = 4, n_blocks = 5;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    model::KvBlockStore store(c, n_blocks, bs, t);
    // Values exact in every dtype: small integers, V = -K.
    auto value = [&](int64_t l, int64_t b, int64_t o, int64_t j) { return (float)((l * 7 + b * 5 + o * 3 + j) % 61); };
    std::vector<float> k(kv_dim), v(kv_dim);
    for (int64_t l = 0; l < c.n_layers; ++l)
      for (int64_t b = 0; b < n_blocks; ++b)
        for (int64_t o = 0; o < bs; ++o) {
          for (int64_t j = 0; j < kv_dim; ++j) k[j] = value(l, b, o, j), v[j] = -k[j];
          store.Write(l, b, o, k.data(), v.data());
        }
    for (int64_t l = 0; l < c.n_layers; ++l)
      for (int64_t b = 0; b < n_blocks; ++b)
        for (int64_t h = 0; h < c.n_kv_heads; ++h) {
          // One head's slice of the block: consecutive positions head_dim elements apart.
          ASSERT_EQ(store.PosOffset(b, 1) - store.PosOffset(b, 0), c.head_dim);
          for (int64_t o = 0; o < bs; ++o)
            for (int64_t d = 0; d < c.head_dim; ++d) {
              const int64_t e = store.HeadOffset(h) + store.PosOffset(b, o) + d;
              float kv[2];
              for (int w = 0; w < 2; ++w) {
                const void* base = w ? store.VLayer(l) : store.KLayer(l);
                kv[w] = t == DType::kF32 ? ((const float*)base)[e]
                        : t == DType::kF16 ? F16ToF32(((const uint16_t*)base)[e])
                                           : BF16ToF32(((const uint16_t*)base)[e]);
              }
              ASSERT_EQ(kv[0], value(l, b, o, h * c.head_dim + d))
                  << DTypeName(t) << " l" << l << " b" << b << " h" << h;
              ASSERT_EQ(kv[1], -kv[0]);
            }
        }
    store.CopyBlock(1, 3);
    std::vector<float> rk(kv_dim), rv(kv_dim);
    for (int64_t l = 0; l < c.n_layers; ++l)
      for (int64_t o = 0; o < bs; ++o) {
        store.ReadK(l, 3, o, rk.data());
        store.ReadV(l, 3, o, rv.data());
        for (int64_t j = 0; j < kv_dim; ++j) {
          ASSERT_EQ(rk[j], value(l, 1, o, j)) << DTypeName(t);
          ASSERT_EQ(rv[j], -value(l, 1, o, j)) << DTypeName(t);
        }
      }
  }
}

// 16 blocks of 4 tokens and a manager over them.
struct Cache {
  BlockPool pool{16, 4};
  model::KvBlockStore store{TinyConfig(), 16, 4};
  KvCacheManager m{pool, store};
};

// first, first + 1, ... (n tokens).
std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(KvCacheManager, PrefixReuseAndLastTokenComputed) {
  Cache cache;
  BlockPool& pool = cache.pool;
  KvCacheManager& m = cache.m;
  const std::vector<int32_t> a = Tokens(10, 100);
  auto ca = m.Allocate(1, a, 0);
  ASSERT_TRUE(ca.ok());
  EXPECT_EQ(*ca, 0);
  EXPECT_EQ(m.BlockTable(1).size(), 3u);
  m.MarkComputed(1, a, 10);  // blocks 0 and 1 are full
  EXPECT_EQ(pool.num_cached(), 2);
  // Same first 9 tokens: two full blocks hit, 8 tokens computed.
  std::vector<int32_t> b(a.begin(), a.begin() + 9);
  auto cb = m.Allocate(2, b, 0);
  ASSERT_TRUE(cb.ok());
  EXPECT_EQ(*cb, 8);
  EXPECT_EQ(m.BlockTable(2)[0], m.BlockTable(1)[0]);
  EXPECT_EQ(m.BlockTable(2)[1], m.BlockTable(1)[1]);
  EXPECT_NE(m.BlockTable(2)[2], m.BlockTable(1)[2]);
  // Exactly the two full blocks: the second is recomputed in a fresh block (never written shared).
  std::vector<int32_t> c(a.begin(), a.begin() + 8);
  auto cc = m.Allocate(3, c, 0);
  ASSERT_TRUE(cc.ok());
  EXPECT_EQ(*cc, 4);
  EXPECT_EQ(m.BlockTable(3)[0], m.BlockTable(1)[0]);
  EXPECT_NE(m.BlockTable(3)[1], m.BlockTable(1)[1]);
  // Another adapter shares nothing.
  auto cd = m.Allocate(4, b, /*extra_key=*/7);
  EXPECT_EQ(*cd, 0);
  for (int64_t s : {1, 2, 3, 4}) m.Free(s);
  EXPECT_EQ(pool.num_free(), 16);
  EXPECT_EQ(pool.num_used(), 0);
}

// For each KV cache dtype (CopyBlock copies elements of its size).
TEST(KvCacheManager, ForkCopiesSharedBlockBeforeWriting) {
  for (DType kv : {DType::kF32, DType::kF16, DType::kBF16}) {
    BlockPool pool(8, 4);
    model::KvBlockStore store(TinyConfig(), 8, 4, kv);
    const int64_t kv_dim = store.kv_dim();
    std::vector<float> row(kv_dim, 0.0f), zero(kv_dim, 0.0f), got(kv_dim);
    row[kv_dim - 1] = 42.0f;
    KvCacheManager m(pool, store);
    std::vector<int32_t> p = {1, 2, 3, 4, 5, 6};
    ASSERT_TRUE(m.Allocate(1, p, 0).ok());
    int32_t partial = m.BlockTable(1)[1];
    store.Write(1, partial, 1, row.data(), zero.data());  // position 5 of layer 1, already computed
    m.Fork(1, 2);
    EXPECT_EQ(pool.ref_count(partial), 2);
    ASSERT_TRUE(m.Reserve(2, 7));
    ASSERT_TRUE(m.PrepareWrite(2, 6, 7));  // sample 2 writes position 6, in the shared block
    int32_t copy = m.BlockTable(2)[1];
    EXPECT_NE(copy, partial);
    store.ReadK(1, copy, 1, got.data());
    EXPECT_EQ(got[kv_dim - 1], 42.0f) << DTypeName(kv);  // the computed part came along
    EXPECT_EQ(pool.ref_count(partial), 1);
    EXPECT_EQ(m.BlockTable(2)[0], m.BlockTable(1)[0]);  // the full block stays shared
    ASSERT_TRUE(m.PrepareWrite(1, 6, 7));  // now private to 1: no copy
    EXPECT_EQ(m.BlockTable(1)[1], partial);
    m.Free(1);
    m.Free(2);
    EXPECT_EQ(pool.num_used(), 0);
  }
}

TEST(KvCacheManager, OutOfBlocksHoldsNothing) {
  BlockPool pool(2, 4);
  model::KvBlockStore store(TinyConfig(), 2, 4);
  KvCacheManager m(pool, store);
  std::vector<int32_t> big(12, 3);
  auto r = m.Allocate(1, big, 0);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("KV cache full"), std::string::npos);
  EXPECT_FALSE(m.Has(1));
  EXPECT_EQ(pool.num_free(), 2);
  std::vector<int32_t> small = {1, 2, 3};
  ASSERT_TRUE(m.Allocate(1, small, 0).ok());
  EXPECT_TRUE(m.Reserve(1, 8));
  EXPECT_FALSE(m.Reserve(1, 9));  // a third block does not exist
  EXPECT_EQ(m.BlockTable(1).size(), 2u);
}

// A chunked prefill starts with blocks for its first chunk only (after the prefix hits), so used
// blocks hold computed tokens; the next chunks reserve theirs as they run.
TEST(KvCacheManager, AllocateCoversTheFirstChunkOnly) {
  Cache cache;
  KvCacheManager& m = cache.m;
  const std::vector<int32_t> a = Tokens(30, 7);
  auto ca = m.Allocate(1, a, 0, /*max_new_tokens=*/6);
  ASSERT_TRUE(ca.ok());
  EXPECT_EQ(*ca, 0);
  EXPECT_EQ(m.BlockTable(1).size(), 2u);  // positions 0-5
  m.MarkComputed(1, a, 6);
  EXPECT_TRUE(m.Reserve(1, 12));
  EXPECT_EQ(m.BlockTable(1).size(), 3u);
  m.MarkComputed(1, a, 12);  // blocks 0-2 full and cached
  // The same prompt again: 3 blocks hit, then blocks for 5 more positions (12-16).
  auto cb = m.Allocate(2, a, 0, 5);
  ASSERT_TRUE(cb.ok());
  EXPECT_EQ(*cb, 12);
  EXPECT_EQ(m.BlockTable(2).size(), 5u);
  // A chunk past the end takes only the prompt's blocks; 0 still covers the last token.
  auto cc = m.Allocate(3, std::span<const int32_t>(a.data(), 3), 9, 100);
  ASSERT_TRUE(cc.ok());
  EXPECT_EQ(m.BlockTable(3).size(), 1u);
  auto cd = m.Allocate(4, std::span<const int32_t>(a.data(), 3), 10, 0);
  ASSERT_TRUE(cd.ok());
  EXPECT_EQ(m.BlockTable(4).size(), 1u);
  for (int64_t s : {1, 2, 3, 4}) m.Free(s);
  EXPECT_EQ(cache.pool.num_used(), 0);
}

}  // namespace
}  // namespace lathe::serve
