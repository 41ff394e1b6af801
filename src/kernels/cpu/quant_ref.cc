// Packed quantized weights: bitsandbytes-exact quantizers (4-bit, blockwise 8-bit), the owning
// PackedWeight, header validation, the reference dequantizer and the scalar decode tier.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_tables.h"
#include "kernels/cpu/reference.h"
#include "kernels/quant.h"

namespace lathe::kernels {

namespace quant {

namespace {

struct DynMaps {
  float s[256], u[256];
  DynMaps() {
    std::memcpy(s, kDynamicSigned, sizeof(s));
    std::memcpy(u, kDynamicUnsigned, sizeof(u));
  }
};
const DynMaps& Maps() {
  static const DynMaps m;
  return m;
}

}  // namespace

const float* DynamicMapSigned() { return Maps().s; }
const float* DynamicMapUnsigned() { return Maps().u; }

const float* CodeBook(DType t) {
  LATHE_CHECK(IsPacked4Bit(t));
  return IsNf4(t) ? kNF4Code : kFP4Code;
}

void Quantize4Bit(bool nf4, const float* x, int64_t n, uint8_t* codes, float* absmax) {
  LATHE_CHECK(n % kQuant4Block == 0);
  const float* bounds = nf4 ? kNF4Bounds : kFP4Bounds;
  const uint8_t* order = nf4 ? nullptr : kFP4Order;
  for (int64_t b = 0; b < n / kQuant4Block; ++b) {
    const float* xb = x + b * kQuant4Block;
    float amax = 0;
    for (int i = 0; i < kQuant4Block; ++i) amax = std::max(amax, std::fabs(xb[i]));
    absmax[b] = amax;
    const float inv = 1.0f / std::max(amax, 1e-38f);
    uint8_t* cb = codes + b * (kQuant4Block / 2);
    for (int i = 0; i < kQuant4Block; ++i) {
      const float s = std::clamp(xb[i] * inv, -1.0f, 1.0f);
      // torch.bucketize(right=False): the number of bounds strictly below s.
      int q = (int)(std::lower_bound(bounds, bounds + 15, s) - bounds);
      if (order) q = order[q];
      if (i % 2 == 0) {
        cb[i / 2] = (uint8_t)(q << 4);
      } else {
        cb[i / 2] |= (uint8_t)q;
      }
    }
  }
}

namespace {

// bitsandbytes 0.50's CPU quantize_blockwise (csrc cpu_ops build_quantize_lut / quantize_cpu_impl):
// a 65536-entry table over [-1, 1]; entry k holds the nearest code to the grid point
// 2k / 65535 - 1 (ties to the lower code), found against the f32 midpoints of the sorted map.
struct QuantLut {
  uint8_t lut[65536];
  explicit QuantLut(const float* code) {
    float mid[255];
    for (int i = 0; i < 255; ++i) mid[i] = (code[i] + code[i + 1]) * 0.5f;
    int idx = 0;
    for (int k = 0; k < 65536; ++k) {
      const float v = ((float)k + (float)k) / 65535.0f - 1.0f;
      while (idx <= 254 && v > mid[idx]) ++idx;
      lut[k] = (uint8_t)idx;
    }
  }
};

const QuantLut& LutFor(const float* code) {
  static const QuantLut s(DynamicMapSigned()), u(DynamicMapUnsigned());
  if (code == DynamicMapSigned()) return s;
  LATHE_CHECK_MSG(code == DynamicMapUnsigned(), "QuantizeBlockwise8: not one of the dynamic maps");
  return u;
}

}  // namespace

void QuantizeBlockwise8(const float* code, const float* x, int64_t n, int64_t blocksize, uint8_t* out,
                        float* absmax) {
  const uint8_t* lut = LutFor(code).lut;
  for (int64_t b0 = 0, bi = 0; b0 < n; b0 += blocksize, ++bi) {
    const int64_t b1 = std::min(n, b0 + blocksize);
    float amax = -INFINITY;
    for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    amax = std::max(0.0f, amax);
    absmax[bi] = amax;
    if (amax == 0.0f) {
      std::memset(out + b0, 0, (size_t)(b1 - b0));
      continue;
    }
    const float inv = 1.0f / amax;
    for (int64_t i = b0; i < b1; ++i) {
      const float t = std::clamp(x[i] * inv, -1.0f, 1.0f);
      const float u = (t + 1.0f) * 0.5f;
      const float cell = std::fma(u, 65535.0f, 0.5f);
      // Truncation as cvttss2si; a NaN input (which bitsandbytes turns into cell 0) stays defined.
      const int k = cell >= 0.0f && cell < 65536.0f ? (int)cell : 0;
      out[i] = lut[k & 0xffff];
    }
  }
}

void DequantizeBlockwise8(const float* code, const uint8_t* q, const float* absmax, int64_t n,
                          int64_t blocksize, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = code[q[i]] * absmax[i / blocksize];
}

void BlockAbsmax(const Tensor& w, int64_t b0, int64_t nb, float* out) {
  const QuantHeader* h = (const QuantHeader*)w.data;
  const uint8_t* base = (const uint8_t*)w.data;
  if (!IsDoubleQuant(w.dtype)) {
    std::memcpy(out, base + h->absmax_offset + 4 * b0, 4 * nb);
    return;
  }
  const uint8_t* qa = base + h->absmax_offset;
  const float* a2 = (const float*)(base + h->absmax2_offset);
  const float* dyn = DynamicMapSigned();
  // dequantize_blockwise (f32 product) then += offset, as bitsandbytes' dequantize_4bit.
  for (int64_t b = b0; b < b0 + nb; ++b) out[b - b0] = dyn[qa[b]] * a2[b / kQuantDqBlock] + h->offset;
}

void DequantPackedBlock(const QuantKernels& qk, const Tensor& w, int64_t r0, int64_t nr, int64_t k0,
                        int64_t nk, float* out, int64_t ldo) {
  const QuantHeader* h = (const QuantHeader*)w.data;
  const uint8_t* base = (const uint8_t*)w.data;
  const int64_t K = w.shape[1];
  if (w.dtype == DType::kI8Row) {
    const int8_t* q = (const int8_t*)(base + h->codes_offset);
    const float* am = (const float*)(base + h->absmax_offset);
    for (int64_t r = r0; r < r0 + nr; ++r) {
      const float s = am[r] / 127.0f;
      const int8_t* qr = q + r * K + k0;
      float* o = out + (r - r0) * ldo;
      for (int64_t k = 0; k < nk; ++k) o[k] = qr[k] * s;
    }
    return;
  }
  LATHE_CHECK(k0 % kQuant4Block == 0 && nk % kQuant4Block == 0);
  const uint8_t* codes = base + h->codes_offset;
  const float* code16 = CodeBook(w.dtype);
  const int64_t nb = nk / kQuant4Block;
  constexpr int64_t kMaxBlocks = 512;  // absmax decoded in pieces of up to 32768 elements
  float am[kMaxBlocks];
  for (int64_t r = r0; r < r0 + nr; ++r) {
    for (int64_t j = 0; j < nb; j += kMaxBlocks) {
      const int64_t b0 = (r * K + k0) / kQuant4Block + j, n = std::min(kMaxBlocks, nb - j);
      BlockAbsmax(w, b0, n, am);
      qk.dequant4(codes + b0 * (kQuant4Block / 2), code16, am, n, out + (r - r0) * ldo + j * kQuant4Block);
    }
  }
}

namespace scalar {
namespace {

void Dequant4(const uint8_t* codes, const float* code16, const float* absmax, int64_t nb, float* out) {
  for (int64_t b = 0; b < nb; ++b) {
    const float a = absmax[b];
    for (int i = 0; i < kQuant4Block / 2; ++i) {
      const uint8_t c = codes[b * 32 + i];
      out[b * 64 + 2 * i] = code16[c >> 4] * a;
      out[b * 64 + 2 * i + 1] = code16[c & 15] * a;
    }
  }
}

void Gemv4(const uint8_t* codes, const float* code16, const float* absmax, int64_t n_rows, int64_t K,
           const float* x, int64_t m, float* y, int64_t ldy) {
  const int64_t nb = K / kQuant4Block;
  float row[kQuant4Block];
  for (int64_t r = 0; r < n_rows; ++r) {
    float acc[4] = {0, 0, 0, 0};
    for (int64_t b = 0; b < nb; ++b) {
      Dequant4(codes + (r * nb + b) * 32, code16, absmax + r * nb + b, 1, row);
      for (int64_t i = 0; i < m; ++i) {
        float s = 0;
        for (int j = 0; j < kQuant4Block; ++j) s += row[j] * x[i * K + b * kQuant4Block + j];
        acc[i] += s;
      }
    }
    for (int64_t i = 0; i < m; ++i) y[i * ldy + r] = acc[i];
  }
}

int32_t DotI8(const int8_t* a, const int8_t* b, int64_t K) {
  int32_t s = 0;
  for (int64_t k = 0; k < K; ++k) s += (int32_t)a[k] * b[k];
  return s;
}

}  // namespace

const QuantKernels& Table() {
  static const QuantKernels t{IsaTier::kScalar, Dequant4, Gemv4, DotI8};
  return t;
}
}  // namespace scalar

const QuantKernels& QuantKernelsFor(IsaTier tier) {
  switch (tier) {
    case IsaTier::kScalar: return scalar::Table();
    case IsaTier::kAvx2: return avx2::Table();
    default: return avx512::Table();
  }
}

}  // namespace quant

void PackedWeight::Free::operator()(uint8_t* p) const { std::free(p); }

PackedWeight::PackedWeight(DType t, int64_t rows, int64_t cols) : dtype_(t), rows_(rows), cols_(cols) {
  const QuantHeader h = PackedQuantLayout(t, rows, cols);
  bytes_ = (size_t)h.total_bytes;
  buf_.reset((uint8_t*)std::aligned_alloc(64, bytes_));
  LATHE_CHECK(buf_ != nullptr);
  std::memset(buf_.get(), 0, bytes_);
  std::memcpy(buf_.get(), &h, sizeof(h));
}

Result<PackedWeight> QuantizeWeight(const Tensor& w, DType t, const char* name) {
  if (!IsPackedQuant(t))
    return Status::Error(std::string(name) + ": " + DTypeName(t) + " is not a packed type");
  if (w.ndim() != 2) {
    return Status::Error(std::string(name) + ": quantizing needs a 2-D weight, got shape " + w.ShapeString());
  }
  if (w.dtype != DType::kF32 && w.dtype != DType::kF16 && w.dtype != DType::kBF16) {
    return Status::Error(std::string(name) + ": quantizing needs an f32/f16/bf16 source, got " +
                         DTypeName(w.dtype));
  }
  const int64_t rows = w.shape[0], cols = w.shape[1];
  if (IsPacked4Bit(t) && cols % kQuant4Block != 0) {
    return Status::Error(std::string(name) + ": " + DTypeName(t) + " needs cols % 64 == 0, got shape " +
                         w.ShapeString());
  }
  const int64_t n = rows * cols;
  std::vector<float> x((size_t)n);
  for (int64_t r = 0; r < rows; ++r) {
    ref::DequantizeRow(w.dtype, (const uint8_t*)w.data + r * DTypeBytes(w.dtype, cols), cols,
                       x.data() + r * cols);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      return Status::Error(std::string(name) + ": non-finite value at row " + std::to_string(i / cols) +
                           ", col " + std::to_string(i % cols));
    }
  }
  PackedWeight pw(t, rows, cols);
  QuantHeader* h = (QuantHeader*)pw.data();
  uint8_t* base = pw.data();
  if (t == DType::kI8Row) {
    int8_t* q = (int8_t*)(base + h->codes_offset);
    float* am = (float*)(base + h->absmax_offset);
    // Int8Params: int8_vectorwise_quant: absmax per row, round(x * (127 / absmax)).
    for (int64_t r = 0; r < rows; ++r) {
      float amax = 0;
      for (int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::fabs(x[r * cols + k]));
      am[r] = amax;
      const float s = amax == 0 ? 0.0f : 127.0f / amax;
      for (int64_t k = 0; k < cols; ++k) q[r * cols + k] = (int8_t)std::nearbyint(x[r * cols + k] * s);
    }
    return pw;
  }
  const int64_t nb = n / kQuant4Block;
  std::vector<float> absmax((size_t)nb);
  quant::Quantize4Bit(IsNf4(t), x.data(), n, base + h->codes_offset, absmax.data());
  if (!IsDoubleQuant(t)) {
    std::memcpy(base + h->absmax_offset, absmax.data(), 4 * nb);
    return pw;
  }
  // compress_statistics: offset = absmax.mean(); quantize_blockwise(absmax - offset, blocksize=256).
  double sum = 0;
  for (float a : absmax) sum += a;
  const float offset = nb ? (float)(sum / (double)nb) : 0.0f;
  h->offset = offset;
  for (float& a : absmax) a -= offset;
  quant::QuantizeBlockwise8(quant::DynamicMapSigned(), absmax.data(), nb, kQuantDqBlock,
                            base + h->absmax_offset, (float*)(base + h->absmax2_offset));
  return pw;
}

Status ValidatePacked(const Tensor& w, const char* name) {
  if (!IsPackedQuant(w.dtype)) return Status::Error(std::string(name) + ": not a packed quantized dtype");
  if (w.ndim() != 2 || w.data == nullptr)
    return Status::Error(std::string(name) + ": packed weight must be 2-D");
  const QuantHeader* h = (const QuantHeader*)w.data;
  if (h->magic != kQuantMagic) return Status::Error(std::string(name) + ": bad packed-weight magic");
  if (h->dtype != (uint8_t)w.dtype || h->rows != w.shape[0] || h->cols != w.shape[1]) {
    return Status::Error(std::string(name) + ": packed header (dtype " + std::to_string(h->dtype) + ", " +
                         std::to_string(h->rows) + " x " + std::to_string(h->cols) +
                         ") disagrees with tensor " + DTypeName(w.dtype) + " " + w.ShapeString());
  }
  if (IsPacked4Bit(w.dtype) && w.shape[1] % kQuant4Block != 0) {
    return Status::Error(std::string(name) + ": 4-bit packed weight needs cols % 64 == 0");
  }
  const QuantHeader want = PackedQuantLayout(w.dtype, w.shape[0], w.shape[1]);
  if (want.codes_offset != h->codes_offset || want.absmax_offset != h->absmax_offset ||
      want.absmax2_offset != h->absmax2_offset || want.total_bytes != h->total_bytes) {
    return Status::Error(std::string(name) + ": packed header section offsets are not the version-1 layout");
  }
  return Status::Ok();
}

void DequantizePacked(const Tensor& w, float* out) {
  LATHE_CHECK(IsPackedQuant(w.dtype) && w.ndim() == 2);
  quant::DequantPackedBlock(quant::scalar::Table(), w, 0, w.shape[0], 0, w.shape[1], out, w.shape[1]);
}

}  // namespace lathe::kernels
