// Memory accounting by category (weights, lora, gradients, optimizer,
// activations, temporary): current and peak bytes like
// torch.cuda.memory_allocated / max_memory_allocated, plus the process's
// resident set (now from /proc/self/statm, peak from getrusage).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace lathe::monitor {

enum class MemCategory { kWeights, kLora, kGradients, kOptimizer, kActivations, kTemporary, kCount };
constexpr int kMemCategories = (int)MemCategory::kCount;
const char *MemCategoryName(MemCategory c);  // "weights", "lora", ...

// Thread-safe counters. Add/Release move the current bytes of one category; Set
// replaces them (for owners that report their whole footprint at once). Peaks
// (per category and of the sum) only grow until ResetPeaks.
class MemoryTracker {
 public:
  void Add(MemCategory c, int64_t bytes);
  void Release(MemCategory c,
               int64_t bytes);  // LATHE_CHECKs that current stays >= 0
  void Set(MemCategory c, int64_t bytes);
  int64_t current(MemCategory c) const;
  int64_t peak(MemCategory c) const;
  int64_t current_total() const;
  int64_t peak_total() const;
  void ResetPeaks();
  // {"weights": {"current": B, "peak": B}, ..., "total": {...}, "rss":
  // {"current": B, "peak": B}}
  nlohmann::json ToJson() const;
  // "weights 1.2 MiB (peak 1.2 MiB) | lora ... | rss 40.1 MiB (peak 41.0 MiB)"
  std::string Format() const;

 private:
  void UpdateTotalLocked();
  mutable std::mutex mu_;
  std::array<int64_t, kMemCategories> cur_{}, peak_{};
  int64_t total_ = 0, peak_total_ = 0;
};

// Resident set size of this process now (/proc/self/statm) and its peak
// (getrusage ru_maxrss).
int64_t ProcessRssBytes();
int64_t ProcessPeakRssBytes();
std::string FormatBytes(double bytes);  // "12.3 MiB"

}  // namespace lathe::monitor
