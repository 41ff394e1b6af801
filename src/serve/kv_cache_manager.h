// KvCacheManager: per-sequence block tables over a BlockPool and the KvBlockStore holding the
// data. Prompts reuse cached full-block prefixes; blocks are registered for reuse as they fill;
// forked sequences (n > 1 sampling) share blocks and copy a shared block before writing into it.
// Not thread-safe: the engine thread owns it.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "model/transformer.h"
#include "serve/block_pool.h"

namespace lathe::serve {

class KvCacheManager {
 public:
  KvCacheManager(BlockPool& pool, model::KvBlockStore& store) : pool_(pool), store_(store) {}

  // Starts `seq` with its known tokens (the prompt, or prompt + generated when a preempted
  // sequence returns): reuses cached full blocks from the start and allocates blocks for the next
  // `max_new_tokens` of the rest (all of it by default; a chunked prefill reserves each further
  // chunk as it runs, so blocks hold computed tokens, as vLLM's scheduler allocates). Returns how
  // many leading tokens are already computed — never all of them (the last token must run to give
  // logits), and no token is ever recomputed into a shared block. On too few free blocks returns
  // an error and holds nothing.
  Result<int64_t> Allocate(int64_t seq, std::span<const int32_t> tokens, uint64_t extra_key,
                           int64_t max_new_tokens = INT64_MAX);
  // Makes the table cover n_tokens positions; false (nothing allocated) if blocks run out.
  bool Reserve(int64_t seq, int64_t n_tokens);
  // Blocks Reserve(seq, n_tokens) would take.
  int64_t BlocksNeeded(int64_t seq, int64_t n_tokens) const;
  // Before writing positions [from, to): gives `seq` a private copy of any shared block there.
  // False if no block was free for a copy.
  bool PrepareWrite(int64_t seq, int64_t from, int64_t to);
  // After positions [0, computed) of `tokens` are in the cache: registers every newly full block
  // for prefix reuse.
  void MarkComputed(int64_t seq, std::span<const int32_t> tokens, int64_t computed);
  // dst shares all of src's blocks (n > 1 sampling).
  void Fork(int64_t src, int64_t dst);
  // Releases every block of `seq` at once (finish, abort, preemption).
  void Free(int64_t seq);
  bool Has(int64_t seq) const { return seqs_.count(seq) > 0; }
  std::span<const int32_t> BlockTable(int64_t seq) const { return seqs_.at(seq).table; }

 private:
  struct Seq {
    std::vector<int32_t> table;
    std::vector<uint64_t> hashes;  // of the first hashes.size() blocks, all registered
    uint64_t extra_key = 0;
  };
  BlockPool& pool_;
  model::KvBlockStore& store_;
  std::unordered_map<int64_t, Seq> seqs_;
};

}  // namespace lathe::serve
