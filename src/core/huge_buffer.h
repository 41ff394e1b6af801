// HugePageBuffer: zero-filled anonymous memory, 2 MiB aligned and asked for as transparent huge pages
// (MADV_HUGEPAGE) when it spans 2 MiB or more. One fault per 2 MiB instead of per 4 KiB page, and one TLB
// entry per 2 MiB: for buffers read in scattered pieces (a paged KV cache: a 4 KiB page per 16-position
// block left a decode step waiting on page walks) or written fresh per call (the loss's chunk of
// logits). Committed page by page as first touched, or all at once with Populate() (a KV pool: its
// faults would otherwise land in the serving steps that first write each block). Where the kernel
// gives no huge pages it is plain anonymous memory.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/check.h"

namespace lathe {

class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  explicit HugePageBuffer(size_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    constexpr size_t kHuge = size_t{2} << 20;
    const bool huge = bytes >= kHuge;
    len_ = huge ? (bytes + kHuge - 1) / kHuge * kHuge + kHuge : bytes;
    base_ = mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    LATHE_CHECK_MSG(base_ != MAP_FAILED, "out of memory: could not map %zu bytes", bytes);
    uintptr_t p = (uintptr_t)base_;
    if (huge) {
      p = (p + kHuge - 1) / kHuge * kHuge;
      madvise((void*)p, (bytes + kHuge - 1) / kHuge * kHuge, MADV_HUGEPAGE);  // a hint: failure is fine
    }
    p_ = (uint8_t*)p;
  }
  ~HugePageBuffer() {
    if (base_) munmap(base_, len_);
  }
  HugePageBuffer(HugePageBuffer&& o) noexcept { *this = std::move(o); }
  HugePageBuffer& operator=(HugePageBuffer&& o) noexcept {
    std::swap(size_, o.size_);
    std::swap(len_, o.len_);
    std::swap(base_, o.base_);
    std::swap(p_, o.p_);
    return *this;
  }
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  // Touches every page now (one write per 4 KiB: a single fault per 2 MiB where huge pages are given).
  void Populate() {
    volatile uint8_t* p = p_;
    for (size_t o = 0; o < size_; o += 4096) p[o] = 0;
  }

  uint8_t* data() { return p_; }
  const uint8_t* data() const { return p_; }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0, len_ = 0;
  void* base_ = nullptr;
  uint8_t* p_ = nullptr;
};

}  // namespace lathe
