// BlockPool: the KV-cache blocks of the serving engine. Reference-counted blocks; free blocks
// wait in least-recently-freed order; a full block can be registered under a prefix hash (the
// hash chain of its parent block, its token ids and an extra key such as the adapter), so later
// requests with the same prefix reuse it — even after it was freed, until a fresh allocation
// evicts it. Not thread-safe: the engine thread owns it.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace lathe::serve {

// Hash of a full block: parent block's hash (0 for the first block), its tokens, an extra key.
uint64_t BlockHash(uint64_t parent, std::span<const int32_t> tokens, uint64_t extra_key);

class BlockPool {
 public:
  BlockPool(int64_t n_blocks, int64_t block_size);
  int64_t n_blocks() const { return (int64_t)ref_.size(); }
  int64_t block_size() const { return block_size_; }

  // A block with ref count 1 and no hash, taken from the least recently freed; -1 when every
  // block is in use. Evicts that block's cached hash, if any.
  int32_t Allocate();
  void Retain(int32_t block);
  // Drops one reference; at zero the block joins the free list (keeping its hash for reuse).
  void Release(int32_t block);
  int32_t ref_count(int32_t block) const { return ref_[block]; }

  // The block cached under `hash`, retained (ref + 1, leaving the free list if it was free);
  // -1 on a miss. Counts a query and, on success, a hit.
  int32_t Lookup(uint64_t hash);
  // Registers a full, computed block under `hash` (no-op if the hash is already cached by
  // another block: the first stays canonical).
  void Register(int32_t block, uint64_t hash);
  bool IsCached(int32_t block) const { return hash_[block] != 0; }

  int64_t num_free() const { return (int64_t)free_.size(); }  // free, cached or not
  int64_t num_used() const { return n_blocks() - num_free(); }
  int64_t num_cached() const { return (int64_t)by_hash_.size(); }
  int64_t queries() const { return queries_; }
  int64_t hits() const { return hits_; }

 private:
  int64_t block_size_;
  std::vector<int32_t> ref_;
  std::vector<uint64_t> hash_;                  // 0 = not cached
  std::list<int32_t> free_;                     // front = least recently freed
  std::vector<std::list<int32_t>::iterator> free_pos_;
  std::vector<bool> in_free_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  int64_t queries_ = 0, hits_ = 0;
};

}  // namespace lathe::serve
