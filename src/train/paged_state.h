// PagedStatePool: optimizer state in a file-backed MAP_SHARED mapping of an unlinked temp file, with
// a resident cap. Regions the optimizer has finished with are written back (msync) and dropped from
// RAM (madvise(MADV_DONTNEED) + posix_fadvise(POSIX_FADV_DONTNEED)) oldest first once more than the
// cap is resident, so states larger than RAM (or than the cap) still work: the CPU analogue of
// bitsandbytes' paged optimizers (which page between GPU and CPU memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "core/status.h"

namespace lathe::train {

class PagedStatePool {
 public:
  // dir: where the temp file lives (output_dir or $TMPDIR); it is unlinked at once, so nothing is
  // left behind. cap_bytes: resident budget for the state (0 = no cap: never evicts).
  static Result<std::unique_ptr<PagedStatePool>> Create(const std::string& dir, size_t cap_bytes);
  ~PagedStatePool();
  PagedStatePool(const PagedStatePool&) = delete;
  PagedStatePool& operator=(const PagedStatePool&) = delete;

  // Maps `bytes` (zero-filled) for the whole state; call once. The base is page-aligned; carve it
  // with Carve(). Errors name the file and the failing call (disk full, mmap limits).
  Status Map(size_t bytes);
  // Next `bytes` of the mapping, 64-byte aligned. REQUIRES Map() and enough room left.
  void* Carve(size_t bytes);
  // Records that [p, p + len) was just used; when more than the cap is resident, the oldest used
  // regions are paged out (never the region just recorded). Not thread-safe.
  void Used(void* p, size_t len);
  // Writes back and drops the whole state from RAM (e.g. before a phase that needs the memory).
  void PageOutAll();

  size_t cap_bytes() const { return cap_; }
  size_t mapped_bytes() const { return size_; }
  // Bytes of the mapping resident in this process now (the mapping's Rss in /proc/self/smaps: what
  // the process's RSS counts). Paged-out regions leave it at once (madvise MADV_DONTNEED); the
  // kernel may keep their clean, written-back copies in its page cache a while (fadvise asks it to
  // drop them; whether it can depends on its per-CPU LRU batches), which is reclaimable, so
  // mincore(2)'s view of the page cache is not the measure: it made the cap test flaky.
  size_t ResidentBytes() const;
  // Largest resident amount seen by Used() right after each eviction round (for tests).
  size_t peak_tracked_bytes() const { return peak_tracked_; }

 private:
  PagedStatePool() = default;
  void PageOut(uint8_t* p, size_t len);

  int fd_ = -1;
  std::string path_;
  uint8_t* base_ = nullptr;
  size_t size_ = 0, carved_ = 0, cap_ = 0, page_ = 4096;
  struct Region {
    uint8_t* p;
    size_t len;
  };
  std::deque<Region> used_;  // oldest first
  size_t tracked_ = 0, peak_tracked_ = 0;
};

}  // namespace lathe::train
