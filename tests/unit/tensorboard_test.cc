// TensorBoard event files: CRC32C against its published check value, and the records read
// back (framing, both CRCs, Event/Summary decoding) exactly as written.
#include "monitor/tensorboard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "monitor/tensorboard_event.pb.h"

namespace lathe::monitor {
namespace {

TEST(TensorBoard, Crc32cCheckValue) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xe3069283u);  // the CRC-32C check value (RFC 3720)
  EXPECT_EQ(Crc32c("", 0), 0u);
}

TEST(TensorBoard, RecordsReadBack) {
  std::string dir = ::testing::TempDir() + "/tb_test/run1";
  auto w = TensorBoardWriter::Open(dir);
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_TRUE((*w)->AddScalar("train/loss", 1, 2.5, 100.0).ok());
  ASSERT_TRUE((*w)->AddScalar("train/lr", 2, 1e-4, 101.0).ok());
  std::string path = (*w)->path();
  w->reset();
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string data = ss.str();
  std::vector<tb::Event> events;
  size_t p = 0;
  while (p < data.size()) {
    ASSERT_LE(p + 12, data.size());
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, data.data() + p, 8);
    std::memcpy(&len_crc, data.data() + p + 8, 4);
    ASSERT_EQ(len_crc, MaskedCrc32c(data.data() + p, 8));
    ASSERT_LE(p + 12 + len + 4, data.size());
    std::memcpy(&data_crc, data.data() + p + 12 + len, 4);
    ASSERT_EQ(data_crc, MaskedCrc32c(data.data() + p + 12, len));
    tb::Event e;
    ASSERT_TRUE(e.ParseFromArray(data.data() + p + 12, (int)len));
    events.push_back(e);
    p += 12 + len + 4;
  }
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[1].step(), 1);
  EXPECT_EQ(events[1].wall_time(), 100.0);
  EXPECT_EQ(events[1].summary().value(0).tag(), "train/loss");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 2.5f);
  EXPECT_EQ(events[2].summary().value(0).simple_value(), 1e-4f);
}

TEST(TensorBoard, UnwritableDirIsAnError) {
  auto w = TensorBoardWriter::Open("/proc/lathe_cannot_write_here");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("/proc/lathe_cannot_write_here"), std::string::npos);
}

}  // namespace
}  // namespace lathe::monitor
