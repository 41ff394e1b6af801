// GGUF v2/v3 reader: metadata key/values, tensor infos, alignment, tensor data used in place.
// Every read is bounds-checked; a bad file yields a Status naming the file, the key or tensor,
// and the byte offset. Parse() works on any byte buffer (used by the fuzz target).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "core/tensor.h"

namespace lathe::formats {

// The first four bytes of a GGUF file, "GGUF", read as a little-endian uint32.
inline constexpr uint32_t kGgufMagic = 0x46554747;

enum class GgufValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};
const char* GgufValueTypeName(GgufValueType t);

// GGML tensor type ids as stored in the file.
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28, kBF16 = 30,
};
// Maps a GGML type to a lathe DType; false for types lathe does not support (yet).
bool GgmlTypeToDType(uint32_t ggml_type, DType* out);
bool DTypeToGgmlType(DType t, uint32_t* out);
const char* GgmlTypeName(uint32_t ggml_type);
// Block geometry of every GGML type the gguf package knows (also those lathe cannot compute
// with), so that their data can still be bounds-checked and copied. False for unknown ids.
bool GgmlTypeBlock(uint32_t ggml_type, int* block_size, int* block_bytes);

struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType elem_type = GgufValueType::kUint8;  // for arrays
  // Scalars: integers in i (or u for unsigned 64), floats in f, bools in i, strings in s.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string s;
  // Arrays: numeric elements converted to ints/floats, or strings.
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
  uint64_t array_size = 0;
  bool IsInteger() const;
  bool IsFloat() const { return type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64; }
};

struct GgufTensorInfo {
  std::string name;
  uint32_t ggml_type = 0;
  DType dtype = DType::kF32;          // valid only if supported
  bool supported = false;             // lathe has a DType for it
  bool known_size = false;            // block geometry known: nbytes valid and bounds-checked
  std::vector<int64_t> ne;            // GGUF order: ne[0] innermost
  std::vector<int64_t> shape;         // PyTorch order: reversed ne
  uint64_t offset = 0;                // absolute offset in the file
  uint64_t nbytes = 0;                // 0 when !known_size
};

class GgufFile {
 public:
  // mmaps the file and parses it.
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses a buffer the caller keeps alive; `name` is used in error messages.
  static Result<std::unique_ptr<GgufFile>> Parse(const uint8_t* data, size_t size, const std::string& name);

  const std::string& path() const { return name_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }

  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  // Metadata keys in file order (to copy metadata into a new file unchanged).
  const std::vector<std::string>& keys() const { return key_order_; }
  const GgufValue* Find(const std::string& key) const;
  bool Has(const std::string& key) const { return Find(key) != nullptr; }
  // Typed getters: error names the file and key when missing or of the wrong type.
  Result<std::string> GetString(const std::string& key) const;
  Result<int64_t> GetInt(const std::string& key) const;
  Result<double> GetFloat(const std::string& key) const;  // accepts integer values too
  Result<bool> GetBool(const std::string& key) const;
  // With defaults when absent (still an error if present with the wrong type).
  Result<int64_t> GetIntOr(const std::string& key, int64_t def) const;
  Result<double> GetFloatOr(const std::string& key, double def) const;
  Result<bool> GetBoolOr(const std::string& key, bool def) const;
  Result<std::string> GetStringOr(const std::string& key, const std::string& def) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(const std::string& name) const;
  // A view of the tensor's bytes in the mapping; error if the type is unsupported.
  Result<Tensor> GetTensor(const std::string& name) const;
  const uint8_t* base() const { return data_; }
  size_t size() const { return size_; }

 private:
  GgufFile() = default;
  Status ParseAll();

  std::unique_ptr<MappedFile> file_;
  std::string name_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<std::string> key_order_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace lathe::formats
