// Scalar reference implementations: the definition of each op, used by tests/ops and as the
// building blocks of the scalar tier (kernels/cpu/scalar.cc). Written for clarity, not speed.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace lathe::kernels::ref {

// One weight row (K elements) dotted with x (K floats), weight row in dtype t.
float DotRow(DType t, const void* row, const float* x, int64_t K);
void MatMul(const float* x, int64_t M, const Tensor& w, float* y);
void DequantizeRow(DType t, const void* row, int64_t K, float* out);

// One block of an IsExtQuant type (Q5_0, Q5_1, Q2_K .. Q6_K) as integers, the form the int8 kernels
// compute with: element e's value is d * sc[e / 16] * q[e] - dmin * mn[e / 16], the products taken
// in f32 in that order (which is also how ggml / gguf-py dequantize: (d * sc) * q - (dmin * mn)).
// q is signed with the offset removed for Q5_0 (-16..15), Q3_K (-4..3) and Q6_K (-32..31), unsigned
// otherwise (0..3 / 0..15 / 0..31); Q5_1's min is dmin = m with mn = -1. n = the block's elements
// (32 or 256), whose first n / 16 entries of sc / mn are set.
struct DecodedBlock {
  int8_t q[256];
  int16_t sc[16];
  int16_t mn[16];
  float d, dmin;
  int n;
  bool has_min;  // any mn != 0 possible for this type
};
void DecodeBlock(DType t, const uint8_t* block, DecodedBlock* out);
// The 6-bit scales and mins of Q4_K / Q5_K (8 each) from their 12 packed bytes.
void KScaleMin(const uint8_t* packed, uint8_t* sc, uint8_t* mn);
// The 6-bit scales of Q3_K (16, still offset by 32) from their 12 packed bytes.
void Q3KScales(const uint8_t* packed, uint8_t* sc);
// x (n floats, whole blocks) into a row of dtype t. Every quantized type follows llama.cpp's
// reference quantizer (what llama-quantize does without an importance matrix), byte for byte.
void QuantizeRow(DType t, const float* x, int64_t n, void* out);
// QuantizeRow for the IsExtQuant types (quantize_ggml.cc).
void QuantizeRowGgml(DType t, const float* x, int64_t n, void* out);
void RmsNorm(const float* x, const float* w, float* out, int64_t T, int64_t C, float eps);
void SiluMul(float* gate, const float* up, int64_t n);
void Softmax(float* x, int64_t n);
int64_t Argmax(const float* x, int64_t n);

}  // namespace lathe::kernels::ref
