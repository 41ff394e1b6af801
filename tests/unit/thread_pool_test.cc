// ThreadPool covers every index exactly once, for many job sizes, repeatedly.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace lathe {
namespace {

TEST(ThreadPool, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 2, 7, 64, 1000}) {
      for (int64_t grain : {1, 3, 16, 2000}) {
        std::vector<std::atomic<int>> hits(n);
        pool.ParallelFor(n, grain, [&](int64_t b, int64_t e, int t) {
          ASSERT_GE(t, 0);
          ASSERT_LT(t, threads);
          for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << grain << " " << i;
      }
    }
  }
}

TEST(ThreadPool, ManySmallJobs) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int rep = 0; rep < 20000; ++rep) {
    pool.ParallelFor(4, 1, [&](int64_t b, int64_t e, int) { sum.fetch_add(e - b); });
  }
  EXPECT_EQ(sum.load(), 80000);
}

}  // namespace
}  // namespace lathe
