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
  // Packed whole-weight buffers (bitsandbytes layouts, see QuantHeader below). A Tensor of one of
  // these dtypes points at the header; shape is the logical (rows, cols) weight shape.
  kNF4,     // 4-bit NormalFloat codes, absmax f32 per 64
  kFP4,     // 4-bit float codes, absmax f32 per 64
  kNF4DQ,   // NF4 with double-quantized absmax (u8 per 64, f32 absmax per 256 blocks, f32 offset)
  kFP4DQ,   // FP4 with double-quantized absmax
  kI8Row,   // LLM.int8 weight: int8 per element, f32 absmax per row (scale = absmax / 127)
  // More GGML block types (byte-compatible, see the Block* structs below). After the packed types so
  // the packed types' numbers stay what QuantHeader::dtype has always held.
  kQ5_0,  // 32 x 5-bit (offset 16) + f16 scale (22 bytes)
  kQ5_1,  // 32 x 5-bit + f16 scale + f16 min (24 bytes)
  kQ2_K,  // 256: 16 x (4-bit scale, 4-bit min) of 16 x 2-bit, f16 d and dmin (84 bytes)
  kQ3_K,  // 256: 16 x 6-bit signed scale of 16 x 3-bit (offset 4), f16 d (110 bytes)
  kQ4_K,  // 256: 8 x (6-bit scale, 6-bit min) of 32 x 4-bit, f16 d and dmin (144 bytes)
  kQ5_K,  // 256: as Q4_K with 5-bit values (176 bytes)
  kQ6_K,  // 256: 16 x int8 scale of 16 x 6-bit (offset 32), f16 d (210 bytes)
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
// Bytes for n elements; REQUIRES n % block_size == 0. For the packed types (below) this is the size
// of a whole buffer of n elements: exact for the 4-bit types (their layout depends on n only), and
// for i8_row 4 * (rows - 1) bytes short (the per-row absmax needs the shape: PackedQuantBytes is
// exact). So Tensor::nbytes() is (nearly) right, but row_bytes() has no meaning for packed types:
// their rows are not separately addressable; kernels take them through kernels/quant.h.
size_t DTypeBytes(DType t, int64_t n);

// Packed quantized weights: one self-describing contiguous buffer per 2-D weight (rows, cols), so a
// Tensor {data = buffer, dtype, shape = {rows, cols}} is the weight as stored. Layout (every
// section starts 64-byte aligned, offsets from the buffer start are in the header):
//   QuantHeader (64 bytes)
//   NF4/FP4[_DQ]: codes   u8[rows*cols/2]  the flattened row-major weight, two 4-bit codes per byte,
//                                          element 2i in the HIGH nibble, 2i+1 in the low nibble
//                                          (bitsandbytes quantize_4bit order)
//                 absmax  f32[nb]          nb = rows*cols/64 blocks of 64 consecutive elements
//              or (DQ)    u8[nb]           quantize_blockwise(absmax - offset, dynamic map, 256)
//                         absmax2 f32[ceil(nb/256)], offset f32 in the header
//                 value = code[q] * absmax[block] (DQ: absmax = dyn[qa] * absmax2[block/256] + offset)
//   I8Row:        int8    i8[rows*cols]    round(w * 127 / row_absmax) (bitsandbytes Int8Params CB)
//                 absmax  f32[rows]        row_absmax (bitsandbytes SCB); value = q * absmax / 127
// REQUIRES cols % 64 == 0 for the 4-bit types (a block never crosses a row; holds for every Llama
// shape), which QuantizeWeight checks.
inline bool IsPackedQuant(DType t) { return t >= DType::kNF4 && t <= DType::kI8Row; }
inline bool IsPacked4Bit(DType t) { return t >= DType::kNF4 && t <= DType::kFP4DQ; }
inline bool IsNf4(DType t) { return t == DType::kNF4 || t == DType::kNF4DQ; }
inline bool IsDoubleQuant(DType t) { return t == DType::kNF4DQ || t == DType::kFP4DQ; }
constexpr int kQuant4Block = 64;     // elements per 4-bit absmax block
constexpr int kQuantDqBlock = 256;   // absmax values per second-level block (double quant)
constexpr uint32_t kQuantMagic = 0x544e514c;  // "LQNT"

struct QuantHeader {
  uint32_t magic;  // kQuantMagic
  uint8_t dtype;   // the DType
  uint8_t version;  // 1
  uint16_t reserved0;
  int64_t rows, cols;
  uint64_t codes_offset;    // codes / int8 section
  uint64_t absmax_offset;   // f32 absmax (or u8 quantized absmax with DQ, or f32 row absmax)
  uint64_t absmax2_offset;  // DQ only: f32 second-level absmax; 0 otherwise
  uint64_t total_bytes;     // whole buffer
  float offset;             // DQ only: mean of the first-level absmax
  uint32_t reserved1;
};
static_assert(sizeof(QuantHeader) == 64);

// Size of the packed buffer for a (rows, cols) weight of packed type t, and its section offsets.
QuantHeader PackedQuantLayout(DType t, int64_t rows, int64_t cols);
inline size_t PackedQuantBytes(DType t, int64_t rows, int64_t cols) {
  return (size_t)PackedQuantLayout(t, rows, cols).total_bytes;
}
// Whether a weight with `cols` input features can be packed as t: the 4-bit types' blocks of 64
// run along a row, so they need cols % 64 == 0 (train::QuantizeBaseWeights keeps the others as stored).
inline bool PackableAs(DType t, int64_t cols) { return !IsPacked4Bit(t) || cols % 64 == 0; }

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
// Q5_0 / Q5_1: element j < 16 is the low nibble of qs[j], element j + 16 the high nibble; bit j
// of qh (little-endian u32) is element j's fifth bit.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
// K-quants (256 elements). Element e = 128 h + 32 s + l (h < 2, s < 4, l < 32) of Q2_K / Q3_K has
// its 2 low bits at (qs[32 h + l] >> 2 s) & 3; Q3_K's third bit is (hmask[l] >> (e / 32)) & 1
// (clear = subtract 4). Q4_K / Q5_K: element e = 64 c + 32 n + l has its 4 low bits in nibble n of
// qs[32 c + l]; Q5_K's fifth bit is (qh[l] >> (e / 32)) & 1. Q6_K: element e = 128 h + 64 n + l
// (l < 64) has its 4 low bits in nibble n of ql[64 h + l], and element e = 128 h + 32 s + l (l < 32)
// its 2 high bits at (qh[32 h + l] >> 2 s) & 3. Scales per 16 elements (Q2_K, Q3_K, Q6_K) or 32
// (Q4_K, Q5_K, packed 6-bit, see ref::KScaleMin).
struct BlockQ2_K {
  uint8_t scales[16];  // low nibble scale, high nibble min
  uint8_t qs[64];
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);
// The GGML block types beyond Q8_0 / Q4_0 / Q4_1 (computed by the generic int8 kernels).
inline bool IsExtQuant(DType t) { return t >= DType::kQ5_0 && t <= DType::kQ6_K; }
inline bool IsKQuant(DType t) { return t >= DType::kQ2_K && t <= DType::kQ6_K; }
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
