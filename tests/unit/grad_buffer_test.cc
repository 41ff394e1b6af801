// GradBuffer: Zero(true) hands the pages back, ReadyToWrite makes them resident once after each such Zero
// (and not again until the next: the advice walks every page), Zero(false) keeps them resident and zeroed.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#include "model/train_model_impl.h"

namespace lathe::model::internal {
namespace {

// Pages of [p, p + bytes) resident in memory (anonymous memory: mincore reports exactly these).
int64_t ResidentPages(const void* p, size_t bytes) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> v((bytes + page - 1) / page);
  EXPECT_EQ(mincore(const_cast<void*>(p), bytes, v.data()), 0);
  int64_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

TEST(GradBuffer, ReadyToWriteOncePerZero) {
  const int64_t n = 64 * 1024;  // 64 pages of floats
  const size_t bytes = n * sizeof(float);
  GradBuffer g(n);
  EXPECT_EQ(ResidentPages(g.data(), bytes), 0);
  g.ReadyToWrite();
  EXPECT_EQ(ResidentPages(g.data(), bytes), 64);
  g.data()[5] = 1.0f;
  g.Zero(/*hand_back_pages=*/true);
  EXPECT_EQ(ResidentPages(g.data(), bytes), 0);
  EXPECT_EQ(g.data()[5], 0.0f);  // reading maps the zero page, not a resident copy
  g.ReadyToWrite();  // a stale "ready" flag would leave them out
  EXPECT_EQ(ResidentPages(g.data(), bytes), 64);
  g.data()[7] = 2.0f;
  g.Zero(/*hand_back_pages=*/false);  // memset: resident and zero
  EXPECT_EQ(ResidentPages(g.data(), bytes), 64);
  EXPECT_EQ(g.data()[7], 0.0f);
  g.ReadyToWrite();
  EXPECT_EQ(ResidentPages(g.data(), bytes), 64);
}

}  // namespace
}  // namespace lathe::model::internal
