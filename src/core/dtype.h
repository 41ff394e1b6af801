// Element types of tensors: plain floats/ints and GGUF-style block-quantized formats.
// A row of n elements of a block type occupies (n / BlockSize) * BlockBytes bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace lathe {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kI8,
  kI16,
  kI32,
  kI64,
  kU8,
  kBool,
  kQ8_0,  // 32 x int8 + f16 scale (34 bytes)
  kQ4_0,  // 32 x 4-bit (offset 8) + f16 scale (18 bytes)
  kQ4_1,  // 32 x 4-bit + f16 scale + f16 min (20 bytes)
  kCount,
};

struct DTypeInfo {
  const char* name;
  int block_size;   // elements per block (1 for plain types)
  int block_bytes;  // bytes per block
};

const DTypeInfo& GetDTypeInfo(DType t);
inline const char* DTypeName(DType t) { return GetDTypeInfo(t).name; }
// Parses names such as "f32", "bf16", "q4_1" (case-insensitive). Returns false if unknown.
bool ParseDType(std::string_view name, DType* out);
inline bool IsQuantized(DType t) { return GetDTypeInfo(t).block_size > 1; }
// Bytes for n elements; REQUIRES n % block_size == 0.
size_t DTypeBytes(DType t, int64_t n);

// Block layouts, byte-compatible with GGML.
struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[32];
};
struct BlockQ4_0 {
  uint16_t d;  // f16 scale
  uint8_t qs[16];  // element j in low nibble of qs[j], element j+16 in high nibble
};
struct BlockQ4_1 {
  uint16_t d;  // f16 scale
  uint16_t m;  // f16 min
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);

// IEEE half <-> float, and bfloat16 <-> float (round to nearest even).
inline float F16ToF32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        e++;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t F32ToF16(float f);

inline float BF16ToF32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t F32ToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffff) > 0x7f800000) return (uint16_t)((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fff + ((bits >> 16) & 1);
  return (uint16_t)(bits >> 16);
}

}  // namespace lathe
