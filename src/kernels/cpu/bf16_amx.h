// bf16 pair products on AMX tiles (bf16dot_amx.cc), for the pair GEMM of bf16dot_avx512bf16.cc where
// UsesAmxBf16() (core/cpu.h). Operands in the pair layouts of bf16_pairs.h: A row-major pairs (lda dwords a row),
// B 16-column pair strips (strip s at b + s * sstride, its pair p at + p * 16: one 64-byte row of a B tile).
// Per C element: one tdpbf16ps per 16 pairs (a call's last partial step zero-padded) onto an f32 accumulator that
// starts at zero, or at C's value with accumulate. That accumulator is C's own f32 value between steps, so a
// product split along its pairs at multiples of 16 into accumulating calls gives the one call's bits; a row's
// result depends only on its own A row and B, not on M, the other rows, the task split or the thread count.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace lathe::kernels::cpu::amx {

// C rows [m0, m1) (c + i * ldc, row i absolute; a at A's row m0, lda dwords apart) over strips [s0, s1) of B
// (Kd columns in all: the last strip's columns past Kd left alone), Lp pairs. On the calling thread, whose tile
// configuration stays loaded after it (for the next small product) until ReleaseTiles.
void PairGemmBlock(float* c, int64_t ldc, int64_t m0, int64_t m1, int64_t s0, int64_t s1, int64_t Kd, int64_t Lp,
                   const uint32_t* a, int64_t lda, const uint32_t* b, int64_t sstride, bool accumulate);

// A's rows [0, rows) (lda dwords apart, Lp pairs each) in tile order (TiledDwords(rows, Lp) dwords at out): row
// pair q's step s of ceil(Lp / 16) at out + (q * S + s) * 512, its rows 0-15 then 16-31, each row's 16 pairs in
// 64 bytes, zero past Lp (a partial row tile's missing rows left unwritten: never loaded). For an A that many blocks share (PairGemmBlockTiled).
int64_t TiledDwords(int64_t rows, int64_t Lp);
void TileRows(const uint32_t* a, int64_t lda, int64_t rows, int64_t Lp, uint32_t* out);
// PairGemmBlock with A already in tile order: at holds rows [m0, m1) (TileRows of A's rows from m0; m0 a
// multiple of 32 within a larger tiled A: at + m0 / 32 * ceil(Lp / 16) * 512). The same bits.
// qstride: dwords between at's row pairs (0: ceil(Lp / 16) * 512; more for the first Lp pairs of a wider tiled A).
void PairGemmBlockTiled(float* c, int64_t ldc, int64_t m0, int64_t m1, int64_t s0, int64_t s1, int64_t Kd, int64_t Lp,
                        const uint32_t* at, const uint32_t* b, int64_t sstride, bool accumulate, int64_t qstride = 0);

// PairGemm with A (R rows) already in tile order (TileRows' layout, row pairs qstride dwords apart: 0 for
// ceil(Lp / 16) * 512), as the packers write it for AMX (bf16_pairs.h, TiledPairs): no per-task copy. The same bits.
void PairGemmTiled(ThreadPool& pool, float* c, int64_t ldc, int64_t R, int64_t Kd, int64_t Lp, const uint32_t* at,
                   int64_t qstride, const uint32_t* b, bool accumulate);  // each task's thread releases its tiles

// Returns the calling thread's tiles to the init state (nothing held, nothing for the OS to save).
void ReleaseTiles();

// C (R, Kd), row stride ldc, (=, +=) A . B over Lp pairs, strips Lp * 16 dwords apart, the pool's threads.
void PairGemm(ThreadPool& pool, float* c, int64_t ldc, int64_t R, int64_t Kd, int64_t Lp, const uint32_t* a,
              int64_t lda, const uint32_t* b, bool accumulate);  // each task's thread releases its tiles

}  // namespace lathe::kernels::cpu::amx
