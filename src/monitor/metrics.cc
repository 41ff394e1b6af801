// Prometheus text exposition.
#include "monitor/metrics.h"

#include <cmath>
#include <cstdio>

#include "core/check.h"

namespace lathe::monitor {

namespace {
void AtomicAdd(std::atomic<double>& a, double v) {
  double cur = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}

std::string Num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15) std::snprintf(buf, sizeof(buf), "%.0f", v);
  else std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

std::string Braced(const std::string& labels, const std::string& extra = "") {
  std::string all = labels;
  if (!extra.empty()) all += (all.empty() ? "" : ",") + extra;
  return all.empty() ? "" : "{" + all + "}";
}
}  // namespace

void Counter::Inc(double v) {
  LATHE_CHECK(v >= 0);
  AtomicAdd(v_, v);
}

void Gauge::Add(double v) { AtomicAdd(v_, v); }

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {
  for (size_t i = 1; i < bounds_.size(); ++i) LATHE_CHECK(bounds_[i] > bounds_[i - 1]);
}

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  std::lock_guard<std::mutex> lock(mu_);
  counts_[i]++;
  sum_ += v;
  count_++;
}

Histogram::Snapshot Histogram::Get() const {
  std::lock_guard<std::mutex> lock(mu_);
  Snapshot s;
  s.bounds = bounds_;
  uint64_t c = 0;
  for (uint64_t n : counts_) s.cumulative.push_back(c += n);
  s.sum = sum_;
  s.count = count_;
  return s;
}

std::string LabelPair(const std::string& key, const std::string& value) {
  std::string v;
  for (char ch : value) {
    if (ch == '\\') v += "\\\\";
    else if (ch == '"') v += "\\\"";
    else if (ch == '\n') v += "\\n";
    else v += ch;
  }
  return key + "=\"" + v + "\"";
}

Registry::Family& Registry::GetFamily(const std::string& name, const std::string& type, const std::string& help) {
  Family& f = families_[name];
  if (f.type.empty()) {
    f.type = type;
    f.help = help;
  }
  LATHE_CHECK_MSG(f.type == type, "metric %s registered as %s and %s", name.c_str(), f.type.c_str(), type.c_str());
  return f;
}

Counter* Registry::GetCounter(const std::string& name, const std::string& help, const std::string& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = GetFamily(name, "counter", help).counters[labels];
  if (!slot) slot = std::make_unique<Counter>();
  return slot.get();
}

Gauge* Registry::GetGauge(const std::string& name, const std::string& help, const std::string& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = GetFamily(name, "gauge", help).gauges[labels];
  if (!slot) slot = std::make_unique<Gauge>();
  return slot.get();
}

Histogram* Registry::GetHistogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                                  const std::string& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = GetFamily(name, "histogram", help).histograms[labels];
  if (!slot) slot = std::make_unique<Histogram>(bounds);
  return slot.get();
}

std::string Registry::Render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    out += "# HELP " + name + " " + f.help + "\n# TYPE " + name + " " + f.type + "\n";
    for (const auto& [labels, c] : f.counters) out += name + Braced(labels) + " " + Num(c->value()) + "\n";
    for (const auto& [labels, g] : f.gauges) out += name + Braced(labels) + " " + Num(g->value()) + "\n";
    for (const auto& [labels, h] : f.histograms) {
      Histogram::Snapshot s = h->Get();
      for (size_t i = 0; i <= s.bounds.size(); ++i) {
        std::string le = i < s.bounds.size() ? Num(s.bounds[i]) : "+Inf";
        out += name + "_bucket" + Braced(labels, "le=\"" + le + "\"") + " " + Num((double)s.cumulative[i]) + "\n";
      }
      out += name + "_sum" + Braced(labels) + " " + Num(s.sum) + "\n";
      out += name + "_count" + Braced(labels) + " " + Num((double)s.count) + "\n";
    }
  }
  return out;
}

}  // namespace lathe::monitor
