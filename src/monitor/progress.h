// Training progress on stderr: on a terminal, one line redrawn in place with \r (step/total, loss,
// lr, tokens/s, ETA, RSS); otherwise quiet except plain log lines when the trainer logs.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace lathe::monitor {

// "1:02:03" for seconds >= 0 (hours unbounded), "?" for negative or non-finite.
std::string FormatDuration(double seconds);

struct ProgressState {
  int64_t step = 0, total = 0;
  double loss = -1;  // < 0: not known yet
  double lr = 0;
  double tokens_per_s = 0;
  double elapsed_s = 0;
  int64_t rss_bytes = 0;
};
// The one-line summary, e.g. "step 12/100  12% | loss 2.3456 | lr 4.50e-05 | 1234 tok/s |
// ETA 0:01:23 | RSS 123.4 MiB". ETA = elapsed / step * (total - step).
std::string FormatProgress(const ProgressState& s);

class ProgressBar {
 public:
  // interactive: redraw one line with \r (pass IsTerminal(out) for stderr's real state).
  ProgressBar(FILE* out, bool interactive) : out_(out), interactive_(interactive) {}
  static bool IsTerminal(FILE* f);
  // Redraws the line (interactive only; at most ~10 times a second unless force).
  void Update(const ProgressState& s, bool force = false);
  // A line that stays (log lines, messages): clears the bar first when interactive, redraws after.
  void Print(const std::string& line);
  // Ends the bar's line (interactive only).
  void Finish();

 private:
  FILE* out_;
  bool interactive_;
  bool drawn_ = false;
  double last_draw_ = -1;
  size_t last_len_ = 0;
  std::string last_line_;
};

}  // namespace lathe::monitor
