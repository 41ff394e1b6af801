// "Did you mean" suggestions.
#include "core/strings.h"

#include <gtest/gtest.h>

namespace lathe {
namespace {

TEST(Strings, EditDistance) {
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3);
  EXPECT_EQ(EditDistance("", "abc"), 3);
  EXPECT_EQ(EditDistance("same", "same"), 0);
}

TEST(Strings, NearestPrefersPrefixRelations) {
  std::vector<std::string> flags = {"--temp", "--template", "--top-k", "--top-p"};
  EXPECT_EQ(Nearest("--temperature", flags), "--temp");  // closer in spelling to --template
  EXPECT_EQ(Nearest("--top_k", flags), "--top-k");
  EXPECT_EQ(Nearest("adam", {"adamw", "adamw_8bit", "sgd"}), "adamw");
  EXPECT_EQ(Nearest("lora_rnak", {"lora_rank", "lora_alpha"}), "lora_rank");
  EXPECT_EQ(Nearest("completely_different", flags), "");
}

TEST(Strings, MarkerPrefixAtEnd) {
  EXPECT_EQ(MarkerPrefixAtEnd("abc </thi", "</think>"), 5u);
  EXPECT_EQ(MarkerPrefixAtEnd("abc <", "</think>"), 1u);
  EXPECT_EQ(MarkerPrefixAtEnd("abc </think>", "</think>"), 0u);  // the whole marker is not held back
  EXPECT_EQ(MarkerPrefixAtEnd("abc <<", "<<x"), 2u);             // the longest end that begins it
  EXPECT_EQ(MarkerPrefixAtEnd("abc", "</think>"), 0u);
  EXPECT_EQ(MarkerPrefixAtEnd("", "</think>"), 0u);
  EXPECT_EQ(MarkerPrefixAtEnd("<", ""), 0u);
}

}  // namespace
}  // namespace lathe
