// Regular expressions against Python's re: for each pattern of tests/golden/fixtures/regex/cases.json
// (tools/ref/make_regex_fixture.py), the grammar RegexToGbnf makes accepts exactly the strings re.fullmatch
// matches (guided_regex: the output is one match), and a JSON schema string with that `pattern` accepts exactly the
// strings re.search finds it in, written as json.dumps writes them (as generation writes JSON strings).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "serve/grammar.h"
#include "server/json_schema.h"
#include "server/regex.h"
#include "grammar_util.h"
#include "test_util.h"

namespace lathe {
namespace {

using lathe::testing::GrammarMatches;

TEST(RegexGolden, GrammarAgreesWithPythonRe) {
  std::ifstream f(lathe::testing::SourceDir() + "/tests/golden/fixtures/regex/cases.json");
  ASSERT_TRUE(f.good());
  const auto fixture = nlohmann::json::parse(f);
  ASSERT_GE(fixture["cases"].size(), 30u);
  size_t rows = 0, full = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string pattern = c["pattern"].get<std::string>();
    auto expr = server::RegexToGbnf(pattern);
    ASSERT_TRUE(expr.ok()) << pattern << ": " << expr.status().message();
    auto g = serve::Grammar::Parse("root ::= " + expr.value() + "\n");
    ASSERT_TRUE(g.ok()) << pattern << ": " << g.status().message() << "\n" << expr.value();
    nlohmann::ordered_json schema = {{"type", "string"}, {"pattern", pattern}};
    auto sg = server::JsonSchemaToGbnf(schema);
    ASSERT_TRUE(sg.ok()) << pattern << ": " << sg.status().message();
    auto jg = serve::Grammar::Parse(sg.value());
    ASSERT_TRUE(jg.ok()) << pattern << ": " << jg.status().message() << "\n" << sg.value();
    for (const auto& row : c["strings"]) {
      const std::string s = row[0].get<std::string>();
      const bool want_full = row[1].get<bool>(), want_search = row[2].get<bool>();
      EXPECT_EQ(GrammarMatches(g.value(), s), want_full) << "/" << pattern << "/ on " << nlohmann::json(s).dump() << "\n"
                                                  << expr.value();
      const std::string doc = nlohmann::json(s).dump(-1, ' ', false);
      EXPECT_EQ(GrammarMatches(jg.value(), doc), want_search) << "pattern /" << pattern << "/ in " << doc << "\n" << sg.value();
      ++rows;
      full += want_full;
    }
  }
  EXPECT_GT(rows, 5000u);
  EXPECT_GT(full, 1000u);
}

}  // namespace
}  // namespace lathe
