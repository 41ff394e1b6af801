// AtomicFileWriter: writes a file under a temporary name, fsyncs it and renames it into place, so
// readers never see a half-written checkpoint or model file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace lathe::formats {

// mkdir -p: creates `dir` and its missing parents (mode 0755); an existing folder is fine. Errors
// name the component that could not be created.
Status MakeDirs(const std::string& dir);

// Writes `bytes` to `path` through an AtomicFileWriter (temp file, fsync, rename): a reader sees the old file or the
// whole new one.
Status WriteFileAtomically(const std::string& path, const std::string& bytes);

// Not thread-safe. If Commit() is not reached (error, early return) the temp file is removed.
class AtomicFileWriter {
 public:
  AtomicFileWriter() = default;
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Creates `path`.tmp.<pid>.<n> next to `path`.
  Status Open(const std::string& path);
  Status Write(const void* data, size_t n);
  // Writes n zero bytes.
  Status WriteZeros(size_t n);
  uint64_t bytes_written() const { return written_; }
  // Flushes, fsyncs, closes and renames the temp file to the final path (then fsyncs the folder).
  Status Commit();

 private:
  Status Flush();
  int fd_ = -1;
  std::string path_, tmp_path_;
  std::string buf_;  // small writes are batched
  uint64_t written_ = 0;
};

}  // namespace lathe::formats
