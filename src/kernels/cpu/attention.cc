// Causal grouped-query attention over a contiguous KV cache, built from one tier's Dot, Softmax and
// Axpy, parallel over (token, head) pairs; and one token's attention over a paged cache (GroupAttention)
// of f32, f16 or bf16 K / V.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/kv_elem.h"

namespace lathe::kernels::cpu {

void AttentionWith(const KernelTable& kt, ThreadPool& pool, const float* q, int64_t q_stride, const float* k,
                   const float* v, int64_t kv_stride, int64_t T, int64_t pos0, int n_head, int n_kv_head,
                   int head_dim, float scale, float* out, int64_t out_stride) {
  LATHE_CHECK(n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0 && T >= 0 && pos0 >= 0);
  const int group = n_head / n_kv_head;
  const int64_t hd = head_dim;
  pool.ParallelFor(T * n_head, 1, [&](int64_t b, int64_t e, int) {
    static thread_local std::vector<float> scores_buf;
    for (int64_t task = b; task < e; ++task) {
      const int64_t t = task / n_head;
      const int h = (int)(task % n_head), g = h / group;
      const int64_t n_keys = pos0 + t + 1;
      if ((int64_t)scores_buf.size() < n_keys) scores_buf.resize(n_keys);
      float* sc = scores_buf.data();
      const float* qv = q + t * q_stride + h * hd;
      const float* kg = k + g * hd;
      const float* vg = v + g * hd;
      for (int64_t s = 0; s < n_keys; ++s) sc[s] = scale * kt.dot(qv, kg + s * kv_stride, hd);
      kt.softmax(sc, n_keys);
      float* o = out + t * out_stride + h * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t s = 0; s < n_keys; ++s) kt.axpy(o, sc[s], vg + s * kv_stride, hd);
    }
  });
}

void GroupAttentionWith(const KernelTable& kt, const float* q, int group, const void* k, const void* v, DType kv,
                        const int64_t* off, int64_t n_pos, int head_dim, float scale, float* out,
                        float* scores) {
  LATHE_CHECK(group > 0 && n_pos > 0 && head_dim > 0);
  if (kt.group_attend && kt.group_attend(q, group, k, v, kv, off, n_pos, head_dim, scale, out, scores)) return;
  WithKvElem(kv, k, v, [&](const auto* ke, const auto* ve) {
    // f32 rows are read in place; 16-bit ones widened (exactly) into a row of floats first.
    static thread_local std::vector<float> row_buf;
    row_buf.resize(head_dim);
    auto row = [&](const auto* base, int64_t p) -> const float* {
      if constexpr (std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(base)>>, float>) {
        return base + off[p];
      } else {
        for (int i = 0; i < head_dim; ++i) row_buf[i] = KvToF32(base[off[p] + i]);
        return row_buf.data();
      }
    };
    for (int h = 0; h < group; ++h) {
      const float* qh = q + (int64_t)h * head_dim;
      for (int64_t p = 0; p < n_pos; ++p) scores[p] = kt.dot(qh, row(ke, p), head_dim) * scale;
      kt.softmax(scores, n_pos);
      float* o = out + (int64_t)h * head_dim;
      std::fill(o, o + head_dim, 0.0f);
      for (int64_t p = 0; p < n_pos; ++p) kt.axpy(o, scores[p], row(ve, p), head_dim);
    }
    return 0;
  });
}

void GroupAttentionRowsWith(const KernelTable& kt, const float* q, int64_t q_stride, int64_t n_tok, int group,
                            const void* k, const void* v, DType kv, const int64_t* off, int64_t n_pos0,
                            int head_dim, float scale, float* out, int64_t out_stride, float* scores,
                            int64_t window) {
  LATHE_CHECK(group > 0 && n_tok > 0 && n_pos0 >= 0 && head_dim > 0 && window >= 0);
  // Tokens [0, n_full) see every position from 0 (all of them without a window); each later one
  // sees its last `window` positions only, through its own GroupAttention call (the shared position
  // blocks of the run kernel assume the runs start together).
  const int64_t n_full = window == 0 ? n_tok : std::clamp<int64_t>(window - n_pos0, 0, n_tok);
  int64_t t = 0;
  if (n_full > 0 && kt.group_attend_rows &&
      kt.group_attend_rows(q, q_stride, n_full, group, k, v, kv, off, n_pos0, head_dim, scale, out, out_stride,
                           scores)) {
    t = n_full;
  }
  for (; t < n_tok; ++t) {
    const int64_t end = n_pos0 + t + 1, lo = t < n_full ? 0 : end - window;
    GroupAttentionWith(kt, q + t * q_stride, group, k, v, kv, off + lo, end - lo, head_dim, scale,
                       out + t * out_stride, scores);
  }
}

}  // namespace lathe::kernels::cpu
