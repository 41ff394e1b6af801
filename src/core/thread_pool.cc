// ThreadPool implementation: generation-tagged chunk claims, spin-then-futex idle workers.
#include "core/thread_pool.h"

#include "core/profiler.h"

#include <immintrin.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>

namespace lathe {


ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  wake_.fetch_add(1, std::memory_order_acq_rel);
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

int64_t ThreadPool::RunChunks(uint32_t gen, int thread) {
  int64_t ran = 0;
  uint64_t cur = claim_.load(std::memory_order_acquire);
  for (;;) {
    if ((uint32_t)(cur >> 32) != gen) break;
    int64_t c = (int64_t)(uint32_t)cur;
    // n_chunks_ is stable while the generation matches: the job cannot finish before our claim.
    if (c >= n_chunks_.load(std::memory_order_relaxed)) break;
    if (!claim_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    int64_t b = c * grain_;
    int64_t e = b + grain_ < n_ ? b + grain_ : n_;
    if (profiler_) {
      ScopedOp op(profiler_, "pool_chunk");
      (*fn_)(b, e, thread);
    } else {
      (*fn_)(b, e, thread);
    }
    ++ran;
    if (done_chunks_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_chunks_.load(std::memory_order_relaxed)) done_chunks_.notify_one();
    cur = claim_.load(std::memory_order_acquire);
  }
  return ran;
}

void ThreadPool::WorkerLoop(int index) {
  uint32_t seen_wake = 0;
  for (;;) {
    uint32_t w = wake_.load(std::memory_order_acquire);
    const int spins = spin_iters_.load(std::memory_order_relaxed);
    for (int spin = 0; w == seen_wake && spin < spins; ++spin) {
      _mm_pause();
      w = wake_.load(std::memory_order_acquire);
    }
    if (w == seen_wake) {
      sleepers_.fetch_add(1, std::memory_order_acq_rel);
      wake_.wait(seen_wake, std::memory_order_acquire);
      sleepers_.fetch_sub(1, std::memory_order_acq_rel);
      continue;
    }
    seen_wake = w;
    if (stop_.load(std::memory_order_acquire)) return;
    uint64_t cur = claim_.load(std::memory_order_acquire);
    RunChunks((uint32_t)(cur >> 32), index);
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
  n_chunks_.store(n_chunks, std::memory_order_relaxed);
  fn_ = &fn;
  done_chunks_.store(0, std::memory_order_relaxed);
  uint32_t gen = ++generation_;
  claim_.store((uint64_t)gen << 32, std::memory_order_release);  // publishes the parameters
  wake_.fetch_add(1, std::memory_order_acq_rel);
  if (sleepers_.load(std::memory_order_acquire) > 0) wake_.notify_all();
  RunChunks(gen, 0);
  // Only chunks that a worker claimed can still be running.
  int64_t done = done_chunks_.load(std::memory_order_acquire);
  const int spins = spin_iters_.load(std::memory_order_relaxed);
  for (int spin = 0; done != n_chunks && spin < spins; ++spin) {
    _mm_pause();
    done = done_chunks_.load(std::memory_order_acquire);
  }
  while (done != n_chunks) {
    done_chunks_.wait(done, std::memory_order_acquire);
    done = done_chunks_.load(std::memory_order_acquire);
  }
  // Close the job: later claims for this generation fail.
  claim_.store((uint64_t)gen << 32 | 0xffffffffu, std::memory_order_release);
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
