// JSON schema -> GBNF: what each keyword makes the grammar accept, and errors that name the keyword and where it is.
#include "server/json_schema.h"

#include <gtest/gtest.h>

#include "serve/grammar.h"

namespace lathe::server {
namespace {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const serve::Grammar> Compile(const std::string& schema) {
  auto gbnf = JsonSchemaToGbnf(ojson::parse(schema));
  EXPECT_TRUE(gbnf.ok()) << gbnf.status().message();
  if (!gbnf.ok()) return nullptr;
  auto g = serve::Grammar::Parse(gbnf.value());
  EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << gbnf.value();
  return g.ok() ? g.value() : nullptr;
}

bool Matches(const std::shared_ptr<const serve::Grammar>& g, const std::string& text) {
  serve::GrammarMatcher m(g, serve::GrammarVocab::Bytes());
  return m.AcceptBytes(text) && m.Complete();
}

TEST(JsonSchema, ObjectMembersInOrderOptionalOnesMayBeLeftOut) {
  auto g = Compile(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                      "c": {"type": "boolean"}}, "required": ["b"]})");
  ASSERT_TRUE(g);
  for (const char* ok : {R"({"b": ""})", R"({"a": 1, "b": "x"})", R"({"b": "x", "c": true})", R"({"a":-2,"b":"","c":false})"})
    EXPECT_TRUE(Matches(g, ok)) << ok;
  for (const char* bad : {R"({})", R"({"a": 1})", R"({"b": "x", "a": 1})", R"({"b": "x",})", R"({, "b": "x"})",
                          R"({"b": "x", "d": 1})", R"({"b": 1})", R"({"a": 1.5, "b": "x"})"})
    EXPECT_FALSE(Matches(g, bad)) << bad;
}

// `properties` given, even empty, closes the object unless additionalProperties opens it (a tool without
// parameters takes {} only); without `properties` any keys are allowed.
TEST(JsonSchema, ListedPropertiesCloseTheObject) {
  auto empty = Compile(R"({"type": "object", "properties": {}})");
  ASSERT_TRUE(empty);
  EXPECT_TRUE(Matches(empty, "{}"));
  EXPECT_FALSE(Matches(empty, R"({"a": 1})"));
  auto open = Compile(R"({"type": "object"})");
  ASSERT_TRUE(open);
  EXPECT_TRUE(Matches(open, R"({"a": [1, {"b": null}]})"));
  auto map = Compile(R"({"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}})");
  ASSERT_TRUE(map);
  EXPECT_TRUE(Matches(map, R"({"a": 1, "b": -2})"));
  EXPECT_FALSE(Matches(map, R"({"a": "x"})"));
}

TEST(JsonSchema, GeneratedTextEndsWithTheValue) {
  auto g = Compile(R"({"type": "object", "properties": {"x": {"type": "null"}}, "required": ["x"]})");
  ASSERT_TRUE(g);
  serve::GrammarMatcher m(g, serve::GrammarVocab::Bytes());
  ASSERT_TRUE(m.AcceptBytes("{\"x\": null"));
  EXPECT_FALSE(m.Complete());
  ASSERT_TRUE(m.AcceptBytes(" }"));
  EXPECT_TRUE(m.Finished());  // nothing may follow: generation stops here
}

TEST(JsonSchema, ErrorsNameThePathAndKeyword) {
  struct Case {
    const char* schema;
    const char* expect;
  } cases[] = {
      {R"({"type": "string", "pattern": "^a"})", "JSON schema $: 'pattern' is not supported"},
      {R"({"properties": {"age": {"type": "integer", "minimum": 0}}})", "$.properties.age: 'minimum' is not supported"},
      {R"({"type": "object", "properties": {"a": {"type": "thing"}}})", "$.properties.a.type: unknown type 'thing'"},
      {R"({"$ref": "#/$defs/missing"})", "$ref '#/$defs/missing' points at nothing"},
      {R"({"$ref": "http://example.com/s.json"})", "only references into this schema"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "'b' is required but has no schema"},
      {R"({"type": "object", "properties": {"a": {}}, "additionalProperties": true})",
       "$.additionalProperties: other keys beside 'properties' are not supported"},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})", "$.allOf: only an allOf with one schema"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "maxItems is below minItems"},
      {R"({"type": "string", "maxLength": -1})", "$.maxLength: must be a non-negative integer"},
      {R"({"enum": []})", "$.enum: must be a non-empty array"},
      {R"(false)", "the schema 'false' allows nothing"},
      {R"({"anyOf": [{"type": "integer"}, {"not": {}}]})", "$.anyOf[1]: 'not' is not supported"},
      {R"(["string"])", "a schema must be an object or a boolean"},
  };
  for (const auto& c : cases) {
    auto g = JsonSchemaToGbnf(ojson::parse(c.schema));
    ASSERT_FALSE(g.ok()) << c.schema;
    EXPECT_NE(g.status().message().find(c.expect), std::string::npos) << c.schema << " -> " << g.status().message();
  }
}

TEST(JsonSchema, LiteralsAndChoicesEscape) {
  EXPECT_EQ(GbnfLiteral("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\x01\"");
  auto g = serve::Grammar::Parse(ChoiceGbnf({"yes", "no \"way\"", "caf\xC3\xA9"}));
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(Matches(g.value(), "no \"way\""));
  EXPECT_TRUE(Matches(g.value(), "caf\xC3\xA9"));
  EXPECT_FALSE(Matches(g.value(), "yes "));
  auto e = Compile(R"({"enum": ["a\"q", 1.5, null, {"k": [1]}]})");
  ASSERT_TRUE(e);
  EXPECT_TRUE(Matches(e, "\"a\\\"q\""));
  EXPECT_TRUE(Matches(e, "1.5"));
  EXPECT_TRUE(Matches(e, "{\"k\":[1]}"));
  EXPECT_FALSE(Matches(e, "1"));
}

}  // namespace
}  // namespace lathe::server
