// KvCacheManager implementation.
#include "serve/kv_cache_manager.h"

#include <algorithm>

#include "core/check.h"

namespace lathe::serve {

Result<int64_t> KvCacheManager::Allocate(int64_t seq, std::span<const int32_t> tokens, uint64_t extra_key,
                                         int64_t max_new_tokens) {
  LATHE_CHECK(!seqs_.count(seq) && !tokens.empty());
  const int64_t bs = pool_.block_size();
  Seq s;
  s.extra_key = extra_key;
  uint64_t parent = 0;
  for (int64_t i = 0; (i + 1) * bs <= (int64_t)tokens.size(); ++i) {
    uint64_t h = BlockHash(parent, tokens.subspan(i * bs, bs), extra_key);
    int32_t b = pool_.Lookup(h);
    if (b < 0) break;
    s.table.push_back(b);
    s.hashes.push_back(h);
    parent = h;
  }
  // The last token must be computed; it would land in a shared block, so recompute that whole
  // block in a fresh one.
  if (!s.table.empty() && (int64_t)s.table.size() * bs >= (int64_t)tokens.size()) {
    pool_.Release(s.table.back());
    s.table.pop_back();
    s.hashes.pop_back();
  }
  int64_t computed = (int64_t)s.table.size() * bs;
  // Blocks up to position `upto`: the next max_new_tokens (at least the last token) or the rest.
  const int64_t rest = (int64_t)tokens.size() - computed;
  const int64_t upto = computed + std::min<int64_t>(rest, std::max<int64_t>(max_new_tokens, 1));
  int64_t need = (upto + bs - 1) / bs - (int64_t)s.table.size();
  if (need > pool_.num_free()) {
    for (auto it = s.table.rbegin(); it != s.table.rend(); ++it) pool_.Release(*it);
    return Status::Error(StrFormat("KV cache full: %lld more blocks needed, %lld free", (long long)need,
                                   (long long)pool_.num_free()));
  }
  for (int64_t i = 0; i < need; ++i) s.table.push_back(pool_.Allocate());
  seqs_.emplace(seq, std::move(s));
  return computed;
}

int64_t KvCacheManager::BlocksNeeded(int64_t seq, int64_t n_tokens) const {
  const int64_t bs = pool_.block_size();
  int64_t have = (int64_t)seqs_.at(seq).table.size();
  return std::max<int64_t>(0, (n_tokens + bs - 1) / bs - have);
}

bool KvCacheManager::Reserve(int64_t seq, int64_t n_tokens) {
  int64_t need = BlocksNeeded(seq, n_tokens);
  if (need > pool_.num_free()) return false;
  Seq& s = seqs_.at(seq);
  for (int64_t i = 0; i < need; ++i) s.table.push_back(pool_.Allocate());
  return true;
}

bool KvCacheManager::PrepareWrite(int64_t seq, int64_t from, int64_t to) {
  Seq& s = seqs_.at(seq);
  const int64_t bs = pool_.block_size();
  for (int64_t i = from / bs; i < (to + bs - 1) / bs && i < (int64_t)s.table.size(); ++i) {
    int32_t b = s.table[i];
    if (pool_.ref_count(b) == 1) continue;
    int32_t nb = pool_.Allocate();
    if (nb < 0) return false;
    store_.CopyBlock(b, nb);
    pool_.Release(b);
    s.table[i] = nb;
    if (i < (int64_t)s.hashes.size()) s.hashes.resize(i);  // the copy is not the registered block
  }
  return true;
}

void KvCacheManager::MarkComputed(int64_t seq, std::span<const int32_t> tokens, int64_t computed) {
  Seq& s = seqs_.at(seq);
  const int64_t bs = pool_.block_size();
  while ((int64_t)(s.hashes.size() + 1) * bs <= computed && s.hashes.size() < s.table.size()) {
    size_t i = s.hashes.size();
    uint64_t parent = i == 0 ? 0 : s.hashes.back();
    uint64_t h = BlockHash(parent, tokens.subspan(i * bs, bs), s.extra_key);
    pool_.Register(s.table[i], h);
    s.hashes.push_back(h);
  }
}

void KvCacheManager::Fork(int64_t src, int64_t dst) {
  LATHE_CHECK(!seqs_.count(dst));
  Seq copy = seqs_.at(src);
  for (int32_t b : copy.table) pool_.Retain(b);
  seqs_.emplace(dst, std::move(copy));
}

void KvCacheManager::Free(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  // Last blocks first, so a shared prefix is the last to be evicted.
  for (auto b = it->second.table.rbegin(); b != it->second.table.rend(); ++b) pool_.Release(*b);
  seqs_.erase(it);
}

}  // namespace lathe::serve
