// MappedFile via POSIX mmap.
#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace lathe {

Result<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Error(StrFormat("%s: cannot open: %s", path.c_str(), std::strerror(errno)));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Status::Error(StrFormat("%s: cannot stat: %s", path.c_str(), std::strerror(e)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::Error(StrFormat("%s: not a regular file", path.c_str()));
  }
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = (size_t)st.st_size;
  if (f->size_ > 0) {
    void* p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return Status::Error(StrFormat("%s: mmap failed: %s", path.c_str(), std::strerror(e)));
    }
    f->data_ = (const uint8_t*)p;
  }
  ::close(fd);
  return f;
}

MappedFile::~MappedFile() {
  if (data_) munmap((void*)data_, size_);
}

Result<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(StrFormat("%s: cannot open: %s", path.c_str(), std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::Error(StrFormat("%s: read error", path.c_str()));
  return ss.str();
}

}  // namespace lathe
