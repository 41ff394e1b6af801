// MappedFile: a read-only mmap of a whole file (weights are used in place, never copied).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace lathe {

class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Reads a whole file into a string (for small text files: JSON, YAML, templates).
Result<std::string> ReadFileToString(const std::string& path);

}  // namespace lathe
