// Prometheus text exposition of counters, gauges and histograms.
#include "monitor/metrics.h"

#include <gtest/gtest.h>

#include <thread>

namespace lathe::monitor {
namespace {

TEST(Metrics, RendersTextFormat) {
  Registry r;
  r.GetCounter("lathe_requests_total", "Requests.", LabelPair("status", "ok"))->Inc(3);
  r.GetGauge("lathe_kv_blocks_used", "Blocks in use.")->Set(12);
  Histogram* h = r.GetHistogram("lathe_ttft_seconds", "Time to first token.", {0.1, 1.0});
  h->Observe(0.05);
  h->Observe(0.5);
  h->Observe(5);
  std::string t = r.Render();
  EXPECT_NE(t.find("# TYPE lathe_requests_total counter\nlathe_requests_total{status=\"ok\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lathe_kv_blocks_used 12\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lathe_ttft_seconds_bucket{le=\"0.1\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lathe_ttft_seconds_bucket{le=\"1\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lathe_ttft_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lathe_ttft_seconds_sum 5.55\n"), std::string::npos) << t;
  EXPECT_NE(t.find("lathe_ttft_seconds_count 3\n"), std::string::npos) << t;
}

TEST(Metrics, EscapesLabelsAndCountsConcurrently) {
  EXPECT_EQ(LabelPair("model", "a\"b\\c\nd"), "model=\"a\\\"b\\\\c\\nd\"");
  Registry r;
  Counter* c = r.GetCounter("x_total", "x");
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i) ts.emplace_back([c] { for (int j = 0; j < 10000; ++j) c->Inc(); });
  for (auto& t : ts) t.join();
  EXPECT_EQ(c->value(), 40000);
  EXPECT_EQ(r.GetCounter("x_total", "x"), c);  // same series
}

}  // namespace
}  // namespace lathe::monitor
