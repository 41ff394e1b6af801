// MappedFile via POSIX mmap.
#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
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

bool InReadOnlyFileMapping(const void* p, size_t n) {
  if (!p || n == 0) return false;
  std::ifstream maps("/proc/self/maps");
  const uintptr_t b = (uintptr_t)p, e = b + n;
  std::string line;
  while (std::getline(maps, line)) {
    // "start-end perms offset dev inode   path": anonymous mappings have inode 0 and no path.
    unsigned long lo = 0, hi = 0, inode = 0;
    char perms[8] = {}, dev[32] = {};
    unsigned long long offset = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx %7s %llx %31s %lu", &lo, &hi, perms, &offset, dev, &inode) != 6) continue;
    if (b < lo || b >= hi) continue;
    return e <= hi && perms[1] != 'w' && inode != 0;
  }
  return false;
}

size_t DropFilePages(const void* p, size_t n) {
  if (!InReadOnlyFileMapping(p, n)) return 0;
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t b = (uintptr_t)p & ~(page - 1), e = ((uintptr_t)p + n + page - 1) & ~(page - 1);
  return madvise((void*)b, e - b, MADV_DONTNEED) == 0 ? n : 0;
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
