// safetensors reader (single files and sharded HF directories) and writer.
// Every offset and size is bounds-checked; errors name the file, the tensor and the byte offset.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "core/tensor.h"

namespace lathe::formats {

struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype_name;      // as written in the header: "F32", "BF16", "F8_E4M3", ...
  DType dtype = DType::kF32;   // valid only if supported
  bool supported = false;      // false for dtypes lathe has no DType for (U16, F8_*, ...)
  std::vector<int64_t> shape;  // PyTorch order
  uint64_t offset = 0;         // absolute byte offset of the data in the file
  uint64_t nbytes = 0;
};

class SafetensorsFile {
 public:
  // The Python library refuses headers above 100 MB; so do we (a corrupt length must not make
  // us parse gigabytes of tensor data as JSON).
  static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

  // mmaps the file and parses it.
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Parses a buffer the caller keeps alive; `name` is used in error messages (fuzz entry point).
  static Result<std::unique_ptr<SafetensorsFile>> Parse(const uint8_t* data, size_t size,
                                                        const std::string& name);

  const std::string& path() const { return name_; }
  // The optional "__metadata__" string map.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Sorted by data offset.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  const SafetensorsTensorInfo* FindTensor(const std::string& name) const;
  // A view of the tensor's bytes in the mapping (PyTorch shape). The data pointer is only as
  // aligned as the file makes it: files from the Python library align every tensor to its
  // element size, hand-made files might not (see Tensor::aligned).
  Result<Tensor> GetTensor(const std::string& name) const;
  uint64_t data_offset() const { return data_offset_; }  // 8 + header length
  const uint8_t* base() const { return data_; }
  size_t size() const { return size_; }

 private:
  SafetensorsFile() = default;
  Status ParseAll();

  std::unique_ptr<MappedFile> file_;
  std::string name_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  uint64_t data_offset_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
};

// One or several safetensors files seen as one set of tensors: a single file, or a HF sharded
// checkpoint described by model.safetensors.index.json ({"weight_map": {tensor: shard file}}).
// Thread safety: immutable after Open; safe to read from many threads.
class SafetensorsSet {
 public:
  // `path` is a .safetensors file, a *.safetensors.index.json, or a directory holding
  // model.safetensors.index.json or model.safetensors. Every shard the index names is opened and
  // every tensor it maps must exist in its shard.
  static Result<std::unique_ptr<SafetensorsSet>> Open(const std::string& path);

  bool Has(const std::string& name) const { return where_.count(name) != 0; }
  // The file holding `name`, or nullptr.
  const SafetensorsFile* FileFor(const std::string& name) const;
  // Error names the index (or file) and the tensor when it is missing.
  Result<Tensor> GetTensor(const std::string& name) const;
  // All tensor names, sorted.
  std::vector<std::string> TensorNames() const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // What error messages call this set: the index file or the single file.
  const std::string& source() const { return source_; }

 private:
  SafetensorsSet() = default;
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index in files_
};

// A tensor to write: the bytes are borrowed until WriteSafetensors returns; or, with fill set instead of data, made
// only as the file is written (fill writes nbytes into dst, a buffer reused from one such tensor to the next, so a
// writer of converted tensors holds one at a time; an error from fill stops the write, nothing is renamed).
struct SafetensorsWriteEntry {
  SafetensorsWriteEntry() = default;
  // {name, dtype, shape, data, nbytes} with the bytes given, or with fill and no data.
  SafetensorsWriteEntry(std::string name_, DType dtype_, std::vector<int64_t> shape_, const void* data_, size_t nbytes_,
                        std::function<Status(uint8_t* dst)> fill_ = {})
      : name(std::move(name_)), dtype(dtype_), shape(std::move(shape_)), data(data_), nbytes(nbytes_),
        fill(std::move(fill_)) {}
  std::string name;
  DType dtype = DType::kF32;  // plain types only (no block-quantized types)
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;  // must equal numel * element size
  std::function<Status(uint8_t* dst)> fill;
};

// Serializes like the Python library (byte-identical for the same tensors and at most one
// metadata key; with several, keys are sorted): data ordered by element size (largest first)
// then name, JSON header in that order with "__metadata__" first, padded with spaces to a
// multiple of 8. WriteSafetensors writes to a temp file beside `path`, fsyncs, then renames over `path`.
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsWriteEntry>& tensors,
                        const std::map<std::string, std::string>& metadata = {});
// The same bytes in memory (small files: tests, fuzz seeds).
Result<std::vector<uint8_t>> SerializeSafetensors(const std::vector<SafetensorsWriteEntry>& tensors,
                                                  const std::map<std::string, std::string>& metadata = {});

// "F32" <-> DType for the dtypes lathe supports.
const char* SafetensorsDTypeName(DType t);  // nullptr if not representable

}  // namespace lathe::formats
