// Scalar reference kernels (GGML-compatible block formats).
#include "kernels/cpu/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"

namespace lathe::kernels::ref {

void KScaleMin(const uint8_t* p, uint8_t* sc, uint8_t* mn) {
  // Bytes 0-3: scale j (low 6 bits) and the top 2 bits of scale j + 4; bytes 4-7: the same for the
  // mins; bytes 8-11: low nibble = low 4 bits of scale j + 4, high nibble = of min j + 4.
  for (int j = 0; j < 4; ++j) {
    sc[j] = p[j] & 63;
    mn[j] = p[j + 4] & 63;
    sc[j + 4] = (uint8_t)((p[j + 8] & 15) | ((p[j] >> 6) << 4));
    mn[j + 4] = (uint8_t)((p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4));
  }
}

void Q3KScales(const uint8_t* p, uint8_t* sc) {
  // Low 4 bits: scale i < 8 in the low nibble of byte i, scale i >= 8 in the high nibble of byte
  // i - 8; high 2 bits: bits 2 (i / 4) of byte 8 + i % 4.
  for (int i = 0; i < 16; ++i) {
    const int lo = i < 8 ? (p[i] & 15) : (p[i - 8] >> 4);
    const int hi = (p[8 + i % 4] >> (2 * (i / 4))) & 3;
    sc[i] = (uint8_t)(lo | (hi << 4));
  }
}

void DecodeBlock(DType t, const uint8_t* blk, DecodedBlock* o) {
  o->dmin = 0;
  o->has_min = false;
  switch (t) {
    case DType::kQ5_0:
    case DType::kQ5_1: {
      const bool q51 = t == DType::kQ5_1;
      const uint16_t* h = (const uint16_t*)blk;
      const uint8_t* qh = blk + (q51 ? 4 : 2);
      const uint8_t* qs = qh + 4;
      uint32_t bits;
      std::memcpy(&bits, qh, 4);
      for (int l = 0; l < 16; ++l) {
        const int lo = (qs[l] & 15) | (((bits >> l) & 1) << 4);
        const int hi = (qs[l] >> 4) | (((bits >> (l + 16)) & 1) << 4);
        o->q[l] = (int8_t)(q51 ? lo : lo - 16);
        o->q[l + 16] = (int8_t)(q51 ? hi : hi - 16);
      }
      o->n = 32;
      o->d = F16ToF32(h[0]);
      for (int i = 0; i < 2; ++i) {
        o->sc[i] = 1;
        o->mn[i] = q51 ? -1 : 0;
      }
      if (q51) {
        o->dmin = F16ToF32(h[1]);
        o->has_min = true;
      }
      return;
    }
    case DType::kQ2_K: {
      const BlockQ2_K* b = (const BlockQ2_K*)blk;
      for (int e = 0; e < 256; ++e) o->q[e] = (int8_t)((b->qs[32 * (e / 128) + e % 32] >> (2 * (e / 32 % 4))) & 3);
      for (int i = 0; i < 16; ++i) {
        o->sc[i] = b->scales[i] & 15;
        o->mn[i] = b->scales[i] >> 4;
      }
      o->n = 256;
      o->d = F16ToF32(b->d);
      o->dmin = F16ToF32(b->dmin);
      o->has_min = true;
      return;
    }
    case DType::kQ3_K: {
      const BlockQ3_K* b = (const BlockQ3_K*)blk;
      for (int e = 0; e < 256; ++e) {
        const int lo = (b->qs[32 * (e / 128) + e % 32] >> (2 * (e / 32 % 4))) & 3;
        const int hbit = (b->hmask[e % 32] >> (e / 32)) & 1;
        o->q[e] = (int8_t)(lo - (hbit ? 0 : 4));
      }
      uint8_t sc[16];
      Q3KScales(b->scales, sc);
      for (int i = 0; i < 16; ++i) {
        o->sc[i] = (int16_t)(sc[i] - 32);
        o->mn[i] = 0;
      }
      o->n = 256;
      o->d = F16ToF32(b->d);
      return;
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool q5 = t == DType::kQ5_K;
      const uint16_t* h = (const uint16_t*)blk;
      const uint8_t* scales = blk + 4;
      const uint8_t* qh = blk + 16;
      const uint8_t* qs = blk + (q5 ? 48 : 16);
      for (int e = 0; e < 256; ++e) {
        int v = (qs[32 * (e / 64) + e % 32] >> (4 * (e / 32 % 2))) & 15;
        if (q5) v |= ((qh[e % 32] >> (e / 32)) & 1) << 4;
        o->q[e] = (int8_t)v;
      }
      uint8_t sc[8], mn[8];
      KScaleMin(scales, sc, mn);
      for (int i = 0; i < 16; ++i) {
        o->sc[i] = sc[i / 2];
        o->mn[i] = mn[i / 2];
      }
      o->n = 256;
      o->d = F16ToF32(h[0]);
      o->dmin = F16ToF32(h[1]);
      o->has_min = true;
      return;
    }
    case DType::kQ6_K: {
      const BlockQ6_K* b = (const BlockQ6_K*)blk;
      for (int e = 0; e < 256; ++e) {
        const int hf = e / 128, r = e % 128;
        const int lo = (b->ql[64 * hf + r % 64] >> (4 * (r / 64))) & 15;
        const int hi = (b->qh[32 * hf + r % 32] >> (2 * (r / 32))) & 3;
        o->q[e] = (int8_t)((lo | (hi << 4)) - 32);
      }
      for (int i = 0; i < 16; ++i) {
        o->sc[i] = b->scales[i];
        o->mn[i] = 0;
      }
      o->n = 256;
      o->d = F16ToF32(b->d);
      return;
    }
    default: LATHE_CHECK_MSG(false, "DecodeBlock: %s is not an extended block type", DTypeName(t));
  }
}

void DequantizeRow(DType t, const void* row, int64_t K, float* out) {
  if (IsExtQuant(t)) {
    const DTypeInfo& info = GetDTypeInfo(t);
    DecodedBlock db;
    for (int64_t j = 0; j < K / info.block_size; ++j) {
      DecodeBlock(t, (const uint8_t*)row + j * info.block_bytes, &db);
      float* o = out + j * info.block_size;
      for (int e = 0; e < db.n; ++e) {
        const float scale = db.d * (float)db.sc[e / 16];
        const float min = db.dmin * (float)db.mn[e / 16];
        o[e] = scale * (float)db.q[e] - min;
      }
    }
    return;
  }
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
    default:
      LATHE_CHECK_MSG(IsExtQuant(t), "QuantizeRow: unsupported dtype %s", DTypeName(t));
      QuantizeRowGgml(t, x, n, out);
      return;
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

// std::max_element's scan: x[i] replaces the best only when strictly larger.
int64_t Argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[best] < x[i]) best = i;
  return best;
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
