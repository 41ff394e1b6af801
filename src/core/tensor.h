// Tensor: a typed view (data pointer, dtype, shape) over memory someone else owns: an mmapped
// file, an arena, or a std::vector. Shapes are in PyTorch order, row-major (last dim contiguous).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace lathe {

struct Tensor {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t nbytes() const { return DTypeBytes(dtype, numel()); }
  int ndim() const { return (int)shape.size(); }
  int64_t dim(int i) const { return shape[i < 0 ? shape.size() + i : i]; }
  // For a 2-D weight (rows, cols): bytes per row in its stored dtype.
  size_t row_bytes() const { return DTypeBytes(dtype, shape.back()); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data); }
  std::string ShapeString() const;
  // True when data is aligned to the element size (safe to read as T* on any platform; block types: their f16
  // fields' 2 bytes). A file may place a tensor anywhere (safetensors' header length, GGUF's general.alignment).
  bool aligned() const;
};

}  // namespace lathe
