// Qwen3.5's XML tool calls (ToolFormat::kQwen3Coder, vLLM's qwen3_coder parser): the grammar that holds a call to
// the tools' shapes, the reader that turns the generated text back into OpenAI tool calls (whole and streamed), and
// the parameter values read as the types the tools declare. The call text itself is the one tool_turns writes,
// which tests/golden/tool_chat_test.cc holds to Qwen3.5's jinja.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "grammar_util.h"
#include "server/openai_api.h"
#include "tokenizer/tool_turns.h"
#include "tool_call_util.h"

namespace lathe::server {
namespace {

using ojson = nlohmann::ordered_json;

// The tools of the tests below: weather (a required string, an optional enum of strings), and a clock with typed
// parameters.
ojson XmlTools() {
  return ojson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "time_in", "parameters": {"type": "object",
      "properties": {"zone": {"type": "string"}, "as_24h": {"type": "boolean"}, "offset": {"type": "number"},
                     "n": {"type": "integer"}, "opts": {"type": "object", "properties": {"a": {"type": "array"}}},
                     "note": {}},
      "required": ["zone"]}}}])");
}

ojson XmlParameters() {
  ojson params = ojson::object();
  for (const auto& t : XmlTools()) params[t["function"]["name"].get<std::string>()] = t["function"]["parameters"];
  return params;
}

// Feeds `text` to a kQwen3Coder reader `step` bytes at a time (then finished): the content and the calls, their
// deltas joined as the server joins them.
std::pair<std::string, std::vector<ToolCall>> XmlRead(const std::string& text, size_t step) {
  ToolCallReader reader("call_q_", ToolFormat::kQwen3Coder, /*list=*/false, XmlParameters());
  return lathe::testing::FeedToolCallReader(reader, text, step);
}

// The request's "auto" grammar (XmlToolCallGbnf over XmlTools) accepts `text` (what follows "<tool_call>") whole.
bool XmlGrammarAccepts(const std::string& text, bool parallel = true) {
  std::vector<std::pair<std::string, ojson>> fns;
  for (const auto& t : XmlTools()) fns.push_back({t["function"]["name"], t["function"]["parameters"]});
  auto gbnf = XmlToolCallGbnf(fns, parallel);
  EXPECT_TRUE(gbnf.ok()) << gbnf.status().message();
  auto g = serve::Grammar::Parse(gbnf.value());
  EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << gbnf.value();
  return g.ok() && lathe::testing::GrammarMatches(g.value(), text);
}

TEST(XmlToolCalls, ParameterValuesTakeTheirDeclaredTypes) {
  const ojson p = XmlParameters()["time_in"];
  EXPECT_EQ(XmlParameterValue("Europe/Paris", p, "zone"), "Europe/Paris");
  EXPECT_EQ(XmlParameterValue("42", p, "zone"), "42");  // a string stays a string
  EXPECT_EQ(XmlParameterValue("True", p, "as_24h"), true);
  EXPECT_EQ(XmlParameterValue("false", p, "as_24h"), false);
  EXPECT_EQ(XmlParameterValue("yes", p, "as_24h"), false);  // vLLM: only "true" is true
  EXPECT_EQ(XmlParameterValue("1.5", p, "offset"), 1.5);
  const ojson whole = XmlParameterValue("2.0", p, "offset");
  EXPECT_TRUE(whole.is_number_integer()) << whole;  // a whole number is an integer, as vLLM's float -> int
  EXPECT_EQ(whole, 2);
  EXPECT_EQ(XmlParameterValue(" 7 ", p, "n"), 7);
  EXPECT_EQ(XmlParameterValue("7.5", p, "n"), "7.5");  // not an integer: the text
  EXPECT_EQ(XmlParameterValue("{\"a\": [1, \"x\"]}", p, "opts"), ojson::parse(R"({"a": [1, "x"]})"));
  EXPECT_EQ(XmlParameterValue("{not json", p, "opts"), "{not json");
  EXPECT_EQ(XmlParameterValue("NULL", p, "zone"), nullptr);
  EXPECT_EQ(XmlParameterValue("3", p, "unlisted"), "3");  // a key the schema does not list: the text
  EXPECT_EQ(XmlParameterValue("[1, 2]", p, "note"), "[1, 2]");  // no type: a string
  const ojson types = ojson::parse(R"({"properties": {"v": {"type": ["integer", "null"]}}})");
  EXPECT_EQ(XmlParameterValue("12", types, "v"), 12);  // a list of types: the JSON the text holds
  EXPECT_EQ(XmlParameterValue("True", types, "v"), true);
  EXPECT_EQ(XmlParameterValue("abc", types, "v"), "abc");
}

// The call text tool_turns writes (the jinja's) reads back as the same call, whole and at every piece size.
TEST(XmlToolCalls, ReaderReadsWhatTheTemplateWrites) {
  std::vector<tokenizer::ToolCallTurn> turns = {
      {"get_weather", ojson::parse(R"({"city": "Paris", "unit": "c"})"), ""},
      {"time_in", ojson::parse(R"({"zone": "a <b> c\nd", "as_24h": false, "offset": 1.5, "n": 3, "opts": {"a": [1, "x"]}})"), ""}};
  const std::string text = tokenizer::ToolCallsText(ToolFormat::kQwen3Coder, "Let me check.", turns);
  ASSERT_NE(text.find("<parameter=as_24h>\nFalse\n</parameter>"), std::string::npos) << text;
  for (size_t step : {1, 2, 3, 7, 16, 1000}) {
    auto [content, calls] = XmlRead(text, step);
    EXPECT_EQ(content, "Let me check.") << step;
    ASSERT_EQ(calls.size(), 2u) << step;
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(calls[0].id, "call_q_0");
    EXPECT_EQ(calls[0].arguments, R"({"city":"Paris","unit":"c"})") << step;
    EXPECT_EQ(calls[1].name, "time_in");
    EXPECT_EQ(calls[1].index, 1);
    EXPECT_EQ(ojson::parse(calls[1].arguments), turns[1].arguments) << calls[1].arguments;
  }
  // What follows "<tool_call>" is what the "auto" grammar allows (the parameters in the schema's order).
  EXPECT_TRUE(XmlGrammarAccepts(text.substr(text.find("<tool_call>") + 11)));
}

TEST(XmlToolCalls, ReaderStreamsEachParameterAndKeepsTextThatIsNotACall) {
  ToolCallReader reader("c_", ToolFormat::kQwen3Coder, false, XmlParameters());
  std::string content;
  std::vector<ToolCall> d;
  std::string text = "Sure.\n<tool_call>\n<function=get_weather>\n";
  reader.Update(text, false, &content, &d);
  EXPECT_EQ(content, "Sure.");
  ASSERT_EQ(d.size(), 1u);  // the call goes out at its function tag
  EXPECT_EQ(d[0].name, "get_weather");
  EXPECT_EQ(d[0].arguments, "{");
  d.clear();
  text += "<parameter=city>\nOs";
  reader.Update(text, false, &content, &d);
  EXPECT_TRUE(d.empty());  // a value goes out once it has ended
  text += "lo\n</parameter>\n";
  reader.Update(text, false, &content, &d);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].id, "");
  EXPECT_EQ(d[0].arguments, R"("city":"Oslo")");
  d.clear();
  text += "</function>\n</tool_call>";
  reader.Update(text, true, &content, &d);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].arguments, "}");
  EXPECT_EQ(reader.calls(), 1);
  EXPECT_EQ(content, "Sure.");

  // No call: all content, including a tag's prefix at the end.
  EXPECT_EQ(XmlRead("Hello <tool_c", 1).first, "Hello <tool_c");
  EXPECT_TRUE(XmlRead("Hello <tool_c", 1).second.empty());
  // A block that is not an XML call (Hermes JSON) comes back as content.
  const std::string json_call = "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>";
  for (size_t step : {1, 5, 100}) {
    auto [content2, calls2] = XmlRead(json_call, step);
    EXPECT_EQ(content2, json_call) << step;
    EXPECT_TRUE(calls2.empty());
  }
  // Lenient as vLLM's parser: a value the model did not close ends at </function>; a call without </tool_call>.
  auto [c3, calls3] = XmlRead("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</function>", 3);
  ASSERT_EQ(calls3.size(), 1u);
  EXPECT_EQ(calls3[0].arguments, R"({"city":"Rome"})");
  EXPECT_EQ(c3, "");
  // Cut by max_tokens inside a value: the call keeps what it has.
  auto [c4, calls4] = XmlRead("<tool_call>\n<function=time_in>\n<parameter=n>\n4\n</parameter>\n<parameter=zo", 4);
  ASSERT_EQ(calls4.size(), 1u);
  EXPECT_EQ(calls4[0].arguments, R"({"n":4)");
}

TEST(XmlToolCalls, GrammarHoldsCallsToTheToolsShapes) {
  const std::string weather = "\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(XmlGrammarAccepts(weather));
  // Optional parameters may be left out; an enum takes one of its strings, as text.
  EXPECT_TRUE(XmlGrammarAccepts("\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nf\n"
                                "</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(XmlGrammarAccepts("\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\n"
                                 "kelvin\n</parameter>\n</function>\n</tool_call>"));
  // A required parameter may not be left out; an unknown function or parameter is refused.
  EXPECT_FALSE(XmlGrammarAccepts("\n<function=get_weather>\n</function>\n</tool_call>"));
  EXPECT_FALSE(XmlGrammarAccepts("\n<function=get_time>\n</function>\n</tool_call>"));
  EXPECT_FALSE(XmlGrammarAccepts("\n<function=get_weather>\n<parameter=town>\nParis\n</parameter>\n</function>\n</tool_call>"));
  // Typed values are JSON of their schema.
  const std::string typed = "\n<function=time_in>\n<parameter=zone>\nUTC\n</parameter>\n<parameter=as_24h>\ntrue\n"
                            "</parameter>\n<parameter=n>\n12\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(XmlGrammarAccepts(typed));
  std::string bad = typed;
  bad.replace(bad.find("12"), 2, "twelve");
  EXPECT_FALSE(XmlGrammarAccepts(bad));
  // A string value may hold anything but the closing tags: code with "<" and "</" in it, a long one too.
  std::string code = "if (a < b) { return \"</p>\"; } // <parameter <function </ </param";
  for (int i = 0; i < 200; ++i) code += " x < y </fun";
  EXPECT_TRUE(XmlGrammarAccepts("\n<function=get_weather>\n<parameter=city>\n" + code + "\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(XmlGrammarAccepts("\n<function=get_weather>\n<parameter=city>\nParis</parameter>x\n</parameter>\n</function>\n"
                                 "</tool_call>"));
  // Parallel calls follow in tags; without parallel_tool_calls, one.
  const std::string two = weather + "\n<tool_call>" + weather;
  EXPECT_TRUE(XmlGrammarAccepts(two, true));
  EXPECT_FALSE(XmlGrammarAccepts(two, false));
}

// A chat request for a Qwen3.5 model: the XML grammar after the "<tool_call>" trigger, the tools' parameters kept for
// the reader, and names the XML cannot hold refused by field.
TEST(XmlToolCalls, RequestsForQwen35UseTheXmlCalls) {
  const std::string body = R"({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": )" +
                           XmlTools().dump() + "}";
  CompletionRequest r;
  const auto ordered = ojson::parse(body);
  auto e = ParseCompletionRequest(nlohmann::json::parse(body), true, &r, &ordered, ToolFormat::kQwen3Coder);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(r.tool_mode, "auto");
  EXPECT_EQ(r.sampling.grammar_trigger, "<tool_call>");
  EXPECT_NE(r.grammar.find("<function=time_in>"), std::string::npos);
  EXPECT_EQ(r.tool_parameters["get_weather"]["required"][0], "city");
  EXPECT_NE(r.tools_prompt.find("<function=example_function_name>"), std::string::npos);
  // "required" is a JSON list of calls, as for every format (vLLM's too).
  CompletionRequest req;
  std::string required = body;
  required.insert(required.size() - 1, R"(, "tool_choice": "required")");
  const auto ordered2 = ojson::parse(required);
  e = ParseCompletionRequest(nlohmann::json::parse(required), true, &req, &ordered2, ToolFormat::kQwen3Coder);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(req.grammar.find("<function="), std::string::npos);
  // A parameter name with ">" cannot be written in a call.
  const std::string bad = R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
      "function": {"name": "f", "parameters": {"type": "object", "properties": {"a>b": {"type": "string"}}}}}]})";
  CompletionRequest rb;
  const auto ordered3 = ojson::parse(bad);
  e = ParseCompletionRequest(nlohmann::json::parse(bad), true, &rb, &ordered3, ToolFormat::kQwen3Coder);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "tools");
  EXPECT_NE(e->message.find("parameter name 'a>b'"), std::string::npos) << e->message;
}

}  // namespace
}  // namespace lathe::server
