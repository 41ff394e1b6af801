// AVX2 + FMA elementwise and reduction ops (RmsNorm, SiluMul, Dot, Axpy, Softmax) and the AVX2
// kernel table.
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/dispatch.h"

namespace lathe::kernels::cpu::avx2 {

namespace {

float Dot(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  if (i < n) {
    const __m256i m = TailMask(n - i);
    s1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s1);
  }
  return HsumPs(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

void Axpy(float* y, float a, const float* x, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

void RmsNorm(const float* x, const float* w, float* out, int64_t T, int64_t C, float eps) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * C;
    float* o = out + t * C;
    const float ss = Dot(xr, xr, C);
    const __m256 r = _mm256_set1_ps(1.0f / std::sqrt(ss / (float)C + eps));
    int64_t i = 0;
    for (; i + 8 <= C; i += 8)
      _mm256_storeu_ps(o + i,
                       _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), r), _mm256_loadu_ps(w + i)));
    const float rs = _mm256_cvtss_f32(r);
    for (; i < C; ++i) o[i] = xr[i] * rs * w[i];
  }
}

inline __m256 Silu(__m256 g) {
  const __m256 e = ExpPs(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

void SiluMul(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(Silu(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
  if (i < n) {
    const __m256i m = TailMask(n - i);
    const __m256 g = _mm256_maskload_ps(gate + i, m);
    _mm256_maskstore_ps(gate + i, m, _mm256_mul_ps(Silu(g), _mm256_maskload_ps(up + i, m)));
  }
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  __m256 mx = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
  float m = HmaxPs(mx);
  for (; i < n; ++i) m = std::fmax(m, x[i]);
  const __m256 mv = _mm256_set1_ps(m);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0;
  i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 e0 = ExpPs(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
    const __m256 e1 = ExpPs(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), mv));
    _mm256_storeu_ps(x + i, e0);
    _mm256_storeu_ps(x + i + 8, e1);
    s0 = _mm256_add_ps(s0, e0);
    s1 = _mm256_add_ps(s1, e1);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 e0 = ExpPs(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
    _mm256_storeu_ps(x + i, e0);
    s0 = _mm256_add_ps(s0, e0);
  }
  if (i < n) {
    const __m256i tm = TailMask(n - i);
    // Masked-off lanes load 0 and give exp(-m) != 0, so mask them out of the sum.
    const __m256 e0 =
        _mm256_and_ps(ExpPs(_mm256_sub_ps(_mm256_maskload_ps(x + i, tm), mv)), _mm256_castsi256_ps(tm));
    _mm256_maskstore_ps(x + i, tm, e0);
    s1 = _mm256_add_ps(s1, e0);
  }
  const __m256 inv = _mm256_set1_ps(1.0f / HsumPs(_mm256_add_ps(s0, s1)));
  i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  const float invs = _mm256_cvtss_f32(inv);
  for (; i < n; ++i) x[i] *= invs;
}

// ref::Argmax with 8 lanes: each lane keeps the first index of its largest value above -inf (a NaN never
// compares larger), then the largest lane value and, among equal ones, the smallest index. Nothing above
// -inf (or x[0] NaN) leaves x[0] the answer, as the scan does.
int64_t Argmax(const float* x, int64_t n) {
  if (n <= 1 || std::isnan(x[0])) return 0;
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 bv = ninf;
  __m256i bi = _mm256_set1_epi32(-1), idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i step = _mm256_set1_epi32(8);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 gt = _mm256_cmp_ps(v, bv, _CMP_GT_OQ);
    bv = _mm256_blendv_ps(bv, v, gt);
    bi = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(bi), _mm256_castsi256_ps(idx), gt));
    idx = _mm256_add_epi32(idx, step);
  }
  alignas(32) float lv[8];
  alignas(32) int32_t li[8];
  _mm256_store_ps(lv, bv);
  _mm256_store_si256((__m256i*)li, bi);
  float best = -INFINITY;
  int64_t at = -1;
  for (int l = 0; l < 8; ++l)
    if (li[l] >= 0 && (lv[l] > best || (lv[l] == best && li[l] < at))) best = lv[l], at = li[l];
  for (; i < n; ++i)  // the tail, after every lane's indices
    if (x[i] > best) best = x[i], at = i;
  return at < 0 ? 0 : at;
}

}  // namespace

// kernels::RoundKv, 8 at a time: f16 by F16C's round-to-nearest-even conversion after the saturation
// (NaN lanes, whose payload F16C keeps, redone by the scalar form); bf16 by the integer rounding of
// F32ToBF16 (bits + 0x7fff + the kept lsb, NaN quieted). The scalar form's bits (op test).
void RoundKv(DType t, const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  if (t == DType::kF16) {
    const __m256 hi = _mm256_set1_ps(65504.0f), lo = _mm256_set1_ps(-65504.0f);
    for (; i + 8 <= n; i += 8) {
      __m256 v = _mm256_loadu_ps(x + i);
      if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
        RoundKvScalar(t, x + i, 8, out + i);
        continue;
      }
      v = _mm256_blendv_ps(v, hi, _mm256_cmp_ps(v, hi, _CMP_GT_OQ));
      v = _mm256_blendv_ps(v, lo, _mm256_cmp_ps(v, lo, _CMP_LT_OQ));
      _mm_storeu_si128((__m128i*)(out + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
  } else {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
    for (; i + 8 <= n; i += 8) {
      const __m256i b = _mm256_castps_si256(_mm256_loadu_ps(x + i));
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, abs_mask), inf);
      const __m256i r = _mm256_srli_epi32(
          _mm256_add_epi32(b, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(b, 16), one))), 16);
      const __m256i q = _mm256_or_si256(_mm256_srli_epi32(b, 16), quiet);
      const __m256i h = _mm256_blendv_epi8(r, q, nan);  // 8 x u16 in the low halves of the dwords
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
      _mm_storeu_si128((__m128i*)(out + i), _mm256_castsi256_si128(packed));
    }
  }
  if (i < n) RoundKvScalar(t, x + i, n - i, out + i);
}

const KernelTable& Table(bool split) {
  auto make = [](bool sp) {
    KernelTable k = {IsaTier::kAvx2, GetMatMulKernels(sp), RmsNorm, SiluMul, Dot, Axpy, Softmax, Argmax};
    k.round_kv = RoundKv;
    k.group_attend = GroupAttend;
    k.group_attend_rows = GroupAttendRows;
    return k;
  };
  static const KernelTable split_table = make(true), full_table = make(false);
  return split ? split_table : full_table;
}

const KernelTable& Table() {
  static const KernelTable& t = Table(Splits256BitOps());
  return t;
}

}  // namespace lathe::kernels::cpu::avx2
