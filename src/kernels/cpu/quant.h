// Internals of the packed quantized weights (kernels/quant.h): bitsandbytes-exact scalar
// quantizers, per-ISA decode tables and the MatMul / MatMulBackwardInput drivers.
#pragma once

#include <cstdint>

#include "core/cpu.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/train_dispatch.h"

namespace lathe::kernels::quant {

// The 16 values of a 4-bit code (NF4 or FP4) for a packed dtype.
const float* CodeBook(DType t);

// bitsandbytes quantize_4bit (backends/default): absmax per 64, scaled = clamp(x * (1/absmax), -1, 1),
// q = number of codebook midpoints < scaled (torch.bucketize), FP4 remapped through its sort order;
// element 2i in the high nibble. n % 64 == 0.
void Quantize4Bit(bool nf4, const float* x, int64_t n, uint8_t* codes, float* absmax);

// bitsandbytes 0.50 quantize_blockwise on CPU, bit for bit: absmax per block, t = x * (1/absmax),
// then a 65536-entry lookup table over [-1, 1] holding the nearest code to each grid point (so values
// within ~1.5e-5 of a code midpoint, and all |t| < ~1.5e-5, may get the neighbouring code). `code`
// must be DynamicMapSigned() or DynamicMapUnsigned().
void QuantizeBlockwise8(const float* code, const float* x, int64_t n, int64_t blocksize, uint8_t* out,
                        float* absmax);
// out[i] = code[q[i]] * absmax[i / blocksize] (f32 product, as dequantize_blockwise).
void DequantizeBlockwise8(const float* code, const uint8_t* q, const float* absmax, int64_t n,
                          int64_t blocksize, float* out);
// bitsandbytes' create_dynamic_map(signed=True / False), 256 sorted values each.
const float* DynamicMapSigned();
const float* DynamicMapUnsigned();

// The absmax of 64-blocks [b0, b0 + nb) of a packed 4-bit weight (decoding double quant).
void BlockAbsmax(const Tensor& w, int64_t b0, int64_t nb, float* out);

// Per-ISA inner kernels.
struct QuantKernels {
  IsaTier tier;
  // out[0..64*nb) = code[q] * absmax[b] for nb blocks of packed codes (32 bytes per block).
  void (*dequant4)(const uint8_t* codes, const float* code16, const float* absmax, int64_t nb, float* out);
  // y[r] = sum_k x[k] * dequant4(row r) for n_rows rows of K (K % 64 == 0); absmax per row block.
  // m x-rows (1..4), x rows K floats apart, y[i * ldy + r].
  void (*gemv4)(const uint8_t* codes, const float* code16, const float* absmax, int64_t n_rows, int64_t K,
                const float* x, int64_t m, float* y, int64_t ldy);
  // Integer dot of K int8 values (K % 32 == 0).
  int32_t (*dot_i8)(const int8_t* a, const int8_t* b, int64_t K);
};
const QuantKernels& QuantKernelsFor(IsaTier tier);
namespace scalar {
const QuantKernels& Table();
}
namespace avx2 {
const QuantKernels& Table();
}
namespace avx512 {
const QuantKernels& Table();  // REQUIRES an AVX-512 CPU (its static init may use AVX-512)
}

// out(nr, nk) (row stride ldo) = dequantized w[r0 : r0 + nr, k0 : k0 + nk] for a packed w. For 4-bit
// types k0 and nk are multiples of 64.
void DequantPackedBlock(const QuantKernels& qk, const Tensor& w, int64_t r0, int64_t nr, int64_t k0,
                        int64_t nk, float* out, int64_t ldo);

// MatMul for packed w: M < kGemvMaxM decode kernels (4-bit: f32 activations against decoded
// blocks; int8: LLM.int8 decomposition, below), else dequantized panels into k.panel (f32).
void PackedMatMul(const QuantKernels& qk, const cpu::MatMulKernels& k, ThreadPool& pool, const float* x,
                  int64_t M, const Tensor& w, float* y);
// LLM.int8 product for int8 weights: columns of x (over all M rows) holding any |x| > threshold go
// through f32 against the dequantized weight columns; the rest through int8 (x row-wise absmax over
// the non-outlier columns, int32 accumulation).
void Int8DecomposedMatMul(const QuantKernels& qk, ThreadPool& pool, const float* x, int64_t M,
                          const Tensor& w, float* y, float threshold);
// (MatMulBackwardInput for packed w runs the shared GEMM driver in train_matmul.cc with
// DequantPackedBlock filling its B chunks.)

}  // namespace lathe::kernels::quant
