// Element types of a KV cache for the attention kernels: f32, IEEE f16 or bf16. The 16-bit ones are
// tags over their bits (distinct types, so a kernel template picks its widening load by overload);
// every kernel widens them to f32 exactly on load and runs the f32 arithmetic after it.
#pragma once

#include <cstdint>

#include "core/check.h"
#include "core/dtype.h"

namespace lathe::kernels::cpu {

struct KvF16 {
  uint16_t bits;
};
struct KvBf16 {
  uint16_t bits;
};

// f(k, v) with the K / V pointers as the element type of `kv` (const float*, const KvF16* or const
// KvBf16*); returns what f returns.
template <typename F>
auto WithKvElem(DType kv, const void* k, const void* v, F&& f) {
  switch (kv) {
    case DType::kF16:
      return f((const KvF16*)k, (const KvF16*)v);
    case DType::kBF16:
      return f((const KvBf16*)k, (const KvBf16*)v);
    default:
      LATHE_CHECK_MSG(kv == DType::kF32, "KV cache dtype %s: expected f32, f16 or bf16", DTypeName(kv));
      return f((const float*)k, (const float*)v);
  }
}

// The attention kernels' software prefetch, kKvAhead positions ahead of their position loops: a decode
// step reads each sequence's K / V once, from DRAM, in runs of one block (a KV head's positions), too
// short and too scattered over the pool for the hardware prefetcher (bench decode_attention, 30 layers:
// 1.2-1.6x with it). Every line of one position's head slice (head_dim elements of E) at row, into L1
// (K ahead of the scores, V ahead of the mix) or L2 (V while the scores run).
constexpr int64_t kKvAhead = 16;
template <typename E, int HeadDim>
inline void PrefetchKvSlice(const E* row, bool l1) {
  constexpr int kBytes = HeadDim * (int)sizeof(E);
  const char* p = (const char*)row;
#pragma GCC unroll 8
  for (int b = 0; b < kBytes + 63; b += 64) {  // every line the slice touches, wherever it starts
    const char* a = p + (b < kBytes ? b : kBytes - 1);
    if (l1) {
      __builtin_prefetch(a, 0, 3);
    } else {
      __builtin_prefetch(a, 0, 2);
    }
  }
}

// One element widened to f32 (exact), for the scalar forms.
inline float KvToF32(float x) { return x; }
inline float KvToF32(KvF16 x) { return F16ToF32(x.bits); }
inline float KvToF32(KvBf16 x) { return BF16ToF32(x.bits); }

}  // namespace lathe::kernels::cpu
