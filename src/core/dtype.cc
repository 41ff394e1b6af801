// DType tables and the float -> half conversion.
#include "core/dtype.h"

#include <cctype>
#include <string>

#include "core/check.h"

namespace lathe {

namespace {
const DTypeInfo kInfos[] = {
    {"f32", 1, 4},  {"f16", 1, 2},  {"bf16", 1, 2},  {"f64", 1, 8},   {"i8", 1, 1},
    {"i16", 1, 2},  {"i32", 1, 4},  {"i64", 1, 8},   {"u8", 1, 1},    {"bool", 1, 1},
    {"q8_0", 32, 34}, {"q4_0", 32, 18}, {"q4_1", 32, 20},
    // Packed buffers: block_size is the absmax block; block_bytes the code bytes per block (the
    // buffer also holds the header and statistics, see PackedQuantLayout).
    {"nf4", 64, 32}, {"fp4", 64, 32}, {"nf4_dq", 64, 32}, {"fp4_dq", 64, 32}, {"i8_row", 1, 1},
    {"q5_0", 32, 22}, {"q5_1", 32, 24}, {"q2_k", 256, 84}, {"q3_k", 256, 110}, {"q4_k", 256, 144},
    {"q5_k", 256, 176}, {"q6_k", 256, 210},
};
static_assert(sizeof(kInfos) / sizeof(kInfos[0]) == (size_t)DType::kCount);
}  // namespace

const DTypeInfo& GetDTypeInfo(DType t) {
  LATHE_CHECK((size_t)t < (size_t)DType::kCount);
  return kInfos[(size_t)t];
}

bool ParseDType(std::string_view name, DType* out) {
  std::string lower;
  for (char c : name) lower.push_back((char)std::tolower((unsigned char)c));
  for (size_t i = 0; i < (size_t)DType::kCount; ++i) {
    if (lower == kInfos[i].name) {
      *out = (DType)i;
      return true;
    }
  }
  return false;
}

size_t DTypeBytes(DType t, int64_t n) {
  if (IsPackedQuant(t)) return (size_t)PackedQuantLayout(t, 1, n).total_bytes;  // see dtype.h
  const DTypeInfo& info = GetDTypeInfo(t);
  LATHE_CHECK(n % info.block_size == 0);
  return (size_t)(n / info.block_size) * info.block_bytes;
}

namespace {
uint64_t Align64(uint64_t n) { return (n + 63) / 64 * 64; }
}  // namespace

QuantHeader PackedQuantLayout(DType t, int64_t rows, int64_t cols) {
  LATHE_CHECK(IsPackedQuant(t) && rows >= 0 && cols >= 0);
  QuantHeader h{};
  h.magic = kQuantMagic;
  h.dtype = (uint8_t)t;
  h.version = 1;
  h.rows = rows;
  h.cols = cols;
  const uint64_t n = (uint64_t)rows * (uint64_t)cols;
  h.codes_offset = sizeof(QuantHeader);
  if (t == DType::kI8Row) {
    h.absmax_offset = Align64(h.codes_offset + n);
    h.total_bytes = Align64(h.absmax_offset + 4 * (uint64_t)rows);
    return h;
  }
  LATHE_CHECK(cols % kQuant4Block == 0);
  const uint64_t nb = n / kQuant4Block;
  h.absmax_offset = Align64(h.codes_offset + n / 2);
  if (IsDoubleQuant(t)) {
    h.absmax2_offset = Align64(h.absmax_offset + nb);
    h.total_bytes = Align64(h.absmax2_offset + 4 * ((nb + kQuantDqBlock - 1) / kQuantDqBlock));
  } else {
    h.total_bytes = Align64(h.absmax_offset + 4 * nb);
  }
  return h;
}

uint16_t F32ToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000) {  // inf or nan
    return (uint16_t)(sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0));
  }
  if (abs >= 0x477ff000) return (uint16_t)(sign | 0x7c00);  // overflow -> inf (after rounding)
  if (abs < 0x38800000) {  // subnormal or zero in half
    if (abs < 0x33000000) return (uint16_t)sign;  // rounds to zero
    uint32_t mant = (abs & 0x7fffff) | 0x800000;
    int shift = 113 - (int)(abs >> 23) + 13;  // 126 - exp + 14 - 1
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t h = ((abs - 0x38000000) >> 13);
  uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

}  // namespace lathe
