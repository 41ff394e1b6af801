// bf16 pair products on AMX tiles (amx_tile + amx_bf16: Sapphire Rapids and later Xeons), for the training GEMM
// where UsesAmxBf16() (bf16_amx.h says what is computed). The pair layouts are AMX's own: an A tile is 16 rows of
// 16 pairs (64 bytes a row, read in place with A's row stride), a B tile 16 pair rows of one 16-column strip (1 KB,
// contiguous in a strip). The register tile: 2 A tiles x 2 B tiles -> 4 C tiles (32 x 32 f32); tails by the tile
// configuration (fewer rows, fewer columns: nothing read or written past an edge), the last partial step of
// pairs from zero-padded copies. One tdpbf16ps does 16 x 16 x 32 multiply-adds: ~2.9 TFLOP/s on one core of the
// Xeon measured (Granite Rapids class, 2.6 GHz), 14x its f32 FMA peak.
#include "kernels/cpu/bf16_amx.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/scratch.h"

namespace lathe::kernels::cpu::amx {

namespace {

// Tiles: 0 C00, 1 C01, 2 C10, 3 C11 (C row tile i, strip j: 2 i + j); 4, 5 A row tiles; 6, 7 B strips.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The configuration in force on this thread: loaded when the tile shape changes (loading zeroes the tiles, so
// only between register tiles), kept between PairGemmBlock calls (the attention's many small products), released
// by ReleaseTiles (PairGemm's tasks, at their end). Every load and release of the process's tiles goes through
// here, so the record is the thread's real state.
class Tiles {
 public:
  // r0, r1: rows of the two row tiles (r1 0: one); n0, n1: columns of the two strips (n1 0: one).
  void Shape(int r0, int r1, int n0, int n1) {
    if (loaded_ && r0 == r0_ && r1 == r1_ && n0 == n0_ && n1 == n1_) return;
    TileConfig cfg;
    const int rr[2] = {r0, r1}, nn[2] = {n0, n1};
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 2; ++j) {
        if (rr[i] > 0 && nn[j] > 0) cfg.rows[2 * i + j] = (uint8_t)rr[i], cfg.colsb[2 * i + j] = (uint16_t)(4 * nn[j]);
      }
      if (rr[i] > 0) cfg.rows[4 + i] = (uint8_t)rr[i], cfg.colsb[4 + i] = 64;
      if (nn[i] > 0) cfg.rows[6 + i] = 16, cfg.colsb[6 + i] = (uint16_t)(4 * nn[i]);
    }
    if (r1 == 0) {  // one row tile: 5 a second A, 2 and 3 second B strips (Kernel<1, NT> alternates the two sets)
      cfg.rows[5] = (uint8_t)r0, cfg.colsb[5] = 64;
      for (int j = 0; j < 2; ++j)
        if (nn[j] > 0) cfg.rows[2 + j] = 16, cfg.colsb[2 + j] = (uint16_t)(4 * nn[j]);
    }
    _tile_loadconfig(&cfg);
    loaded_ = true, r0_ = r0, r1_ = r1, n0_ = n0, n1_ = n1;
  }
  void Release() {
    if (loaded_) _tile_release();
    loaded_ = false;
  }
  ~Tiles() { Release(); }

 private:
  bool loaded_ = false;
  int r0_ = 0, r1_ = 0, n0_ = 0, n1_ = 0;
};

Tiles& ThreadTiles() {
  static thread_local Tiles t;
  return t;
}

// MT row tiles x NT strips: `steps` full steps of 16 pairs from B's strips, then (btail non-null) one step from
// the zero-padded copy btail (16 x 16 dwords per strip). A in tiles (TileRows): step s's row tiles at at + s * 512
// and + 256, the last partial step's included.
template <int MT, int NT>
void Kernel(const uint32_t* at, const uint32_t* b, int64_t sstride, int64_t steps, const uint32_t* btail, float* c,
            int64_t ldc, bool load_c) {
  const int64_t sc = ldc * 4;
  if (load_c) {
    _tile_loadd(0, c, sc);
    if constexpr (NT > 1) _tile_loadd(1, c + 16, sc);
    if constexpr (MT > 1) _tile_loadd(2, c + 16 * ldc, sc);
    if constexpr (MT > 1 && NT > 1) _tile_loadd(3, c + 16 * ldc + 16, sc);
  } else {
    _tile_zero(0);
    if constexpr (NT > 1) _tile_zero(1);
    if constexpr (MT > 1) _tile_zero(2);
    if constexpr (MT > 1 && NT > 1) _tile_zero(3);
  }
  const uint32_t* b1 = b + sstride;
  const int64_t n = steps + (btail ? 1 : 0);
  if constexpr (MT == 1) {
    // One row tile (decode, small batches: W streams from DRAM): two sets of input tiles, one step each in turn, so
    // a step's loads need not wait for the previous step's products to release their tiles.
#define LATHE_AMX_STEP(TA, TB0, TB1, st)                                                      \
  do {                                                                                        \
    const bool tl = (st) == steps;                                                            \
    _tile_loadd(TA, at + 512 * (st), 64);                                                     \
    _tile_loadd(TB0, tl ? btail : b + 256 * (st), 64);                                        \
    if constexpr (NT > 1) _tile_loadd(TB1, tl ? btail + 256 : b1 + 256 * (st), 64);            \
    _tile_dpbf16ps(0, TA, TB0);                                                               \
    if constexpr (NT > 1) _tile_dpbf16ps(1, TA, TB1);                                         \
  } while (0)
    // The two steps' B lines requested just before their tile loads (SmolLM2 bf16 decode, 2 threads: 96-97 tok/s
    // without, 101-102 so, 97-106 two steps ahead, L2 prefetches 4-16 steps ahead no better; single-buffered tiles
    // and rows past `rows` zero-filled: 82-88; the pair tiles' RowGemm: 104-108).
    for (int64_t s = 0; s < n; s += 2) {
      for (int64_t q = s; q < std::min(steps, s + 2); ++q) {
        const char* p0 = (const char*)(b + 256 * q);
        const char* p1 = (const char*)(b1 + 256 * q);
#pragma GCC unroll 16
        for (int r = 0; r < 16; ++r) {
          _mm_prefetch(p0 + 64 * r, _MM_HINT_T0);
          if constexpr (NT > 1) _mm_prefetch(p1 + 64 * r, _MM_HINT_T0);
        }
      }
      LATHE_AMX_STEP(4, 6, 7, s);
      if (s + 1 < n) LATHE_AMX_STEP(5, 2, 3, s + 1);
    }
#undef LATHE_AMX_STEP
    _tile_stored(0, c, sc);
    if constexpr (NT > 1) _tile_stored(1, c + 16, sc);
    return;
  }
  // Two row tiles: one set of input tiles, each loaded once a step for two products.
  for (int64_t s = 0; s < n; ++s) {
    const bool tail = s == steps;
    // The next step's B lines fetched into L1 while this one runs (the tile load would wait on L2: measured +8-10%
    // on SmolLM2's 512-row products; two or four steps ahead the same, A's tiles too a loss).
    if (s + 1 < steps) {
      const char* p0 = (const char*)(b + 256 * (s + 1));
      const char* p1 = (const char*)(b1 + 256 * (s + 1));
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) {
        _mm_prefetch(p0 + 64 * r, _MM_HINT_T0);
        if constexpr (NT > 1) _mm_prefetch(p1 + 64 * r, _MM_HINT_T0);
      }
    }
    _tile_loadd(4, at + 512 * s, 64);
    _tile_loadd(6, tail ? btail : b + 256 * s, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NT > 1) {
      _tile_loadd(7, tail ? btail + 256 : b1 + 256 * s, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    _tile_loadd(5, at + 512 * s + 256, 64);
    _tile_dpbf16ps(2, 5, 6);
    if constexpr (NT > 1) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, sc);
  if constexpr (NT > 1) _tile_stored(1, c + 16, sc);
  _tile_stored(2, c + 16 * ldc, sc);
  if constexpr (NT > 1) _tile_stored(3, c + 16 * ldc + 16, sc);
}

}  // namespace

// TileRows (bf16_amx.h): each tile load is then 1 KB in one piece (a strided A: 16 lines 4 * lda bytes apart;
// measured ~20% more products per second from L2 in one piece), and the last partial step comes for free. Rows past
// `rows` are not written: Tiles::Shape gives a partial row tile only its rows.
void TileRows(const uint32_t* a, int64_t lda, int64_t rows, int64_t Lp, uint32_t* out) {
  const int64_t S = (Lp + 15) / 16, full = Lp / 16, kt = Lp % 16;
  const __mmask16 tail = (__mmask16)((1u << kt) - 1);
  for (int64_t q = 0; q < (rows + 31) / 32; ++q)
    for (int r = 0; r < 32; ++r) {
      const int64_t i = 32 * q + r;
      uint32_t* o = out + q * S * 512 + (r / 16) * 256 + (r % 16) * 16;
      if (i >= rows) break;  // a partial row tile's missing rows: its configuration loads only those present
      const uint32_t* src = a + i * lda;
      for (int64_t s = 0; s < full; ++s) _mm512_storeu_si512(o + 512 * s, _mm512_loadu_si512(src + 16 * s));
      if (kt) _mm512_storeu_si512(o + 512 * full, _mm512_maskz_loadu_epi32(tail, src + 16 * full));
    }
}

namespace {

using KernelFn = void (*)(const uint32_t*, const uint32_t*, int64_t, int64_t, const uint32_t*, float*, int64_t, bool);

KernelFn KernelFor(int mt, int nt) {
  if (mt > 1) return nt > 1 ? &Kernel<2, 2> : &Kernel<2, 1>;
  return nt > 1 ? &Kernel<1, 2> : &Kernel<1, 1>;
}

// A block's tiles (TileRows).
uint32_t* TileBuf(size_t n) {
  static thread_local std::vector<uint32_t> buf;
  return Scratch(buf, n);
}

}  // namespace

int64_t TiledDwords(int64_t rows, int64_t Lp) { return (rows + 31) / 32 * ((Lp + 15) / 16) * 512; }

void PairGemmBlockTiled(float* c, int64_t ldc, int64_t m0, int64_t m1, int64_t s0, int64_t s1, int64_t Kd, int64_t Lp,
                        const uint32_t* at, const uint32_t* b, int64_t sstride, bool accumulate, int64_t qstride) {
  if (m1 <= m0 || s1 <= s0) return;
  const int64_t steps = Lp / 16, kt = Lp % 16, rows = m1 - m0;
  if (qstride <= 0) qstride = (Lp + 15) / 16 * 512;
  // Each strip's last partial step zero-padded (strip s's at bt + (s - s0) * 256).
  uint32_t* bt = nullptr;
  if (kt) {
    static thread_local std::vector<uint32_t> buf;
    const int64_t b_dw = (s1 - s0 + 1) / 2 * 2 * 256;
    bt = Scratch(buf, (size_t)b_dw);
    std::memset(bt, 0, (size_t)b_dw * 4);
    for (int64_t s = s0; s < s1; ++s) std::memcpy(bt + (s - s0) * 256, b + s * sstride + 256 * steps, (size_t)kt * 64);
  }
  // Strip pairs outer, row pairs inner: a strip pair's B (2 x Lp x 64 bytes) is read from L2 once for the block's
  // rows. Measured (1536 x 576 and 576 x 1536, M 512, 1 thread): the other order, blocks of 4-16 steps along the
  // pairs (C reloaded between them: the same bits) and 32-512 rows per task were all within -15% .. +5% of this.
  Tiles& tiles = ThreadTiles();
  for (int64_t s = s0; s < s1; s += 2) {
    const int nt = (int)std::min<int64_t>(2, s1 - s);
    const int n0 = (int)std::min<int64_t>(16, Kd - 16 * s);
    const int n1 = nt > 1 ? (int)std::min<int64_t>(16, Kd - 16 * (s + 1)) : 0;
    for (int64_t i = 0; i < rows; i += 32) {
      const int r = (int)std::min<int64_t>(32, rows - i), r0 = std::min(16, r), r1 = r - r0;
      tiles.Shape(r0, r1, n0, n1);
      KernelFor(r1 > 0 ? 2 : 1, nt)(at + i / 32 * qstride, b + s * sstride, sstride, steps,
                                   kt ? bt + (s - s0) * 256 : nullptr, c + (m0 + i) * ldc + 16 * s, ldc, accumulate);
    }
  }
}

void PairGemmBlock(float* c, int64_t ldc, int64_t m0, int64_t m1, int64_t s0, int64_t s1, int64_t Kd, int64_t Lp,
                   const uint32_t* a, int64_t lda, const uint32_t* b, int64_t sstride, bool accumulate) {
  if (m1 <= m0 || s1 <= s0) return;
  uint32_t* at = TileBuf((size_t)TiledDwords(m1 - m0, Lp));
  TileRows(a, lda, m1 - m0, Lp, at);
  PairGemmBlockTiled(c, ldc, m0, m1, s0, s1, Kd, Lp, at, b, sstride, accumulate);
}

namespace {
// PairGemm's tasks: 64 C rows x a group of strips, enough of them to share among the threads (4 a thread), strips in
// pairs (the register tile's two); block(m0, m1, s0, s1) runs one, each thread releases its tiles at the end.
template <typename Block>
void OverTasks(ThreadPool& pool, int64_t R, int64_t Kd, int64_t Lp, Block block) {
  constexpr int64_t kRows = 64;
  const int64_t n_strips = (Kd + 15) / 16, n_mb = (R + kRows - 1) / kRows, th = pool.size();
  const int64_t want = th > 1 ? 4 * th : 1, n_sg_want = std::max<int64_t>(1, (want + n_mb - 1) / n_mb);
  const int64_t per = std::max<int64_t>(2, ((n_strips + n_sg_want - 1) / n_sg_want + 1) / 2 * 2);
  const int64_t n_sg = (n_strips + per - 1) / per;
  pool.ParallelFor(n_mb * n_sg, 1, [&](int64_t tb, int64_t te, int) {
    for (int64_t t = tb; t < te; ++t) {
      const int64_t mb = t / n_sg, sg = t % n_sg;
      const int64_t m0 = mb * kRows, s0 = sg * per;
      block(m0, std::min(R, m0 + kRows), s0, std::min(n_strips, s0 + per));
    }
    ReleaseTiles();
  }, 2.0 * R * Kd * Lp * 2);
}
}  // namespace

void PairGemm(ThreadPool& pool, float* c, int64_t ldc, int64_t R, int64_t Kd, int64_t Lp, const uint32_t* a,
              int64_t lda, const uint32_t* b, bool accumulate) {
  OverTasks(pool, R, Kd, Lp, [&](int64_t m0, int64_t m1, int64_t s0, int64_t s1) {
    PairGemmBlock(c, ldc, m0, m1, s0, s1, Kd, Lp, a + m0 * lda, lda, b, Lp * 16, accumulate);
  });
}

void PairGemmTiled(ThreadPool& pool, float* c, int64_t ldc, int64_t R, int64_t Kd, int64_t Lp, const uint32_t* at,
                   int64_t qstride, const uint32_t* b, bool accumulate) {
  if (qstride <= 0) qstride = (Lp + 15) / 16 * 512;
  OverTasks(pool, R, Kd, Lp, [&](int64_t m0, int64_t m1, int64_t s0, int64_t s1) {
    PairGemmBlockTiled(c, ldc, m0, m1, s0, s1, Kd, Lp, at + m0 / 32 * qstride, b, Lp * 16, accumulate, qstride);
  });
}

void ReleaseTiles() { ThreadTiles().Release(); }

}  // namespace lathe::kernels::cpu::amx
