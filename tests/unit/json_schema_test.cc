// JSON schema -> GBNF: what each keyword makes the grammar accept, and errors that name the keyword and where it is.
#include "server/json_schema.h"

#include <gtest/gtest.h>

#include "serve/grammar.h"
#include "grammar_util.h"

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

using lathe::testing::GrammarMatches;

TEST(JsonSchema, ObjectMembersInOrderOptionalOnesMayBeLeftOut) {
  auto g = Compile(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                      "c": {"type": "boolean"}}, "required": ["b"]})");
  ASSERT_TRUE(g);
  for (const char* ok : {R"({"b": ""})", R"({"a": 1, "b": "x"})", R"({"b": "x", "c": true})", R"({"a":-2,"b":"","c":false})"})
    EXPECT_TRUE(GrammarMatches(g, ok)) << ok;
  for (const char* bad : {R"({})", R"({"a": 1})", R"({"b": "x", "a": 1})", R"({"b": "x",})", R"({, "b": "x"})",
                          R"({"b": "x", "d": 1})", R"({"b": 1})", R"({"a": 1.5, "b": "x"})"})
    EXPECT_FALSE(GrammarMatches(g, bad)) << bad;
}

// `properties` given, even empty, closes the object unless additionalProperties opens it (a tool without
// parameters takes {} only); without `properties` any keys are allowed.
TEST(JsonSchema, ListedPropertiesCloseTheObject) {
  auto empty = Compile(R"({"type": "object", "properties": {}})");
  ASSERT_TRUE(empty);
  EXPECT_TRUE(GrammarMatches(empty, "{}"));
  EXPECT_FALSE(GrammarMatches(empty, R"({"a": 1})"));
  auto open = Compile(R"({"type": "object"})");
  ASSERT_TRUE(open);
  EXPECT_TRUE(GrammarMatches(open, R"({"a": [1, {"b": null}]})"));
  auto map = Compile(R"({"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}})");
  ASSERT_TRUE(map);
  EXPECT_TRUE(GrammarMatches(map, R"({"a": 1, "b": -2})"));
  EXPECT_FALSE(GrammarMatches(map, R"({"a": "x"})"));
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
      {R"({"type": "string", "multipleOf": 2})", "JSON schema $: 'multipleOf' is not supported"},
      {R"({"properties": {"age": {"type": ["number", "integer"], "minimum": 0}}})",
       "$.properties.age: 'minimum' is supported with \"type\": \"integer\" or \"number\" (not both)"},
      {R"({"properties": {"age": {"minimum": 0}}})", "$.properties.age: 'minimum' is supported with \"type\": \"integer\""},
      {R"({"type": "number", "minimum": 1, "exclusiveMaximum": 1})", "$: no number lies within its minimum and maximum"},
      {R"({"type": "integer", "minimum": 5, "exclusiveMaximum": 5})", "$: no integer lies within its minimum and maximum"},
      {R"({"type": "integer", "maximum": "3"})", "$.maximum: must be a number"},
      {R"({"type": "integer", "minimum": 1e17})", "$.minimum: beyond 16 digits is not supported"},
      {R"({"pattern": "a"})", "$: 'pattern' is supported with \"type\": \"string\" only"},
      {R"({"type": "string", "pattern": "(a"})", "$.pattern: regex at offset 0: missing ), unterminated subpattern"},
      {R"({"type": "string", "pattern": "(a)\\1"})", "$.pattern: regex at offset 3: backreferences are not supported"},
      {R"({"type": "string", "pattern": "a", "maxLength": 3})", "'pattern' together with minLength / maxLength"},
      {R"({"type": "string", "pattern": "a", "format": "date"})", "'pattern' together with a 'format'"},
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

// Integer bounds against the definition, for every integer in [-1200, 1200] and a few far away.
TEST(JsonSchema, IntegerBoundsAcceptExactlyTheRange) {
  struct Bounds {
    const char* keywords;
    int64_t lo, hi;  // the range they allow (INT64_MIN / INT64_MAX: open)
  } cases[] = {
      {R"("minimum": 0, "maximum": 100)", 0, 100},
      {R"("minimum": -12, "maximum": 305)", -12, 305},
      {R"("minimum": 7)", 7, INT64_MAX},
      {R"("maximum": -3)", INT64_MIN, -3},
      {R"("exclusiveMinimum": 0)", 1, INT64_MAX},
      {R"("exclusiveMinimum": -1.5, "exclusiveMaximum": 999.5)", -1, 999},
      {R"("minimum": 1000, "maximum": 1000)", 1000, 1000},
      {R"("minimum": -1000, "maximum": -999)", -1000, -999},
      {R"("minimum": 10, "maximum": 1099, "exclusiveMaximum": 1000)", 10, 999},
      {R"("minimum": 0.5, "maximum": 9.99)", 1, 9},
      {R"("minimum": -1e20, "maximum": 1e20)", INT64_MIN, INT64_MAX},
  };
  for (const auto& c : cases) {
    const std::string schema = std::string(R"({"type": "integer", )") + c.keywords + "}";
    auto g = Compile(schema);
    ASSERT_TRUE(g) << schema;
    std::vector<int64_t> xs;
    for (int64_t x = -1200; x <= 1200; ++x) xs.push_back(x);
    for (int64_t x : {99999LL, 100000LL, 123456789LL, 9999999999999999LL, -9999999999999999LL, -5000LL, 5000LL}) xs.push_back(x);
    for (int64_t x : xs) {
      EXPECT_EQ(GrammarMatches(g, std::to_string(x)), x >= c.lo && x <= c.hi) << schema << " on " << x;
    }
    EXPECT_FALSE(GrammarMatches(g, "01")) << schema;  // no leading zeros
    if (c.lo != INT64_MIN || c.hi != INT64_MAX) {
      EXPECT_FALSE(GrammarMatches(g, "-0")) << schema;
    }
    EXPECT_FALSE(GrammarMatches(g, "1.0")) << schema;
  }
}

// Number bounds against the definition: every decimal -12.999 .. 12.999 written with 0-3 fraction digits (trailing
// zeros too), compared in thousandths.
TEST(JsonSchema, NumberBoundsAcceptExactlyTheRange) {
  struct Bounds {
    const char* keywords;
    int64_t lo, hi;  // thousandths; lo/hi_open: that side strict; INT64_MIN / INT64_MAX: unbounded
    bool lo_open, hi_open;
  } cases[] = {
      {R"("minimum": 0, "maximum": 1)", 0, 1000, false, false},
      {R"("minimum": -0.5, "maximum": 2.25)", -500, 2250, false, false},
      {R"("exclusiveMinimum": 0, "exclusiveMaximum": 1)", 0, 1000, true, true},
      {R"("exclusiveMinimum": 0.25)", 250, INT64_MAX, true, false},
      {R"("maximum": -1.05)", INT64_MIN, -1050, false, false},
      {R"("exclusiveMaximum": -1.05)", INT64_MIN, -1050, false, true},
      {R"("minimum": -9.99, "exclusiveMaximum": -2)", -9990, -2000, false, true},
      {R"("minimum": 3.14, "maximum": 3.142)", 3140, 3142, false, false},
      {R"("minimum": 3.5, "maximum": 3.5)", 3500, 3500, false, false},
      {R"("minimum": 1e-2, "maximum": 1.2e1)", 10, 12000, false, false},
      {R"("minimum": 2, "exclusiveMinimum": 2, "maximum": 7, "exclusiveMaximum": 9)", 2000, 7000, true, false},
      {R"("minimum": -12.5, "maximum": 0)", -12500, 0, false, false},
      {R"("exclusiveMinimum": -3, "exclusiveMaximum": 0)", -3000, 0, true, true},
  };
  std::vector<std::pair<std::string, int64_t>> xs;  // text, thousandths
  for (int neg = 0; neg < 2; ++neg) {
    for (int64_t i = 0; i <= 12; ++i) {
      const std::string sign = neg ? "-" : "";
      const int64_t s = neg ? -1 : 1;
      if (!(neg && i == 0)) xs.push_back({sign + std::to_string(i), s * i * 1000});
      for (int64_t f = 0; f < 10; ++f) xs.push_back({sign + std::to_string(i) + "." + std::to_string(f), s * (i * 1000 + f * 100)});
      for (int64_t f = 0; f < 100; ++f) {
        const std::string fs = (f < 10 ? "0" : "") + std::to_string(f);
        xs.push_back({sign + std::to_string(i) + "." + fs, s * (i * 1000 + f * 10)});
      }
      for (const char* fs : {"001", "049", "050", "099", "100", "140", "142", "143", "250", "499", "500", "501", "999"})
        xs.push_back({sign + std::to_string(i) + "." + fs, s * (i * 1000 + std::atoi(fs))});
    }
  }
  for (const auto& c : cases) {
    const std::string schema = std::string(R"({"type": "number", )") + c.keywords + "}";
    auto g = Compile(schema);
    ASSERT_TRUE(g) << schema;
    for (const auto& [text, v] : xs) {
      // Zero is written "0" ("-0.0" is never generated, though it is in range where 0 is).
      const bool want = (c.lo == INT64_MIN || (c.lo_open ? v > c.lo : v >= c.lo)) &&
                        (c.hi == INT64_MAX || (c.hi_open ? v < c.hi : v <= c.hi)) && !(v == 0 && text[0] == '-');
      EXPECT_EQ(GrammarMatches(g, text), want) << schema << " on " << text;
    }
    for (const char* bad : {"01", "1e0", "-0", "1.", ".5", "+1"}) EXPECT_FALSE(GrammarMatches(g, bad)) << schema << " on " << bad;
  }
  // Far values: long integer parts, beyond the bounds or not.
  auto g = Compile(R"({"type": "number", "minimum": -1000000.5})");
  ASSERT_TRUE(g);
  EXPECT_TRUE(GrammarMatches(g, "9999999999999999.25"));
  EXPECT_TRUE(GrammarMatches(g, "-1000000.5"));
  EXPECT_FALSE(GrammarMatches(g, "-1000000.51"));
  EXPECT_TRUE(GrammarMatches(g, "-999999.999"));
  // No number in range, bounds beyond the digits, bounds on a number-or-integer: refused.
  std::string error;
  for (const char* schema : {R"({"type": "number", "minimum": 2, "maximum": 1})",
                             R"({"type": "number", "exclusiveMinimum": 1, "maximum": 1})",
                             R"({"type": "number", "minimum": 1e30})",
                             R"({"type": ["number", "integer"], "minimum": 1})"}) {
    auto r = server::JsonSchemaToGbnf(ojson::parse(schema));
    EXPECT_FALSE(r.ok()) << schema;
  }
}

TEST(JsonSchema, FormatsAndPatterns) {
  auto date = Compile(R"({"type": "string", "format": "date"})");
  ASSERT_TRUE(date);
  EXPECT_TRUE(GrammarMatches(date, "\"2026-12-07\""));
  EXPECT_TRUE(GrammarMatches(date, "\"1999-02-28\""));
  EXPECT_FALSE(GrammarMatches(date, "\"2026-02-30\""));
  EXPECT_FALSE(GrammarMatches(date, "\"2026-13-01\""));
  EXPECT_FALSE(GrammarMatches(date, "\"0999-01-01\""));
  auto dt = Compile(R"({"type": "string", "format": "date-time"})");
  EXPECT_TRUE(GrammarMatches(dt, "\"2026-12-07T04:05:28Z\""));
  EXPECT_TRUE(GrammarMatches(dt, "\"2026-12-07T23:59:59.123456+05:30\""));
  EXPECT_FALSE(GrammarMatches(dt, "\"2026-12-07 04:05:28Z\""));
  EXPECT_FALSE(GrammarMatches(dt, "\"2026-12-07T24:00:00Z\""));
  auto uuid = Compile(R"({"type": "string", "format": "uuid"})");
  EXPECT_TRUE(GrammarMatches(uuid, "\"123e4567-e89b-12d3-a456-426614174000\""));
  EXPECT_FALSE(GrammarMatches(uuid, "\"123e4567e89b12d3a456426614174000\""));
  auto ip = Compile(R"({"type": "string", "format": "ipv4"})");
  EXPECT_TRUE(GrammarMatches(ip, "\"192.168.0.255\""));
  EXPECT_FALSE(GrammarMatches(ip, "\"192.168.0.256\""));
  EXPECT_FALSE(GrammarMatches(ip, "\"192.168.00.1\""));
  // Unknown formats are annotations.
  auto hostname = Compile(R"({"type": "string", "format": "hostname"})");
  EXPECT_TRUE(GrammarMatches(hostname, "\"anything at all\""));
  // A pattern is a search unless anchored; the string is written JSON-escaped.
  auto p = Compile(R"({"type": "string", "pattern": "ab+"})");
  EXPECT_TRUE(GrammarMatches(p, "\"xx abbb \\\"yy\""));
  EXPECT_FALSE(GrammarMatches(p, "\"a b\""));
  auto q = Compile(R"({"type": "string", "pattern": "^[\"\\\\]{2}$"})");  // two of: " and backslash
  EXPECT_TRUE(GrammarMatches(q, R"("\"\\")"));
  EXPECT_FALSE(GrammarMatches(q, R"("\"\\x")"));
}

TEST(JsonSchema, LiteralsAndChoicesEscape) {
  EXPECT_EQ(GbnfLiteral("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\x01\"");
  auto g = serve::Grammar::Parse(ChoiceGbnf({"yes", "no \"way\"", "caf\xC3\xA9"}));
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(GrammarMatches(g.value(), "no \"way\""));
  EXPECT_TRUE(GrammarMatches(g.value(), "caf\xC3\xA9"));
  EXPECT_FALSE(GrammarMatches(g.value(), "yes "));
  auto e = Compile(R"({"enum": ["a\"q", 1.5, null, {"k": [1]}]})");
  ASSERT_TRUE(e);
  EXPECT_TRUE(GrammarMatches(e, "\"a\\\"q\""));
  EXPECT_TRUE(GrammarMatches(e, "1.5"));
  EXPECT_TRUE(GrammarMatches(e, "{\"k\":[1]}"));
  EXPECT_FALSE(GrammarMatches(e, "1"));
}

}  // namespace
}  // namespace lathe::server
