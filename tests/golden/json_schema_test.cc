// Structured outputs against the Python reference validator: for each schema of
// tests/golden/fixtures/json_schema/cases.json (tools/ref/make_json_schema_fixture.py, jsonschema 4.26), the grammar
// JsonSchemaToGbnf makes accepts every document jsonschema calls valid (written the way generation writes JSON) and
// rejects every document it calls invalid or that is not JSON.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "serve/grammar.h"
#include "server/json_schema.h"
#include "grammar_util.h"
#include "test_util.h"

namespace lathe {
namespace {

using lathe::testing::GrammarMatches;

TEST(JsonSchemaGolden, GrammarAgreesWithJsonschema) {
  std::ifstream f(lathe::testing::SourceDir() + "/tests/golden/fixtures/json_schema/cases.json");
  ASSERT_TRUE(f.good());
  const auto fixture = nlohmann::ordered_json::parse(f);
  ASSERT_GE(fixture["cases"].size(), 7u);
  size_t valid = 0, invalid = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["name"].get<std::string>();
    auto gbnf = server::JsonSchemaToGbnf(c["schema"]);
    ASSERT_TRUE(gbnf.ok()) << name << ": " << gbnf.status().message();
    auto g = serve::Grammar::Parse(gbnf.value());
    ASSERT_TRUE(g.ok()) << name << ": " << g.status().message() << "\n" << gbnf.value();
    for (const auto& d : c["valid"]) {
      EXPECT_TRUE(GrammarMatches(g.value(), d.get<std::string>())) << name << " should accept: " << d.get<std::string>()
                                                            << "\n" << gbnf.value();
      ++valid;
    }
    for (const auto& d : c["invalid"]) {
      EXPECT_FALSE(GrammarMatches(g.value(), d.get<std::string>())) << name << " should reject: " << d.get<std::string>();
      ++invalid;
    }
  }
  EXPECT_GT(valid, 100u);
  EXPECT_GT(invalid, 1000u);
}

// JSON mode: every valid document that is an object is a JSON object the generic grammar takes.
TEST(JsonSchemaGolden, JsonObjectModeTakesEveryObject) {
  std::ifstream f(lathe::testing::SourceDir() + "/tests/golden/fixtures/json_schema/cases.json");
  ASSERT_TRUE(f.good());
  const auto fixture = nlohmann::ordered_json::parse(f);
  auto g = serve::Grammar::Parse(server::JsonObjectGbnf());
  ASSERT_TRUE(g.ok()) << g.status().message();
  for (const auto& c : fixture["cases"]) {
    for (const auto& d : c["valid"]) {
      const std::string text = d.get<std::string>();
      EXPECT_EQ(GrammarMatches(g.value(), text), text[0] == '{') << text;
    }
  }
}

}  // namespace
}  // namespace lathe
