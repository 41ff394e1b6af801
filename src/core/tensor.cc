// Tensor helpers.
#include "core/tensor.h"

namespace lathe {

std::string Tensor::ShapeString() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace lathe
