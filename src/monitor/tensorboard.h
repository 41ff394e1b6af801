// TensorBoard event files: TFRecord framing (length, masked CRC32C of the length, payload, masked
// CRC32C of the payload) around Event protobufs carrying scalar summaries. One writer per run
// directory; each record is flushed so a crash loses at most the record being written.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "core/status.h"

namespace lathe::monitor {

// CRC32C (Castagnoli) and TFRecord's masking of it.
uint32_t Crc32c(const void* data, size_t n);
uint32_t MaskedCrc32c(const void* data, size_t n);

class TensorBoardWriter {
 public:
  // Creates logdir (and parents) and events.out.tfevents.<seconds>.<hostname>.<pid>.lathe in it.
  static Result<std::unique_ptr<TensorBoardWriter>> Open(const std::string& logdir);
  ~TensorBoardWriter();
  Status AddScalar(const std::string& tag, int64_t step, double value, double wall_time = -1);
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter() = default;
  Status WriteRecord(const std::string& payload);
  std::string path_;
  FILE* f_ = nullptr;
};

}  // namespace lathe::monitor
