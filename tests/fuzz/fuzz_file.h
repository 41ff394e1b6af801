// A fuzz input written to an anonymous in-memory file (memfd) so that readers which take a path
// (and mmap or read it) see exactly the fuzzer's bytes: /proc/self/fd/N names it.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
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

}  // namespace lathe::fuzz
