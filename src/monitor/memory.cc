// MemoryTracker counters and the process RSS readers.
#include "monitor/memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "core/check.h"
#include "core/status.h"

namespace lathe::monitor {

const char *MemCategoryName(MemCategory c) {
  static const char *kNames[] = {"weights", "lora", "gradients", "optimizer", "activations", "temporary"};
  int i = (int)c;
  return i >= 0 && i < kMemCategories ? kNames[i] : "?";
}

void MemoryTracker::UpdateTotalLocked() {
  total_ = 0;
  for (int64_t v : cur_) total_ += v;
  peak_total_ = std::max(peak_total_, total_);
}

void MemoryTracker::Add(MemCategory c, int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  int i = (int)c;
  cur_[i] += bytes;
  LATHE_CHECK(cur_[i] >= 0);
  peak_[i] = std::max(peak_[i], cur_[i]);
  UpdateTotalLocked();
}

void MemoryTracker::Release(MemCategory c, int64_t bytes) { Add(c, -bytes); }

void MemoryTracker::Set(MemCategory c, int64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  LATHE_CHECK(bytes >= 0);
  int i = (int)c;
  cur_[i] = bytes;
  peak_[i] = std::max(peak_[i], bytes);
  UpdateTotalLocked();
}

int64_t MemoryTracker::current(MemCategory c) const {
  std::lock_guard<std::mutex> l(mu_);
  return cur_[(int)c];
}
int64_t MemoryTracker::peak(MemCategory c) const {
  std::lock_guard<std::mutex> l(mu_);
  return peak_[(int)c];
}
int64_t MemoryTracker::current_total() const {
  std::lock_guard<std::mutex> l(mu_);
  return total_;
}
int64_t MemoryTracker::peak_total() const {
  std::lock_guard<std::mutex> l(mu_);
  return peak_total_;
}

void MemoryTracker::ResetPeaks() {
  std::lock_guard<std::mutex> l(mu_);
  peak_ = cur_;
  peak_total_ = total_;
}

nlohmann::json MemoryTracker::ToJson() const {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < kMemCategories; ++i) {
    j[MemCategoryName((MemCategory)i)] = {{"current", current((MemCategory)i)},
                                          {"peak", peak((MemCategory)i)}};
  }
  j["total"] = {{"current", current_total()}, {"peak", peak_total()}};
  j["rss"] = {{"current", ProcessRssBytes()}, {"peak", ProcessPeakRssBytes()}};
  return j;
}

std::string MemoryTracker::Format() const {
  std::string s;
  for (int i = 0; i < kMemCategories; ++i) {
    MemCategory c = (MemCategory)i;
    s += lathe::StrFormat("%s %s (peak %s) | ", MemCategoryName(c), FormatBytes((double)current(c)).c_str(),
                          FormatBytes((double)peak(c)).c_str());
  }
  s += lathe::StrFormat("rss %s (peak %s)", FormatBytes((double)ProcessRssBytes()).c_str(),
                        FormatBytes((double)ProcessPeakRssBytes()).c_str());
  return s;
}

int64_t ProcessRssBytes() {
  FILE *f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long long size = 0, resident = 0;
  int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return n == 2 ? (int64_t)resident * (int64_t)sysconf(_SC_PAGESIZE) : 0;
}

int64_t ProcessPeakRssBytes() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  // Linux reports KiB, and updates its high-water mark lazily (at mm events), so it can trail the
  // current RSS read from statm: the peak is never less than what is resident now.
  return std::max<int64_t>((int64_t)ru.ru_maxrss * 1024, ProcessRssBytes());
}

std::string FormatBytes(double b) {
  if (b < 0) return "-" + FormatBytes(-b);  // a plan's overlap line
  if (b >= 1024.0 * 1024 * 1024) return lathe::StrFormat("%.2f GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return lathe::StrFormat("%.1f MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return lathe::StrFormat("%.1f KiB", b / 1024.0);
  return lathe::StrFormat("%.0f B", b);
}

}  // namespace lathe::monitor
