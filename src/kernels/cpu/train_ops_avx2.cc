// AVX2 + FMA paths of the training ops: RMSNorm and SwiGLU forward/backward and the 6x16 GEMM
// micro-kernels (packed A, and A rows in place) behind the training GEMM (train_matmul.cc blocks).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/train_dispatch.h"

namespace lathe::kernels::cpu::avx2 {

namespace {

void RmsNormForward(float* out, float* rstd, const float* x, const float* w, int64_t T, int64_t C, float eps) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * C;
    float* ot = out + t * C;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= C; c += 16) {
      const __m256 a = _mm256_loadu_ps(xt + c), b = _mm256_loadu_ps(xt + c + 8);
      s0 = _mm256_fmadd_ps(a, a, s0);
      s1 = _mm256_fmadd_ps(b, b, s1);
    }
    float ss = HsumPs(_mm256_add_ps(s0, s1));
    for (; c < C; ++c) ss += xt[c] * xt[c];
    const float r = 1.0f / std::sqrt(ss / (float)C + eps);
    rstd[t] = r;
    const __m256 rv = _mm256_set1_ps(r);
    c = 0;
    for (; c + 8 <= C; c += 8)
      _mm256_storeu_ps(ot + c, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xt + c), rv), _mm256_loadu_ps(w + c)));
    for (; c < C; ++c) ot[c] = xt[c] * r * w[c];
  }
}

// dx = r * dout * w - (r^3 / C) * sum(dout * w * x) * x;  dw += dout * x * r.
void RmsNormBackward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                     int64_t T, int64_t C) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * C;
    const float* dt = dout + t * C;
    float* dxt = dx + t * C;
    const float r = rstd[t];
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= C; c += 16) {
      s0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(dt + c), _mm256_loadu_ps(w + c)), _mm256_loadu_ps(xt + c),
                           s0);
      s1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(dt + c + 8), _mm256_loadu_ps(w + c + 8)),
                           _mm256_loadu_ps(xt + c + 8), s1);
    }
    float dot = HsumPs(_mm256_add_ps(s0, s1));
    for (; c < C; ++c) dot += dt[c] * w[c] * xt[c];
    const float coef = r * r * r * dot / (float)C;
    const __m256 rv = _mm256_set1_ps(r), cv = _mm256_set1_ps(coef);
    c = 0;
    for (; c + 8 <= C; c += 8) {
      const __m256 xv = _mm256_loadu_ps(xt + c), dv = _mm256_loadu_ps(dt + c);
      _mm256_storeu_ps(dw + c, _mm256_fmadd_ps(_mm256_mul_ps(dv, xv), rv, _mm256_loadu_ps(dw + c)));
      _mm256_storeu_ps(dxt + c, _mm256_fnmadd_ps(cv, xv, _mm256_mul_ps(_mm256_mul_ps(dv, _mm256_loadu_ps(w + c)), rv)));
    }
    for (; c < C; ++c) {
      dw[c] += dt[c] * xt[c] * r;
      dxt[c] = dt[c] * w[c] * r - coef * xt[c];
    }
  }
}

inline __m256 SigmoidPs(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, ExpPs(_mm256_sub_ps(_mm256_setzero_ps(), g))));
}

inline float SigmoidS(float g) { return 1.0f / (1.0f + std::exp(-g)); }

void SwiGluForward(float* out, const float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, SigmoidPs(g)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] * SigmoidS(gate[i]) * up[i];
}

void SwiGluBackward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i), d = _mm256_loadu_ps(dout + i), u = _mm256_loadu_ps(up + i);
    const __m256 s = SigmoidPs(g);
    // dgate = d * u * s * (1 + g * (1 - s))
    const __m256 t = _mm256_fmadd_ps(g, _mm256_sub_ps(one, s), one);
    _mm256_storeu_ps(dup + i, _mm256_mul_ps(d, _mm256_mul_ps(g, s)));
    _mm256_storeu_ps(dgate + i, _mm256_mul_ps(_mm256_mul_ps(d, u), _mm256_mul_ps(s, t)));
  }
  for (; i < n; ++i) {
    const float g = gate[i], s = SigmoidS(g), d = dout[i];
    dup[i] = d * g * s;
    dgate[i] = d * up[i] * s * (1.0f + g * (1.0f - s));
  }
}

// 6 x 16 tile: 12 accumulators, per l two B loads, six A broadcasts, twelve FMAs.
void GemmTile(const float* a, const float* b, int64_t ldb, int64_t L, float* c, int64_t ldc, int mr, int nc) {
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(),
         c11 = _mm256_setzero_ps(), c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(),
         c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps(), c40 = _mm256_setzero_ps(),
         c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
  for (int64_t l = 0; l < L; ++l, b += ldb) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    const float* al = a + l * 6;
    __m256 av = _mm256_broadcast_ss(al + 0);
    c00 = _mm256_fmadd_ps(av, b0, c00);
    c01 = _mm256_fmadd_ps(av, b1, c01);
    av = _mm256_broadcast_ss(al + 1);
    c10 = _mm256_fmadd_ps(av, b0, c10);
    c11 = _mm256_fmadd_ps(av, b1, c11);
    av = _mm256_broadcast_ss(al + 2);
    c20 = _mm256_fmadd_ps(av, b0, c20);
    c21 = _mm256_fmadd_ps(av, b1, c21);
    av = _mm256_broadcast_ss(al + 3);
    c30 = _mm256_fmadd_ps(av, b0, c30);
    c31 = _mm256_fmadd_ps(av, b1, c31);
    av = _mm256_broadcast_ss(al + 4);
    c40 = _mm256_fmadd_ps(av, b0, c40);
    c41 = _mm256_fmadd_ps(av, b1, c41);
    av = _mm256_broadcast_ss(al + 5);
    c50 = _mm256_fmadd_ps(av, b0, c50);
    c51 = _mm256_fmadd_ps(av, b1, c51);
  }
  const __m256 acc[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  if (nc == 16) {
    for (int i = 0; i < mr; ++i) {
      float* ci = c + i * ldc;
      _mm256_storeu_ps(ci, _mm256_add_ps(_mm256_loadu_ps(ci), acc[i][0]));
      _mm256_storeu_ps(ci + 8, _mm256_add_ps(_mm256_loadu_ps(ci + 8), acc[i][1]));
    }
  } else {
    alignas(32) float tmp[16];
    for (int i = 0; i < mr; ++i) {
      _mm256_store_ps(tmp, acc[i][0]);
      _mm256_store_ps(tmp + 8, acc[i][1]);
      for (int j = 0; j < nc; ++j) c[i * ldc + j] += tmp[j];
    }
  }
}

// A read in place: row i at a + i * lda (rows past mr alias row mr - 1 and are not stored).
void GemmTileRows(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t L, float* c, int64_t ldc, int mr,
                  int nc, bool overwrite) {
  const float* a0 = a;
  const float* a1 = a + std::min(1, mr - 1) * lda;
  const float* a2 = a + std::min(2, mr - 1) * lda;
  const float* a3 = a + std::min(3, mr - 1) * lda;
  const float* a4 = a + std::min(4, mr - 1) * lda;
  const float* a5 = a + std::min(5, mr - 1) * lda;
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(),
         c11 = _mm256_setzero_ps(), c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(),
         c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps(), c40 = _mm256_setzero_ps(),
         c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
  for (int64_t l = 0; l < L; ++l, b += ldb) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    __m256 av = _mm256_broadcast_ss(a0 + l);
    c00 = _mm256_fmadd_ps(av, b0, c00);
    c01 = _mm256_fmadd_ps(av, b1, c01);
    av = _mm256_broadcast_ss(a1 + l);
    c10 = _mm256_fmadd_ps(av, b0, c10);
    c11 = _mm256_fmadd_ps(av, b1, c11);
    av = _mm256_broadcast_ss(a2 + l);
    c20 = _mm256_fmadd_ps(av, b0, c20);
    c21 = _mm256_fmadd_ps(av, b1, c21);
    av = _mm256_broadcast_ss(a3 + l);
    c30 = _mm256_fmadd_ps(av, b0, c30);
    c31 = _mm256_fmadd_ps(av, b1, c31);
    av = _mm256_broadcast_ss(a4 + l);
    c40 = _mm256_fmadd_ps(av, b0, c40);
    c41 = _mm256_fmadd_ps(av, b1, c41);
    av = _mm256_broadcast_ss(a5 + l);
    c50 = _mm256_fmadd_ps(av, b0, c50);
    c51 = _mm256_fmadd_ps(av, b1, c51);
  }
  const __m256 acc[6][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  if (nc == 16) {
    for (int i = 0; i < mr; ++i) {
      float* ci = c + i * ldc;
      if (overwrite) {
        _mm256_storeu_ps(ci, acc[i][0]);
        _mm256_storeu_ps(ci + 8, acc[i][1]);
      } else {
        _mm256_storeu_ps(ci, _mm256_add_ps(_mm256_loadu_ps(ci), acc[i][0]));
        _mm256_storeu_ps(ci + 8, _mm256_add_ps(_mm256_loadu_ps(ci + 8), acc[i][1]));
      }
    }
  } else {
    alignas(32) float tmp[16];
    for (int i = 0; i < mr; ++i) {
      _mm256_store_ps(tmp, acc[i][0]);
      _mm256_store_ps(tmp + 8, acc[i][1]);
      for (int j = 0; j < nc; ++j) c[i * ldc + j] = (overwrite ? 0.0f : c[i * ldc + j]) + tmp[j];
    }
  }
}

float RowMax(const float* x, int64_t n) {
  __m256 mv = _mm256_set1_ps(x[0]);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
  float m = HmaxPs(mv);
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

float LogSumExp(const float* x, int64_t n) {
  const float m = RowMax(x, n);
  const __m256 mv = _mm256_set1_ps(m);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_add_ps(s0, ExpPs(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv)));
    s1 = _mm256_add_ps(s1, ExpPs(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), mv)));
  }
  float s = HsumPs(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += std::exp(x[i] - m);
  return m + std::log(s);
}

void ExpShiftScale(float* x, int64_t n, float shift, float scale) {
  const __m256 sh = _mm256_set1_ps(shift), sc = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(ExpPs(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh)), sc));
  for (; i < n; ++i) x[i] = std::exp(x[i] - shift) * scale;
}

// Two accumulators over 16 lanes, then the tail in order: a fixed order, so run-to-run identical.
float ExpShiftSum(float* x, int64_t n, float shift) {
  const __m256 sh = _mm256_set1_ps(shift);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 e0 = ExpPs(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
    const __m256 e1 = ExpPs(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), sh));
    _mm256_storeu_ps(x + i, e0);
    _mm256_storeu_ps(x + i + 8, e1);
    s0 = _mm256_add_ps(s0, e0);
    s1 = _mm256_add_ps(s1, e1);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 e0 = ExpPs(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
    _mm256_storeu_ps(x + i, e0);
    s0 = _mm256_add_ps(s0, e0);
  }
  float s = HsumPs(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += (x[i] = std::exp(x[i] - shift));
  return s;
}

void SoftmaxGrad(float* ds, const float* p, int64_t n, float delta, float scale) {
  const __m256 dl = _mm256_set1_ps(delta), sc = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(p + i), _mm256_sub_ps(_mm256_loadu_ps(ds + i), dl));
    _mm256_storeu_ps(ds + i, _mm256_mul_ps(v, sc));
  }
  for (; i < n; ++i) ds[i] = p[i] * (ds[i] - delta) * scale;
}

// F32ToBF16 then back, 8 lanes at a time: bits + 0x7fff + lsb(bits >> 16), low half cleared; NaN
// keeps its upper half with the quiet bit (0x40 << 16) set.
void RoundBf16(float* out, const float* x, int64_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  const __m256i hi = _mm256_set1_epi32((int)0xffff0000u), quiet = _mm256_set1_epi32(0x400000);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i b = _mm256_castps_si256(_mm256_loadu_ps(x + i));
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, abs_mask), inf);
    __m256i r = _mm256_add_epi32(b, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(b, 16), one)));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(b, quiet), nan);
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_and_si256(r, hi)));
  }
  for (; i < n; ++i) out[i] = BF16ToF32(F32ToBF16(x[i]));
}

// F32ToBF16 of 8 lanes as RoundBf16 rounds them, the upper halves packed to 8 bf16.
__attribute__((always_inline)) inline __m128i Bf16Bits8(__m256i b) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x400000);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, abs_mask), inf);
  __m256i r = _mm256_add_epi32(b, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(b, 16), one)));
  r = _mm256_srli_epi32(_mm256_blendv_epi8(r, _mm256_or_si256(b, quiet), nan), 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

void ToBf16(uint16_t* out, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i*)(out + i), Bf16Bits8(_mm256_castps_si256(_mm256_loadu_ps(x + i))));
  for (; i < n; ++i) out[i] = F32ToBF16(x[i]);
}

void FromBf16(float* out, const uint16_t* h, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(h + i)));
    _mm256_storeu_si256((__m256i*)(out + i), _mm256_slli_epi32(w, 16));
  }
  for (; i < n; ++i) out[i] = BF16ToF32(h[i]);
}

// In-register transpose of the 8 x 8 block r (row i = r[i]): afterwards r[k] = column k.
__attribute__((always_inline)) inline void Transpose8(__m256 (&r)[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// Stores the transpose of the 8 x 8 block r (row i = r[i]): o[k * ld + i] = r[i][k].
inline void Transpose8x8(const __m256 (&r)[8], float* o, int64_t ld) {
  __m256 c[8] = {r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]};
  Transpose8(c);
  for (int k = 0; k < 8; ++k) _mm256_storeu_ps(o + k * ld, c[k]);
}

// 8 x 8 blocks: rows j0 .. j0 + 7 of src (zero past nj), columns l .. l + 7, transposed in registers
// into rows l .. l + 7 of the strip; the nl % 8 tail element by element.
void PackStripT(float* bs, int64_t ldo, const float* src, int64_t ld, int64_t nl, int nj) {
  for (int j0 = 0; j0 < kGemmTileC; j0 += 8) {
    int64_t l = 0;
    for (; l + 8 <= nl; l += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = j0 + i < nj ? _mm256_loadu_ps(src + (j0 + i) * ld + l) : _mm256_setzero_ps();
      Transpose8x8(r, bs + l * ldo + j0, ldo);
    }
    for (; l < nl; ++l)
      for (int j = j0; j < j0 + 8; ++j) bs[l * ldo + j] = j < nj ? src[j * ld + l] : 0.0f;
  }
}

}  // namespace

// 8 x 8 blocks (rows i of a, columns l .. l + 7) transposed in registers; the nl % 8 tail one by one.
void PackPanelRows8(float* out, const float* a, int64_t lda, int64_t nl, int mr) {
  const float* r[8];
  for (int i = 0; i < 8; ++i) r[i] = a + std::min(i, mr - 1) * lda;
  int64_t l = 0;
  for (; l + 8 <= nl; l += 8) {
    __m256 v[8];
    for (int i = 0; i < 8; ++i) v[i] = i < mr ? _mm256_loadu_ps(r[i] + l) : _mm256_setzero_ps();
    Transpose8x8(v, out + l * 8, 8);
  }
  for (; l < nl; ++l)
    for (int i = 0; i < 8; ++i) out[l * 8 + i] = i < mr ? r[i][l] : 0.0f;
}

namespace {


// 8 elements of a W row from element l, as f32.
template <DType T>
__attribute__((always_inline)) inline __m256 Load8(const uint8_t* row, int64_t l) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps((const float*)row + l);
  } else {
    const __m128i h = _mm_loadu_si128((const __m128i*)((const uint16_t*)row + l));
    if constexpr (T == DType::kBF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
  }
}

// acc[i] = fma(x_i[l + j], col[j], acc[i]) for j < n, in order (N: n known at compile time, so col
// stays in registers; N = 0: n at run time).
template <int M, int N = 0>
__attribute__((always_inline)) inline void ChainCols(const __m256* col, int n, const float* const (&xr)[4], int64_t l,
                                                     __m256 (&acc)[4]) {
  if constexpr (N > 0) {
#pragma GCC unroll 32
    for (int j = 0; j < N; ++j)
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(xr[i][l + j]), col[j], acc[i]);
  } else {
    for (int j = 0; j < n; ++j)
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(xr[i][l + j]), col[j], acc[i]);
  }
}

// chain_gemv for 8 W rows at a time: 8 x 8 blocks transposed in registers, so each lane is one output's
// FMA chain, as in the GEMM tiles (bf16: 8 x 16 blocks transposed as 32-bit pairs, then split into even
// and odd elements; the tail of a chunk through a zero-padded copy).
template <DType T, int M>
void ChainGemvT(const uint8_t* w, size_t rb, int64_t n_rows, const float* x, int64_t ldx, int64_t K, int64_t inner,
                float* y, int64_t ldy) {
  const float* xr[4];
  for (int i = 0; i < 4; ++i) xr[i] = x + std::min(i, M - 1) * ldx;
  constexpr size_t kEl = T == DType::kF32 ? 4 : 2;
  for (int64_t r0 = 0; r0 < n_rows; r0 += 8) {
    const int nr = (int)std::min<int64_t>(8, n_rows - r0);
    const uint8_t* row[8];
    for (int i = 0; i < 8; ++i) row[i] = w + (r0 + std::min(i, nr - 1)) * rb;
    __m256 tot[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t l0 = 0; l0 < K; l0 += inner) {
      const int64_t le = std::min(K, l0 + inner);
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      int64_t l = l0;
      if constexpr (T == DType::kBF16) {
        const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
        for (; l + 16 <= le; l += 16) {
          __m256 c[8];
          for (int i = 0; i < 8; ++i) c[i] = _mm256_loadu_ps((const float*)(row[i] + l * kEl));
          Transpose8(c);  // c[k]: elements l + 2k, l + 2k + 1 of each row
          __m256 col[16];
          for (int k = 0; k < 8; ++k) {
            const __m256i v = _mm256_castps_si256(c[k]);
            col[2 * k] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            col[2 * k + 1] = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
          }
          ChainCols<M, 16>(col, 16, xr, l, acc);
        }
      }
      for (; l + 8 <= le; l += 8) {
        __m256 c[8];
        for (int i = 0; i < 8; ++i) c[i] = Load8<T>(row[i], l);
        Transpose8(c);
        ChainCols<M, 8>(c, 8, xr, l, acc);
      }
      if (l < le) {
        const int n = (int)(le - l);
        alignas(32) uint8_t pad[8][32] = {};
        __m256 c[8];
        for (int i = 0; i < 8; ++i) {
          std::memcpy(pad[i], row[i] + l * kEl, n * kEl);
          c[i] = Load8<T>(pad[i], 0);
        }
        Transpose8(c);
        ChainCols<M>(c, n, xr, l, acc);
      }
      for (int i = 0; i < M; ++i) tot[i] = l0 == 0 ? acc[i] : _mm256_add_ps(tot[i], acc[i]);
    }
    for (int i = 0; i < M; ++i) {
      alignas(32) float t[8];
      _mm256_store_ps(t, tot[i]);
      std::memcpy(y + i * ldy + r0, t, sizeof(float) * nr);
    }
  }
}

template <DType T>
void ChainGemvM(const uint8_t* w, size_t rb, int64_t n_rows, const float* x, int64_t ldx, int m, int64_t K,
                int64_t inner, float* y, int64_t ldy) {
  switch (m) {
    case 1: return ChainGemvT<T, 1>(w, rb, n_rows, x, ldx, K, inner, y, ldy);
    case 2: return ChainGemvT<T, 2>(w, rb, n_rows, x, ldx, K, inner, y, ldy);
    case 3: return ChainGemvT<T, 3>(w, rb, n_rows, x, ldx, K, inner, y, ldy);
    default: return ChainGemvT<T, 4>(w, rb, n_rows, x, ldx, K, inner, y, ldy);
  }
}

// 16 elements of a strip row at p as two 8-lane f32 halves.
template <DType T>
__attribute__((always_inline)) inline void LoadStrip16(const uint8_t* p, __m256& lo, __m256& hi) {
  if constexpr (T == DType::kF32) {
    lo = _mm256_loadu_ps((const float*)p);
    hi = _mm256_loadu_ps((const float*)p + 8);
  } else {
    lo = Load8<T>(p, 0);
    hi = Load8<T>(p, 8);
  }
}

// strip_gemv for S strips side by side (S x M x 2 accumulators, S independent chains per x row).
// run: strip s of the group at strips + s * run strips (1: side by side), its results at y + 16 * s * run.
template <DType T, int M, int S>
__attribute__((always_inline)) inline void StripsT(const uint8_t* strips, int64_t K, int64_t inner,
                                                   const float* const (&xr)[4], float* y, int64_t ldy,
                                                   int64_t n_cols, int64_t run = 1) {
  constexpr size_t kRow = 16 * (T == DType::kF32 ? 4 : 2);  // bytes per strip row
  const size_t sk = (size_t)run * K;  // strip rows from one strip of the group to the next
  __m256 tot[S][4][2] = {};  // set at l0 == 0 (K >= 1); the zeros only quiet GCC 12's maybe-uninitialized
  for (int64_t l0 = 0; l0 < K; l0 += inner) {
    const int64_t le = std::min(K, l0 + inner);
    __m256 acc[S][4][2];
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) acc[s][i][0] = acc[s][i][1] = _mm256_setzero_ps();
    for (int64_t l = l0; l < le; ++l) {
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s) {
        __m256 lo, hi;
        LoadStrip16<T>(strips + ((size_t)s * sk + l) * kRow, lo, hi);
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i) {
          const __m256 xv = _mm256_set1_ps(xr[i][l]);
          acc[s][i][0] = _mm256_fmadd_ps(xv, lo, acc[s][i][0]);
          acc[s][i][1] = _mm256_fmadd_ps(xv, hi, acc[s][i][1]);
        }
      }
    }
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i)
        for (int h = 0; h < 2; ++h)
          tot[s][i][h] = l0 == 0 ? acc[s][i][h] : _mm256_add_ps(tot[s][i][h], acc[s][i][h]);
  }
  for (int s = 0; s < S; ++s) {
    const int nc = (int)std::min<int64_t>(16, n_cols - 16 * s * run);
    for (int i = 0; i < M; ++i) {
      alignas(32) float t[16];
      _mm256_store_ps(t, tot[s][i][0]);
      _mm256_store_ps(t + 8, tot[s][i][1]);
      std::memcpy(y + i * ldy + 16 * s * run, t, sizeof(float) * std::max(0, nc));
    }
  }
}

template <DType T, int M>
void StripGemvT(const uint8_t* strips, int64_t n_strips, int64_t K, int64_t inner, const float* x, int64_t ldx,
                float* y, int64_t ldy, int64_t n_cols) {
  const float* xr[4];
  for (int i = 0; i < 4; ++i) xr[i] = x + std::min(i, M - 1) * ldx;
  constexpr int S = M == 1 ? 4 : M == 2 ? 2 : 1;
  constexpr size_t kStrip = 16 * (T == DType::kF32 ? 4 : 2);
  int64_t s = 0;
  if (S > 1 && n_strips >= 2 * S) {  // S long streams, as the AVX-512 tier's StripGemvT (same bits)
    const int64_t n = (n_strips - 1) / S;
    for (int64_t j = 0; j < n; ++j)
      StripsT<T, M, S>(strips + j * K * kStrip, K, inner, xr, y + 16 * j, ldy, n_cols - 16 * j, n);
    s = S * n;
  }
  for (; s + S <= n_strips; s += S)
    StripsT<T, M, S>(strips + s * K * kStrip, K, inner, xr, y + 16 * s, ldy, n_cols - 16 * s);
  for (; s < n_strips; ++s) StripsT<T, M, 1>(strips + s * K * kStrip, K, inner, xr, y + 16 * s, ldy, n_cols - 16 * s);
}

template <DType T>
void StripGemvM(const uint8_t* strips, int64_t n_strips, int64_t K, int64_t inner, const float* x, int64_t ldx,
                int m, float* y, int64_t ldy, int64_t n_cols) {
  switch (m) {
    case 1: return StripGemvT<T, 1>(strips, n_strips, K, inner, x, ldx, y, ldy, n_cols);
    case 2: return StripGemvT<T, 2>(strips, n_strips, K, inner, x, ldx, y, ldy, n_cols);
    case 3: return StripGemvT<T, 3>(strips, n_strips, K, inner, x, ldx, y, ldy, n_cols);
    default: return StripGemvT<T, 4>(strips, n_strips, K, inner, x, ldx, y, ldy, n_cols);
  }
}

}  // namespace

void StripGemv(DType t, const uint8_t* strips, int64_t n_strips, int64_t K, int64_t inner, const float* x,
               int64_t ldx, int m, float* y, int64_t ldy, int64_t n_cols) {
  LATHE_CHECK(m >= 1 && m <= 4);
  if (t == DType::kF32) return StripGemvM<DType::kF32>(strips, n_strips, K, inner, x, ldx, m, y, ldy, n_cols);
  if (t == DType::kBF16) return StripGemvM<DType::kBF16>(strips, n_strips, K, inner, x, ldx, m, y, ldy, n_cols);
  LATHE_CHECK(t == DType::kF16);
  StripGemvM<DType::kF16>(strips, n_strips, K, inner, x, ldx, m, y, ldy, n_cols);
}

void ChainGemv(DType t, const uint8_t* w, size_t rb, int64_t n_rows, const float* x, int64_t ldx, int m, int64_t K,
               int64_t inner, float* y, int64_t ldy) {
  LATHE_CHECK(m >= 1 && m <= 4);
  if (t == DType::kF32) return ChainGemvM<DType::kF32>(w, rb, n_rows, x, ldx, m, K, inner, y, ldy);
  if (t == DType::kBF16) return ChainGemvM<DType::kBF16>(w, rb, n_rows, x, ldx, m, K, inner, y, ldy);
  LATHE_CHECK(t == DType::kF16);
  ChainGemvM<DType::kF16>(w, rb, n_rows, x, ldx, m, K, inner, y, ldy);
}

namespace {

void ColMax(float* m, const float* row, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(m + j, _mm256_max_ps(_mm256_loadu_ps(m + j), _mm256_loadu_ps(row + j)));
  for (; j < n; ++j) m[j] = std::max(m[j], row[j]);
}

void ColExpSum(float* s, const float* row, const float* m, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(s + j, _mm256_add_ps(_mm256_loadu_ps(s + j),
                                          ExpPs(_mm256_sub_ps(_mm256_loadu_ps(row + j), _mm256_loadu_ps(m + j)))));
  for (; j < n; ++j) s[j] += std::exp(row[j] - m[j]);
}

void ColExpScale(float* row, const float* shift, float scale, int64_t n) {
  const __m256 sc = _mm256_set1_ps(scale);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(row + j,
                     _mm256_mul_ps(ExpPs(_mm256_sub_ps(_mm256_loadu_ps(row + j), _mm256_loadu_ps(shift + j))), sc));
  for (; j < n; ++j) row[j] = std::exp(row[j] - shift[j]) * scale;
}

// The scalar tier's arithmetic, 8 lanes at a time: separate multiplies and adds (GCC would fuse
// them into FMAs in this -mfma file: LATHE_NO_FP_CONTRACT), vsqrtps / vdivps correctly rounded as
// sqrtf and '/'. The tail goes through the same vector code on a zero-padded copy, so no scalar
// expression here can be contracted either.
LATHE_NO_FP_CONTRACT void AdamWUpdate(float* p, float* m, float* v, const float* g, int64_t n, const AdamWCoefs& k) {
  const __m256 decay = _mm256_set1_ps(k.decay), ob1 = _mm256_set1_ps(1.0f - k.b1), b2 = _mm256_set1_ps(k.b2),
               ob2 = _mm256_set1_ps(1.0f - k.b2), bc2 = _mm256_set1_ps(k.bc2_sqrt), eps = _mm256_set1_ps(k.eps),
               step = _mm256_set1_ps(k.step_size);
  alignas(32) float tp[8], tm[8], tv[8], tg[8];
  for (int64_t j = 0; j < n; j += 8) {
    float *pp = p + j, *mp = m + j, *vp = v + j;
    const float* gp = g + j;
    const size_t r = (size_t)std::min<int64_t>(8, n - j) * sizeof(float);
    if (r < 8 * sizeof(float)) {  // the tail, zero-padded (0 stays finite: denom = eps)
      for (float* t : {tp, tm, tv, tg}) std::memset(t, 0, sizeof(tp));
      std::memcpy(tp, pp, r);
      std::memcpy(tm, mp, r);
      std::memcpy(tv, vp, r);
      std::memcpy(tg, gp, r);
      pp = tp, mp = tm, vp = tv, gp = tg;
    }
    const __m256 gj = _mm256_loadu_ps(gp);
    __m256 mj = _mm256_loadu_ps(mp), vj = _mm256_loadu_ps(vp);
    __m256 pj = _mm256_mul_ps(_mm256_loadu_ps(pp), decay);
    mj = _mm256_add_ps(mj, _mm256_mul_ps(_mm256_sub_ps(gj, mj), ob1));
    vj = _mm256_add_ps(_mm256_mul_ps(vj, b2), _mm256_mul_ps(_mm256_mul_ps(ob2, gj), gj));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vj), bc2), eps);
    pj = _mm256_sub_ps(pj, _mm256_mul_ps(step, _mm256_div_ps(mj, denom)));
    _mm256_storeu_ps(mp, mj);
    _mm256_storeu_ps(vp, vj);
    _mm256_storeu_ps(pp, pj);
    if (pp == tp) {
      std::memcpy(p + j, tp, r);
      std::memcpy(m + j, tm, r);
      std::memcpy(v + j, tv, r);
    }
  }
}

}  // namespace

const TrainKernelTable& TrainTable() {
  static const TrainKernelTable t = [] {
    TrainKernelTable k = {IsaTier::kAvx2, RmsNormForward, RmsNormBackward, SwiGluForward,
                          SwiGluBackward, GemmTile, GemmTileRows, LogSumExp, ExpShiftScale, RowMax,
                          ExpShiftSum, SoftmaxGrad, RoundBf16, PackStripT, ColMax, ColExpSum,
                          ColExpScale, AdamWUpdate};
    k.chain_gemv = ChainGemv;
    k.strip_gemv = StripGemv;
    k.to_bf16 = ToBf16;
    k.from_bf16 = FromBf16;
    return k;
  }();
  return t;
}

}  // namespace lathe::kernels::cpu::avx2
