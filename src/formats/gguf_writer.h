// GGUF v3 writer: metadata of every value type (scalars, strings, arrays), tensor infos and
// aligned tensor data, laid out like the Python gguf package writes it (so files are byte-identical
// for the same inputs). Files are written to a temp name, fsynced and renamed into place.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "formats/gguf.h"

namespace lathe::formats {

// Builds a file in memory (metadata values and tensor infos; tensor bytes are borrowed).
// Not thread-safe. Metadata and tensors are written in insertion order; setting a key again
// replaces its value in place. Alignment is 32 unless "general.alignment" is set (power of two).
class GgufWriter {
 public:
  void Set(const std::string& key, GgufValue value);
  void SetString(const std::string& key, const std::string& v);
  void SetBool(const std::string& key, bool v);
  void SetUint8(const std::string& key, uint8_t v);
  void SetInt8(const std::string& key, int8_t v);
  void SetUint16(const std::string& key, uint16_t v);
  void SetInt16(const std::string& key, int16_t v);
  void SetUint32(const std::string& key, uint32_t v);
  void SetInt32(const std::string& key, int32_t v);
  void SetUint64(const std::string& key, uint64_t v);
  void SetInt64(const std::string& key, int64_t v);
  void SetFloat32(const std::string& key, float v);
  void SetFloat64(const std::string& key, double v);
  void SetStringArray(const std::string& key, std::vector<std::string> v);
  // elem: any integer type or kBool; values are truncated to it when written.
  void SetIntArray(const std::string& key, GgufValueType elem, std::vector<int64_t> v);
  // elem: kFloat32 or kFloat64.
  void SetFloatArray(const std::string& key, GgufValueType elem, std::vector<double> v);

  // `shape` in PyTorch order (written reversed as GGUF ne). REQUIRES `data` to stay valid until
  // Write/Serialize returns. Errors: duplicate name, name of 64+ bytes (ggml's limit), 0 or more
  // than 4 dims, a dtype GGUF cannot hold, a row not a whole number of blocks, nbytes mismatch.
  Status AddTensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data,
                   size_t nbytes);
  // The same for any GGML type with known block geometry (GgmlTypeBlock), e.g. to copy K-quant
  // tensors lathe cannot compute with.
  Status AddRawTensor(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& shape,
                      const void* data, size_t nbytes);
  // A tensor whose bytes are made only as the file is written: fill writes its nbytes into dst, a buffer the
  // writer reuses from one such tensor to the next, so a conversion holds one converted tensor at a time, not the
  // model. An error from fill stops the write (nothing is renamed into place). fill must outlive Write/Serialize.
  using TensorFill = std::function<Status(uint8_t* dst)>;
  Status AddTensorFilled(const std::string& name, DType dtype, const std::vector<int64_t>& shape, size_t nbytes,
                         TensorFill fill);

  Status Write(const std::string& path) const;
  Result<std::vector<uint8_t>> Serialize() const;

 private:
  struct Kv {
    std::string key;
    GgufValue value;
  };
  struct TensorEntry {
    std::string name;
    uint32_t ggml_type;
    std::vector<int64_t> ne;  // GGUF order
    const void* data;
    size_t nbytes;
    TensorFill fill;  // set instead of data by AddTensorFilled
  };
  Status Add(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& shape, const void* data,
             size_t nbytes, TensorFill fill);
  template <typename Sink>
  Status Emit(Sink&& sink, const std::string& where) const;
  Result<uint64_t> Alignment(const std::string& where) const;

  std::vector<Kv> kv_;
  std::vector<TensorEntry> tensors_;
};

}  // namespace lathe::formats
