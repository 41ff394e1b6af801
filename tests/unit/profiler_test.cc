// Profiler: the Chrome trace parses back with every op, per-thread tracks and metadata; the
// summary aggregates by op; an unwritable path is an error.
#include "core/profiler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/thread_pool.h"

namespace lathe {
namespace {

TEST(Profiler, TraceAndSummary) {
  Profiler p;
  {
    ScopedOp a(&p, "matmul", 2e9, 1e9, "[1, 576] x [576, 576] q4_1");
  }
  {
    ScopedOp b(&p, "matmul", 2e9, 1e9);
  }
  {
    ScopedOp c(&p, "rmsnorm", 1e6, 1e6);
  }
  ThreadPool pool(2);
  pool.SetProfiler(&p);
  {
    ScopedOp par(&p, "parallel");  // both threads busy inside it
    // Every chunk waits (up to 2 s) until both threads have started one, so they overlap even when a
    // loaded machine (CI under ASan) is slow to wake the worker: it flaked at exactly 1.20 there.
    std::atomic<int> seen{0};
    pool.ParallelFor(64, 1, [&](int64_t, int64_t, int thread) {
      seen.fetch_or(1 << thread);
      for (int i = 0; i < 40000 && seen.load() != 3; ++i) std::this_thread::sleep_for(std::chrono::microseconds(50));
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    });
  }
  pool.SetProfiler(nullptr);
  {
    ScopedOp off(nullptr, "ignored");  // no profiler: nothing recorded
  }
  std::string path = ::testing::TempDir() + "/trace.json";
  ASSERT_TRUE(p.WriteChromeTrace(path).ok());
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in);
  int matmuls = 0, chunks = 0, meta = 0;
  std::set<int> chunk_threads;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M") {
      meta++;
      continue;
    }
    EXPECT_EQ(e["ph"], "X");
    EXPECT_GE(e["dur"].get<double>(), 0);
    if (e["name"] == "matmul") matmuls++;
    if (e["name"] == "pool_chunk") {
      chunks++;
      chunk_threads.insert(e["tid"].get<int>());
    }
    EXPECT_NE(e["name"], "ignored");
  }
  EXPECT_EQ(matmuls, 2);
  EXPECT_EQ(chunks, 64);
  EXPECT_GE(meta, 1);
  EXPECT_EQ(j["traceEvents"][0]["args"]["shape"], "[1, 576] x [576, 576] q4_1");
  std::string s = p.Summary();
  EXPECT_NE(s.find("matmul"), std::string::npos);
  EXPECT_EQ(s.find("pool_chunk"), std::string::npos);
  EXPECT_LT(s.find("matmul"), s.find("rmsnorm")) << s;  // sorted by time
  // The cores column: the serial ops 1.00; the pool job between 1 and 2 (sleeping chunks leave the
  // second thread free to claim about half of them).
  auto cores = [&](const std::string& op) {
    size_t at = s.find("\n" + op + " ");
    EXPECT_NE(at, std::string::npos) << s;
    size_t eol = s.find('\n', at + 1);
    return std::stod(s.substr(s.rfind(' ', eol) + 1, eol - s.rfind(' ', eol) - 1));
  };
  EXPECT_NE(s.find("cores"), std::string::npos) << s;
  EXPECT_DOUBLE_EQ(cores("rmsnorm"), 1.0) << s;
  EXPECT_GT(cores("parallel"), 1.2) << s;
  EXPECT_LE(cores("parallel"), 2.01) << s;
  EXPECT_FALSE(p.WriteChromeTrace("/proc/nope/trace.json").ok());
}

// Events live in per-thread buffers: each thread keeps one track, a later profiler (maybe at the same
// address) starts empty, Clear empties every thread's buffer, and Events come back by start time.
TEST(Profiler, PerThreadBuffers) {
  for (int round = 0; round < 2; ++round) {
    auto p = std::make_unique<Profiler>();
    {
      ScopedOp a(p.get(), "main_op");
    }
    std::thread([&] {
      ScopedOp b(p.get(), "other_op");
    }).join();
    {
      ScopedOp c(p.get(), "main_op");
    }
    std::vector<Profiler::Event> evs = p->Events();
    ASSERT_EQ(evs.size(), 3u) << "round " << round;
    EXPECT_EQ(evs[0].name, "main_op");
    EXPECT_EQ(evs[1].name, "other_op");
    EXPECT_EQ(evs[2].name, "main_op");
    EXPECT_EQ(evs[0].tid, 0);
    EXPECT_EQ(evs[1].tid, 1);
    EXPECT_EQ(evs[2].tid, 0);
    for (size_t i = 1; i < evs.size(); ++i) EXPECT_LE(evs[i - 1].start_ns, evs[i].start_ns);
    p->Clear();
    EXPECT_TRUE(p->Events().empty());
    {
      ScopedOp d(p.get(), "after_clear");
    }
    ASSERT_EQ(p->Events().size(), 1u);
    EXPECT_EQ(p->Events()[0].tid, 0);
  }
}

}  // namespace
}  // namespace lathe
