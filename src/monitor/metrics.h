// Prometheus metrics: counters, gauges and histograms with labels, rendered in the text
// exposition format (version 0.0.4) for GET /metrics. Thread-safe; updates are lock-free for
// counters and gauges, a short mutex for histograms.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace lathe::monitor {

class Counter {
 public:
  void Inc(double v = 1.0);
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

class Gauge {
 public:
  void Set(double v) { v_.store(v, std::memory_order_relaxed); }
  void Add(double v);
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);  // upper bounds, ascending; +Inf is implied
  void Observe(double v);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Get() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// A set of named metric families. Labels are given as "key=\"value\"" text (already escaped by
// LabelPair). Returned pointers stay valid for the registry's lifetime.
class Registry {
 public:
  Counter* GetCounter(const std::string& name, const std::string& help, const std::string& labels = "");
  Gauge* GetGauge(const std::string& name, const std::string& help, const std::string& labels = "");
  Histogram* GetHistogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                          const std::string& labels = "");
  // The text exposition of every family.
  std::string Render() const;

 private:
  struct Family {
    std::string type, help;
    std::map<std::string, std::unique_ptr<Counter>> counters;
    std::map<std::string, std::unique_ptr<Gauge>> gauges;
    std::map<std::string, std::unique_ptr<Histogram>> histograms;
  };
  Family& GetFamily(const std::string& name, const std::string& type, const std::string& help);
  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
};

// key="value" with the value escaped as Prometheus requires (\\, \", \n).
std::string LabelPair(const std::string& key, const std::string& value);

}  // namespace lathe::monitor
