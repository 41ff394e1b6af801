// Progress line formatting: step/total, loss, lr, tokens/s, ETA and RSS; durations and sizes.
#include <gtest/gtest.h>

#include <cstdio>

#include "monitor/memory.h"
#include "monitor/progress.h"

namespace lathe::monitor {
namespace {

TEST(TrainerProgress, FormatsOneLine) {
  ProgressState s{25, 100, 2.34567, 4.5e-5, 1234.4, 50.0, 123 * 1024 * 1024 + 512 * 1024};
  EXPECT_EQ(FormatProgress(s),
            "step 25/100  25% | loss 2.3457 | lr 4.50e-05 | 1234 tok/s | ETA 0:02:30 | RSS 123.5 MiB");
  s.step = 0;
  s.loss = -1;
  EXPECT_EQ(FormatProgress(s), "step 0/100   0% | loss - | lr 4.50e-05 | 1234 tok/s | ETA ? | RSS 123.5 MiB");
}

TEST(TrainerProgress, DurationsAndBytes) {
  EXPECT_EQ(FormatDuration(0), "0:00:00");
  EXPECT_EQ(FormatDuration(59.6), "0:01:00");
  EXPECT_EQ(FormatDuration(3725), "1:02:05");
  EXPECT_EQ(FormatDuration(100 * 3600), "100:00:00");
  EXPECT_EQ(FormatDuration(-1), "?");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(3 << 20), "3.0 MiB");
  EXPECT_EQ(FormatBytes(5LL << 30), "5.00 GiB");
}

TEST(TrainerProgress, NotATerminalPrintsOnlyLogLines) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  ProgressBar bar(f, ProgressBar::IsTerminal(f));
  ProgressState s{1, 10, 2.0, 1e-3, 10, 1, 1 << 20};
  bar.Update(s, true);
  bar.Print("step 1/10 log line");
  bar.Finish();
  std::fclose(f);
  EXPECT_EQ(std::string(buf, len), "step 1/10 log line\n");
  free(buf);
}

TEST(TrainerProgress, TerminalRedrawsWithCarriageReturn) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  ProgressBar bar(f, /*interactive=*/true);
  ProgressState s{1, 10, 2.0, 1e-3, 10, 1, 1 << 20};
  bar.Update(s, true);
  s.step = 2;
  bar.Update(s, true);
  bar.Finish();
  std::fclose(f);
  std::string out(buf, len);
  free(buf);
  EXPECT_EQ(out.rfind("\rstep 1/10", 0), 0u) << out;
  EXPECT_NE(out.find("\rstep 2/10"), std::string::npos);
  EXPECT_EQ(out.back(), '\n');
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1);
}

}  // namespace
}  // namespace lathe::monitor
