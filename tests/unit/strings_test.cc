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

}  // namespace
}  // namespace lathe
