// Grammar-constrained decoding: the GBNF parser, the matcher on text, and token masks against a brute force
// (every token tried alone on a copy of the matcher).
#include "serve/grammar.h"

#include <gtest/gtest.h>

#include "formats/gguf.h"
#include "grammar_util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lathe::serve {
namespace {

// JSON as ECMA-404 defines it, with whitespace limited as llama.cpp's json.gbnf limits it.
constexpr const char* kJson = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt/] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)";

std::shared_ptr<const Grammar> MustParse(const std::string& text) {
  auto g = Grammar::Parse(text);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return g.ok() ? g.value() : nullptr;
}

bool Accepts(const std::shared_ptr<const Grammar>& g, const std::string& text, bool* complete = nullptr) {
  GrammarMatcher m(g, GrammarVocab::Bytes());
  if (!m.AcceptBytes(text)) return false;
  if (complete) *complete = m.Complete();
  return true;
}

using lathe::testing::GrammarMatches;

TEST(Grammar, JsonAcceptsAndRejects) {
  auto g = MustParse(kJson);
  ASSERT_TRUE(g);
  for (const char* ok : {"{}", "{\"a\":1}", "{\"a\": [1, 2.5e3, -0.5, true, null, \"x\\n\\u00e9\"]}",
                         "{\"k\": {\"n\": {}}}", "{\"caf\xC3\xA9\": \"\xE2\x82\xAC\"}", "{\n  \"a\": 1\n}"}) {
    EXPECT_TRUE(GrammarMatches(g, ok)) << ok;
  }
  for (const char* bad : {"[]", "{\"a\" 1}", "{\"a\":01}", "{\"a\":tru}", "{'a':1}", "{\"a\":1,}", "{\"a\":\"\x01\"}",
                          "{\"a\":1}}", "{\"a\":\"\\x\"}"}) {
    EXPECT_FALSE(GrammarMatches(g, bad)) << bad;
  }
  // Prefixes are accepted but not complete.
  bool complete = true;
  EXPECT_TRUE(Accepts(g, "{\"a\": [1,", &complete));
  EXPECT_FALSE(complete);
}

TEST(Grammar, RepetitionsAndClasses) {
  auto g = MustParse("root ::= \"a\"{2,4} [^a-z]? (\"b\" | \"cd\")+ .{0,2}\n");
  ASSERT_TRUE(g);
  EXPECT_TRUE(GrammarMatches(g, "aab"));
  EXPECT_TRUE(GrammarMatches(g, "aaaa-cdbcd"));
  EXPECT_TRUE(GrammarMatches(g, "aab\xE2\x82\xAC!"));
  EXPECT_FALSE(GrammarMatches(g, "ab"));
  EXPECT_FALSE(GrammarMatches(g, "aaaaab"));  // a fifth 'a' is neither the class nor b / cd
  EXPECT_FALSE(GrammarMatches(g, "aayb"));
  EXPECT_FALSE(GrammarMatches(g, "aab123"));
  auto exact = MustParse("root ::= [0-9]{3} \"-\" [0-9]{,2}\n");
  ASSERT_TRUE(exact);
  EXPECT_TRUE(GrammarMatches(exact, "123-"));
  EXPECT_TRUE(GrammarMatches(exact, "123-45"));
  EXPECT_FALSE(GrammarMatches(exact, "12-45"));
  EXPECT_FALSE(GrammarMatches(exact, "123-456"));
  auto escapes = MustParse("root ::= \"\\x41\\u00e9\\U0001F600\" [\\]\\-] \"\\\"\"\n");
  ASSERT_TRUE(escapes);
  EXPECT_TRUE(GrammarMatches(escapes, "A\xC3\xA9\xF0\x9F\x98\x80]\""));
  EXPECT_TRUE(GrammarMatches(escapes, "A\xC3\xA9\xF0\x9F\x98\x80-\""));
}

// A long chain of rules, each only referring to the next: expanding it must not recurse once per rule.
TEST(Grammar, LongRuleChainsExpandWithoutRecursion) {
  std::string text = "root ::= r0\n";
  const int n = 200000;
  for (int i = 0; i < n; ++i) text += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + " | \"x\"\n";
  text += "r" + std::to_string(n) + " ::= \"y\"\n";
  auto g = MustParse(text);
  ASSERT_TRUE(g);
  EXPECT_TRUE(GrammarMatches(g, "y"));
  EXPECT_TRUE(GrammarMatches(g, "x"));
  EXPECT_FALSE(GrammarMatches(g, "z"));
}

TEST(Grammar, Finished) {
  auto g = MustParse("root ::= \"ab\" [0-9]*\n");
  ASSERT_TRUE(g);
  GrammarMatcher m(g, GrammarVocab::Bytes());
  ASSERT_TRUE(m.AcceptBytes("ab"));
  EXPECT_TRUE(m.Complete());
  EXPECT_FALSE(m.Finished());  // digits may follow
  auto h = MustParse("root ::= \"{\" \"}\"\n");
  GrammarMatcher n(h, GrammarVocab::Bytes());
  ASSERT_TRUE(n.AcceptBytes("{"));
  EXPECT_FALSE(n.Complete());
  ASSERT_TRUE(n.AcceptBytes("}"));
  EXPECT_TRUE(n.Finished());
  EXPECT_FALSE(n.AcceptBytes(" "));
}

TEST(Grammar, ParseErrorsNameThePlace) {
  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {
      {"root ::= foo\n", "rule 'foo' is used (line 1, column 10) but not defined"},
      {"root ::= \"a\"\nroot ::= \"b\"\n", "line 2, column 1: rule 'root' is defined twice"},
      {"root ::= \"abc\n", "line 1, column 10: unterminated string literal"},
      {"root ::= [ab\n", "line 1, column 10: unterminated character class"},
      {"root ::= [z-a]\n", "character range out of order"},
      {"root = \"a\"\n", "expected '::=' after rule name 'root'"},
      {"root ::= \"a\"{3,1}\n", "the maximum is below the minimum"},
      {"root ::= *\n", "'*' follows nothing it could repeat"},
      {"root ::= (\"a\"\n", "unclosed '('"},
      {"root ::= \"a\" )\n", "unexpected ')'"},
      {"root ::= root \"a\" | \"b\"\n", "rule 'root' is left-recursive"},
      {"root ::= x\nx ::= y? \"b\"\ny ::= x \"a\"\n", "is left-recursive"},
      {"root ::= \"\"*\n", "'*' follows nothing it could repeat"},
      {"root ::= (\"a\"?)*\n", "left-recursive"},
      {"root ::= \"\\q\"\n", "unknown escape '\\q'"},
      {"root ::= \"\\x4\"\n", "escape '\\x' needs 2 hex digits"},
      {"other ::= \"a\"\n", "no rule named 'root'"},
      {"root ::= \"a\"{99999}\n", "repetition bound above 4096"},
  };
  const std::string deep = "root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')') + "\n";
  auto d = Grammar::Parse(deep);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("groups nested deeper than 256"), std::string::npos) << d.status().message();
  auto big = Grammar::Parse("root ::= \"" + std::string(300, 'a') + "\"{4000}\n");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("the repetitions write out more than"), std::string::npos);
  for (const auto& c : cases) {
    auto g = Grammar::Parse(c.text);
    ASSERT_FALSE(g.ok()) << c.text;
    EXPECT_NE(g.status().message().find(c.expect), std::string::npos) << c.text << " -> " << g.status().message();
  }
}

// AllowedTokens against trying each token alone, at every prefix of several texts. Then the same walk again with
// a shared mask cache: the second pass takes every mask from it, and they are the first pass's.
void CheckMasks(const std::shared_ptr<const Grammar>& g, const std::shared_ptr<const GrammarVocab>& vocab,
                const std::vector<std::vector<int32_t>>& paths) {
  auto cache = std::make_shared<GrammarMaskCache>();
  std::vector<std::vector<uint8_t>> masks;
  for (int round = 0; round < 3; ++round) {
    size_t k = 0;
    for (const auto& path : paths) {
      GrammarMatcher m(g, vocab, round == 0 ? nullptr : cache);
      for (size_t step = 0; step <= path.size(); ++step) {
        std::vector<uint8_t> mask;
        m.AllowedTokens(&mask);
        ASSERT_EQ((int32_t)mask.size(), vocab->size());
        // (A large vocabulary is tried alone at every sixth step: 49152 tokens a step are ~1 s under ASan.)
        if (round == 0 && (vocab->size() < 4096 || step % 6 == 0)) {
          int allowed = 0;
          for (int32_t id = 0; id < vocab->size(); ++id) {
            ASSERT_EQ(mask[id] != 0, m.Allows(id))
                << "step " << step << " token " << id << " '" << vocab->bytes(id) << "'";
            allowed += mask[id];
          }
          EXPECT_GT(allowed, 0) << "step " << step;
        }
        if (round == 0) {
          masks.push_back(mask);
        } else {
          ASSERT_EQ(mask, masks[k]) << "round " << round << " step " << step;
        }
        ++k;
        if (step < path.size()) {
          ASSERT_TRUE(m.AcceptToken(path[step])) << "step " << step;
        }
      }
    }
  }
  EXPECT_GE(cache->hits(), masks.size());  // the third round hits every time
}

TEST(Grammar, MaskEqualsBruteForceWithSplitCharacters) {
  auto g = MustParse(kJson);
  ASSERT_TRUE(g);
  // Tokens that split UTF-8 characters (é = C3 A9, € = E2 82 AC), cross structure, or are not UTF-8.
  std::vector<std::string> pieces = {"{",    "}",    "\"",     ":",       ",",     " ",     "\n  ", "a",    "\"a\"",
                                     "1",    "12",   ".5",     "e",       "-",     "true",  "nul",  "l",    "\xC3",
                                     "\xA9", "\xE2", "\x82\xAC", "\xE2\x82", "\xAC\"", "caf\xC3", "\xC3\xA9\"",
                                     "\x80", "\xFF", "\\",     "\\u00e9", "[",     "]",     "\":",  "\"}",  "},",
                                     "",     "<eos>", "<ctl>"};
  std::vector<uint8_t> text(pieces.size(), 1);
  text[pieces.size() - 1] = 0;  // a control token
  text[pieces.size() - 2] = 0;
  auto vocab = std::make_shared<GrammarVocab>(pieces, text, std::vector<int32_t>{(int32_t)pieces.size() - 2});
  auto id = [&](const std::string& s) {
    for (size_t i = 0; i < pieces.size(); ++i)
      if (pieces[i] == s) return (int32_t)i;
    ADD_FAILURE() << s;
    return 0;
  };
  const int32_t eos = (int32_t)pieces.size() - 2;
  std::vector<std::vector<int32_t>> paths = {
      {id("{"), id("\"a\""), id(":"), id(" "), id("12"), id(".5"), id("}"), eos},
      {id("{"), id("\""), id("caf\xC3"), id("\xA9"), id("\xE2"), id("\x82\xAC"), id("\":"), id("["), id("true"),
       id(","), id("nul"), id("l"), id("]"), id("}")},
      {id("{"), id("\n  "), id("\""), id("\xE2\x82"), id("\xAC\""), id(":"), id("\""), id("\\u00e9"), id("\"}")},
  };
  CheckMasks(g, vocab, paths);
  // After the closing brace only the end token (and the trailing whitespace rule) remain.
  GrammarMatcher m(g, vocab);
  ASSERT_TRUE(m.AcceptBytes("{}"));
  EXPECT_TRUE(m.Allows(eos));
  EXPECT_TRUE(m.Allows(id(" ")));
  EXPECT_FALSE(m.Allows(id("a")));
  EXPECT_FALSE(m.Allows(id("<ctl>")));
  EXPECT_FALSE(m.Allows(id("")));
  GrammarMatcher start(g, vocab);
  EXPECT_FALSE(start.Allows(eos));
  EXPECT_FALSE(start.AcceptToken(id("}")));
  EXPECT_TRUE(start.AcceptToken(id("{")));
}

// A token that ends inside a character is allowed only when some character it can still become fits: E0 starts
// U+0800..U+0FFF and F0 U+10000.., never '{' (found on stories260K, whose byte tokens let the model write E0 80 ..
// where '{' was due). Overlong forms, surrogates and code points past U+10FFFF are not UTF-8 at all.
TEST(Grammar, IncompleteCharactersMustStillFit) {
  auto g = MustParse("root ::= \"{\" [\u00e9] [\u0800-\uFFFF]*\n");
  ASSERT_TRUE(g);
  std::vector<std::string> pieces = {"{", "\xE0", "\xF0", "\xC3", "\xC3\xA9", "\xA9", "\xC0", "\xE0\x80", "\xE0\xA0",
                                     "\x80", "\xED\xA0", "\xF4\x90"};
  auto vocab = std::make_shared<GrammarVocab>(pieces, std::vector<uint8_t>(pieces.size(), 1), std::vector<int32_t>{});
  auto allowed = [&](const GrammarMatcher& m) {
    std::vector<uint8_t> mask;
    m.AllowedTokens(&mask);
    std::string out;
    for (size_t i = 0; i < mask.size(); ++i) {
      EXPECT_EQ(mask[i] != 0, m.Allows((int32_t)i)) << i;
      if (mask[i]) out += std::to_string(i) + " ";
    }
    return out;
  };
  GrammarMatcher m(g, vocab);
  EXPECT_EQ(allowed(m), "0 ");  // only "{"
  ASSERT_TRUE(m.AcceptToken(0));
  EXPECT_EQ(allowed(m), "3 4 ");  // C3 (then A9), C3 A9
  ASSERT_TRUE(m.AcceptToken(3));
  EXPECT_EQ(allowed(m), "5 ");    // A9 completes U+00E9
  ASSERT_TRUE(m.AcceptToken(5));
  EXPECT_TRUE(m.Complete());
  EXPECT_EQ(allowed(m), "1 8 ");  // E0 and E0 A0 can become U+0800..; E0 80 is overlong, ED A0 a surrogate
  GrammarMatcher bytes(g, vocab);
  EXPECT_FALSE(bytes.AcceptBytes("{\xC3\xA9\xED\xA0\x80"));     // a surrogate
  EXPECT_FALSE(bytes.AcceptBytes("{\xC3\xA9\xF4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(bytes.AcceptBytes("{\xC1\xA9"));                  // overlong
  EXPECT_TRUE(bytes.AcceptBytes("{\xC3\xA9\xE0\xA0\x80"));
}

// A real vocabulary: the stories260K SentencePiece tokenizer (byte-fallback tokens for every non-ASCII
// character) and, when LATHE_SMOLLM2 names it, SmolLM2's byte-level BPE.
void CheckRealVocab(const tokenizer::Tokenizer& tok) {
  // SentencePiece adds a space before the text: allow one.
  auto parsed = Grammar::Parse(std::string(kJson) + "start ::= \" \"? object\n", "start");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  auto g = parsed.value();
  auto vocab = GrammarVocab::FromTokenizer(tok);
  std::vector<std::vector<int32_t>> paths;
  for (const char* doc : {"{\"name\": \"Lily\", \"age\": 3, \"tags\": [\"caf\xC3\xA9\", true, null]}",
                          "{\"story\": \"Once upon a time \xE2\x82\xAC 1.5e3\", \"n\": -0.25}"}) {
    std::vector<int32_t> ids = tok.Encode(doc, false, false);
    // The tokenizer's own split of the text must be a path the grammar allows.
    paths.push_back(ids);
  }
  CheckMasks(g, vocab, paths);
}

void CheckGgufVocab(const std::string& path) {
  auto gguf = formats::GgufFile::Open(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status().message();
  auto tok = tokenizer::Tokenizer::FromGguf(**gguf);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  CheckRealVocab(**tok);
}

TEST(Grammar, MaskEqualsBruteForceStories260K) {
  const std::string path = lathe::testing::SharedPath("models/stories260K/stories260K.gguf");
  LATHE_REQUIRE_FILE(path);
  CheckGgufVocab(path);
}

TEST(Grammar, MaskEqualsBruteForceSmolLM2) {
  const std::string path = lathe::testing::SmolLM2Path();
  LATHE_REQUIRE_FILE(path);
  CheckGgufVocab(path);
}

}  // namespace
}  // namespace lathe::serve
