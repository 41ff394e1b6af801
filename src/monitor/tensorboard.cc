// TensorBoard event writer.
#include "monitor/tensorboard.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

#include "formats/atomic_file.h"
#include "monitor/tensorboard_event.pb.h"

namespace lathe::monitor {

namespace {

uint32_t kCrcTable[256];
bool InitTable() {
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // reflected Castagnoli
    kCrcTable[i] = c;
  }
  return true;
}
const bool kTableReady = InitTable();

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t Crc32c(const void* data, size_t n) {
  (void)kTableReady;
  const uint8_t* p = (const uint8_t*)data;
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = kCrcTable[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t MaskedCrc32c(const void* data, size_t n) {
  uint32_t c = Crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

Result<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Open(const std::string& logdir) {
  LATHE_RETURN_IF_ERROR(formats::MakeDirs(logdir));
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter());
  w->path_ = StrFormat("%s/events.out.tfevents.%lld.%s.%d.lathe", logdir.c_str(), (long long)Now(), host, (int)getpid());
  w->f_ = std::fopen(w->path_.c_str(), "wb");
  if (!w->f_) return Status::Error(StrFormat("%s: cannot create: %s", w->path_.c_str(), std::strerror(errno)));
  tb::Event e;
  e.set_wall_time(Now());
  e.set_file_version("brain.Event:2");
  LATHE_RETURN_IF_ERROR(w->WriteRecord(e.SerializeAsString()));
  return w;
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

Status TensorBoardWriter::WriteRecord(const std::string& payload) {
  uint64_t len = payload.size();
  uint32_t len_crc = MaskedCrc32c(&len, sizeof(len));
  uint32_t data_crc = MaskedCrc32c(payload.data(), payload.size());
  bool ok = std::fwrite(&len, sizeof(len), 1, f_) == 1 && std::fwrite(&len_crc, 4, 1, f_) == 1 &&
            std::fwrite(payload.data(), 1, payload.size(), f_) == payload.size() &&
            std::fwrite(&data_crc, 4, 1, f_) == 1 && std::fflush(f_) == 0;
  if (!ok) return Status::Error(StrFormat("%s: write failed: %s", path_.c_str(), std::strerror(errno)));
  return Status::Ok();
}

Status TensorBoardWriter::AddScalar(const std::string& tag, int64_t step, double value, double wall_time) {
  tb::Event e;
  e.set_wall_time(wall_time >= 0 ? wall_time : Now());
  e.set_step(step);
  tb::SummaryValue* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value((float)value);
  return WriteRecord(e.SerializeAsString());
}

}  // namespace lathe::monitor
