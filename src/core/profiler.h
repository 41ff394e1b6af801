// Profiler: records ops (name, shape, start, duration, FLOPs, bytes) per thread, writes them as a
// Chrome trace JSON (Perfetto / chrome://tracing open it; one track per thread) and summarizes
// the top ops by total time with their share, achieved GFLOP/s and GB/s. Recording appends to the
// recording thread's own buffer (its lock is only contended while Events / Clear read), so pool
// chunks on several threads do not serialize on one lock; code pays nothing when no profiler is
// attached (a null pointer).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "core/status.h"

namespace lathe {

class Profiler {
 public:
  struct Event {
    std::string name;
    std::string shape;  // e.g. "[512, 576] x [1536, 576] q4_1"
    int tid = 0;        // small per-thread index (0 = first thread that recorded)
    int64_t start_ns = 0;
    int64_t dur_ns = 0;
    double flops = 0;
    double bytes = 0;
  };

  Profiler();
  int64_t NowNs() const;
  // Thread-safe.
  void Record(Event e);
  std::vector<Event> Events() const;  // every thread's, by start time
  void Clear();  // drops the events recorded so far (thread indices stay)
  // Chrome trace format ("X" complete events, microseconds).
  Status WriteChromeTrace(const std::string& path) const;
  // A table of the `top` ops by total time: calls, total ms, share, GFLOP/s, GB/s, and cores (the
  // threads busy on average while the op ran: its own thread plus the "pool_chunk" spans other
  // threads ran inside it; 1.00 = serial). The pool_chunk spans are not rows of their own.
  std::string Summary(int top = 15) const;

 private:
  // One recording thread's events; tid is its index in threads_.
  struct ThreadEvents {
    std::mutex mu;
    std::vector<Event> events;
  };
  ThreadEvents& ForThisThread();
  std::chrono::steady_clock::time_point t0_;
  const uint64_t serial_;  // this profiler among all made, for the per-thread lookup cache
  mutable std::mutex mu_;  // guards threads_ (not the buffers' contents)
  std::vector<std::pair<std::thread::id, std::unique_ptr<ThreadEvents>>> threads_;
};

// Times a scope as one op. A null profiler makes it a no-op.
class ScopedOp {
 public:
  ScopedOp(Profiler* p, const char* name, double flops = 0, double bytes = 0, std::string shape = {})
      : p_(p) {
    if (!p_) return;
    e_.name = name;
    e_.flops = flops;
    e_.bytes = bytes;
    e_.shape = std::move(shape);
    e_.start_ns = p_->NowNs();
  }
  ~ScopedOp() {
    if (!p_) return;
    e_.dur_ns = p_->NowNs() - e_.start_ns;
    p_->Record(std::move(e_));
  }
  ScopedOp(const ScopedOp&) = delete;
  ScopedOp& operator=(const ScopedOp&) = delete;

 private:
  Profiler* p_;
  Profiler::Event e_;
};

}  // namespace lathe
