// ThreadPool: the one pool every parallel kernel uses (no OpenMP, no second pool).
// Work is split into chunks claimed from one atomic (job generation << 32 | next chunk). The
// caller runs chunks too and waits only for chunks a worker has actually claimed, so a worker
// that is asleep or has lost its core to another process costs nothing: the caller just does
// more of the work. Idle workers spin briefly, then sleep on a futex (std::atomic::wait). A busy
// machine therefore degrades to single-thread speed instead of collapsing like spinning barriers.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace lathe {

// A non-owning reference to a callable void(int64_t begin, int64_t end, int thread_index).
class RangeFn {
 public:
  template <typename F>
  RangeFn(const F& f)  // NOLINT: implicit by design
      : obj_(&f), call_([](const void* o, int64_t b, int64_t e, int t) { (*(const F*)o)(b, e, t); }) {}
  void operator()(int64_t b, int64_t e, int t) const { call_(obj_, b, e, t); }

 private:
  const void* obj_;
  void (*call_)(const void*, int64_t, int64_t, int);
};

class ThreadPool {
 public:
  // n_threads counts the calling thread: n_threads - 1 workers are started.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Records every chunk each thread runs as a "pool_chunk" op (a track per thread in the trace).
  // Not owned; nullptr turns it off. Set it only while no ParallelFor is running.
  void SetProfiler(class Profiler* p) { profiler_ = p; }
  // Pause-loop iterations an idle worker (and the caller waiting for claimed chunks) spins before it
  // sleeps on the futex. Longer for training, whose products follow each other with short serial gaps
  // between them: waking a sleeping worker costs a futex call and, on a VM, a halted vCPU's wake-up.
  static constexpr int kDefaultSpinIters = 1 << 13;  // a few tens of microseconds
  static constexpr int kTrainSpinIters = 1 << 16;    // about a millisecond
  void SetSpinIters(int n) { spin_iters_.store(n < 0 ? 0 : n, std::memory_order_relaxed); }

  // Calls fn(begin, end, thread) over [0, n) in chunks of `grain` (the last may be short), on all
  // threads including the caller, and returns when every chunk is done. Not reentrant: fn must not
  // call ParallelFor on the same pool. Only one thread may call ParallelFor at a time.
  void ParallelFor(int64_t n, int64_t grain, RangeFn fn);
  // The same, but all on the caller when `work` (the job's flops, or an equivalent count of simple
  // operations) is below kMinParallelWork: a job that small finishes before a second thread could
  // join it, and handing it over costs more than it saves (stories260K decode: 2 threads were
  // slower than 1).
  void ParallelFor(int64_t n, int64_t grain, RangeFn fn, double work) {
    ParallelFor(n, work < kMinParallelWork ? (n > 0 ? n : 1) : grain, fn);
  }
  // About 2 us of one core's f32 FMA work. Picked, not swept. On a loaded box stories260K decode on
  // 2 threads went from 11705 to 15562 tok/s with it; a quiet-box repeat could not resolve a
  // difference (bench/RESULTS.md, "Prefill attention in K/V blocks"); other values were not tried.
  static constexpr double kMinParallelWork = 128 * 1024;

 private:
  void WorkerLoop(int index);
  // Claims and runs chunks of job `gen` until none are left; returns the number run.
  int64_t RunChunks(uint32_t gen, int thread);

  int n_threads_;
  std::vector<std::thread> workers_;
  // (generation << 32) | next chunk index. Workers claim a chunk by CAS, which fails once the
  // caller has moved on to another generation, so a late worker never touches a finished job.
  std::atomic<uint64_t> claim_{0};
  std::atomic<uint32_t> wake_{0};       // bumped per job; sleeping workers wait on it
  std::atomic<int> sleepers_{0};
  std::atomic<int64_t> done_chunks_{0};
  // Job parameters: written before the generation is published, read only after a claim.
  int64_t n_ = 0;
  int64_t grain_ = 1;
  std::atomic<int64_t> n_chunks_{0};  // atomic: a stale worker may read it while it changes
  const RangeFn* fn_ = nullptr;
  uint32_t generation_ = 0;  // caller-side copy
  std::atomic<bool> stop_{false};
  std::atomic<int> spin_iters_{kDefaultSpinIters};
  class Profiler* profiler_ = nullptr;
};

// A process-wide default pool sized by LATHE_THREADS or the number of online CPUs; CLI sub-
// commands create their own from --threads instead.
int DefaultThreadCount();

}  // namespace lathe
