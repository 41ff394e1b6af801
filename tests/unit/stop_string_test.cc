// StopStringMatcher: streamed text is held back only while it could still become a stop string.
#include "serve/generate.h"

#include <gtest/gtest.h>

namespace lathe::serve {
namespace {

TEST(StopStringMatcher, HoldsPrefixesAndCutsAtMatch) {
  StopStringMatcher m({"<|im_end|>", "\n\n"});
  bool stopped = false;
  EXPECT_EQ(m.Push("Hello", &stopped), "Hello");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(m.Push(" world<|im", &stopped), " world");  // "<|im" may start a stop string
  EXPECT_FALSE(stopped);
  EXPECT_EQ(m.Push("_en", &stopped), "");
  EXPECT_EQ(m.Push("d|>tail", &stopped), "");
  EXPECT_TRUE(stopped);
}

TEST(StopStringMatcher, FalseAlarmIsReleased) {
  StopStringMatcher m({"STOP"});
  bool stopped = false;
  EXPECT_EQ(m.Push("ST", &stopped), "");
  EXPECT_EQ(m.Push("AR", &stopped), "STAR");
  EXPECT_EQ(m.Push("S", &stopped), "");  // may start "STOP" again
  EXPECT_EQ(m.Push("T", &stopped), "");
  EXPECT_EQ(m.Flush(), "ST");
  EXPECT_FALSE(stopped);
}

TEST(StopStringMatcher, EarliestOfSeveral) {
  StopStringMatcher m({"b", "abc"});
  bool stopped = false;
  EXPECT_EQ(m.Push("xxabcd", &stopped), "xx");  // "abc" starts before "b"
  EXPECT_TRUE(stopped);
}

TEST(StopStringMatcher, NoStops) {
  StopStringMatcher m({});
  bool stopped = false;
  EXPECT_EQ(m.Push("anything", &stopped), "anything");
  EXPECT_EQ(m.Flush(), "");
}

}  // namespace
}  // namespace lathe::serve
