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
void QuantizeRow(DType t, const float* x, int64_t n, void* out);
void RmsNorm(const float* x, const float* w, float* out, int64_t T, int64_t C, float eps);
void SiluMul(float* gate, const float* up, int64_t n);
void Softmax(float* x, int64_t n);

}  // namespace lathe::kernels::ref
