// Per-thread scratch buffers and the prefill blocking shared by the dense, packed-quant and
// training matmul/attention drivers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/check.h"
#include "core/huge_buffer.h"

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
  explicit TransientFloats(size_t n) : buf_(n * sizeof(float)), n_(n) {}
  float* data() { return (float*)buf_.data(); }
  const float* data() const { return (const float*)buf_.data(); }
  size_t size() const { return n_; }
  float& operator[](size_t i) { return data()[i]; }
  const float& operator[](size_t i) const { return data()[i]; }

 private:
  HugePageBuffer buf_;
  size_t n_;
};

// Bytes of x rows kept hot in L2 per M block (L2 is 512 KiB on Zen 3, 1-2 MiB on Zen 4/5). Larger
// blocks mean fewer re-dequantizations of each weight panel (one per M block); 384 KiB measured
// ~3 % faster than 192 KiB at K = 1536 on Zen 3 (cpu time, loaded machine), equal at K = 576.
constexpr int64_t kXBlockBytes = 384 * 1024;
// Weight rows per prefill task (several panels, so a task amortizes its x block).
constexpr int64_t kPrefillRowsPerTask = 48;

}  // namespace lathe::kernels::cpu
