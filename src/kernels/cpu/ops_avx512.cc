// AVX-512 elementwise and reduction ops (RmsNorm, SiluMul, Dot, Axpy, Softmax) and the AVX-512
// kernel table. Tails use masked loads/stores.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/avx512_util.h"
#include "kernels/cpu/dispatch.h"

namespace lathe::kernels::cpu::avx512 {

namespace {

float Dot(const float* a, const float* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
    s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = Mask16(std::min<int64_t>(16, n - i));
    s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

void Axpy(float* y, float a, const float* x, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = Mask16(std::min<int64_t>(16, n - i));
    _mm512_mask_storeu_ps(
        y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

void RmsNorm(const float* x, const float* w, float* out, int64_t T, int64_t C, float eps) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * C;
    float* o = out + t * C;
    const float ss = Dot(xr, xr, C);
    const __m512 r = _mm512_set1_ps(1.0f / std::sqrt(ss / (float)C + eps));
    for (int64_t i = 0; i < C; i += 16) {
      const __mmask16 m = Mask16(std::min<int64_t>(16, C - i));
      _mm512_mask_storeu_ps(
          o + i, m,
          _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + i), r), _mm512_maskz_loadu_ps(m, w + i)));
    }
  }
}

void SiluMul(float* gate, const float* up, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = Mask16(std::min<int64_t>(16, n - i));
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 e = ExpPs(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(gate + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = Mask16(std::min<int64_t>(16, n - i));
    mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, x + i));
  }
  const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  // The sums of avx2::Softmax bit for bit: its two 8-lane sums are this one's halves (chunks 16 i and
  // 16 i + 8), and it adds a last chunk of fewer than 8 to the second (high) one; the reductions and
  // the exp are the same operations, so the attention of a prompt (this tier) equals its decode steps
  // (the AVX2 kernel's softmax).
  __m512 s = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t r = std::min<int64_t>(16, n - i);
    const __mmask16 m = Mask16(r);
    const __m512 e = ExpPs(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mv));
    _mm512_mask_storeu_ps(x + i, m, e);
    if (r >= 8) {
      s = _mm512_mask_add_ps(s, m, s, e);
    } else {  // lanes 0 .. r-1 onto the high half's
      s = _mm512_mask_add_ps(s, (__mmask16)(m << 8), s, _mm512_shuffle_f32x4(e, e, 0x44));
    }
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(s));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = Mask16(std::min<int64_t>(16, n - i));
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
  }
}

// avx2's Argmax with 16 lanes and a masked tail (masked-off lanes read -inf and never win).
int64_t Argmax(const float* x, int64_t n) {
  if (n <= 1 || std::isnan(x[0])) return 0;
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 bv = ninf;
  __m512i bi = _mm512_set1_epi32(-1),
          idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(16);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_mask_loadu_ps(ninf, Mask16(std::min<int64_t>(16, n - i)), x + i);
    const __mmask16 gt = _mm512_cmp_ps_mask(v, bv, _CMP_GT_OQ);
    bv = _mm512_mask_mov_ps(bv, gt, v);
    bi = _mm512_mask_mov_epi32(bi, gt, idx);
    idx = _mm512_add_epi32(idx, step);
  }
  const float best = _mm512_reduce_max_ps(bv);
  if (best == -INFINITY) return 0;
  const __mmask16 eq = _mm512_cmp_ps_mask(bv, _mm512_set1_ps(best), _CMP_EQ_OQ);
  return _mm512_mask_reduce_min_epi32(eq, bi);
}

}  // namespace

const KernelTable& Table() {
  static const KernelTable t = [] {
    KernelTable k = {IsaTier::kAvx512, GetMatMulKernels(), RmsNorm, SiluMul, Dot, Axpy, Softmax, Argmax};
    k.mm.tier = IsaTier::kAvx512;
    // Grouped attention: the AVX2 kernels (head sizes 8..128); without them this tier took the
    // per-position Dot / Softmax / Axpy path, ~2.5x slower where measured (AVX2, Zen 1).
    k.round_kv = avx2::RoundKv;
    k.group_attend = avx2::GroupAttend;
    k.group_attend_rows = GroupAttendRows;  // the AVX2 arithmetic, K / V rows shared by 4 queries
    // A bf16 cache on vdpbf16ps where the bf16 products run there at their own rate (attention_avx512bf16.cc;
    // the other dtypes and head sizes pass through to the two above, and so does every call where vdpbf16ps
    // runs at half the FMA rate, Bf16PairsOnFma: Intel's cores, where the same products would take twice the
    // f32 kernels' time). Bf16PairsOnFma is asked there, at the first bf16 cache's call, not here: it times
    // both instructions, which tests/emu's emulated CPU cannot (no clock).
    if (GetCpuFeatures().avx512_bf16 && (BestIsaTier() != IsaTier::kAvx512 || UsesBf16Dot())) {
      k.group_attend = avx512bf16::GroupAttend;
      k.group_attend_rows = avx512bf16::GroupAttendRows;
    }
    return k;
  }();
  return t;
}

}  // namespace lathe::kernels::cpu::avx512
