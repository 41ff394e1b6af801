// Helpers for the training-op tests: central finite differences in double and the normalized
// error of a float result against a double reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/reference.h"

namespace lathe::kernels::testing {

// d loss / d x[i] by central differences, h scaled to |x[i]|. loss reads x (which it may not keep).
template <typename Loss>
std::vector<double> FiniteDiffGrad(std::vector<double> x, const Loss& loss, double h = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i], hi = h * std::max(1.0, std::fabs(xi));
    x[i] = xi + hi;
    const double lp = loss(x);
    x[i] = xi - hi;
    const double lm = loss(x);
    x[i] = xi;
    g[i] = (lp - lm) / (2 * hi);
  }
  return g;
}

inline std::vector<double> ToDouble(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// ||y - ref|| / ||ref|| (absolute when ref is all zero).
template <typename A, typename B>
double RelErr(const std::vector<A>& y, const std::vector<B>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double d = (double)y[i] - (double)ref[i];
    num += d * d;
    den += (double)ref[i] * (double)ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

inline double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// The weight's rows as the reference dequantizer gives them, in double.
inline std::vector<double> Dequantized(const Tensor& w) {
  const int64_t N = w.shape[0], K = w.shape[1];
  std::vector<float> f(N * K);
  for (int64_t n = 0; n < N; ++n)
    ref::DequantizeRow(w.dtype, (const uint8_t*)w.data + n * w.row_bytes(), K, f.data() + n * K);
  return ToDouble(f);
}

}  // namespace lathe::kernels::testing
