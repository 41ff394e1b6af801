// Profiler: event buffer, Chrome trace writer, summary table.
#include "core/profiler.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

namespace lathe {

namespace {
std::atomic<uint64_t> g_profiler_serial{0};
}  // namespace

Profiler::Profiler() : t0_(std::chrono::steady_clock::now()), serial_(++g_profiler_serial) {}

int64_t Profiler::NowNs() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count();
}

Profiler::ThreadEvents& Profiler::ForThisThread() {
  // The last profiler this thread recorded into, by serial (an address can be reused by a later one).
  thread_local uint64_t cached_serial = 0;
  thread_local ThreadEvents* cached = nullptr;
  if (cached_serial == serial_) return *cached;
  std::lock_guard<std::mutex> lock(mu_);
  const std::thread::id id = std::this_thread::get_id();
  ThreadEvents* found = nullptr;
  for (const auto& [t, buf] : threads_) {
    if (t == id) found = buf.get();
  }
  if (!found) {
    threads_.push_back({id, std::make_unique<ThreadEvents>()});
    found = threads_.back().second.get();
  }
  cached_serial = serial_;
  cached = found;
  return *found;
}

void Profiler::Record(Event e) {
  ThreadEvents& t = ForThisThread();
  std::lock_guard<std::mutex> lock(t.mu);
  t.events.push_back(std::move(e));
}

std::vector<Profiler::Event> Profiler::Events() const {
  std::vector<Event> all;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < threads_.size(); ++i) {
    std::lock_guard<std::mutex> tl(threads_[i].second->mu);
    for (const Event& e : threads_[i].second->events) {
      all.push_back(e);
      all.back().tid = (int)i;
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const Event& a, const Event& b) { return a.start_ns < b.start_ns; });
  return all;
}

void Profiler::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, buf] : threads_) {
    std::lock_guard<std::mutex> tl(buf->mu);
    buf->events.clear();
  }
}

Status Profiler::WriteChromeTrace(const std::string& path) const {
  // Written event by event (a whole-document DOM of a 2-thread training step's ~650k pool chunks
  // took over a GB).
  const std::vector<Event> evs = Events();
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) return Status::Error(StrFormat("%s: cannot write: %s", path.c_str(), std::strerror(errno)));
    out << "{\"traceEvents\":[";
    int max_tid = 0;
    bool first = true;
    auto put = [&](const nlohmann::json& j) {
      out << (first ? "" : ",") << j.dump();
      first = false;
    };
    for (const Event& e : evs) {
      max_tid = std::max(max_tid, e.tid);
      nlohmann::json args = {{"flops", e.flops}, {"bytes", e.bytes}};
      if (!e.shape.empty()) args["shape"] = e.shape;
      put({{"name", e.name}, {"ph", "X"}, {"pid", 1}, {"tid", e.tid}, {"ts", e.start_ns / 1000.0},
           {"dur", e.dur_ns / 1000.0}, {"args", args}});
    }
    for (int t = 0; t <= max_tid; ++t) {
      put({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", t},
           {"args", {{"name", t == 0 ? std::string("main") : "thread " + std::to_string(t)}}}});
    }
    out << "],\"displayTimeUnit\":\"ms\"}";
    if (!out) return Status::Error(StrFormat("%s: write failed", path.c_str()));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::Error(StrFormat("%s: cannot rename into place: %s", path.c_str(), std::strerror(errno)));
  }
  return Status::Ok();
}

std::string Profiler::Summary(int top) const {
  struct Agg {
    int64_t calls = 0, ns = 0;
    double flops = 0, bytes = 0;
    double other_ns = 0;  // pool chunks run by other threads inside this op's spans
  };
  std::vector<Event> evs = Events();
  // Pool chunks by start time, to find those overlapping an op: a chunk that overlaps [s, e)
  // starts before e and at or after s - (the longest chunk).
  std::vector<const Event*> chunks;
  int64_t longest = 0;
  for (const Event& e : evs) {
    if (e.name != "pool_chunk") continue;
    chunks.push_back(&e);
    longest = std::max(longest, e.dur_ns);
  }
  std::sort(chunks.begin(), chunks.end(), [](const Event* a, const Event* b) { return a->start_ns < b->start_ns; });
  std::map<std::string, Agg> by;
  int64_t total = 0;
  for (const Event& e : evs) {
    if (e.name == "pool_chunk") continue;  // worker-track spans nested inside the ops below
    Agg& a = by[e.name];
    a.calls++;
    a.ns += e.dur_ns;
    a.flops += e.flops;
    a.bytes += e.bytes;
    total += e.dur_ns;
    const int64_t s = e.start_ns, end = e.start_ns + e.dur_ns;
    auto it = std::lower_bound(chunks.begin(), chunks.end(), s - longest,
                               [](const Event* c, int64_t t) { return c->start_ns < t; });
    for (; it != chunks.end() && (*it)->start_ns < end; ++it) {
      if ((*it)->tid == e.tid) continue;  // the op's own thread: already in its duration
      const int64_t lo = std::max(s, (*it)->start_ns), hi = std::min(end, (*it)->start_ns + (*it)->dur_ns);
      if (hi > lo) a.other_ns += (double)(hi - lo);
    }
  }
  std::vector<std::pair<std::string, Agg>> rows(by.begin(), by.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  // "cores": threads busy on average while the op ran (its own thread plus pool chunks that
  // other threads ran inside it); 1.00 = serial, the pool size = perfectly parallel.
  std::string out =
      StrFormat("%-18s %8s %10s %7s %9s %8s %6s\n", "op", "calls", "total ms", "share", "GFLOP/s", "GB/s", "cores");
  for (size_t i = 0; i < rows.size() && (int)i < top; ++i) {
    const Agg& a = rows[i].second;
    double s = a.ns / 1e9;
    out += StrFormat("%-18s %8lld %10.2f %6.1f%% %9.1f %8.1f %6.2f\n", rows[i].first.c_str(), (long long)a.calls,
                     a.ns / 1e6, total ? 100.0 * a.ns / total : 0.0, s > 0 ? a.flops / s / 1e9 : 0.0,
                     s > 0 ? a.bytes / s / 1e9 : 0.0, a.ns > 0 ? 1.0 + a.other_ns / (double)a.ns : 1.0);
  }
  out += StrFormat("%-18s %8s %10.2f\n", "total", "", total / 1e6);
  return out;
}

}  // namespace lathe
