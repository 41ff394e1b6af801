// Straightforward scalar references for the training ops (train_ops.h), templated on the number
// type: tests run them in float to check the fast paths and in double for finite differences.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/train_ops.h"

namespace lathe::kernels::train_ref {

template <typename R>
void RmsNormForward(R* out, R* rstd, const R* x, const R* w, int64_t T, int64_t C, R eps) {
  for (int64_t t = 0; t < T; ++t) {
    R ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += x[t * C + c] * x[t * C + c];
    const R r = R(1) / std::sqrt(ss / R(C) + eps);
    rstd[t] = r;
    for (int64_t c = 0; c < C; ++c) out[t * C + c] = x[t * C + c] * r * w[c];
  }
}

template <typename R>
void RmsNormBackward(R* dx, R* dw, const R* dout, const R* x, const R* w, const R* rstd, int64_t T, int64_t C) {
  for (int64_t t = 0; t < T; ++t) {
    const R r = rstd[t];
    const R* xt = x + t * C;
    const R* dt = dout + t * C;
    R dot = 0;  // sum_c dxhat * xhat
    for (int64_t c = 0; c < C; ++c) dot += dt[c] * w[c] * xt[c] * r;
    const R mean = dot / R(C);
    for (int64_t c = 0; c < C; ++c) {
      const R xhat = xt[c] * r;
      dw[c] += dt[c] * xhat;
      dx[t * C + c] = r * (dt[c] * w[c] - xhat * mean);
    }
  }
}

template <typename R>
R Sigmoid(R g) {
  return R(1) / (R(1) + std::exp(-g));
}

template <typename R>
void SwiGluForward(R* out, const R* gate, const R* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] * Sigmoid(gate[i]) * up[i];
}

template <typename R>
void SwiGluBackward(R* dgate, R* dup, const R* dout, const R* gate, const R* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const R g = gate[i], s = Sigmoid(g), d = dout[i];
    dup[i] = d * g * s;
    dgate[i] = d * up[i] * s * (R(1) + g * (R(1) - s));
  }
}

// Rotates by +theta (sign = 1) or -theta (sign = -1).
template <typename R>
void Rope(R* out, const R* x, const float* cos, const float* sin, int64_t T, int n_head, int head_dim,
          RopeLayout layout, int sign) {
  const int half = head_dim / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < n_head; ++h)
      for (int i = 0; i < half; ++i) {
        const int64_t base = (t * n_head + h) * head_dim;
        const int64_t i0 = base + (layout == RopeLayout::kInterleaved ? 2 * i : i);
        const int64_t i1 = base + (layout == RopeLayout::kInterleaved ? 2 * i + 1 : i + half);
        const R c = cos[t * half + i], s = sign * R(sin[t * half + i]);
        const R a = x[i0], b = x[i1];
        out[i0] = a * c - b * s;
        out[i1] = a * s + b * c;
      }
}

template <typename R>
void EmbeddingForward(R* out, const int32_t* tokens, const R* wte, int64_t T, int64_t C) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) out[t * C + c] = wte[(int64_t)tokens[t] * C + c];
}

template <typename R>
void EmbeddingBackward(R* dwte, const R* dout, const int32_t* tokens, int64_t T, int64_t C) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) dwte[(int64_t)tokens[t] * C + c] += dout[t * C + c];
}

// y(M, N) = x(M, K) . w(N, K)^T.
template <typename R>
void MatMul(R* y, const R* x, const R* w, int64_t M, int64_t N, int64_t K) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      R s = 0;
      for (int64_t k = 0; k < K; ++k) s += x[m * K + k] * w[n * K + k];
      y[m * N + n] = s;
    }
}

// dx(M, K) = dy(M, N) . w(N, K).
template <typename R>
void MatMulBackwardInput(R* dx, const R* dy, const R* w, int64_t M, int64_t N, int64_t K) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      R s = 0;
      for (int64_t n = 0; n < N; ++n) s += dy[m * N + n] * w[n * K + k];
      dx[m * K + k] = s;
    }
}

// dw(N, K) += dy(M, N)^T . x(M, K).
template <typename R>
void MatMulBackwardWeight(R* dw, const R* dy, const R* x, int64_t M, int64_t N, int64_t K) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      R s = 0;
      for (int64_t m = 0; m < M; ++m) s += dy[m * N + n] * x[m * K + k];
      dw[n * K + k] += s;
    }
}

}  // namespace lathe::kernels::train_ref
