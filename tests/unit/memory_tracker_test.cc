// MemoryTracker: per-category current / peak bytes, the peak of the sum, Set vs
// Add/Release, and the process RSS readers (a touched 64 MiB buffer shows up in
// both).
#include "monitor/memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace lathe::monitor {
namespace {

TEST(MemoryTracker, CurrentAndPeakPerCategoryAndTotal) {
  MemoryTracker t;
  t.Add(MemCategory::kActivations, 100);
  t.Add(MemCategory::kTemporary, 50);
  EXPECT_EQ(t.current_total(), 150);
  t.Release(MemCategory::kTemporary, 50);
  t.Add(MemCategory::kActivations, 20);
  EXPECT_EQ(t.current(MemCategory::kActivations), 120);
  EXPECT_EQ(t.peak(MemCategory::kTemporary), 50);
  EXPECT_EQ(t.current(MemCategory::kTemporary), 0);
  EXPECT_EQ(t.current_total(), 120);
  EXPECT_EQ(t.peak_total(), 150); // the sum peaked with both categories live
  t.Set(MemCategory::kWeights, 1000);
  t.Set(MemCategory::kWeights, 400);
  EXPECT_EQ(t.current(MemCategory::kWeights), 400);
  EXPECT_EQ(t.peak(MemCategory::kWeights), 1000);
  EXPECT_EQ(t.peak_total(), 1120);
  t.ResetPeaks();
  EXPECT_EQ(t.peak(MemCategory::kWeights), 400);
  EXPECT_EQ(t.peak_total(), 520);
  nlohmann::json j = t.ToJson();
  EXPECT_EQ(j["weights"]["current"], 400);
  EXPECT_EQ(j["activations"]["peak"], 120);
  EXPECT_EQ(j["total"]["current"], 520);
  EXPECT_GT(j["rss"]["current"].get<int64_t>(), 0);
  EXPECT_NE(t.Format().find("activations 120 B (peak 120 B)"),
            std::string::npos)
      << t.Format();
  EXPECT_STREQ(MemCategoryName(MemCategory::kOptimizer), "optimizer");
}

TEST(MemoryTracker, ReleasingMoreThanHeldDies) {
  MemoryTracker t;
  t.Add(MemCategory::kLora, 10);
  EXPECT_DEATH(t.Release(MemCategory::kLora, 11), "");
}

TEST(ProcessRss, TouchedBufferShowsInCurrentAndPeak) {
  const int64_t before = ProcessRssBytes();
  ASSERT_GT(before, 0);
  const size_t n = 64 << 20;
  std::vector<char> buf(n);
  std::memset(buf.data(), 1, n);
  const int64_t after = ProcessRssBytes();
  EXPECT_GT(after - before, (int64_t)(n * 9 / 10));
  // ru_maxrss is updated from per-CPU counters, so it can trail statm by a few
  // hundred KiB.
  EXPECT_GE(ProcessPeakRssBytes(), before + (int64_t)(n * 9 / 10));
  EXPECT_EQ(FormatBytes(64.0 * 1024 * 1024), "64.0 MiB");
  EXPECT_EQ(buf[n - 1], 1);
}

} // namespace
} // namespace lathe::monitor
