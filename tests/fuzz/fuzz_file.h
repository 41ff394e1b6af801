// Files for fuzz targets whose readers take paths: MemFile, a fuzz input in an anonymous in-memory
// file (memfd) that readers which mmap or read a path see byte for byte (/proc/self/fd/N names it);
// TempDir, a directory for targets that need several named files (made once per process).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace lathe::fuzz {

class MemFile {
 public:
  MemFile(const char* name, const uint8_t* data, size_t size) : fd_(memfd_create(name, 0)) {
    if (fd_ < 0) __builtin_trap();
    for (size_t off = 0; off < size;) {
      ssize_t n = write(fd_, data + off, size - off);
      if (n <= 0) __builtin_trap();
      off += (size_t)n;
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

// A fresh /tmp/lathe_NAME_XXXXXX directory.
inline std::string TempDir(const std::string& name) {
  std::string tmpl = "/tmp/lathe_" + name + "_XXXXXX";
  if (!mkdtemp(tmpl.data())) std::abort();
  return tmpl;
}

// Writes bytes [data, data + size) to path, replacing it.
inline void WriteFile(const std::string& path, const void* data, size_t size) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(static_cast<const char*>(data), (std::streamsize)size);
}

}  // namespace lathe::fuzz
