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

// True when [p, p + n) lies inside one read-only file mapping of this process (a MappedFile):
// its pages hold nothing but the file's bytes, so dropping them loses nothing. Reads
// /proc/self/maps (Linux); false elsewhere or for anonymous / writable memory.
bool InReadOnlyFileMapping(const void* p, size_t n);
// Drops the pages of [p, p + n) (rounded out to whole pages) from this process's resident memory
// when the range is InReadOnlyFileMapping: the next read faults them back in from the file, with
// the same bytes. Returns n when dropped, 0 when the range is not such a mapping (left alone).
size_t DropFilePages(const void* p, size_t n);

// Reads a whole file into a string (for small text files: JSON, YAML, templates).
Result<std::string> ReadFileToString(const std::string& path);

}  // namespace lathe
