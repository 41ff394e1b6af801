// Per-thread scratch buffers and the prefill blocking shared by the dense, packed-quant and
// training matmul/attention drivers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lathe::kernels::cpu {

// Grows (never shrinks) a per-thread buffer, so steady-state calls do not allocate.
template <typename T>
T* Scratch(std::vector<T>& buf, size_t n) {
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Bytes of x rows kept hot in L2 per M block (L2 is 512 KiB on Zen 3, 1-2 MiB on Zen 4/5). Larger
// blocks mean fewer re-dequantizations of each weight panel (one per M block); 384 KiB measured
// ~3 % faster than 192 KiB at K = 1536 on Zen 3 (cpu time, loaded machine), equal at K = 576.
constexpr int64_t kXBlockBytes = 384 * 1024;
// Weight rows per prefill task (several panels, so a task amortizes its x block).
constexpr int64_t kPrefillRowsPerTask = 48;

}  // namespace lathe::kernels::cpu
