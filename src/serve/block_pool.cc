// BlockPool implementation.
#include "serve/block_pool.h"

#include "core/check.h"

namespace lathe::serve {

uint64_t BlockHash(uint64_t parent, std::span<const int32_t> tokens, uint64_t extra_key) {
  // FNV-1a over (parent, extra, tokens); 0 is reserved for "not cached".
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(parent);
  mix(extra_key);
  for (int32_t t : tokens) mix((uint64_t)(uint32_t)t);
  return h == 0 ? 1 : h;
}

BlockPool::BlockPool(int64_t n_blocks, int64_t block_size)
    : block_size_(block_size), ref_(n_blocks, 0), hash_(n_blocks, 0), free_pos_(n_blocks), in_free_(n_blocks, true) {
  LATHE_CHECK(n_blocks > 0 && block_size > 0);
  for (int32_t b = 0; b < (int32_t)n_blocks; ++b) free_pos_[b] = free_.insert(free_.end(), b);
}

int32_t BlockPool::Allocate() {
  if (free_.empty()) return -1;
  int32_t b = free_.front();
  free_.pop_front();
  in_free_[b] = false;
  if (hash_[b] != 0) {  // evict the cached prefix this block held
    auto it = by_hash_.find(hash_[b]);
    if (it != by_hash_.end() && it->second == b) by_hash_.erase(it);
    hash_[b] = 0;
  }
  ref_[b] = 1;
  return b;
}

void BlockPool::Retain(int32_t b) {
  LATHE_CHECK(b >= 0 && b < (int32_t)ref_.size());
  if (in_free_[b]) {
    free_.erase(free_pos_[b]);
    in_free_[b] = false;
  }
  ref_[b]++;
}

void BlockPool::Release(int32_t b) {
  LATHE_CHECK(b >= 0 && b < (int32_t)ref_.size() && ref_[b] > 0);
  if (--ref_[b] == 0) {
    free_pos_[b] = free_.insert(free_.end(), b);
    in_free_[b] = true;
  }
}

int32_t BlockPool::Lookup(uint64_t hash) {
  ++queries_;
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  ++hits_;
  Retain(it->second);
  return it->second;
}

void BlockPool::Register(int32_t b, uint64_t hash) {
  LATHE_CHECK(b >= 0 && b < (int32_t)ref_.size() && hash != 0);
  if (hash_[b] != 0 || by_hash_.count(hash)) return;
  hash_[b] = hash;
  by_hash_[hash] = b;
}

}  // namespace lathe::serve
