// Chunked cross-entropy over the output head: logits for chunk_tokens tokens at a time (never the
// whole (T, V) matrix), loss from each token's logsumexp, and in the backward dlogits = (softmax -
// onehot) * dloss / normalizer pushed through the input- and weight-gradient GEMMs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/bf16_amx.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/train_dispatch.h"
#include "kernels/train_ops.h"

namespace lathe::kernels::cpu {

namespace {
constexpr int64_t kXentBlock = 256;  // rows of logits^T per softmax block
}  // namespace

int64_t HeadGradBlockDwords(int64_t V, int64_t pairs, bool tiled) {
  return tiled ? amx::TiledDwords(V, pairs) : V * pairs;
}

void HeadGradPartsDwords(int64_t V, int64_t C, int64_t tokens, int64_t ct, bool tiled, int64_t* a, int64_t* b) {
  *a = *b = 0;
  for (int64_t t = 0; t < tokens; t += ct) {
    const int64_t np = (std::min(ct, tokens - t) + 1) / 2;
    *a += HeadGradBlockDwords(V, np, tiled);
    *b += (C + 15) / 16 * 16 * np;
  }
}

float CrossEntropyWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dx, float* dw,
                       const float* x, int64_t T, const Tensor& w_head, const int32_t* labels, float normalizer,
                       float dloss, int64_t chunk_tokens, const float* packed_head, bool bf16_dot,
                       const uint32_t* packed_pairs, HeadGradParts* head_grad_parts) {
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
  std::vector<float> xc(ct * C), dxc(dx ? ct * C : 0), row_loss(ct);
  TransientFloats logits((size_t)(ct * V));  // 25 MB for 128 tokens of a 49152 vocabulary: huge pages
  const float scale = dloss / normalizer;
  // An f32 head is the A operand of logits^T (V, nc) = W . X^T: its rows are read in place by the
  // training GEMM's rows micro-kernel (B = the chunk's X^T, packed small), and the softmax runs down
  // the columns, 8 tokens per vector. Other dtypes: logits (nc, V) through MatMul, softmax per row.
  // A bf16 head with bf16_dot: logits^T too, from vdpbf16ps over W's rows as stored (HeadLogitsT).
  // A head in another dtype (f32: a trained head's masters, or a quantized-base run's head kept as stored; f16, a
  // GGUF block type) takes the same products on its rows (dequantized and) rounded to bf16 as they are paired
  // (HeadLogitsT, HeadBackwardInputTRows), as autocast casts it: the bits of a bf16 copy, without the copy.
  bf16_dot = bf16_dot && C % 2 == 0;
  const bool transposed = w_head.dtype == DType::kF32 || bf16_dot;
  std::vector<float> cmax(transposed ? ct : 0), csum(transposed ? ct : 0), bpart;
  // The head's gradient on the bf16 path: each chunk's operand pairs (a block of HeadGradParts), one product per
  // chunk, added into dw at once (the block's storage: head_grad_parts, else the call's own; it then takes dy's
  // pairs for dx too) or, with dw null, every chunk's block kept for the caller's AddHeadGrad, which adds them in
  // the same order: the same bits.
  if (head_grad_parts && !dw) LATHE_CHECK(bf16_dot && dx);
  HeadGradParts own_parts;
  HeadGradParts* parts = !bf16_dot ? nullptr : head_grad_parts ? head_grad_parts : dw ? &own_parts : nullptr;
  int64_t a_off = 0, b_off = 0;  // where the next chunk's block goes
  if (parts) {
    HeadGradParts& p = *parts;
    p.V = V;
    p.C = C;
    p.tokens.clear();
    p.tiled = avx512bf16::HeadGradTiled(ct);
    int64_t ad = 0, bd = 0;
    HeadGradPartsDwords(V, C, dw ? std::min<int64_t>(ct, (int64_t)rows.size()) : (int64_t)rows.size(), ct, p.tiled,
                        &ad, &bd);
    if (dw) ad = std::max(ad, avx512bf16::HeadBackwardInputADwords(ct, V));
    p.a.resize((size_t)ad);
    p.b.resize((size_t)bd);
  }
  double loss = 0;
  for (size_t r0 = 0; r0 < rows.size(); r0 += ct) {
    const int64_t nc = std::min<int64_t>(ct, (int64_t)rows.size() - (int64_t)r0);
    for (int64_t i = 0; i < nc; ++i) std::memcpy(&xc[i * C], x + rows[r0 + i] * C, sizeof(float) * C);
    if (transposed) {
      if (bf16_dot) {
        avx512bf16::HeadLogitsT(pool, logits.data(), w_head, xc.data(), nc);
      } else {
        Tensor xt;
        xt.data = xc.data();
        xt.dtype = DType::kF32;
        xt.shape = {nc, C};
        MatMulForwardWith(tk, kt, pool, logits.data(), (const float*)w_head.data, V, xt);
      }
      // Softmax down each column in blocks of 256 rows of logits^T (each row: every token of the chunk,
      // contiguous): block maxima, then block sums of exp(l - max) added in block order, then the
      // gradient. Blocks may run on any thread; the result does not depend on which.
      const int64_t nb = (V + kXentBlock - 1) / kXentBlock;
      bpart.resize(nb * nc);
      pool.ParallelFor(nb, 1, [&](int64_t bb, int64_t be, int) {
        for (int64_t blk = bb; blk < be; ++blk) {
          float* m = &bpart[blk * nc];
          const int64_t v0 = blk * kXentBlock, v1 = std::min(V, v0 + kXentBlock);
          std::memcpy(m, &logits[v0 * nc], sizeof(float) * nc);
          for (int64_t v = v0 + 1; v < v1; ++v) tk.col_max(m, &logits[v * nc], nc);
        }
      });
      std::memcpy(cmax.data(), bpart.data(), sizeof(float) * nc);
      for (int64_t blk = 1; blk < nb; ++blk) tk.col_max(cmax.data(), &bpart[blk * nc], nc);
      pool.ParallelFor(nb, 1, [&](int64_t bb, int64_t be, int) {
        for (int64_t blk = bb; blk < be; ++blk) {
          float* part = &bpart[blk * nc];
          std::fill(part, part + nc, 0.0f);
          for (int64_t v = blk * kXentBlock; v < std::min(V, (blk + 1) * kXentBlock); ++v)
            tk.col_exp_sum(part, &logits[v * nc], cmax.data(), nc);
        }
      });
      std::fill(csum.begin(), csum.end(), 0.0f);
      for (int64_t blk = 0; blk < nb; ++blk)
        for (int64_t j = 0; j < nc; ++j) csum[j] += bpart[blk * nc + j];
      for (int64_t j = 0; j < nc; ++j) {
        cmax[j] += std::log(csum[j]);  // the token's logsumexp
        row_loss[j] = cmax[j] - logits[labels[rows[r0 + j]] * nc + j];
      }
      if (dx) {
        pool.ParallelFor(nb, 1, [&](int64_t bb, int64_t be, int) {
          for (int64_t v = bb * kXentBlock; v < std::min(V, be * kXentBlock); ++v)
            tk.col_exp_scale(&logits[v * nc], cmax.data(), scale, nc);
        });
        for (int64_t j = 0; j < nc; ++j) logits[labels[rows[r0 + j]] * nc + j] -= scale;
      }
    } else {
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
    }
    for (int64_t i = 0; i < nc; ++i) loss += row_loss[i];
    if (!dx) continue;
    uint32_t* dx_pairs = nullptr;  // where dy's pairs for dx go (null: a buffer of the thread's)
    if (parts) {
      HeadGradParts& p = *parts;
      const int64_t np = (nc + 1) / 2;
      uint32_t* a = p.a.data() + a_off;
      uint32_t* b = p.b.data() + b_off;
      avx512bf16::HeadWeightGradPairs(pool, logits.data(), xc.data(), nc, V, C, a, 0, b, np, p.tiled);
      if (dw) {
        avx512bf16::HeadWeightGradFromPairs(pool, dw, np, V, C, a, b, p.tiled);
        dx_pairs = p.a.data();  // free again (the chunk's dw is added)
      } else {
        p.tokens.push_back(nc);
        a_off += HeadGradBlockDwords(V, np, p.tiled);
        b_off += (C + 15) / 16 * 16 * np;
      }
    }
    if (bf16_dot && packed_pairs) {
      avx512bf16::HeadBackwardInputT(pool, dxc.data(), logits.data(), nc, V, C, packed_pairs, dx_pairs);
    } else if (bf16_dot) {  // a head kept as stored (QLoRA, 8-bit base) or trained: its pairs a chunk at a time
      avx512bf16::HeadBackwardInputTRows(pool, dxc.data(), logits.data(), nc, w_head, dx_pairs);
    } else if (transposed) {
      MatMulBackwardInputTWith(tk, kt, pool, dxc.data(), logits.data(), nc, w_head, false, packed_head);
    } else {
      MatMulBackwardInputWith(tk, kt, pool, dxc.data(), logits.data(), nc, w_head, false, packed_head);
    }
    for (int64_t i = 0; i < nc; ++i) std::memcpy(dx + rows[r0 + i] * C, &dxc[i * C], sizeof(float) * C);
    if (dw && !parts) {
      if (transposed) {
        MatMulBackwardWeightTWith(tk, pool, dw, logits.data(), xc.data(), nc, V, C);
      } else {
        MatMulBackwardWeightWith(tk, pool, dw, logits.data(), xc.data(), nc, V, C);
      }
    }
  }
  return (float)(loss / normalizer);
}

}  // namespace lathe::kernels::cpu
