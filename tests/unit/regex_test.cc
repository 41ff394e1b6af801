// Regular expressions as GBNF: what each construct accepts (tests/golden/regex_test.cc checks whole patterns
// against Python's re), and the errors for what a grammar cannot express.
#include "server/regex.h"

#include <gtest/gtest.h>

#include "serve/grammar.h"

namespace lathe::server {
namespace {

bool FullMatch(const std::string& pattern, const std::string& text) {
  auto e = RegexToGbnf(pattern);
  EXPECT_TRUE(e.ok()) << pattern << ": " << e.status().message();
  if (!e.ok()) return false;
  auto g = serve::Grammar::Parse("root ::= " + e.value() + "\n");
  EXPECT_TRUE(g.ok()) << pattern << ": " << g.status().message() << "\n" << e.value();
  if (!g.ok()) return false;
  serve::GrammarMatcher m(g.value(), serve::GrammarVocab::Bytes());
  return m.AcceptBytes(text) && m.Complete();
}

TEST(Regex, Constructs) {
  EXPECT_TRUE(FullMatch("a.c", "abc"));
  EXPECT_FALSE(FullMatch("a.c", "a\nc"));  // . is not a newline
  EXPECT_TRUE(FullMatch("[^a-c]x", "dx"));
  EXPECT_FALSE(FullMatch("[^a-c]x", "bx"));
  EXPECT_TRUE(FullMatch("\\d{2,3}", "123"));
  EXPECT_FALSE(FullMatch("\\d{2,3}", "1234"));
  EXPECT_TRUE(FullMatch("x{,2}y", "y"));
  EXPECT_TRUE(FullMatch("a{2", "a{2"));  // not a quantifier: literal, as Python reads it
  EXPECT_TRUE(FullMatch("(?:ab)+?", "abab"));
  EXPECT_TRUE(FullMatch("(?P<n>a)|(?<m>b)", "b"));
  EXPECT_TRUE(FullMatch("^ab$", "ab"));
  EXPECT_TRUE(FullMatch("\\u00e9\\x41\\U0001F600", "\xC3\xA9" "A\xF0\x9F\x98\x80"));
  EXPECT_TRUE(FullMatch("[\\w-]+", "a_b-9"));
  EXPECT_FALSE(FullMatch("\\w", "\xC3\xA9"));  // ASCII classes
  EXPECT_TRUE(FullMatch("\\W", "\xC3\xA9"));
  EXPECT_TRUE(FullMatch("(a*)*", ""));
  EXPECT_TRUE(FullMatch("(a|b?)+c", "abbac"));
  EXPECT_TRUE(FullMatch("(x?y?){2}z", "yxz"));
  EXPECT_TRUE(FullMatch("a{0}b", "b"));
  EXPECT_TRUE(FullMatch("(?#note)a", "a"));
}

TEST(Regex, ErrorsNameTheOffset) {
  struct Case {
    const char* pattern;
    const char* expect;
  } cases[] = {
      {"(a", "offset 0: missing ), unterminated subpattern"},
      {"a)", "offset 1: unbalanced ')'"},
      {"[ab", "offset 0: unterminated character set"},
      {"[b-a]", "offset 1: bad character range (out of order)"},
      {"*a", "offset 0: nothing to repeat"},
      {"a**", "offset 2: multiple repeat"},
      {"a++", "offset 1: possessive quantifiers are not supported"},
      {"(a)\\1", "offset 3: backreferences are not supported"},
      {"(?P=n)", "backreferences are not supported"},
      {"a(?=b)", "offset 1: lookahead is not supported"},
      {"(?<!a)b", "lookbehind is not supported"},
      {"(?i)a", "inline flags"},
      {"\\bword", "offset 0: word boundaries"},
      {"a^b", "offset 1: anchors (^, \\A) are supported only at the start"},
      {"(a$)", "offset 2: anchors ($, \\Z) are supported only at the end"},
      {"a{5,2}", "offset 1: min repeat greater than max repeat"},
      {"a{5000}", "repeat counts above 4096"},
      {"\\q", "offset 0: bad escape '\\q'"},
      {"\\x4", "escape '\\x' needs 2 hex digits"},
      {"\xff", "not UTF-8"},
      {"[^\\x00-\\U0010FFFF]", "matches nothing"},
  };
  for (const auto& c : cases) {
    auto e = RegexToGbnf(c.pattern);
    ASSERT_FALSE(e.ok()) << c.pattern;
    EXPECT_NE(e.status().message().find(c.expect), std::string::npos) << c.pattern << " -> " << e.status().message();
  }
  std::string optional_items = "(";
  for (int i = 0; i < 3000; ++i) optional_items += "a?";
  auto big = RegexToGbnf(optional_items + ")*");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("too complex"), std::string::npos) << big.status().message();
  EXPECT_TRUE(RegexToGbnf("(a?b?c?d?e?f?g?h?)*").ok());
  std::string deep(300, '(');
  EXPECT_FALSE(RegexToGbnf(deep + "a" + std::string(300, ')')).ok());
}

}  // namespace
}  // namespace lathe::server
