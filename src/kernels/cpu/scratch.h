// Per-thread scratch buffers and the prefill blocking shared by the dense, packed-quant and
// training matmul/attention drivers.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/check.h"

namespace lathe::kernels::cpu {

// Grows (never shrinks) a per-thread buffer, so steady-state calls do not allocate.
template <typename T>
T* Scratch(std::vector<T>& buf, size_t n) {
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// A buffer of n floats for one call, handed back when it goes (as a std::vector's would be, so it adds to the
// peak only while the call runs), from anonymous memory asked for as transparent huge pages (MADV_HUGEPAGE,
// 2 MiB aligned) when it spans 2 MiB or more: its first touch then costs one fault per 2 MiB instead of one
// per 4 KiB page (the cross-entropy's 25 MB chunk of logits: ~6100 faults, ~29 ms a call, measured at 11% of
// the loss). Where the kernel gives no huge pages it behaves as plain anonymous memory. Zero-filled.
class TransientFloats {
 public:
  explicit TransientFloats(size_t n) : n_(n) {
    if (n == 0) return;
    constexpr size_t kHuge = 2u << 20;
    const size_t bytes = n * sizeof(float);
    const bool huge = bytes >= kHuge;
    len_ = huge ? (bytes + kHuge - 1) / kHuge * kHuge + kHuge : bytes;
    base_ = mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    LATHE_CHECK(base_ != MAP_FAILED);
    uintptr_t p = (uintptr_t)base_;
    if (huge) {
      p = (p + kHuge - 1) / kHuge * kHuge;
      madvise((void*)p, (bytes + kHuge - 1) / kHuge * kHuge, MADV_HUGEPAGE);  // a hint: failure is fine
    }
    p_ = (float*)p;
  }
  ~TransientFloats() {
    if (base_) munmap(base_, len_);
  }
  TransientFloats(const TransientFloats&) = delete;
  TransientFloats& operator=(const TransientFloats&) = delete;
  float* data() { return p_; }
  const float* data() const { return p_; }
  size_t size() const { return n_; }
  float& operator[](size_t i) { return p_[i]; }
  const float& operator[](size_t i) const { return p_[i]; }

 private:
  size_t n_ = 0, len_ = 0;
  void* base_ = nullptr;
  float* p_ = nullptr;
};

// Bytes of x rows kept hot in L2 per M block (L2 is 512 KiB on Zen 3, 1-2 MiB on Zen 4/5). Larger
// blocks mean fewer re-dequantizations of each weight panel (one per M block); 384 KiB measured
// ~3 % faster than 192 KiB at K = 1536 on Zen 3 (cpu time, loaded machine), equal at K = 576.
constexpr int64_t kXBlockBytes = 384 * 1024;
// Weight rows per prefill task (several panels, so a task amortizes its x block).
constexpr int64_t kPrefillRowsPerTask = 48;

}  // namespace lathe::kernels::cpu
