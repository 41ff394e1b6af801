// Scalar reference kernels (GGML-compatible block formats).
#include "kernels/cpu/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"

namespace lathe::kernels::ref {

void DequantizeRow(DType t, const void* row, int64_t K, float* out) {
  switch (t) {
    case DType::kF32: std::memcpy(out, row, K * 4); return;
    case DType::kF16: {
      const uint16_t* h = (const uint16_t*)row;
      for (int64_t i = 0; i < K; ++i) out[i] = F16ToF32(h[i]);
      return;
    }
    case DType::kBF16: {
      const uint16_t* h = (const uint16_t*)row;
      for (int64_t i = 0; i < K; ++i) out[i] = BF16ToF32(h[i]);
      return;
    }
    case DType::kQ8_0: {
      const BlockQ8_0* b = (const BlockQ8_0*)row;
      for (int64_t j = 0; j < K / 32; ++j) {
        float d = F16ToF32(b[j].d);
        for (int i = 0; i < 32; ++i) out[j * 32 + i] = d * b[j].qs[i];
      }
      return;
    }
    case DType::kQ4_0: {
      const BlockQ4_0* b = (const BlockQ4_0*)row;
      for (int64_t j = 0; j < K / 32; ++j) {
        float d = F16ToF32(b[j].d);
        for (int i = 0; i < 16; ++i) {
          out[j * 32 + i] = d * ((b[j].qs[i] & 0xf) - 8);
          out[j * 32 + i + 16] = d * ((b[j].qs[i] >> 4) - 8);
        }
      }
      return;
    }
    case DType::kQ4_1: {
      const BlockQ4_1* b = (const BlockQ4_1*)row;
      for (int64_t j = 0; j < K / 32; ++j) {
        float d = F16ToF32(b[j].d), m = F16ToF32(b[j].m);
        for (int i = 0; i < 16; ++i) {
          out[j * 32 + i] = d * (b[j].qs[i] & 0xf) + m;
          out[j * 32 + i + 16] = d * (b[j].qs[i] >> 4) + m;
        }
      }
      return;
    }
    default: LATHE_CHECK_MSG(false, "DequantizeRow: unsupported dtype %s", DTypeName(t));
  }
}

void QuantizeRow(DType t, const float* x, int64_t n, void* out) {
  switch (t) {
    case DType::kF32: std::memcpy(out, x, n * 4); return;
    case DType::kF16: {
      uint16_t* h = (uint16_t*)out;
      for (int64_t i = 0; i < n; ++i) h[i] = F32ToF16(x[i]);
      return;
    }
    case DType::kBF16: {
      uint16_t* h = (uint16_t*)out;
      for (int64_t i = 0; i < n; ++i) h[i] = F32ToBF16(x[i]);
      return;
    }
    case DType::kQ8_0: {  // as ggml quantize_row_q8_0_ref
      BlockQ8_0* b = (BlockQ8_0*)out;
      for (int64_t j = 0; j < n / 32; ++j) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[j * 32 + i]));
        float d = amax / 127.0f;
        float id = d ? 1.0f / d : 0.0f;
        b[j].d = F32ToF16(d);
        for (int i = 0; i < 32; ++i) b[j].qs[i] = (int8_t)std::roundf(x[j * 32 + i] * id);
      }
      return;
    }
    case DType::kQ4_0: {  // as ggml quantize_row_q4_0_ref
      BlockQ4_0* b = (BlockQ4_0*)out;
      for (int64_t j = 0; j < n / 32; ++j) {
        float amax = 0, max = 0;
        for (int i = 0; i < 32; ++i) {
          float v = x[j * 32 + i];
          if (std::fabs(v) > amax) {
            amax = std::fabs(v);
            max = v;
          }
        }
        float d = max / -8.0f;
        float id = d ? 1.0f / d : 0.0f;
        b[j].d = F32ToF16(d);
        for (int i = 0; i < 16; ++i) {
          float x0 = x[j * 32 + i] * id, x1 = x[j * 32 + 16 + i] * id;
          uint8_t q0 = (uint8_t)std::min(15, (int)(x0 + 8.5f));
          uint8_t q1 = (uint8_t)std::min(15, (int)(x1 + 8.5f));
          b[j].qs[i] = q0 | (q1 << 4);
        }
      }
      return;
    }
    case DType::kQ4_1: {  // as ggml quantize_row_q4_1_ref
      BlockQ4_1* b = (BlockQ4_1*)out;
      for (int64_t j = 0; j < n / 32; ++j) {
        float mn = x[j * 32], mx = x[j * 32];
        for (int i = 1; i < 32; ++i) {
          mn = std::min(mn, x[j * 32 + i]);
          mx = std::max(mx, x[j * 32 + i]);
        }
        float d = (mx - mn) / 15.0f;
        float id = d ? 1.0f / d : 0.0f;
        b[j].d = F32ToF16(d);
        b[j].m = F32ToF16(mn);
        for (int i = 0; i < 16; ++i) {
          float x0 = (x[j * 32 + i] - mn) * id, x1 = (x[j * 32 + 16 + i] - mn) * id;
          uint8_t q0 = (uint8_t)std::min(15, (int)(x0 + 0.5f));
          uint8_t q1 = (uint8_t)std::min(15, (int)(x1 + 0.5f));
          b[j].qs[i] = q0 | (q1 << 4);
        }
      }
      return;
    }
    default: LATHE_CHECK_MSG(false, "QuantizeRow: unsupported dtype %s", DTypeName(t));
  }
}

float DotRow(DType t, const void* row, const float* x, int64_t K) {
  std::vector<float> w(K);
  DequantizeRow(t, row, K, w.data());
  double s = 0;
  for (int64_t i = 0; i < K; ++i) s += (double)w[i] * x[i];
  return (float)s;
}

void MatMul(const float* x, int64_t M, const Tensor& w, float* y) {
  LATHE_CHECK(w.ndim() == 2);
  int64_t N = w.shape[0], K = w.shape[1];
  size_t rb = w.row_bytes();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) y[m * N + n] = DotRow(w.dtype, (const uint8_t*)w.data + n * rb, x + m * K, K);
}

void RmsNorm(const float* x, const float* w, float* out, int64_t T, int64_t C, float eps) {
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < C; ++i) ss += (double)x[t * C + i] * x[t * C + i];
    float r = 1.0f / std::sqrt((float)(ss / C) + eps);
    for (int64_t i = 0; i < C; ++i) out[t * C + i] = x[t * C + i] * r * w[i];
  }
}

void SiluMul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void Softmax(float* x, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    s += x[i];
  }
  float inv = (float)(1.0 / s);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace lathe::kernels::ref
