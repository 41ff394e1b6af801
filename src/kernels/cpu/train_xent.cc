// Chunked cross-entropy over the output head: logits for chunk_tokens tokens at a time (never the
// whole (T, V) matrix), loss from a per-row logsumexp, and in the backward dlogits = (softmax -
// onehot) * dloss / normalizer pushed through MatMulBackwardInput / MatMulBackwardWeight.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/train_dispatch.h"
#include "kernels/train_ops.h"

namespace lathe::kernels::cpu {

float CrossEntropyWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dx, float* dw,
                       const float* x, int64_t T, const Tensor& w_head, const int32_t* labels, float normalizer,
                       float dloss, int64_t chunk_tokens, const float* packed_head) {
  LATHE_CHECK(w_head.ndim() == 2 && normalizer > 0 && chunk_tokens > 0);
  LATHE_CHECK(dx != nullptr || dw == nullptr);
  const int64_t V = w_head.shape[0], C = w_head.shape[1];
  std::vector<int64_t> rows;  // tokens that carry a label
  rows.reserve(T);
  for (int64_t t = 0; t < T; ++t) {
    if (labels[t] == kIgnoreLabel) continue;
    LATHE_CHECK(labels[t] >= 0 && labels[t] < V);
    rows.push_back(t);
  }
  if (dx) std::memset(dx, 0, sizeof(float) * T * C);
  const int64_t ct = std::min<int64_t>(chunk_tokens, std::max<int64_t>(1, (int64_t)rows.size()));
  std::vector<float> xc(ct * C), logits(ct * V), dxc(dx ? ct * C : 0), row_loss(ct);
  const float scale = dloss / normalizer;
  double loss = 0;
  for (size_t r0 = 0; r0 < rows.size(); r0 += ct) {
    const int64_t nc = std::min<int64_t>(ct, (int64_t)rows.size() - (int64_t)r0);
    for (int64_t i = 0; i < nc; ++i) std::memcpy(&xc[i * C], x + rows[r0 + i] * C, sizeof(float) * C);
    // exact_activations: no int8 rounding of x on the small-M GEMV path of block-quantized heads.
    MatMulWith(kt.mm, pool, xc.data(), nc, w_head, logits.data(), /*exact_activations=*/true);
    pool.ParallelFor(nc, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) {
        float* li = &logits[i * V];
        const int32_t y = labels[rows[r0 + i]];
        const float lse = tk.logsumexp(li, V);
        row_loss[i] = lse - li[y];
        if (dx) {
          tk.exp_shift_scale(li, V, lse, scale);
          li[y] -= scale;
        }
      }
    });
    for (int64_t i = 0; i < nc; ++i) loss += row_loss[i];
    if (!dx) continue;
    MatMulBackwardInputWith(tk, kt, pool, dxc.data(), logits.data(), nc, w_head, false, packed_head);
    for (int64_t i = 0; i < nc; ++i) std::memcpy(dx + rows[r0 + i] * C, &dxc[i * C], sizeof(float) * C);
    if (dw) MatMulBackwardWeightWith(tk, pool, dw, logits.data(), xc.data(), nc, V, C);
  }
  return (float)(loss / normalizer);
}

}  // namespace lathe::kernels::cpu
