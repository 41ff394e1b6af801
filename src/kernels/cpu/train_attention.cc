// Flash-style causal grouped-query attention for training in f32: the drivers of
// train_attention_driver.h (tiled online-softmax forward saving out and the per-row logsumexp, a backward
// that recomputes scores tile by tile) over products that run on the tier's GEMM micro-kernel (QK^T, PV,
// dO V^T, P^T dO, dS^T Q, dS K).
#include "kernels/cpu/train_attention_driver.h"

namespace lathe::kernels::cpu {

namespace {

// Per-thread A packing buffer for KeyRowsProduct.
struct GemmScratch {
  std::vector<float> a;
};

// B(L, N) as 16-column strips: element (l, j) at [(j / 16 * L + l) * 16 + j % 16], padding zero.
// kBRowsContiguous: b(l, j) is contiguous in l (a transposed row-major matrix), so pack l-inner.
template <bool kBRowsContiguous, typename FB>
float* PackB(float* out, int64_t L, int64_t N, const FB& b) {
  const int64_t n_strips = (N + kGemmTileC - 1) / kGemmTileC;
  for (int64_t s = 0; s < n_strips; ++s) {
    float* bs = out + s * L * kGemmTileC;
    const int64_t j0 = s * kGemmTileC, nj = std::min<int64_t>(kGemmTileC, N - j0);
    if (kBRowsContiguous) {
      for (int64_t j = 0; j < kGemmTileC; ++j)
        for (int64_t l = 0; l < L; ++l) bs[l * kGemmTileC + j] = j < nj ? b(l, j0 + j) : 0.0f;
    } else {
      for (int64_t l = 0; l < L; ++l) {
        for (int64_t j = 0; j < nj; ++j) bs[l * kGemmTileC + j] = b(l, j0 + j);
        for (int64_t j = nj; j < kGemmTileC; ++j) bs[l * kGemmTileC + j] = 0.0f;
      }
    }
  }
  return out;
}

// A B operand of the micro-kernels: 16-column strip s starts at p + s * stride, its row l is ldb
// floats further on (a packed strip: ldb 16; a row-major matrix read in place: its row stride, stride 16).
struct BOperand {
  const float* p;
  int64_t ldb, stride;
  BOperand Rows(int64_t l0) const { return {p + l0 * ldb, ldb, stride}; }
  const float* At(int64_t l, int64_t strip) const { return p + strip * stride + l * ldb; }
};

// The query rows of one register tile: the tier's panel tile (8 x 48, A's rows read in place) where it has one,
// else the 6 x 16 / 6 x 32 tiles. Either gives every element the same FMA chain.
int64_t AttentionRowTile(const TrainKernelTable& tk) { return tk.gemm_panel_rows ? tk.panel_rows : kGemmTileR; }

// Columns of the next panel-tile call with `left` columns to go: the tier's panel width, but a last 16 after it
// (head_dim 64 = 48 + 16) goes as 32 + 32: the one-strip tile's 8 broadcasts per 8 multiply-adds ran at ~60% of the
// three-strip tile's rate (perf, attention backward); the two-strip tile's 8 per 16 do not hold the FMAs up. Each
// element's FMA chain is the same whichever tile computes it.
int PanelStep(const TrainKernelTable& tk, int64_t left) {
  const int64_t pc = tk.panel_cols;
  return (int)(left == pc + kGemmTileC && pc == 3 * kGemmTileC ? 2 * kGemmTileC : std::min<int64_t>(pc, left));
}

// c(R, N) (+)= A . B with A's rows read in place (row i at a + i * lda), row tiles of AttentionRowTile(tk) rows.
// With cols: row tile rt writes only the column strips that cover [cols->clo[rt], cols->chi[rt]). With inner: row
// tile rt sums only over [inner->clo[rt], inner->chi[rt]) of L (the rest of A's row is zero there).
void RowsTimesStrips(const TrainKernelTable& tk, float* c, int64_t ldc, int64_t R, int64_t N, int64_t L,
                     const float* a, int64_t lda, const BOperand& b, const TileRanges* cols,
                     const TileRanges* inner, bool overwrite) {
  const int64_t row_tile = AttentionRowTile(tk);
  for (int64_t r0 = 0, rt = 0; r0 < R; r0 += row_tile, ++rt) {
    const int mr = (int)std::min<int64_t>(row_tile, R - r0);
    int64_t j_lo = 0, j_hi = N, l_lo = 0, l_hi = L;
    if (cols) j_lo = cols->clo[rt], j_hi = cols->chi[rt];
    if (inner) l_lo = inner->clo[rt], l_hi = inner->chi[rt];
    if (l_hi <= l_lo) continue;
    if (j_hi <= j_lo) continue;
    // Whole strips from j_lo (a multiple of 16) on, as far as N.
    const int64_t nc = std::min(N - j_lo, (j_hi - j_lo + kGemmTileC - 1) / kGemmTileC * kGemmTileC);
    if (row_tile != kGemmTileR) {
      for (int64_t j = 0, w = 0; j < nc; j += w) {
        w = PanelStep(tk, nc - j);
        tk.gemm_panel_rows(a + r0 * lda + l_lo, lda, b.At(l_lo, (j_lo + j) / kGemmTileC), b.stride, b.ldb, l_hi - l_lo,
                           c + r0 * ldc + j_lo + j, ldc, mr, (int)w, overwrite, nullptr, nullptr);
      }
      continue;
    }
    GemmStripsRows(tk, a + r0 * lda + l_lo, lda, b.At(l_lo, j_lo / kGemmTileC), b.stride, b.ldb, l_hi - l_lo,
                   c + r0 * ldc + j_lo, ldc, mr, nc, overwrite);
  }
}

// c(nk, N) += A^T . B for the key-major products dV += P^T dO and dK += dS^T Q: A (nq x nk, row
// stride ld) read transposed, packed here per key row tile (AttentionRowTile keys: the panel tile's 8 or the
// 6 x 16 tiles' 6) over the query rows that see those keys only (r.rlo / r.rhi), runs of that many floats of each
// source row.
void KeyRowsProduct(const TrainKernelTable& tk, GemmScratch& gs, float* c, int64_t ldc, int64_t nk, int64_t N,
                    int64_t nq, const float* at, int64_t ld, const BOperand& b, const TileRanges& r) {
  const int64_t kt = AttentionRowTile(tk);
  float* ap = Scratch(gs.a, (size_t)(nq * kt));
  for (int64_t rt = 0; rt < RowTiles(nk, kt); ++rt) {
    const int64_t l0 = r.rlo[rt], l1 = r.rhi[rt];
    if (l1 <= l0) continue;
    const int64_t r0 = rt * kt;
    const int mr = (int)std::min<int64_t>(kt, nk - r0);
    if (mr == kt) {
      for (int64_t l = l0; l < l1; ++l) std::memcpy(ap + (l - l0) * kt, at + l * ld + r0, sizeof(float) * kt);
    } else {
      for (int64_t l = l0; l < l1; ++l)
        for (int i = 0; i < kt; ++i) ap[(l - l0) * kt + i] = i < mr ? at[l * ld + r0 + i] : 0.0f;
    }
    if (kt != kGemmTileR) {
      for (int64_t j = 0, w = 0; j < N; j += w) {
        w = PanelStep(tk, N - j);
        tk.gemm_panel(ap, b.At(l0, j / kGemmTileC), b.stride, b.ldb, l1 - l0, c + r0 * ldc + j, ldc, mr, (int)w,
                      /*overwrite=*/false, nullptr, nullptr);
      }
      continue;
    }
    GemmStrips(tk, ap, b.At(l0, 0), b.stride, b.ldb, l1 - l0, c + r0 * ldc, ldc, mr, N);
  }
}

// One call's operands packed once for the whole sequence (T rows) and every head, so no tile
// re-packs them. Per head h (n_head of them) or kv head g, each T x D:
//   cols(x, g):  x^T as B strips (PackB<true>, L = D): a key tile at k0 (a multiple of 16) is at + k0 * D
//                with the usual stride D * 16;
//   strips(x, h): x as B (PackB<false>, L = T): strip c of rows [k0, k0 + n) at + c * T * 16 + k0 * 16,
//                stride T * 16 (StripStride()).
// Q and dO, the A operands, are read in place (rows n_head * D floats apart).
struct SeqPack {
  int64_t T, D;
  int64_t ColsSize() const { return ((T + kGemmTileC - 1) / kGemmTileC) * kGemmTileC * D; }
  int64_t StripsSize() const { return ((D + kGemmTileC - 1) / kGemmTileC) * T * kGemmTileC; }
  int64_t StripStride() const { return T * kGemmTileC; }
};

// x(t, c) = src[(t * n + u) * D + c] of each of n units (heads) as a B operand with rows t: read in
// place when D is a multiple of 16 (the micro-kernels read whole 16-float rows), else packed as
// strips(x, u) (PackSeq below). Unit(u) is unit u's operand.
struct SeqStrips {
  const float* base;
  int64_t unit_stride, ldb, stride;
  BOperand Unit(int64_t u) const { return {base + u * unit_stride, ldb, stride}; }
};

// Packs, for each of n units (heads), x(t, c) = src[(t * n + u) * D + c] * mul into one of the layouts.
enum class Layout { kCols, kStrips };
float* PackSeq(ThreadPool& pool, std::vector<float>& buf, const SeqPack& sp, Layout layout, const float* src,
               int n, float mul) {
  const int64_t T = sp.T, D = sp.D;
  const int64_t per = layout == Layout::kCols ? sp.ColsSize() : sp.StripsSize();
  float* out = Scratch(buf, (size_t)(per * n));
  pool.ParallelFor(n, 1, [&](int64_t ub, int64_t ue, int) {
    for (int64_t u = ub; u < ue; ++u) {
      const float* x = src + u * D;
      const int64_t ld = n * D;
      float* o = out + u * per;
      if (layout == Layout::kCols)
        PackB<true>(o, D, T, [&](int64_t c, int64_t t) { return mul * x[t * ld + c]; });
      else
        PackB<false>(o, T, D, [&](int64_t t, int64_t c) { return mul * x[t * ld + c]; });
    }
  });
  return out;
}

SeqStrips Strips(ThreadPool& pool, std::vector<float>& buf, const SeqPack& sp, const float* src, int n) {
  if (sp.D % kGemmTileC == 0) return {src, sp.D, n * sp.D, kGemmTileC};
  return {PackSeq(pool, buf, sp, Layout::kStrips, src, n, 1.0f), sp.StripsSize(), kGemmTileC, sp.StripStride()};
}


// The f32 products: operands packed once per call for the whole sequence (SeqPack), every tile product
// on the tier's 6 x 16 (or two-strip) GEMM tiles, scale folded into K's pack.
struct F32Attention {
  static constexpr bool kPacksSoftmax = false;
  const TrainKernelTable& tk;
  Dims d;
  SeqPack sp;
  const float* q = nullptr;
  const float* dout = nullptr;
  const float* kc = nullptr;  // scale * K^T as column strips (Scores)
  const float* vc = nullptr;  // V^T as column strips (DoVt)
  SeqStrips vs{}, ks{}, qs{}, dos{};

  F32Attention(const TrainKernelTable& tk_, const Dims& d_) : tk(tk_), d(d_), sp{d_.T, d_.D} {}
  int64_t ldq() const { return (int64_t)d.n_head * d.D; }
  int64_t RowTile() const { return AttentionRowTile(tk); }
  int64_t KeyTile() const { return AttentionRowTile(tk); }
  void Scores(float* S, int h, int g, int64_t q0, int64_t nq, int64_t k0, int64_t nk, const TileRanges& tr) const {
    RowsTimesStrips(tk, S, nk, nq, nk, d.D, q + d.QRow(q0, h), ldq(),
                    {kc + g * sp.ColsSize() + k0 * d.D, kGemmTileC, (int64_t)d.D * kGemmTileC}, &tr, nullptr,
                    /*overwrite=*/true);
  }
  void AddPV(float* o, int g, int64_t, int64_t nq, int64_t k0, int64_t nk, const float* P,
             const TileRanges& tr) const {
    RowsTimesStrips(tk, o, d.D, nq, d.D, nk, P, nk, vs.Unit(g).Rows(k0), nullptr, &tr, /*overwrite=*/false);
  }
  void DoVt(float* dP, int h, int g, int64_t q0, int64_t nq, int64_t k0, int64_t nk, const TileRanges& tr) const {
    RowsTimesStrips(tk, dP, nk, nq, nk, d.D, dout + d.QRow(q0, h), ldq(),
                    {vc + g * sp.ColsSize() + k0 * d.D, kGemmTileC, (int64_t)d.D * kGemmTileC}, &tr, nullptr,
                    /*overwrite=*/true);
  }
  void AddPtDo(float* dvt, int h, int64_t q0, int64_t nq, int64_t nk, const float* P, const TileRanges& tr) const {
    static thread_local GemmScratch gs;
    KeyRowsProduct(tk, gs, dvt, d.D, nk, d.D, nq, P, nk, dos.Unit(h).Rows(q0), tr);
  }
  void AddDsTQ(float* dkt, int h, int64_t q0, int64_t nq, int64_t nk, const float* dS, const TileRanges& tr) const {
    static thread_local GemmScratch gs;
    KeyRowsProduct(tk, gs, dkt, d.D, nk, d.D, nq, dS, nk, qs.Unit(h).Rows(q0), tr);
  }
  void AddDsK(float* dq, int64_t ld_dq, int g, int64_t, int64_t nq, int64_t k0, int64_t nk, const float* dS,
              const TileRanges& tr) const {
    RowsTimesStrips(tk, dq, ld_dq, nq, d.D, nk, dS, nk, ks.Unit(g).Rows(k0), nullptr, &tr, /*overwrite=*/false);
  }
  void KeyRows(const float* tile, int64_t n, float* dst, int64_t ld) const {
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * ld, tile + i * d.D, sizeof(float) * d.D);
  }
};

}  // namespace

void FlashAttentionForwardWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* out,
                               float* lse, const float* q, const float* k, const float* v, const int32_t* seg,
                               int64_t T, int n_head, int n_kv_head, int head_dim, float scale, int64_t window) {
  (void)kt;
  LATHE_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0 && head_dim > 0 && window >= 0);
  F32Attention ops(tk, Dims{T, n_head, n_kv_head, head_dim});
  // scale * K^T and V packed once per kv head for every query tile; Q rows are read in place.
  static thread_local std::vector<float> kc_buf, vs_buf;
  ops.q = q;
  ops.kc = PackSeq(pool, kc_buf, ops.sp, Layout::kCols, k, n_kv_head, scale);
  ops.vs = Strips(pool, vs_buf, ops.sp, v, n_kv_head);
  AttentionForward(tk, pool, ops, out, lse, seg, T, n_head, n_kv_head, head_dim, window);
}

void FlashAttentionBackwardWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dq,
                                float* dk, float* dv, const float* dout, const float* q, const float* k,
                                const float* v, const float* out, const float* lse, const int32_t* seg, int64_t T,
                                int n_head, int n_kv_head, int head_dim, float scale, int64_t window) {
  LATHE_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0 && head_dim > 0 && window >= 0);
  const float* delta = AttentionDelta(kt, pool, dout, out, T, n_head, head_dim);
  F32Attention ops(tk, Dims{T, n_head, n_kv_head, head_dim});
  // Packed once for the whole sequence (SeqPack): scale * K^T and V^T as column strips for
  // S = Q (scale K)^T and dP = dO V^T (Q, dO read in place as A); K, Q, dO are the B operands of
  // dQ += dS K, dK += dS^T Q and dV += P^T dO (in place unless D % 16 != 0, see Strips).
  static thread_local std::vector<float> kc_buf, vc_buf, ks_buf, qs_buf, dos_buf;
  ops.q = q;
  ops.dout = dout;
  ops.kc = PackSeq(pool, kc_buf, ops.sp, Layout::kCols, k, n_kv_head, scale);
  ops.vc = PackSeq(pool, vc_buf, ops.sp, Layout::kCols, v, n_kv_head, 1.0f);
  ops.ks = Strips(pool, ks_buf, ops.sp, k, n_kv_head);
  ops.qs = Strips(pool, qs_buf, ops.sp, q, n_head);
  ops.dos = Strips(pool, dos_buf, ops.sp, dout, n_head);
  AttentionBackward(tk, kt, pool, ops, delta, dq, dk, dv, lse, seg, T, n_head, n_kv_head, head_dim, scale, window);
}

}  // namespace lathe::kernels::cpu
