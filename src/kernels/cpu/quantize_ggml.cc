// llama.cpp's reference quantizers for Q5_0, Q5_1 and the K-quants (Q2_K .. Q6_K), the ones
// llama-quantize runs when no importance matrix is given: the same search per sub-block (ggml's
// make_qx_quants / make_q3_quants / make_qkx2_quants), the same f32 operations in the same order,
// so the bytes equal llama-quantize's (tests/golden/ggml_quantize_test.cc checks them against its
// output). Built with -ffp-contract=off: a fused multiply-add would round differently.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/reference.h"

namespace lathe::kernels::ref {

namespace {

constexpr float kGroupMaxEps = 1e-15f;

// Round to nearest (ties to even) through the float mantissa, as ggml's nearest_int; valid for
// |v| <= 4194303 (larger or non-finite inputs are clamped first so the result stays defined).
int NearestInt(float v) {
  if (!(v > -4194303.f)) v = -4194303.f;
  if (!(v < 4194303.f)) v = 4194303.f;
  float f = v + 12582912.f;
  int32_t i;
  std::memcpy(&i, &f, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// float -> int by truncation, as C's conversion of an in-range value (the callers' values are in
// range for finite inputs; out-of-range or NaN become 0 or the bound instead of undefined behavior).
int TruncInt(float v) {
  if (!(v > -2147483520.f)) return v != v ? 0 : -2147483647;
  if (!(v < 2147483520.f)) return 2147483647;
  return (int)v;
}

// The first of x's n values of the largest magnitude (0 when all are 0), that magnitude in *amax: the signed
// extreme ggml's quantizers scale by.
float SignedAbsMax(const float* x, int n, float* amax) {
  float max = 0;
  *amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > *amax) {
      *amax = ax;
      max = x[i];
    }
  }
  return max;
}

// Symmetric: L in [0, 2 nmax), scale by a search over 19 candidate inverse scales weighted by x^2
// (ggml's make_qx_quants with rmse_type 1 and no importance weights).
float MakeQxQuants(int n, int nmax, const float* x, int8_t* L) {
  float amax;
  const float max = SignedAbsMax(x, n, &amax);
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = (float)-nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, NearestInt(iscale * x[i])));
    L[i] = (int8_t)(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * (float)l;
    suml2 += w * (float)l * (float)l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -((float)nmax + 0.1f * (float)is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(-nmax, std::min(nmax - 1, NearestInt(iscale * x[i])));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * (float)l;
      suml2 += w * (float)l * (float)l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        L[i] = (int8_t)(nmax + std::max(-nmax, std::min(nmax - 1, NearestInt(iscale * x[i]))));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q3_K's symmetric sub-block quantizer: a first guess, then up to 5 passes of coordinate descent on
// the x^2-weighted error (ggml's make_q3_quants with do_rmse). L in [0, 2 nmax) on return, except
// an all-zero sub-block, whose L stay 0.
float MakeQ3Quants(int n, int nmax, const float* x, int8_t* L) {
  float amax;
  const float max = SignedAbsMax(x, n, &amax);
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  const float iscale = (float)-nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, NearestInt(iscale * x[i])));
    L[i] = (int8_t)l;
    const float w = x[i] * x[i];
    sumlx += w * x[i] * (float)l;
    suml2 += w * (float)l * (float)l;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * (float)L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * (float)L[i] * (float)L[i];
        const int new_l = std::max(-nmax, std::min(nmax - 1, NearestInt(x[i] * sl2 / slx)));
        if (new_l != L[i]) {
          slx += w * x[i] * (float)new_l;
          sl2 += w * (float)new_l * (float)new_l;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = (int8_t)new_l;
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (!n_changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Asymmetric (scale and min): L in [0, nmax]; a weighted least-squares fit of scale and min for each
// of nstep + 1 candidate inverse scales, keeping the lowest weighted error (squared, or absolute when
// use_mad) (ggml's make_qkx2_quants). *the_min is the min negated (>= 0).
float MakeQkx2Quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                     uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = (float)nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = NearestInt(iscale * (x[i] - min));
    L[i] = (uint8_t)std::max(0, std::min(nmax, l));
    float diff = scale * (float)L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, NearestInt(iscale * (x[i] - min))));
      Laux[i] = (uint8_t)l;
      const float w = weights[i];
      sum_l += w * (float)l;
      sum_l2 += w * (float)l * (float)l;
      sum_xl += w * (float)l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * (float)Laux[i] + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Five-bit values L[0..31] of one Q5_0 / Q5_1 block into its nibbles and fifth bits.
void PackQ5(const uint8_t* L, uint8_t* qh, uint8_t* qs) {
  uint32_t bits = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = (uint8_t)((L[j] & 15) | ((L[j + 16] & 15) << 4));
    bits |= (uint32_t)((L[j] >> 4) & 1) << j;
    bits |= (uint32_t)((L[j + 16] >> 4) & 1) << (j + 16);
  }
  std::memcpy(qh, &bits, 4);
}

void QuantizeQ5_0(const float* x, BlockQ5_0* y) {
  float amax;
  const float d = SignedAbsMax(x, 32, &amax) / -16;
  const float id = d ? 1.0f / d : 0.0f;
  y->d = F32ToF16(d);
  uint8_t L[32];
  for (int j = 0; j < 32; ++j) L[j] = (uint8_t)std::min(31, TruncInt(x[j] * id + 16.5f));
  PackQ5(L, y->qh, y->qs);
}

void QuantizeQ5_1(const float* x, BlockQ5_1* y) {
  float min = x[0], max = x[0];
  for (int j = 1; j < 32; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  const float d = (max - min) / 31;
  const float id = d ? 1.0f / d : 0.0f;
  y->d = F32ToF16(d);
  y->m = F32ToF16(min);
  uint8_t L[32];
  for (int j = 0; j < 32; ++j) L[j] = (uint8_t)TruncInt((x[j] - min) * id + 0.5f);
  PackQ5(L, y->qh, y->qs);
}

// 2-bit values L[0..255] of Q2_K / Q3_K: element 128 h + 32 s + l at bits 2 s of qs[32 h + l].
void PackCrumbs(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < 256; j += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
    }
  }
}

void QuantizeQ2K(const float* x, BlockQ2_K* y) {
  uint8_t L[256], Laux[16];
  float weights[16], mins[16], scales[16];
  const float q4scale = 15.f;
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 16; ++j) {
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
    scales[j] = MakeQkx2Quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  if (max_scale > 0) {
    const float iscale = q4scale / max_scale;
    for (int j = 0; j < 16; ++j) y->scales[j] = (uint8_t)NearestInt(iscale * scales[j]);
    y->d = F32ToF16(max_scale / q4scale);
  } else {
    for (int j = 0; j < 16; ++j) y->scales[j] = 0;
    y->d = F32ToF16(0.f);
  }
  if (max_min > 0) {
    const float iscale = q4scale / max_min;
    for (int j = 0; j < 16; ++j) y->scales[j] |= (uint8_t)(NearestInt(iscale * mins[j]) << 4);
    y->dmin = F32ToF16(max_min / q4scale);
  } else {
    y->dmin = F32ToF16(0.f);
  }
  for (int j = 0; j < 16; ++j) {
    const float d = F16ToF32(y->d) * (float)(y->scales[j] & 15);
    if (!d) continue;
    const float dm = F16ToF32(y->dmin) * (float)(y->scales[j] >> 4);
    for (int i = 0; i < 16; ++i) {
      L[16 * j + i] = (uint8_t)std::max(0, std::min(3, NearestInt((x[16 * j + i] + dm) / d)));
    }
  }
  PackCrumbs(L, y->qs);
}

void QuantizeQ3K(const float* x, BlockQ3_K* y) {
  int8_t L[256];
  float scales[16];
  float max_scale = 0, amax = 0;
  for (int j = 0; j < 16; ++j) {
    scales[j] = MakeQ3Quants(16, 4, x + 16 * j, L + 16 * j);
    const float scale = std::fabs(scales[j]);
    if (scale > amax) {
      amax = scale;
      max_scale = scales[j];
    }
  }
  std::memset(y->scales, 0, 12);
  if (max_scale) {
    const float iscale = -32.f / max_scale;
    for (int j = 0; j < 16; ++j) {
      // ggml keeps this in an int8_t: the value is in [-32, 32] before the clamp.
      int l = (int8_t)NearestInt(iscale * scales[j]);
      l = std::max(-32, std::min(31, l)) + 32;
      if (j < 8) {
        y->scales[j] = (uint8_t)(l & 15);
      } else {
        y->scales[j - 8] |= (uint8_t)((l & 15) << 4);
      }
      l >>= 4;
      y->scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
    }
    y->d = F32ToF16(1 / iscale);
  } else {
    y->d = F32ToF16(0.f);
  }
  uint8_t sc6[16];
  Q3KScales(y->scales, sc6);
  for (int j = 0; j < 16; ++j) {
    const float d = F16ToF32(y->d) * (float)((int)sc6[j] - 32);
    if (!d) continue;
    for (int i = 0; i < 16; ++i) {
      L[16 * j + i] = (int8_t)(std::max(-4, std::min(3, NearestInt(x[16 * j + i] / d))) + 4);
    }
  }
  // Third bits: element e's in bit e / 32 of hmask[e % 32].
  std::memset(y->hmask, 0, 32);
  uint8_t low[256];
  for (int j = 0; j < 256; ++j) {
    int v = L[j];
    if (v > 3) {
      y->hmask[j % 32] |= (uint8_t)(1 << (j / 32));
      v -= 4;
    }
    low[j] = (uint8_t)v;
  }
  PackCrumbs(low, y->qs);
}

// Q4_K / Q5_K: 8 sub-blocks of 32 with a 6-bit scale and min each; nmax 15 or 31.
void QuantizeQ45K(const float* x, int nmax, float rmin, int nstep, uint16_t* dd, uint16_t* dmin,
                  uint8_t* packed_scales, uint8_t* L) {
  uint8_t Laux[32];
  float weights[32], mins[8], scales[8];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = MakeQkx2Quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t* q = packed_scales;
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls = std::min<uint8_t>(63, (uint8_t)NearestInt(inv_scale * scales[j]));
    const uint8_t lm = std::min<uint8_t>(63, (uint8_t)NearestInt(inv_min * mins[j]));
    if (j < 4) {
      q[j] = ls;
      q[j + 4] = lm;
    } else {
      q[j + 4] = (uint8_t)((ls & 15) | ((lm & 15) << 4));
      q[j - 4] |= (uint8_t)((ls >> 4) << 6);
      q[j] |= (uint8_t)((lm >> 4) << 6);
    }
  }
  *dd = F32ToF16(max_scale / 63.f);
  *dmin = F32ToF16(max_min / 63.f);
  uint8_t sc[8], mn[8];
  KScaleMin(q, sc, mn);
  for (int j = 0; j < 8; ++j) {
    const float d = F16ToF32(*dd) * (float)sc[j];
    if (!d) continue;
    const float dm = F16ToF32(*dmin) * (float)mn[j];
    for (int i = 0; i < 32; ++i) {
      L[32 * j + i] = (uint8_t)std::max(0, std::min(nmax, NearestInt((x[32 * j + i] + dm) / d)));
    }
  }
}

void QuantizeQ4K(const float* x, BlockQ4_K* y) {
  uint8_t L[256];
  QuantizeQ45K(x, 15, -1.f, 20, &y->d, &y->dmin, y->scales, L);
  for (int j = 0; j < 256; j += 64) {
    for (int l = 0; l < 32; ++l) y->qs[j / 2 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
  }
}

void QuantizeQ5K(const float* x, BlockQ5_K* y) {
  uint8_t L[256];
  QuantizeQ45K(x, 31, -0.5f, 15, &y->d, &y->dmin, y->scales, L);
  // Element 64 p + 32 h + l: low nibble in qs[32 p + l] (h = 0 low, 1 high), fifth bit at bit
  // 2 p + h of qh[l].
  std::memset(y->qh, 0, 32);
  for (int p = 0; p < 4; ++p) {
    for (int l = 0; l < 32; ++l) {
      const int l1 = L[64 * p + l], l2 = L[64 * p + 32 + l];
      y->qh[l] |= (uint8_t)(((l1 >> 4) << (2 * p)) | ((l2 >> 4) << (2 * p + 1)));
      y->qs[32 * p + l] = (uint8_t)((l1 & 15) | ((l2 & 15) << 4));
    }
  }
}

void QuantizeQ6K(const float* x, BlockQ6_K* y) {
  int8_t L[256];
  float scales[16];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < 16; ++ib) {
    scales[ib] = MakeQxQuants(16, 32, x + 16 * ib, L + 16 * ib);
    const float abs_scale = std::fabs(scales[ib]);
    if (abs_scale > max_abs_scale) {
      max_abs_scale = abs_scale;
      max_scale = scales[ib];
    }
  }
  if (max_abs_scale < kGroupMaxEps) {
    std::memset(y, 0, sizeof(*y));
    return;
  }
  const float iscale = -128.f / max_scale;
  y->d = F32ToF16(1 / iscale);
  for (int ib = 0; ib < 16; ++ib) y->scales[ib] = (int8_t)std::min(127, NearestInt(iscale * scales[ib]));
  for (int j = 0; j < 16; ++j) {
    const float d = F16ToF32(y->d) * (float)y->scales[j];
    if (!d) continue;
    for (int i = 0; i < 16; ++i) {
      L[16 * j + i] = (int8_t)(std::max(-32, std::min(31, NearestInt(x[16 * j + i] / d))) + 32);
    }
  }
  // Element 128 h + 32 s + l: low nibble in ql[64 h + 32 (s & 1) + l] (s < 2 low, else high), top 2
  // bits at bits 2 s of qh[32 h + l].
  for (int h = 0; h < 2; ++h) {
    const int8_t* Lh = L + 128 * h;
    uint8_t* ql = y->ql + 64 * h;
    uint8_t* qh = y->qh + 32 * h;
    for (int l = 0; l < 32; ++l) {
      ql[l] = (uint8_t)((Lh[l] & 15) | ((Lh[l + 64] & 15) << 4));
      ql[l + 32] = (uint8_t)((Lh[l + 32] & 15) | ((Lh[l + 96] & 15) << 4));
      qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) | ((Lh[l + 96] >> 4) << 6));
    }
  }
}

}  // namespace

void QuantizeRowGgml(DType t, const float* x, int64_t n, void* out) {
  const int64_t bs = GetDTypeInfo(t).block_size;
  for (int64_t b = 0; b < n / bs; ++b) {
    const float* xb = x + b * bs;
    switch (t) {
      case DType::kQ5_0: QuantizeQ5_0(xb, (BlockQ5_0*)out + b); break;
      case DType::kQ5_1: QuantizeQ5_1(xb, (BlockQ5_1*)out + b); break;
      case DType::kQ2_K: QuantizeQ2K(xb, (BlockQ2_K*)out + b); break;
      case DType::kQ3_K: QuantizeQ3K(xb, (BlockQ3_K*)out + b); break;
      case DType::kQ4_K: QuantizeQ4K(xb, (BlockQ4_K*)out + b); break;
      case DType::kQ5_K: QuantizeQ5K(xb, (BlockQ5_K*)out + b); break;
      case DType::kQ6_K: QuantizeQ6K(xb, (BlockQ6_K*)out + b); break;
      default: return;
    }
  }
}

}  // namespace lathe::kernels::ref
