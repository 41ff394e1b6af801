// Blocked GEMM driver behind LinearForward (Y = X . W^T), MatMulBackwardInput (dX = dY . W, W in
// any stored dtype) and MatMulBackwardWeight (dW += dY^T . X): packs panels, runs a tier's micro-kernels.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/cpu.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/train_dispatch.h"

namespace lathe::kernels::cpu {

namespace {

// Task = (kRowBlock rows of C) x (a column block of C); the inner dimension goes in chunks of
// InnerChunk(L) <= kMaxInner. A packed B chunk (chunk x kColBlock floats, <= 768 KiB) stays in L2
// while every row tile of the task streams 16-column strips of it through the micro-kernel.
constexpr int64_t kRowBlock = 192;   // multiple of kGemmTileR and of every tier's panel_rows
constexpr int64_t kColBlock = 256;   // multiple of 256 (K-quant blocks) and of kGemmTileC
constexpr int64_t kMaxInner = 768;
// Each C element is the sum of its inner chunks, in order, each one FMA chain: the chunk length is
// the one thing every path (tiers, threads, packed or prepacked B, the few-rows product) must agree
// on. Whole inner dimensions up to kMaxInner (SmolLM2's 576 in one chunk: C read and written once,
// not three times as with 256), longer ones in equal chunks (1536: 2 x 768), multiples of 16.
int64_t InnerChunk(int64_t L) {
  const int64_t n = std::max<int64_t>(1, (L + kMaxInner - 1) / kMaxInner);
  return std::min(kMaxInner, ((L + n - 1) / n + 15) / 16 * 16);
}
// Column blocks on tiers with a panel tile: whole micro-panels (192 = 4 x 48, so SmolLM2's 576, 1536
// and 192 columns leave no edge tiles), or 768 where the B fill needs 256-column alignment (K-quants).
constexpr int64_t kPanelColBlock = 192;
constexpr int64_t kPanelColBlockAligned = 768;
int64_t PanelColBlock(int64_t col_align) {
  return kPanelColBlock % col_align == 0 ? kPanelColBlock : kPanelColBlockAligned;
}
// The panel path may run each inner chunk in sub-chunks of at most this many rows (equal multiples of 16),
// each micro-panel's B sub-chunk (48 x kSubInner floats, 30 KiB) in L1 for all the task's row tiles: faster on
// Intel's cores (Emerald Rapids: kernels +4-10%, thirty-seventh session), slower on AMD's (Zen 4: 1-thread
// kernels -5-6%, thirty-ninth; Zen 5: F32 pp512 -2-8% at 1 and 2 threads, forty-first), which run whole chunks.
// The same bits either way (each C element's chain goes on through the partial tiles). GemmSubChunks() says which
// (train_dispatch.h).
constexpr int64_t kSubInner = 160;
// Products with at most this many rows (the LoRA rank) go through FewRowsGemm.
constexpr int64_t kFewRows = 3 * kGemmTileR;
// A task's rows on those tiers: their A micro-panels (rows x chunk) at most this many floats (1 MiB,
// half an L2), so a micro-panel pair's task streams A from L2, not L3 (the weight gradient's 1536
// rows x 512 tokens did).
constexpr int64_t kPanelABlockFloats = (int64_t)1 << 18;
// B is packed once per call for all rows (and shared by the threads) in column groups of at most
// this many floats: 4 MiB holds every SmolLM2-135M linear whole; a 7B FFN goes in a few groups.
constexpr int64_t kSharedBFloats = (int64_t)1 << 20;
// The panel path (tiers with gemm_panel) packs A once per round for all rows, shared like B: at most
// this many floats (rows in superblocks beyond it). Only for products at least kPanelMinCols wide
// when A's rows are contiguous: each packed A element serves Kd columns, and narrower products (LoRA's
// rank-r outputs, the loss's 128-token logits^T chunks over the whole head) measured slower packed.
constexpr int64_t kSharedAFloats = (int64_t)1 << 20;
constexpr int64_t kPanelMinCols = 192;
// Rows per A superblock before a round takes fewer inner chunks instead (fewer chunks per round
// means C read and written once more per round; fewer rows, B streamed once more per superblock).
constexpr int64_t kPanelMinRows = 256;
// Panel-path products with at most this many rows and a long inner dimension (over two inner chunks: the loss's
// 128-token chunks, the head's input gradient, 128 rows x 576 columns over 49152 inner rows; not the decoder
// linears at M <= 256, whose products were not measured so) split over the threads by columns: one task per thread,
// each all the rows x its share of the columns (whole micro-panels), so each B sub-chunk serves every row tile
// once (split by rows, each thread's 32 rows re-read the whole shared B from L3). Loss of a 512-token group,
// 2 threads: 463 -> 439 ms (fifty-third session).
constexpr int64_t kColSplitRows = 256;

// The caller's shared panel buffers and each thread's B conversion / A tile buffers, one set for
// every instantiation of Gemm (a static inside the template would be one per fill type).
std::vector<float>& SharedPanelsBuf() {
  static thread_local std::vector<float> buf;  // the caller's; the workers only read it
  return buf;
}
std::vector<float>& SharedAPanelsBuf() {
  static thread_local std::vector<float> buf;
  return buf;
}
float* SharedPanels(size_t n) { return Scratch(SharedPanelsBuf(), n); }
float* SharedAPanels(size_t n) { return Scratch(SharedAPanelsBuf(), n); }
float* ThreadTmp(size_t n) {
  static thread_local std::vector<float> buf;
  return Scratch(buf, n);
}
float* ThreadATile(size_t n) {
  static thread_local std::vector<float> buf;
  return Scratch(buf, n);
}
float* ThreadPartials(size_t n) {  // the panel path's partial tiles, a task's row tiles x one micro-panel
  static thread_local std::vector<float> buf;
  return Scratch(buf, n);
}

// Rows of A as one packed tile: out[l * W + i] = A(i, l) = a[i * a_rs + l * a_is] for l < nl, rows past
// mr zero. A constant W makes the contiguous case (a_rs == 1, a full tile) inline copies, not a libc call
// per 24 or 32 bytes.
template <int W>
void PackATileW(float* out, const float* a, int64_t a_rs, int64_t a_is, int64_t nl, int mr) {
  if (a_rs == 1 && mr == W) {
    for (int64_t l = 0; l < nl; ++l) std::memcpy(out + l * W, a + l * a_is, sizeof(float) * W);
    return;
  }
  for (int64_t l = 0; l < nl; ++l) {
    const float* al = a + l * a_is;
    for (int i = 0; i < W; ++i) out[l * W + i] = i < mr ? al[i * a_rs] : 0.0f;
  }
}
void PackATile(float* out, const float* a, int64_t a_rs, int64_t a_is, int64_t nl, int mr, int w) {
  if (w == 8) return PackATileW<8>(out, a, a_rs, a_is, nl, mr);
  if (w == kGemmTileR) return PackATileW<kGemmTileR>(out, a, a_rs, a_is, nl, mr);
  for (int64_t l = 0; l < nl; ++l) {
    const float* al = a + l * a_is;
    for (int i = 0; i < w; ++i) out[l * w + i] = i < mr ? al[i * a_rs] : 0.0f;
  }
}

// A packed B panel (nl x nk, the columns in 16-column strips, zero past nk) in micro-panels mpw columns
// wide: micro-panel m (columns m mpw ..) at panel + m mpw nl, its rows w = min(mpw, nk rounded up to 16 -
// m mpw) floats apart. mpw = 16: plain strips (strip s at panel + s nl 16, rows 16 apart); the panel
// tile's width on the panel path: each micro-panel one stream of whole rows (three strips 36 KiB apart
// at nl = 576 measured 5-10% slower in the tile on the Emerald Rapids Xeon). Either way the strip of
// columns j0 .. j0 + 15 (j0 a multiple of 16) starts at the returned pointer, rows *ld apart.
float* PanelStrip(float* panel, int64_t nl, int64_t nk, int64_t mpw, int64_t j0, int64_t* ld) {
  const int64_t m0 = j0 / mpw * mpw;
  *ld = std::min(mpw, (nk + kGemmTileC - 1) / kGemmTileC * kGemmTileC - m0);
  return panel + m0 * nl + (j0 - m0);
}

// A second source of A's rows on the panel path: A(i, l) = p[i * rs + l - from] for l >= from (the first source
// holds l < from). The "plus" products' [x | x2] without a concatenated copy: PackAPanels packs the two parts
// of a chunk that spans both side by side.
struct ASecond {
  const float* p = nullptr;
  int64_t rs = 0;
  int64_t from = 0;
};

// Rows [0, n) of a row-major B (p, rows ld floats apart, nk columns) into a panel nl_panel rows deep (PanelStrip's
// layout) from its row `row` on, zero past nk in the last strip. Row by row, each row's run of nk floats read front
// to back: B is often a weight row range straight from DRAM (W of 576 or 1536 floats a row, the head's 49152 x 576),
// and a walk down one 16-column strip at a time (rows 2304 bytes apart, past the stride prefetcher's reach) read it
// at ~6 GB/s on 2 threads (the trained head's input gradient, 18 of its 51 ms per 128-token chunk).
void CopyIntoStrips(float* panel, int64_t nl_panel, int64_t row, int64_t n, int64_t nk, int64_t mpw, const float* p,
                    int64_t ld) {
  const int64_t nk16 = (nk + kGemmTileC - 1) / kGemmTileC * kGemmTileC;
  for (int64_t m0 = 0; m0 < nk16; m0 += mpw) {  // micro-panels: each row's w floats, contiguous
    const int64_t w = std::min(mpw, nk16 - m0), nj = std::min(w, nk - m0);
    float* out = panel + m0 * nl_panel + row * w;
    const float* in = p + m0;
    constexpr int64_t kWide = 3 * kGemmTileC;  // the panel tile's micro-panel (AVX-512: 48 columns)
    if (nj == kWide && w == kWide) {  // constant-size copies inline (a libc memcpy per 64 bytes showed up)
      for (int64_t l = 0; l < n; ++l) std::memcpy(out + l * kWide, in + l * ld, sizeof(float) * kWide);
    } else if (nj == kGemmTileC && w == kGemmTileC) {
      for (int64_t l = 0; l < n; ++l) std::memcpy(out + l * kGemmTileC, in + l * ld, sizeof(float) * kGemmTileC);
    } else {
      for (int64_t l = 0; l < n; ++l)
        for (int64_t j = 0; j < w; ++j) out[l * w + j] = j < nj ? in[l * ld + j] : 0.0f;
    }
  }
}

// Rows of A in the panel path (0: no panel path) and the rounds' shapes, shared with the memory plan.
struct GemmPlan {
  int panel_rows = 0;     // rows per packed A micro-panel; 0 = the 6 x 16 tiles
  int64_t inner = 0;      // InnerChunk(L)
  int64_t n_lc_all = 0;   // inner chunks in all
  int64_t chunks = 0;     // inner chunks per round
  int64_t sb_rows = 0;    // rows per A superblock (all of R unless the panel path's A would not fit)
  int64_t col_block = 0;  // columns per packed B panel (and per task)
  int64_t group = 0;      // columns per round's packed B (whole col_blocks)
  bool col_split = false;  // one column block per thread, all rows in each (kColSplitRows)
};

// Floats of a plan's shared panels (what GemmAPanelFloatsWith / GemmBPanelFloatsWith count): A's micro-panels of a
// round (panel path only) and the B panels of a round's column group.
int64_t APanelFloats(const GemmPlan& p) {
  return p.panel_rows ? p.chunks * ((p.sb_rows + p.panel_rows - 1) / p.panel_rows * p.panel_rows) * p.inner : 0;
}
int64_t BPanelFloats(const GemmPlan& p, int64_t Kd) {
  return (std::min(p.group, Kd) + p.col_block - 1) / p.col_block * p.chunks * p.inner * p.col_block;
}

// col_align: the B fill's column alignment (a quantized W's block; 1 for plain types).
GemmPlan PlanGemm(const TrainKernelTable& tk, ThreadPool* pool, int64_t R, int64_t Kd, int64_t L, int64_t a_is,
                  bool bpre, int64_t col_align) {
  GemmPlan p;
  p.inner = InnerChunk(L);
  p.n_lc_all = (L + p.inner - 1) / p.inner;
  p.panel_rows = tk.gemm_panel && (a_is != 1 || Kd >= kPanelMinCols) ? tk.panel_rows : 0;
  p.col_block = p.panel_rows ? PanelColBlock(col_align) : kColBlock;
  LATHE_CHECK(p.col_block % col_align == 0);
  const int64_t panel = p.inner * p.col_block;
  p.chunks = bpre ? p.n_lc_all : std::min(p.n_lc_all, std::max<int64_t>(1, kSharedBFloats / panel));
  p.sb_rows = R;
  if (p.panel_rows) {
    const int64_t pr = p.panel_rows, r_pad = (R + pr - 1) / pr * pr;
    const int64_t want_rows = std::min(r_pad, kPanelMinRows);
    if (p.chunks * p.inner * want_rows > kSharedAFloats)
      p.chunks = std::max<int64_t>(1, kSharedAFloats / (want_rows * p.inner));
    p.sb_rows = std::min(r_pad, std::max<int64_t>(pr, kSharedAFloats / (p.chunks * p.inner) / pr * pr));
  }
  p.group = bpre ? Kd : std::max<int64_t>(1, kSharedBFloats / (p.chunks * panel)) * p.col_block;
  // Few rows on several threads: column blocks of Kd / threads (whole micro-panels), every column in each round
  // (fewer inner chunks a round), all rows in one superblock. Only with a pool: the memory plan's calls (pool null)
  // take the row-split plan, so the split is kept only where its shared A and B panels are no larger than that
  // plan's (GemmAPanelFloatsWith / GemmBPanelFloatsWith count those).
  if (p.panel_rows && !bpre && pool && pool->size() > 1 && R <= kColSplitRows && p.n_lc_all > 2 && col_align == 1) {
    const int64_t th = pool->size(), pc = tk.panel_cols, pr = p.panel_rows, r_pad = (R + pr - 1) / pr * pr;
    GemmPlan q = p;
    q.col_split = true;
    q.col_block = ((Kd + th - 1) / th + pc - 1) / pc * pc;
    q.group = (Kd + q.col_block - 1) / q.col_block * q.col_block;
    q.chunks = std::clamp<int64_t>(std::min(kSharedBFloats / (q.group * q.inner), kSharedAFloats / (r_pad * q.inner)),
                                   1, q.n_lc_all);
    q.sb_rows = r_pad;
    if (BPanelFloats(q, Kd) <= BPanelFloats(p, Kd) && APanelFloats(q) <= APanelFloats(p)) p = q;
  }
  // With bpre (nothing to pack per block) up to 20 strips per column block, the block count a multiple
  // of the threads, so a small-R product (the head's 128-row chunks) still splits evenly.
  if (bpre && pool) {
    const int64_t strips = (Kd + kGemmTileC - 1) / kGemmTileC, th = pool->size();
    int64_t n = (strips + 19) / 20;
    n = std::min(strips, (n + th - 1) / th * th);
    p.col_block = (strips + n - 1) / n * kGemmTileC;
  }
  return p;
}

// The panel path's A micro-panels of one round (inner chunks c0 .. c0 + n_lc - 1, rows s0 .. s1 - 1): micro-panel
// t of chunk lc at out + (lc * n_tiles + t) * pr * inner, (l, i) at [l * pr + i], rows past s1 zero.
void PackAPanels(const TrainKernelTable& tk, ThreadPool& pool, const GemmPlan& plan, const float* a, int64_t a_rs,
                 int64_t a_is, int64_t L, int64_t c0, int64_t n_lc, int64_t s0, int64_t s1, float* out,
                 const ASecond* a2 = nullptr) {
  const int64_t pr = plan.panel_rows, inner = plan.inner, n_tiles = (s1 - s0 + pr - 1) / pr;
  pool.ParallelFor(n_lc * n_tiles, 1, [&](int64_t tb, int64_t te, int) {
    for (int64_t u = tb; u < te; ++u) {
      const int64_t lc = u / n_tiles, ri = s0 + u % n_tiles * pr;
      const int64_t l0 = (c0 + lc) * inner, nl = std::min(inner, L - l0);
      const int mr = (int)std::min<int64_t>(pr, s1 - ri);
      float* o = out + u * pr * inner;
      if (a2 && l0 + nl > a2->from) {  // (a_is == 1: Gemm checks) the first source's part, then the second's
        const int64_t n1 = std::max<int64_t>(0, a2->from - l0);
        if (n1 > 0) tk.pack_panel_rows(o, a + ri * a_rs + l0, a_rs, n1, mr);
        tk.pack_panel_rows(o + n1 * pr, a2->p + ri * a2->rs + (l0 + n1 - a2->from), a2->rs, nl - n1, mr);
      } else if (a_is == 1) {
        tk.pack_panel_rows(o, a + ri * a_rs + l0, a_rs, nl, mr);
      } else {
        PackATile(o, a + ri * a_rs + l0 * a_is, a_rs, a_is, nl, mr, (int)pr);
      }
    }
  });
}

// C(R, Kd) (+)= A(R, L) . B(L, Kd), A(i, l) = a[i * a_rs + l * a_is], C rows ldc floats apart.
// fill_b(l0, nl, k0, nk, panel, &ld, mpw, row, nl_panel) returns a pointer p with B(l0 + l, k0 + k) = p[l * ld + k],
// either into the source or into ThreadTmp (nl x nk floats) after converting; or nullptr after writing those nl
// rows itself into rows row .. row + nl - 1 of a panel nl_panel rows deep, in micro-panels mpw columns wide
// (PanelStrip). k0 is a multiple of col_align; a panel may come in row pieces (any l0 within its chunk).
// Per round of inner chunks: B is packed once (in parallel, into a buffer the threads share) into
// 16-column strips per (column block, inner chunk) panel (interleaved 48-column micro-panels on the panel
// path); then each task runs its row tiles over the panels. A: on tiers with a panel tile (gemm_panel)
// packed once per round into micro-panels shared by the tasks; there, and where the panel tile reads A's
// rows in place (gemm_panel_rows), micro-panel by micro-panel in sub-chunks of the inner chunk, all the
// task's row tiles over each sub-chunk (its B in L1, the chains carried through partial tiles); otherwise,
// with contiguous rows (a_is == 1: the forward and the input gradient), read in place by the rows
// micro-kernel, else (the weight gradient, A = dY^T) a 6-row tile packed per use.
// Each C element sums its inner chunks in order with the same FMAs whichever micro-kernel runs, so
// the result depends neither on the threads nor on the tier.
// With bpre (B already packed for every column and inner row, PackForBackwardInput's layout: strip
// s over all L rows at bpre + s * L * kGemmTileC) nothing is packed and the micro-kernel calls and
// their order are the same, so the result is bit-identical.
// apre: A already packed by PackAPanels for the whole product (only for a plan of one round and one superblock,
// which MatMulForwardStripsShared checks), shared by products with the same A; nothing else changes.
template <typename FillB>
void Gemm(const TrainKernelTable& tk, ThreadPool& pool, float* c, int64_t ldc, int64_t R, int64_t Kd, int64_t L,
          const float* a, int64_t a_rs, int64_t a_is, bool accumulate, const FillB& fill_b,
          const float* bpre = nullptr, int64_t col_align = 1, const float* apre = nullptr,
          const ASecond* a2 = nullptr) {
  if (R <= 0 || Kd <= 0) return;
  if (L <= 0) {
    if (!accumulate)
      for (int64_t r = 0; r < R; ++r) std::memset(c + r * ldc, 0, sizeof(float) * Kd);
    return;
  }
  // Inner chunks per round (all of them unless the round's B would pass kSharedBFloats, e.g. the
  // head's input gradient) and columns per round (whole column blocks, at least one).
  const GemmPlan plan = PlanGemm(tk, &pool, R, Kd, L, a_is, bpre != nullptr, col_align);
  const int64_t pr = plan.panel_rows;
  // A second A source only where A is packed (the panel path), never read in place.
  LATHE_CHECK(!a2 || (pr && a_is == 1 && !apre));
  const bool rows_kernel = !pr && a_is == 1;
  // Rows read in place by the tier's panel tile where it has that form.
  const bool panel_in_place = rows_kernel && tk.gemm_panel_rows;
  const int64_t MR = pr ? pr : panel_in_place ? tk.panel_rows : kGemmTileR;
  const int64_t inner = plan.inner, n_lc_all = plan.n_lc_all, chunks = plan.chunks;
  const int64_t col_block = plan.col_block, group = plan.group, panel_floats = inner * col_block;
  // The panel tile reads the panels packed here as interleaved micro-panels; bpre stays in strips.
  const bool interleave = pr && !bpre;
  const int64_t mpw = interleave ? tk.panel_cols : kGemmTileC;
  if (a_is != 1 && !accumulate)
    for (int64_t r = 0; r < R; ++r) std::memset(c + r * ldc, 0, sizeof(float) * Kd);
  for (int64_t c0 = 0; c0 < n_lc_all; c0 += chunks)
  for (int64_t s0 = 0; s0 < R; s0 += plan.sb_rows) {
    const int64_t n_lc = std::min(chunks, n_lc_all - c0);  // chunks c0 .. c0 + n_lc - 1 this round
    const int64_t s1 = std::min(R, s0 + plan.sb_rows);
    // Panel path: A micro-panel t (rows s0 + pr t ..) of chunk lc at apanels + (lc * n_tiles + t) * pr
    // * inner, (l, i) at [l * pr + i], rows past s1 zero.
    const int64_t n_tiles = (s1 - s0 + MR - 1) / MR;
    const float* apanels = nullptr;
    if (apre) {
      LATHE_CHECK(pr && n_lc == n_lc_all && s0 == 0 && s1 == R);
      apanels = apre;
    } else if (pr) {
      float* packed = SharedAPanels((size_t)(n_lc * n_tiles * pr * inner));
      PackAPanels(tk, pool, plan, a, a_rs, a_is, L, c0, n_lc, s0, s1, packed, a2);
      apanels = packed;
    }
    for (int64_t g0 = 0; g0 < Kd; g0 += group) {
    const int64_t gk = std::min(group, Kd - g0);
    const int64_t n_cb = (gk + col_block - 1) / col_block;
    // Panel (cb, lc) at bpack + (cb * n_lc + lc) * panel_floats; strip s of it s * nl * 16 on.
    float* bpack = bpre ? nullptr : SharedPanels((size_t)(n_cb * n_lc * panel_floats));
    // Panels the threads cannot share evenly (q / k / v / o: 3 or 1; the trained head's input gradient: 7 a round)
    // are filled in one row piece per thread. The panels' contents do not depend on the pieces.
    const int64_t th = pool.size(), n_fill = n_cb * n_lc;
    const int64_t pieces = th > 1 && n_fill % th != 0 ? th : 1;
    if (!bpre) pool.ParallelFor(n_fill * pieces, 1, [&](int64_t tb, int64_t te, int) {
      for (int64_t v = tb; v < te; ++v) {
        const int64_t u = v / pieces, piece = v % pieces;
        const int64_t cb = u / n_lc, lc = u % n_lc;
        const int64_t k0 = g0 + cb * col_block, nk = std::min(col_block, Kd - k0);
        const int64_t l0 = (c0 + lc) * inner, nl = std::min(inner, L - l0);
        const int64_t r0 = nl * piece / pieces, r1 = nl * (piece + 1) / pieces;
        int64_t ld = 0;
        float* panel = bpack + u * panel_floats;
        if (r1 > r0) {
          const float* p = fill_b(l0 + r0, r1 - r0, k0, nk, panel, &ld, mpw, r0, nl);
          if (p) CopyIntoStrips(panel, nl, r0, r1 - r0, nk, mpw, p, ld);
        }
      }
    });
    // Too few tasks for the threads to share evenly (k / v's 192 columns over 512 rows; the head's
    // input gradient per round: 1) -> smaller row blocks, at least 2 tasks per thread (with bpre,
    // whose column blocks already come in a multiple of the threads, 1). The panel path's row blocks
    // are as tall as L2 allows (a micro-panel pair's B is read from L2 once per task).
    // Every C element still sees the same micro-kernel calls, so the split never changes the result.
    const int64_t rows = s1 - s0;
    int64_t row_block = kRowBlock;
    if (pr) {  // equal row blocks whose A micro-panels fit kPanelABlockFloats
      const int64_t n = std::max<int64_t>(1, (rows * inner + kPanelABlockFloats - 1) / kPanelABlockFloats);
      row_block = ((rows + n - 1) / n + MR - 1) / MR * MR;
    }
    const int64_t want = th > 1 ? (bpre || plan.col_split ? 1 : 2) * th : 1;
    if ((rows + row_block - 1) / row_block * n_cb < want) {
      const int64_t parts = (want + n_cb - 1) / n_cb;
      row_block = std::max<int64_t>(MR, ((rows + parts - 1) / parts + MR - 1) / MR * MR);
    }
    // A few tasks that the threads cannot share evenly (the FFN weight gradients' 3 x 3 on 2 threads:
    // one thread ran 5 of 9) -> one more row block at a time until they can.
    for (int64_t n = (rows + row_block - 1) / row_block; th > 1 && n * n_cb < 8 * th && (n * n_cb) % th != 0;) {
      ++n;
      const int64_t rb = std::max<int64_t>(MR, ((rows + n - 1) / n + MR - 1) / MR * MR);
      if (rb >= row_block) break;  // no taller than MR rows left to split
      row_block = rb;
      n = (rows + row_block - 1) / row_block;
    }
    const int64_t n_rb = (rows + row_block - 1) / row_block;
    pool.ParallelFor(n_rb * n_cb, 1, [&](int64_t tb, int64_t te, int) {
      float* apack = rows_kernel || pr ? nullptr : ThreadATile((size_t)(inner * row_block));
      for (int64_t task = tb; task < te; ++task) {
        const int64_t r0 = s0 + task / n_cb * row_block, r1 = std::min(s1, r0 + row_block);
        const int64_t cb = task % n_cb;
        const int64_t k0 = g0 + cb * col_block, nk = std::min(col_block, Kd - k0);
        for (int64_t lc = 0; lc < n_lc; ++lc) {
          const int64_t l0 = (c0 + lc) * inner, nl = std::min(inner, L - l0);
          // Strip j0 / 16 of this (column block, inner chunk) starts at panel + j0 * per_col.
          const float* panel = bpre ? bpre + k0 * L + l0 * kGemmTileC : bpack + (cb * n_lc + lc) * panel_floats;
          const int64_t per_col = bpre ? L : nl;
          const bool overwrite = c0 + lc == 0 && !accumulate && a_is == 1;
          if (pr || panel_in_place) {
            // Micro-panel by micro-panel, its B in sub-chunks of at most kSubInner rows (48 x 144 floats at nl
            // = 576: 27 KiB, kept in L1 while every row tile of the task runs over it, A's micro-panels
            // streamed from L2, or its rows read in place); each C element's chain goes on through the
            // thread's partial tiles.
            const float* ap = pr ? apanels + lc * n_tiles * pr * inner : nullptr;
            const int64_t pc = tk.panel_cols;
            // One-strip products with A's rows in place (LoRA's x A^T) keep whole chunks: their B strip is
            // small, and short runs of rows 6 KiB apart (x of 1536 columns) measured 1.6x slower split.
            const int64_t n_sub = (!pr && nk <= kGemmTileC) || !GemmSubChunks() ? 1 : (nl + kSubInner - 1) / kSubInner;
            const int64_t sub = ((nl + n_sub - 1) / n_sub + kGemmTileC - 1) / kGemmTileC * kGemmTileC;
            float* part = n_sub > 1 ? ThreadPartials((size_t)((r1 - r0 + MR - 1) / MR * MR * pc)) : nullptr;
            for (int64_t j = 0; j < nk; j += pc) {
              const int nc = (int)std::min<int64_t>(pc, nk - j);
              const int64_t ldb = interleave ? (nc + kGemmTileC - 1) / kGemmTileC * kGemmTileC : kGemmTileC;
              const int64_t stride = interleave ? kGemmTileC : kGemmTileC * per_col;
              const float* bj = panel + j * per_col;
              for (int64_t l1 = 0; l1 < nl; l1 += sub) {
                const int64_t ns = std::min(sub, nl - l1);
                const bool first = l1 == 0, last = l1 + ns == nl;
                for (int64_t ri = r0; ri < r1; ri += MR) {
                  float* pt = part ? part + (ri - r0) * pc : nullptr;
                  float* cj = c + ri * ldc + k0 + j;
                  const int mr = (int)std::min<int64_t>(MR, r1 - ri);
                  if (pr) {
                    tk.gemm_panel(ap + (ri - s0) * inner + l1 * pr, bj + l1 * ldb, stride, ldb, ns, cj, ldc, mr, nc,
                                  overwrite, first ? nullptr : pt, last ? nullptr : pt);
                  } else {
                    tk.gemm_panel_rows(a + ri * a_rs + l0 + l1, a_rs, bj + l1 * ldb, stride, ldb, ns, cj, ldc, mr, nc,
                                       overwrite, first ? nullptr : pt, last ? nullptr : pt);
                  }
                }
              }
            }
            continue;
          }
          if (!rows_kernel) {
            // apack tile t (rows r0 + 6 t ..): apack + t * nl * 6, (l, i) = a(r0 + 6 t + i, l0 + l), rows past R zero.
            for (int64_t ri = r0; ri < r1; ri += kGemmTileR) {
              const int mr = (int)std::min<int64_t>(kGemmTileR, r1 - ri);
              PackATileW<kGemmTileR>(apack + (ri - r0) * nl, a + ri * a_rs + l0 * a_is, a_rs, a_is, nl, mr);
            }
          }
          // Strip groups outer, row tiles inner: a group's B strips (2 x 16 columns of the chunk) stay
          // in L1 / L2 while every row tile of the task runs over them (row tiles outer streamed the
          // whole panel per tile). Each C element sees the same micro-kernel calls.
          const int64_t step = (tk.gemm_tile2 ? 2 : 1) * kGemmTileC;
          for (int64_t j0 = 0; j0 < nk; j0 += step) {
            const int64_t nc = std::min(step, nk - j0);
            const float* bj = panel + j0 * per_col;
            for (int64_t ri = r0; ri < r1; ri += kGemmTileR) {
              const int mr = (int)std::min<int64_t>(kGemmTileR, r1 - ri);
              float* cj = c + ri * ldc + k0 + j0;
              if (rows_kernel) {
                GemmStripsRows(tk, a + ri * a_rs + l0, a_rs, bj, kGemmTileC * per_col, kGemmTileC, nl, cj, ldc, mr, nc,
                               overwrite);
              } else {
                GemmStrips(tk, apack + (ri - r0) * nl, bj, kGemmTileC * per_col, kGemmTileC, nl, cj, ldc, mr, nc);
              }
            }
          }
        }
      }
    });
    }
  }
}

}  // namespace

bool GemmSubChunksDefault() { return GetCpuFeatures().intel; }

bool GemmSubChunks() {
  static const bool on = EnvSwitch("LATHE_GEMM_SUBCHUNKS").value_or(GemmSubChunksDefault());
  return on;
}

namespace {

// Calls body(fill, col_align) with the B fill of dX = dY . W for W's dtype: B(l, k) = W(l, k), f32 read
// in place, other dtypes dequantized one panel at a time into the thread's ThreadTmp; columns from a
// multiple of col_align (W's quantization block).
template <typename Body>
void WithBackwardInputFill(const TrainKernelTable& tk, const KernelTable& kt, const Tensor& w, const Body& body) {
  LATHE_CHECK(w.ndim() == 2);
  const int64_t K = w.shape[1];
  if (IsPackedQuant(w.dtype)) {  // NF4/FP4/int8: B chunks dequantized straight from the packed buffer
    if (IsPacked4Bit(w.dtype)) LATHE_CHECK(K % kQuant4Block == 0);
    const quant::QuantKernels& qk = quant::QuantKernelsFor(tk.tier);
    body([&](int64_t l0, int64_t nl, int64_t k0, int64_t nk, float*, int64_t* ld, int64_t, int64_t,
             int64_t) -> const float* {
      float* tmp = ThreadTmp((size_t)(nl * nk));
      quant::DequantPackedBlock(qk, w, l0, nl, k0, nk, tmp, nk);
      *ld = nk;
      return tmp;
    }, (int64_t)kQuant4Block);
    return;
  }
  const size_t rb = w.row_bytes();
  const uint8_t* wd = (const uint8_t*)w.data;
  const DType t = w.dtype;
  if (IsQuantized(t)) LATHE_CHECK(K % 32 == 0);
  body([&](int64_t l0, int64_t nl, int64_t k0, int64_t nk, float*, int64_t* ld, int64_t, int64_t,
           int64_t) -> const float* {
    if (t == DType::kF32) {
      *ld = K;
      return (const float*)w.data + l0 * K + k0;
    }
    float* tmp = ThreadTmp((size_t)(nl * nk));
    kt.mm.dequant_rows(t, wd + l0 * rb + DTypeBytes(t, k0), rb, nl, nk, tmp, nk);
    *ld = nk;
    return tmp;
  }, (int64_t)GetDTypeInfo(t).block_size);
}

}  // namespace

void MatMulBackwardInputWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dx,
                             const float* dy, int64_t M, const Tensor& w, bool accumulate, const float* packed) {
  LATHE_CHECK(w.ndim() == 2);
  const int64_t N = w.shape[0], K = w.shape[1];
  WithBackwardInputFill(tk, kt, w, [&](const auto& fill, int64_t col_align) {
    Gemm(tk, pool, dx, K, M, K, N, dy, N, 1, accumulate, fill, packed, col_align);
  });
}

void MatMulBackwardInputTWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dx,
                              const float* dyT, int64_t M, const Tensor& w, bool accumulate, const float* packed) {
  LATHE_CHECK(w.ndim() == 2);
  const int64_t N = w.shape[0], K = w.shape[1];
  // A(i, l) = dyT[l * M + i]: the packed-A path, 6 contiguous floats per inner row.
  WithBackwardInputFill(tk, kt, w, [&](const auto& fill, int64_t col_align) {
    Gemm(tk, pool, dx, K, M, K, N, dyT, 1, M, accumulate, fill, packed, col_align);
  });
}

GemmSharedFloats GemmSharedPanelFloats() {
  return {(int64_t)SharedAPanelsBuf().size(), (int64_t)SharedPanelsBuf().size()};
}

int64_t GemmAPanelFloatsWith(const TrainKernelTable& tk, int64_t R, int64_t Kd, int64_t L, bool a_rows_contiguous,
                             bool prepacked_b) {
  if (R <= 0 || Kd <= 0 || L <= 0) return 0;
  return APanelFloats(PlanGemm(tk, nullptr, R, Kd, L, a_rows_contiguous ? 1 : 2, prepacked_b, 1));
}

int64_t GemmBPanelFloatsWith(const TrainKernelTable& tk, int64_t Kd, int64_t L, int64_t col_align) {
  if (Kd <= 0 || L <= 0) return 0;
  int64_t most = 0;
  for (int64_t a_is : {1, 2})  // the panel path's column blocks, and the 6 x 16 tiles'
    most = std::max(most, BPanelFloats(PlanGemm(tk, nullptr, 1, Kd, L, a_is, false, col_align), Kd));
  return most;
}

int64_t GemmThreadFloats(const TrainKernelTable& tk, int64_t max_inner, bool converts_w, int64_t col_align) {
  const int64_t inner = InnerChunk(std::max<int64_t>(1, max_inner));
  // ThreadTmp: FewRowsGemm's strips, or a converted (dequantized) B panel (a panel path column block
  // of 192, or 768 for K-quants); ThreadATile: FewRowsGemm's A tiles, or on tiers without a panel tile the weight
  // gradient's 6-row tiles of a row block; FewRowsGemm's edge strip and transposed sums; the
  // forward's converted W rows (f16 / bf16).
  const int64_t panel_cols =
      tk.gemm_panel ? std::max(kColBlock, PanelColBlock(std::max<int64_t>(1, col_align))) : kColBlock;
  const int64_t tmp = std::max((inner + 1) * kColBlock, converts_w ? inner * panel_cols : 0);
  const int64_t atile = std::max(inner * kFewRows, tk.gemm_panel ? 0 : inner * kRowBlock);
  // ThreadPartials: a task's row tiles x one micro-panel, only where chunks are split (GemmSubChunks(), inner > kSubInner),
  // where a panel-path task holds at most kPanelABlockFloats / inner rows (plus one tile's rounding; any
  // chunk up to max_inner may be the one split, so the shortest such), an in-place one kRowBlock; and never
  // more than a product's rows (tokens or a weight's dimension: max_inner bounds them too, rounded to tiles).
  // (Tiers without a panel tile have panel_rows = 0: none of this applies.)
  int64_t partials = 0;
  if (tk.gemm_panel && GemmSubChunks() && inner > kSubInner) {
    const int64_t task_rows = std::max(kPanelABlockFloats / (kSubInner + 1) + 2 * tk.panel_rows, kRowBlock);
    const int64_t rows_bound =
        (std::max<int64_t>(1, max_inner) + tk.panel_rows - 1) / tk.panel_rows * tk.panel_rows + tk.panel_rows;
    partials = std::min(task_rows, rows_bound) * tk.panel_cols;
  }
  return tmp + atile + partials + inner * kGemmTileC + kFewRows * kColBlock + (converts_w ? inner * kColBlock : 0);
}

int64_t PackedBackwardInputFloats(int64_t N, int64_t K) {
  return (K + kGemmTileC - 1) / kGemmTileC * kGemmTileC * N;
}

void PackForBackwardInputWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, const Tensor& w,
                              float* out) {
  LATHE_CHECK(w.ndim() == 2);
  const int64_t N = w.shape[0], K = w.shape[1];
  // Strip s (columns 16 s ..) of W over all N rows at out + s * N * 16, row l at + l * 16; zero past K.
  // (Packed in 256 x 256 pieces; the layout does not depend on the piece size.)
  constexpr int64_t kPiece = 256;
  WithBackwardInputFill(tk, kt, w, [&](const auto& fill, int64_t) {
    const int64_t n_lc = (N + kPiece - 1) / kPiece, n_cb = (K + kColBlock - 1) / kColBlock;
    pool.ParallelFor(n_lc * n_cb, 1, [&](int64_t tb, int64_t te, int) {
      for (int64_t u = tb; u < te; ++u) {
        const int64_t l0 = u / n_cb * kPiece, nl = std::min(kPiece, N - l0);
        const int64_t k0 = u % n_cb * kColBlock, nk = std::min(kColBlock, K - k0);
        int64_t ld = 0;
        const float* p = fill(l0, nl, k0, nk, nullptr, &ld, kGemmTileC, 0, nl);
        for (int64_t j0 = 0; j0 < nk; j0 += kGemmTileC) {
          const int64_t nj = std::min<int64_t>(kGemmTileC, nk - j0);
          float* bs = out + (k0 + j0) * N + l0 * kGemmTileC;
          for (int64_t l = 0; l < nl; ++l)
            for (int64_t j = 0; j < kGemmTileC; ++j) bs[l * kGemmTileC + j] = j < nj ? p[l * ld + j0 + j] : 0.0f;
        }
      }
    });
  });
}

int64_t GemmInnerChunk(int64_t L) { return InnerChunk(L); }

namespace {

// MatMulForwardStrips, with A packed beforehand (apre, PackAPanels for the whole product) or not.
void StripsGemm(const TrainKernelTable& tk, const MatMulKernels& mm, ThreadPool& pool, float* y, const float* x,
                int64_t M, DType t, const void* strips, int64_t N, int64_t K, const float* apre) {
  LATHE_CHECK(t == DType::kF32 || t == DType::kF16 || t == DType::kBF16);
  if (t == DType::kF32) {  // the strips are the forward's B packed for every column and inner row
    Gemm(tk, pool, y, N, M, N, K, x, K, 1, false, [](int64_t, int64_t, int64_t, int64_t, float*, int64_t*, int64_t, int64_t, int64_t) {
      return (const float*)nullptr;
    }, (const float*)strips, 1, apre);
    return;
  }
  const uint16_t* s16 = (const uint16_t*)strips;
  // Strip (k0 + j0) / 16's rows l0 .. l0 + nl - 1 are nl * 16 consecutive elements: one "row" to convert
  // into a plain strip, or nl rows of 16 into an interleaved micro-panel's.
  auto fill = [&](int64_t l0, int64_t nl, int64_t k0, int64_t nk, float* panel, int64_t*, int64_t mpw, int64_t row,
                  int64_t nl_panel) -> const float* {
    for (int64_t j0 = 0; j0 < nk; j0 += kGemmTileC) {
      int64_t ldo = 0;
      float* bs = PanelStrip(panel, nl_panel, nk, mpw, j0, &ldo) + row * ldo;
      const uint8_t* src = (const uint8_t*)(s16 + (((k0 + j0) / kGemmTileC) * K + l0) * kGemmTileC);
      if (ldo == kGemmTileC)
        mm.dequant_rows(t, src, 0, 1, nl * kGemmTileC, bs, 0);
      else
        mm.dequant_rows(t, src, 2 * kGemmTileC, nl, kGemmTileC, bs, ldo);
    }
    return nullptr;
  };
  Gemm(tk, pool, y, N, M, N, K, x, K, 1, false, fill, nullptr, 1, apre);
}

}  // namespace

void MatMulForwardStrips(const TrainKernelTable& tk, const MatMulKernels& mm, ThreadPool& pool, float* y,
                         const float* x, int64_t M, DType t, const void* strips, int64_t N, int64_t K) {
  StripsGemm(tk, mm, pool, y, x, M, t, strips, N, K, nullptr);
}

void MatMulForwardStripsShared(const TrainKernelTable& tk, const MatMulKernels& mm, ThreadPool& pool, const float* x,
                               int64_t M, int64_t K, std::span<const StripsProduct> ws) {
  // A is packed once where every product's plan packs it the same way in one round of one superblock (the
  // panel path; SmolLM2's q / k / v and gate / up at any prompt length up to kSharedAFloats / K rows).
  bool share = ws.size() > 1 && M > 0;
  GemmPlan first;
  for (size_t i = 0; i < ws.size() && share; ++i) {
    const GemmPlan p = PlanGemm(tk, &pool, M, ws[i].N, K, 1, ws[i].t == DType::kF32, 1);
    if (i == 0) first = p;
    share = p.panel_rows && p.chunks == p.n_lc_all && p.sb_rows >= M && p.panel_rows == first.panel_rows &&
            p.inner == first.inner;
  }
  if (!share) {
    for (const StripsProduct& w : ws) StripsGemm(tk, mm, pool, w.y, x, M, w.t, w.strips, w.N, K, nullptr);
    return;
  }
  const int64_t pr = first.panel_rows, n_tiles = (M + pr - 1) / pr;
  float* apre = SharedAPanels((size_t)(first.n_lc_all * n_tiles * pr * first.inner));
  PackAPanels(tk, pool, first, x, K, 1, K, 0, first.n_lc_all, 0, M, apre);
  for (const StripsProduct& w : ws) StripsGemm(tk, mm, pool, w.y, x, M, w.t, w.strips, w.N, K, apre);
}

void MatMulForwardWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* y,
                       const float* x, int64_t M, const Tensor& w, bool accumulate) {
  MatMulForwardMm(tk, kt.mm, pool, y, x, M, w, accumulate);
}

namespace {

// The forward's B (l, k) = W(k, l) for inner rows [l0, l0 + nl) and columns [k0, k0 + nk) of W (N, K) in f32 / f16 /
// bf16 or a block type (converted to f32 first), transposed straight into the 16-column strips of a panel nl_panel
// rows deep from its row `row` on (each W row's run of nl floats becomes one strip column).
void PackForwardB(const TrainKernelTable& tk, const MatMulKernels& mm, const Tensor& w, int64_t l0, int64_t nl,
                  int64_t k0, int64_t nk, float* panel, int64_t nl_panel, int64_t row, int64_t mpw) {
  static thread_local std::vector<float> rows_buf;
  const int64_t K = w.shape[1];
  const DType t = w.dtype;
  const float* src = (const float*)w.data + k0 * K + l0;
  int64_t src_ld = K;
  if (t != DType::kF32) {  // block types from the whole blocks around the rows (chunks need not start on one)
    const int64_t bs = GetDTypeInfo(t).block_size, b0 = l0 / bs * bs, b1 = std::min(K, (l0 + nl + bs - 1) / bs * bs);
    const size_t rb = w.row_bytes();
    float* rows = Scratch(rows_buf, (size_t)(nk * (b1 - b0)));
    mm.dequant_rows(t, (const uint8_t*)w.data + k0 * rb + DTypeBytes(t, b0), rb, nk, b1 - b0, rows, b1 - b0);
    src = rows + (l0 - b0);
    src_ld = b1 - b0;
  }
  for (int64_t j0 = 0; j0 < nk; j0 += kGemmTileC) {
    int64_t ldo = 0;
    float* bs = PanelStrip(panel, nl_panel, nk, mpw, j0, &ldo) + row * ldo;
    tk.pack_strip_t(bs, ldo, src + j0 * src_ld, src_ld, nl, (int)std::min<int64_t>(kGemmTileC, nk - j0));
  }
}

// Inner chunks of an inner dimension L.
int64_t InnerChunks(int64_t L) { return (L + InnerChunk(L) - 1) / InnerChunk(L); }

}  // namespace

void MatMulForwardMm(const TrainKernelTable& tk, const MatMulKernels& mm, ThreadPool& pool, float* y,
                     const float* x, int64_t M, const Tensor& w, bool accumulate) {
  LATHE_CHECK(w.ndim() == 2);
  const int64_t N = w.shape[0], K = w.shape[1];
  LATHE_CHECK(!IsPackedQuant(w.dtype));
  LATHE_CHECK(K % GetDTypeInfo(w.dtype).block_size == 0);
  auto fill = [&](int64_t l0, int64_t nl, int64_t k0, int64_t nk, float* panel, int64_t*, int64_t mpw, int64_t row,
                  int64_t nl_panel) -> const float* {
    PackForwardB(tk, mm, w, l0, nl, k0, nk, panel, nl_panel, row, mpw);
    return nullptr;
  };
  Gemm(tk, pool, y, N, M, N, K, x, K, 1, accumulate, fill);
}

bool PlusFusedWith(const TrainKernelTable& tk, int64_t Kd, int64_t L, int64_t L2) {
  return tk.gemm_panel && Kd >= kPanelMinCols && L > 0 && L2 > 0 && InnerChunks(L + L2) == InnerChunks(L);
}

void MatMulForwardPlusWith(const TrainKernelTable& tk, const MatMulKernels& mm, ThreadPool& pool, float* y,
                           const float* x, int64_t M, const Tensor& w, const float* x2, const Tensor& w2,
                           bool accumulate) {
  LATHE_CHECK(w.ndim() == 2 && w2.ndim() == 2 && w2.dtype == DType::kF32 && w2.shape[0] == w.shape[0]);
  LATHE_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16);
  const int64_t N = w.shape[0], K = w.shape[1], K2 = w2.shape[1];
  LATHE_CHECK_MSG(PlusFusedWith(tk, N, K, K2), "MatMulForwardPlus: not one product here (N %lld, K %lld + %lld)",
                  (long long)N, (long long)K, (long long)K2);
  // B rows l < K: W^T; l >= K: W2^T.
  auto fill = [&](int64_t l0, int64_t nl, int64_t k0, int64_t nk, float* panel, int64_t*, int64_t mpw, int64_t row,
                  int64_t nl_panel) -> const float* {
    const int64_t n1 = std::clamp<int64_t>(K - l0, 0, nl);
    if (n1 > 0) PackForwardB(tk, mm, w, l0, n1, k0, nk, panel, nl_panel, row, mpw);
    if (n1 < nl) PackForwardB(tk, mm, w2, l0 + n1 - K, nl - n1, k0, nk, panel, nl_panel, row + n1, mpw);
    return nullptr;
  };
  const ASecond a2{x2, K2, K};
  Gemm(tk, pool, y, N, M, N, K + K2, x, K, 1, accumulate, fill, nullptr, 1, nullptr, &a2);
}

void MatMulBackwardInputPlusWith(const TrainKernelTable& tk, const KernelTable& kt, ThreadPool& pool, float* dx,
                                 const float* dy, int64_t M, const Tensor& w, const float* dy2, const Tensor& w2,
                                 bool accumulate) {
  LATHE_CHECK(w.ndim() == 2 && w2.ndim() == 2 && w2.dtype == DType::kF32 && w2.shape[1] == w.shape[1]);
  const int64_t N = w.shape[0], K = w.shape[1], N2 = w2.shape[0];
  LATHE_CHECK_MSG(PlusFusedWith(tk, K, N, N2), "MatMulBackwardInputPlus: not one product here (K %lld, N %lld + %lld)",
                  (long long)K, (long long)N, (long long)N2);
  const float* w2d = (const float*)w2.data;
  WithBackwardInputFill(tk, kt, w, [&](const auto& fill_w, int64_t col_align) {
    // B rows l < N: W's (as its own fill gives them); l >= N: W2's, f32 in place. Both into the panel's strips.
    auto fill = [&](int64_t l0, int64_t nl, int64_t k0, int64_t nk, float* panel, int64_t*, int64_t mpw, int64_t row,
                  int64_t nl_panel) -> const float* {
      const int64_t n1 = std::clamp<int64_t>(N - l0, 0, nl);
      if (n1 > 0) {
        int64_t ld1 = 0;
        const float* p1 = fill_w(l0, n1, k0, nk, nullptr, &ld1, mpw, 0, n1);
        CopyIntoStrips(panel, nl_panel, row, n1, nk, mpw, p1, ld1);
      }
      if (n1 < nl) CopyIntoStrips(panel, nl_panel, row + n1, nl - n1, nk, mpw, w2d + (l0 + n1 - N) * K + k0, K);
      return nullptr;
    };
    const ASecond a2{dy2, N2, N};
    Gemm(tk, pool, dx, K, M, K, N + N2, dy, N, 1, accumulate, fill, nullptr, col_align, nullptr, &a2);
  });
}

bool LoraGradPairWith(const TrainKernelTable& tk, ThreadPool& pool, float* dmid, float* dB, const float* dy,
                      const float* smid, const float* B, int64_t M, int64_t out, int64_t r) {
  if (!tk.lora_grad_pair || r < 1 || r > 16 || out <= kFewRows || M <= 0 || pool.size() != 1) return false;
  static thread_local std::vector<float> acc;
  tk.lora_grad_pair(dmid, dB, dy, smid, B, M, out, (int)r, InnerChunk(out), InnerChunk(M),
                    Scratch(acc, (size_t)(out * 16)));
  return true;
}

bool LoraGradAWith(const TrainKernelTable& tk, ThreadPool& pool, float* dA, const float* dmid, const float* x,
                   int64_t M, int64_t K, int64_t r) {
  if (!tk.lora_grad_a || r < 1 || r > 16 || M <= 0 || K <= 0) return false;
  // Column blocks of 64 on the pool (each element's chain is the same whichever thread runs it).
  constexpr int64_t kCols = 64;
  const int64_t chunk = InnerChunk(M);
  pool.ParallelFor((K + kCols - 1) / kCols, 1, [&](int64_t b, int64_t e, int) {
    tk.lora_grad_a(dA, dmid, x, M, K, (int)r, b * kCols, std::min(K, e * kCols), chunk);
  });
  return true;
}

// P(n, k) = sum_m a[m * a_ld + n] * x[m * ldx + k] for n < N <= kFewRows (the LoRA rank), k < K, added
// to c[n * ldc + k], or with transposed to c[k * ldc + n] (then each inner chunk's sums go through a
// per-thread buffer first). B = x is packed per (kColBlock, InnerChunk(M)) block into a per-thread
// buffer (L2), then strips outer, row tiles inner (a strip pair stays in L1 / L2 for the row tiles).
// Per C element the micro-kernel calls are those of Gemm's packed path (one chunk's FMA chain, then
// one add per chunk), so either form is bit-identical to it.
void FewRowsGemm(const TrainKernelTable& tk, ThreadPool& pool, float* c, int64_t ldc, bool transposed, const float* a,
                 int64_t a_ld, int64_t N, const float* x, int64_t ldx, int64_t M, int64_t K) {
  const int64_t n_cb = (K + kColBlock - 1) / kColBlock, n_rt = (N + kGemmTileR - 1) / kGemmTileR;
  const int64_t inner = InnerChunk(M);
  pool.ParallelFor(n_cb, 1, [&](int64_t tb, int64_t te, int) {
    float* apack = ThreadATile((size_t)(inner * kGemmTileR * n_rt));
    static thread_local std::vector<float> tbuf, ebuf;
    float* tmp = transposed ? Scratch(tbuf, (size_t)(kFewRows * kColBlock)) : nullptr;
    float* edge = Scratch(ebuf, (size_t)(inner * kGemmTileC));  // the last partial strip, zero-padded
    float* bstrips = ThreadTmp((size_t)((inner + 1) * kColBlock));  // the block's whole strips, packed
    for (int64_t cb = tb; cb < te; ++cb) {
      const int64_t k0 = cb * kColBlock, nk = std::min(kColBlock, K - k0);
      // Row tile t's sums go to ct + t * 6 * ldt (+ column j).
      float* ct = transposed ? tmp : c + k0;
      const int64_t ldt = transposed ? kColBlock : ldc;
      for (int64_t l0 = 0; l0 < M; l0 += inner) {
        const int64_t nl = std::min(inner, M - l0);
        const int64_t full = nk / kGemmTileC * kGemmTileC;
        if (transposed) std::fill(tmp, tmp + N * kColBlock, 0.0f);
        if (full < nk) {
          const int nj = (int)(nk - full);
          for (int64_t l = 0; l < nl; ++l)
            for (int j = 0; j < kGemmTileC; ++j) edge[l * kGemmTileC + j] = j < nj ? x[(l0 + l) * ldx + k0 + full + j] : 0.0f;
        }
        for (int64_t t = 0; t < n_rt; ++t) {
          const int64_t ri = t * kGemmTileR;
          const int mr = (int)std::min<int64_t>(kGemmTileR, N - ri);
          PackATileW<kGemmTileR>(apack + t * inner * kGemmTileR, a + l0 * a_ld + ri, 1, a_ld, nl, mr);
        }
        // The block's whole strips packed first, row by row (x's rows read in order: strip by strip,
        // every row a new line at a large stride, the reads waited on memory latency; read in place
        // by the micro-kernel, the rows of a strip fell in a few L1 sets at strides like 576 or 1536).
        // Strips sstride floats apart: one cache line more than a strip, or the row-by-row writes (16
        // KiB apart at nl = 256) all fell in one L1 set.
        const int64_t sstride = nl * kGemmTileC + kGemmTileC;
        for (int64_t l = 0; l < nl; ++l) {
          const float* xl = x + (l0 + l) * ldx + k0;
          for (int64_t j = 0; j < full; j += kGemmTileC)
            std::memcpy(bstrips + j / kGemmTileC * sstride + l * kGemmTileC, xl + j, sizeof(float) * kGemmTileC);
        }
        const int64_t step = (tk.gemm_tile2 ? 2 : 1) * kGemmTileC;
        for (int64_t j0 = 0; j0 < full; j0 += step) {
          const int64_t nc = std::min(step, full - j0);
          for (int64_t t = 0; t < n_rt; ++t)
            GemmStrips(tk, apack + t * inner * kGemmTileR, bstrips + j0 / kGemmTileC * sstride, sstride, kGemmTileC, nl,
                       ct + t * kGemmTileR * ldt + j0, ldt, (int)std::min<int64_t>(kGemmTileR, N - t * kGemmTileR), nc);
        }
        if (full < nk)
          for (int64_t t = 0; t < n_rt; ++t)
            tk.gemm_tile(apack + t * inner * kGemmTileR, edge, kGemmTileC, nl, ct + t * kGemmTileR * ldt + full, ldt,
                         (int)std::min<int64_t>(kGemmTileR, N - t * kGemmTileR), (int)(nk - full));
        if (transposed)
          for (int64_t j = 0; j < nk; ++j)
            for (int64_t n = 0; n < N; ++n) c[(k0 + j) * ldc + n] += tmp[n * kColBlock + j];
      }
    }
  });
}

// dw (N, K) += A . x, A(n, m) = a[n * a_rs + m * a_is] (dY^T: a_rs = 1, a_is = N; dY given
// transposed: a_rs = M, a_is = 1), B = x (M, K) rows.
void WeightGrad(const TrainKernelTable& tk, ThreadPool& pool, float* dw, const float* a, int64_t a_rs, int64_t a_is,
                const float* x, int64_t M, int64_t N, int64_t K) {
  auto fill = [&](int64_t l0, int64_t, int64_t k0, int64_t, float*, int64_t* ld, int64_t, int64_t, int64_t) -> const float* {
    *ld = K;
    return x + l0 * K + k0;
  };
  Gemm(tk, pool, dw, K, N, K, M, a, a_rs, a_is, /*accumulate=*/true, fill);
}

void MatMulBackwardWeightWith(const TrainKernelTable& tk, ThreadPool& pool, float* dw, const float* dy,
                              const float* x, int64_t M, int64_t N, int64_t K) {
  if (M <= 0 || K <= 0 || N <= 0) return;
  if (N <= kFewRows) {  // dw (N, K), N = rank: the LoRA A gradient
    FewRowsGemm(tk, pool, dw, K, /*transposed=*/false, dy, N, N, x, K, M, K);
    return;
  }
  if (K <= kFewRows) {  // dw (N, K), K = rank: the LoRA B gradient, as dw^T = x^T . dy
    FewRowsGemm(tk, pool, dw, K, /*transposed=*/true, x, K, K, dy, N, M, N);
    return;
  }
  WeightGrad(tk, pool, dw, dy, 1, N, x, M, N, K);
}

void MatMulBackwardWeightTWith(const TrainKernelTable& tk, ThreadPool& pool, float* dw, const float* dyT,
                               const float* x, int64_t M, int64_t N, int64_t K) {
  WeightGrad(tk, pool, dw, dyT, M, 1, x, M, N, K);
}

}  // namespace lathe::kernels::cpu
