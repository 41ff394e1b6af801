// ThreadPool implementation: atomic chunk counter, spin-then-futex idle workers.
#include "core/thread_pool.h"

#include <immintrin.h>
#include <unistd.h>

#include <cstdlib>

namespace lathe {

namespace {
constexpr int kSpinIters = 1 << 14;  // ~ tens of microseconds before sleeping
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunChunks(int thread) {
  for (;;) {
    int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= n_chunks_) break;
    int64_t b = c * grain_;
    int64_t e = b + grain_ < n_ ? b + grain_ : n_;
    (*fn_)(b, e, thread);
  }
}

void ThreadPool::WorkerLoop(int index) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < kSpinIters; ++spin) {
      _mm_pause();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    RunChunks(index);
    if (busy_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_workers_.notify_one();
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain, RangeFn fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t n_chunks = (n + grain - 1) / grain;
  if (n_threads_ == 1 || n_chunks == 1) {
    for (int64_t b = 0; b < n; b += grain) fn(b, b + grain < n ? b + grain : n, 0);
    return;
  }
  n_ = n;
  grain_ = grain;
  n_chunks_ = n_chunks;
  fn_ = &fn;
  next_chunk_.store(0, std::memory_order_relaxed);
  busy_workers_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  RunChunks(0);
  // Wait for workers: spin briefly, then sleep.
  int left = busy_workers_.load(std::memory_order_acquire);
  for (int spin = 0; left != 0 && spin < kSpinIters; ++spin) {
    _mm_pause();
    left = busy_workers_.load(std::memory_order_acquire);
  }
  while (left != 0) {
    busy_workers_.wait(left, std::memory_order_acquire);
    left = busy_workers_.load(std::memory_order_acquire);
  }
  fn_ = nullptr;
}

int DefaultThreadCount() {
  if (const char* env = std::getenv("LATHE_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

}  // namespace lathe
