// Progress line formatting and terminal redraw.
#include "monitor/progress.h"

#include <unistd.h>

#include <chrono>
#include <cmath>

#include "core/status.h"
#include "monitor/memory.h"  // FormatBytes

namespace lathe::monitor {

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  long long s = (long long)std::llround(seconds);
  return StrFormat("%lld:%02lld:%02lld", s / 3600, (s / 60) % 60, s % 60);
}

std::string FormatProgress(const ProgressState& s) {
  int pct = s.total > 0 ? (int)(100 * s.step / s.total) : 0;
  std::string line = StrFormat("step %lld/%lld %3d%%", (long long)s.step, (long long)s.total, pct);
  line += s.loss >= 0 ? StrFormat(" | loss %.4f", s.loss) : std::string(" | loss -");
  line += StrFormat(" | lr %.2e | %.0f tok/s", s.lr, s.tokens_per_s);
  double eta = s.step > 0 ? s.elapsed_s / (double)s.step * (double)(s.total - s.step) : -1;
  line += " | ETA " + FormatDuration(eta);
  line += " | RSS " + FormatBytes((double)s.rss_bytes);
  return line;
}

bool ProgressBar::IsTerminal(FILE* f) { return isatty(fileno(f)) == 1; }

static double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void ProgressBar::Update(const ProgressState& s, bool force) {
  if (!interactive_) return;
  double now = NowSeconds();
  if (!force && drawn_ && now - last_draw_ < 0.1) return;
  last_draw_ = now;
  last_line_ = FormatProgress(s);
  std::string pad = last_line_.size() < last_len_ ? std::string(last_len_ - last_line_.size(), ' ') : "";
  std::fprintf(out_, "\r%s%s", last_line_.c_str(), pad.c_str());
  std::fflush(out_);
  last_len_ = last_line_.size();
  drawn_ = true;
}

void ProgressBar::Print(const std::string& line) {
  if (interactive_ && drawn_) std::fprintf(out_, "\r%s\r", std::string(last_len_, ' ').c_str());
  std::fprintf(out_, "%s\n", line.c_str());
  if (interactive_ && drawn_) std::fprintf(out_, "%s", last_line_.c_str());
  std::fflush(out_);
}

void ProgressBar::Finish() {
  if (interactive_ && drawn_) std::fprintf(out_, "\n");
  std::fflush(out_);
  drawn_ = false;
}

}  // namespace lathe::monitor
