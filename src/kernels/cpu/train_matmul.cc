// Blocked GEMM driver behind MatMulBackwardInput (dX = dY . W, W in any stored dtype) and
// MatMulBackwardWeight (dW += dY^T . X): packs panels and runs a tier's register-tile kernel.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/train_dispatch.h"

namespace lathe::kernels::cpu {

namespace {

// Task = (kRowBlock rows of C) x (kColBlock columns of C); the inner dimension goes in kInner
// chunks. A packed B chunk (kInner x kColBlock floats, 256 KiB) stays in L2 while every row tile
// of the task streams 16-column strips of it (16 KiB, L1) through the micro-kernel; a dequantized
// W block is therefore reused by kRowBlock rows, which keeps dequantization under ~1 % of the FMAs.
constexpr int64_t kRowBlock = 32 * kGemmTileR;  // 192
constexpr int64_t kColBlock = 256;              // multiple of 32 (quant blocks) and of kGemmTileC
constexpr int64_t kInner = 256;

// C(R, Kd) (+)= A(R, L) . B(L, Kd), A(i, l) = a[i * a_rs + l * a_is], C rows ldc floats apart.
// fill_b(l0, nl, k0, nk, tmp, &ld) returns a pointer p with B(l0 + l, k0 + k) = p[l * ld + k],
// either into the source or into tmp (nl x nk floats) after dequantizing.
template <typename FillB>
void Gemm(const TrainKernelTable& tk, ThreadPool& pool, float* c, int64_t ldc, int64_t R, int64_t Kd, int64_t L,
          const float* a, int64_t a_rs, int64_t a_is, bool accumulate, const FillB& fill_b) {
  const int64_t n_rb = (R + kRowBlock - 1) / kRowBlock, n_kb = (Kd + kColBlock - 1) / kColBlock;
  pool.ParallelFor(n_rb * n_kb, 1, [&](int64_t tb, int64_t te, int) {
    static thread_local std::vector<float> bpack_buf, apack_buf, tmp_buf;
    float* bpack = Scratch(bpack_buf, (size_t)(kInner * kColBlock));
    float* apack = Scratch(apack_buf, (size_t)(kInner * kRowBlock));
    float* tmp = Scratch(tmp_buf, (size_t)(kInner * kColBlock));
    for (int64_t task = tb; task < te; ++task) {
      const int64_t r0 = task / n_kb * kRowBlock, r1 = std::min(R, r0 + kRowBlock);
      const int64_t k0 = task % n_kb * kColBlock, nk = std::min(Kd - k0, kColBlock);
      const int64_t n_strips = (nk + kGemmTileC - 1) / kGemmTileC;
      const int64_t n_tiles = (r1 - r0 + kGemmTileR - 1) / kGemmTileR;
      if (!accumulate)
        for (int64_t r = r0; r < r1; ++r) std::memset(c + r * ldc + k0, 0, sizeof(float) * nk);
      for (int64_t l0 = 0; l0 < L; l0 += kInner) {
        const int64_t nl = std::min(kInner, L - l0);
        int64_t ld = 0;
        const float* p = fill_b(l0, nl, k0, nk, tmp, &ld);
        for (int64_t s = 0; s < n_strips; ++s) {
          const int64_t j0 = s * kGemmTileC, nj = std::min<int64_t>(kGemmTileC, nk - j0);
          float* bs = bpack + s * nl * kGemmTileC;
          if (nj == kGemmTileC) {  // constant-size copies inline (a libc memcpy per 64 bytes showed up)
            for (int64_t l = 0; l < nl; ++l)
              std::memcpy(bs + l * kGemmTileC, p + l * ld + j0, sizeof(float) * kGemmTileC);
          } else {
            for (int64_t l = 0; l < nl; ++l)
              for (int64_t j = 0; j < kGemmTileC; ++j) bs[l * kGemmTileC + j] = j < nj ? p[l * ld + j0 + j] : 0.0f;
          }
        }
        // All row tiles of A once per chunk, walking A in its contiguous direction (dY rows for
        // the input gradient; runs of 6 within a dY row for the weight gradient).
        // Tile rt holds a(r0 + rt * kGemmTileR + i, l0 + l) at apack[(rt * nl + l) * kGemmTileR + i].
        for (int64_t rt = 0; rt < n_tiles; ++rt) {
          float* at = apack + rt * nl * kGemmTileR;
          const int64_t ri = r0 + rt * kGemmTileR;
          const int mr = (int)std::min<int64_t>(kGemmTileR, r1 - ri);
          if (a_is == 1) {
            for (int i = 0; i < kGemmTileR; ++i) {
              const float* ar = a + (ri + std::min(i, mr - 1)) * a_rs + l0;
              for (int64_t l = 0; l < nl; ++l) at[l * kGemmTileR + i] = i < mr ? ar[l] : 0.0f;
            }
          } else if (a_rs == 1 && mr == kGemmTileR) {
            for (int64_t l = 0; l < nl; ++l)
              std::memcpy(at + l * kGemmTileR, a + ri + (l0 + l) * a_is, sizeof(float) * kGemmTileR);
          } else {
            for (int64_t l = 0; l < nl; ++l) {
              const float* al = a + ri * a_rs + (l0 + l) * a_is;
              for (int i = 0; i < kGemmTileR; ++i) at[l * kGemmTileR + i] = i < mr ? al[i * a_rs] : 0.0f;
            }
          }
        }
        for (int64_t rt = 0; rt < n_tiles; ++rt) {
          const int64_t ri = r0 + rt * kGemmTileR;
          const int mr = (int)std::min<int64_t>(kGemmTileR, r1 - ri);
          for (int64_t s = 0; s < n_strips; ++s) {
            const int64_t j0 = s * kGemmTileC;
            tk.gemm_tile(apack + rt * nl * kGemmTileR, bpack + s * nl * kGemmTileC, nl, c + ri * ldc + k0 + j0, ldc,
                         mr, (int)std::min<int64_t>(kGemmTileC, nk - j0));
          }
        }
      }
    }
  });
}

}  // namespace

void MatMulBackwardInputWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dx,
                             const float* dy, int64_t M, const Tensor& w, bool accumulate) {
  LATHE_CHECK(w.ndim() == 2);
  const int64_t N = w.shape[0], K = w.shape[1];
  if (IsPackedQuant(w.dtype)) {  // NF4/FP4/int8: B chunks dequantized straight from the packed buffer
    if (IsPacked4Bit(w.dtype)) LATHE_CHECK(K % kQuant4Block == 0);
    const quant::QuantKernels& qk = quant::QuantKernelsFor(tk.tier);
    auto fill_packed = [&](int64_t l0, int64_t nl, int64_t k0, int64_t nk, float* tmp, int64_t* ld) -> const float* {
      quant::DequantPackedBlock(qk, w, l0, nl, k0, nk, tmp, nk);
      *ld = nk;
      return tmp;
    };
    Gemm(tk, pool, dx, K, M, K, N, dy, N, 1, accumulate, fill_packed);
    return;
  }
  const size_t rb = w.row_bytes();
  const uint8_t* wd = (const uint8_t*)w.data;
  const DType t = w.dtype;
  if (IsQuantized(t)) LATHE_CHECK(K % 32 == 0);
  auto fill = [&](int64_t l0, int64_t nl, int64_t k0, int64_t nk, float* tmp, int64_t* ld) -> const float* {
    if (t == DType::kF32) {
      *ld = K;
      return (const float*)w.data + l0 * K + k0;
    }
    kt.mm.dequant_rows(t, wd + l0 * rb + DTypeBytes(t, k0), rb, nl, nk, tmp, nk);
    *ld = nk;
    return tmp;
  };
  Gemm(tk, pool, dx, K, M, K, N, dy, N, 1, accumulate, fill);
}

void MatMulBackwardWeightWith(const TrainKernelTable& tk, ThreadPool& pool, float* dw, const float* dy,
                              const float* x, int64_t M, int64_t N, int64_t K) {
  auto fill = [&](int64_t l0, int64_t, int64_t k0, int64_t, float*, int64_t* ld) -> const float* {
    *ld = K;
    return x + l0 * K + k0;
  };
  Gemm(tk, pool, dw, K, N, K, M, dy, 1, N, /*accumulate=*/true, fill);
}

}  // namespace lathe::kernels::cpu
