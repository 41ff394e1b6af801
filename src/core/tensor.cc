// Tensor helpers.
#include "core/tensor.h"

#include <cstdint>

namespace lathe {

std::string Tensor::ShapeString() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

bool Tensor::aligned() const {
  size_t a = (size_t)GetDTypeInfo(dtype).block_bytes;
  if (IsQuantized(dtype)) a = 2;  // block structs hold f16 fields
  return a <= 1 || ((uintptr_t)data % a) == 0;
}

}  // namespace lathe
