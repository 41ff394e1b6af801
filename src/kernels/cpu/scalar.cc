// Scalar (baseline x86-64) tier: the same algorithms as the SIMD tiers (int8 GEMV for block types,
// dequantized panels for prefill) in plain C++, used on CPUs without AVX2 and as a test baseline.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/reference.h"

namespace lathe::kernels::cpu::scalar {

namespace {

void QuantizeX(const float* x, int64_t K, BlockQ8X* out) {
  for (int64_t j = 0; j < K / 32; ++j) {
    const float* p = x + j * 32;
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(p[i]));
    const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const int q = (int)std::nearbyint(p[i] * id);
      out[j].qs[i] = (int8_t)q;
      sum += q;
    }
    out[j].d = d;
    out[j].s = d * (float)sum;
  }
}

// Integer dot of one weight block with one x block; returns the block's float contribution.
inline float BlockDot(DType t, const uint8_t* wb, const BlockQ8X& xb) {
  switch (t) {
    case DType::kQ8_0: {
      const BlockQ8_0* b = (const BlockQ8_0*)wb;
      int s = 0;
      for (int i = 0; i < 32; ++i) s += b->qs[i] * xb.qs[i];
      return F16ToF32(b->d) * xb.d * (float)s;
    }
    case DType::kQ4_0: {
      const BlockQ4_0* b = (const BlockQ4_0*)wb;
      int s = 0;
      for (int i = 0; i < 16; ++i) s += (b->qs[i] & 0xf) * xb.qs[i] + (b->qs[i] >> 4) * xb.qs[i + 16];
      const float d = F16ToF32(b->d);
      return d * (xb.d * (float)s - 8.0f * xb.s);
    }
    case DType::kQ4_1: {
      const BlockQ4_1* b = (const BlockQ4_1*)wb;
      int s = 0;
      for (int i = 0; i < 16; ++i) s += (b->qs[i] & 0xf) * xb.qs[i] + (b->qs[i] >> 4) * xb.qs[i + 16];
      return F16ToF32(b->d) * xb.d * (float)s + F16ToF32(b->m) * xb.s;
    }
    default:
      return 0;
  }
}

inline float LoadF(DType t, const uint8_t* row, int64_t k) {
  switch (t) {
    case DType::kF32:
      return ((const float*)row)[k];
    case DType::kF16:
      return F16ToF32(((const uint16_t*)row)[k]);
    default:
      return BF16ToF32(((const uint16_t*)row)[k]);
  }
}

// One row of an IsExtQuant weight against one x row: per 32-element x block, the integer sums of
// the block's 16-element halves times their scales (and mins), then f32 products with the scales.
float ExtRowDot(DType t, const uint8_t* row, const BlockQ8X* xq, int64_t K) {
  const DTypeInfo& info = GetDTypeInfo(t);
  ref::DecodedBlock db;
  float acc = 0, accm = 0;
  for (int64_t b = 0; b < K / info.block_size; ++b) {
    ref::DecodeBlock(t, row + b * info.block_bytes, &db);
    for (int j = 0; j < db.n / 32; ++j) {
      const BlockQ8X& xb = xq[b * (db.n / 32) + j];
      int s = 0, mn = 0;
      for (int h = 0; h < 2; ++h) {
        int dot = 0, sum = 0;
        for (int l = 0; l < 16; ++l) {
          dot += db.q[32 * j + 16 * h + l] * xb.qs[16 * h + l];
          sum += xb.qs[16 * h + l];
        }
        s += db.sc[2 * j + h] * dot;
        mn += db.mn[2 * j + h] * sum;
      }
      acc += db.d * xb.d * (float)s;
      if (db.has_min) accm += db.dmin * xb.d * (float)mn;
    }
  }
  return acc - accm;
}

void Gemv(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const void* x, int64_t m, int64_t K, float* y,
          int64_t ldy) {
  if (IsExtQuant(t)) {
    const BlockQ8X* xq = (const BlockQ8X*)x;
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t i = 0; i < m; ++i) y[i * ldy + r] = ExtRowDot(t, w + r * rb, xq + i * (K / 32), K);
    return;
  }
  if (IsQuantized(t)) {
    const BlockQ8X* xq = (const BlockQ8X*)x;
    const int64_t nb = K / 32, bb = GetDTypeInfo(t).block_bytes;
    for (int64_t r = 0; r < n_rows; ++r) {
      const uint8_t* row = w + r * rb;
      for (int64_t i = 0; i < m; ++i) {
        float s = 0;
        for (int64_t j = 0; j < nb; ++j) s += BlockDot(t, row + j * bb, xq[i * nb + j]);
        y[i * ldy + r] = s;
      }
    }
    return;
  }
  const float* xf = (const float*)x;
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = w + r * rb;
    for (int64_t i = 0; i < m; ++i) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += LoadF(t, row, k) * xf[i * K + k];
      y[i * ldy + r] = s;
    }
  }
}

void DequantRows(DType t, const uint8_t* w, size_t rb, int64_t n_rows, int64_t K, float* out, int64_t ldo) {
  for (int64_t r = 0; r < n_rows; ++r) ref::DequantizeRow(t, w + r * rb, K, out + r * ldo);
}

void Panel(const float* x, int64_t ldx, int64_t m_rows, const float* w, int64_t ldw, int64_t n_rows,
           int64_t K, float* y, int64_t ldy) {
  for (int64_t i = 0; i < m_rows; ++i)
    for (int64_t r = 0; r < n_rows; ++r) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += x[i * ldx + k] * w[r * ldw + k];
      y[i * ldy + r] = s;
    }
}

void RmsNorm(const float* x, const float* w, float* out, int64_t T, int64_t C, float eps) {
  ref::RmsNorm(x, w, out, T, C, eps);
}

float Dot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void Axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

const KernelTable kTable = {
    IsaTier::kScalar,
    {QuantizeX, Gemv, DequantRows, Panel, /*panel_rows=*/4, /*tile_m=*/1},
    RmsNorm,
    ref::SiluMul,
    Dot,
    Axpy,
    ref::Softmax,
    ref::Argmax,
};

}  // namespace

const KernelTable& Table() { return kTable; }

}  // namespace lathe::kernels::cpu::scalar
