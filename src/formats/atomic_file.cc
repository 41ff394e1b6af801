// AtomicFileWriter via POSIX open/write/fsync/rename.
#include "formats/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace lathe::formats {

Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  AtomicFileWriter w;
  LATHE_RETURN_IF_ERROR(w.Open(path));
  LATHE_RETURN_IF_ERROR(w.Write(bytes.data(), bytes.size()));
  return w.Commit();
}

Status MakeDirs(const std::string& dir) {
  std::string cur;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      if (!cur.empty() && mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
        return Status::Error(StrFormat("%s: cannot create directory: %s", cur.c_str(), std::strerror(errno)));
      }
    }
    if (i < dir.size()) cur += dir[i];
  }
  return Status::Ok();
}


namespace {
constexpr size_t kBufBytes = 1 << 20;

Status WriteAll(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::Error(StrFormat("%s: write failed: %s", path.c_str(), std::strerror(errno)));
    }
    p += w;
    n -= (size_t)w;
  }
  return Status::Ok();
}
}  // namespace

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

Status AtomicFileWriter::Open(const std::string& path) {
  if (fd_ >= 0) return Status::Error(path + ": AtomicFileWriter already open");
  path_ = path;
  static std::atomic<uint64_t> counter{0};  // distinct temp names for concurrent writers
  tmp_path_ = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    return Status::Error(StrFormat("%s: cannot create: %s", tmp_path_.c_str(), std::strerror(errno)));
  }
  written_ = 0;
  buf_.clear();
  return Status::Ok();
}

Status AtomicFileWriter::Flush() {
  Status s = WriteAll(fd_, buf_.data(), buf_.size(), tmp_path_);
  buf_.clear();
  return s;
}

Status AtomicFileWriter::Write(const void* data, size_t n) {
  if (fd_ < 0) return Status::Error(path_ + ": write to a file that is not open");
  written_ += n;
  if (buf_.size() + n <= kBufBytes) {
    buf_.append((const char*)data, n);
    return Status::Ok();
  }
  LATHE_RETURN_IF_ERROR(Flush());
  if (n <= kBufBytes) {
    buf_.append((const char*)data, n);
    return Status::Ok();
  }
  return WriteAll(fd_, (const char*)data, n, tmp_path_);
}

Status AtomicFileWriter::WriteZeros(size_t n) {
  static const char kZeros[64] = {};
  while (n > 0) {
    size_t k = n < sizeof(kZeros) ? n : sizeof(kZeros);
    LATHE_RETURN_IF_ERROR(Write(kZeros, k));
    n -= k;
  }
  return Status::Ok();
}

Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return Status::Error(path_ + ": commit of a file that is not open");
  LATHE_RETURN_IF_ERROR(Flush());
  if (::fsync(fd_) != 0) {
    return Status::Error(StrFormat("%s: fsync failed: %s", tmp_path_.c_str(), std::strerror(errno)));
  }
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    ::unlink(tmp_path_.c_str());
    return Status::Error(StrFormat("%s: close failed: %s", tmp_path_.c_str(), std::strerror(errno)));
  }
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp_path_.c_str());
    return Status::Error(StrFormat("%s: cannot rename %s into place: %s", path_.c_str(), tmp_path_.c_str(),
                                   std::strerror(e)));
  }
  // Make the rename itself durable.
  size_t slash = path_.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path_.substr(0, slash));
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
}

}  // namespace lathe::formats
