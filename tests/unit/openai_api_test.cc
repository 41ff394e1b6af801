// OpenAI request validation (errors name the field) and response/chunk shapes.
#include "server/openai_api.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>

#include "serve/grammar.h"
#include "tool_call_util.h"

namespace lathe::server {
namespace {

using nlohmann::json;

std::optional<ApiError> Parse(const std::string& body, bool chat, CompletionRequest* r) {
  return ParseCompletionRequest(json::parse(body), chat, r);
}

// Feeds `text` to a ToolCallReader `step` bytes at a time (then finished) and returns the content and the calls
// (their streamed deltas joined as the server joins them; `deltas`: each Update's); `list`: tool_choice
// "required"'s list of calls.
std::pair<std::string, std::vector<ToolCall>> ReadToolCalls(const std::string& text, size_t step,
                                                            std::vector<std::string>* pieces = nullptr,
                                                            ToolFormat format = ToolFormat::kHermes,
                                                            std::vector<std::vector<ToolCall>>* deltas = nullptr,
                                                            bool list = false) {
  ToolCallReader reader("call_x_", format, list);
  return lathe::testing::FeedToolCallReader(reader, text, step, pieces, deltas);
}

// What a request's grammar makes of raw text: -1 refused, 0 a prefix, 1 complete (more may follow), 2 finished.
int Verdict(const std::string& gbnf, const std::string& text) {
  auto g = serve::Grammar::Parse(gbnf);
  EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << gbnf;
  if (!g.ok()) return -1;
  serve::GrammarMatcher m(g.value(), serve::GrammarVocab::Bytes());
  if (!m.AcceptBytes(text)) return -1;
  return m.Finished() ? 2 : m.Complete() ? 1 : 0;
}
bool Accepts(const std::string& gbnf, const std::string& text) { return Verdict(gbnf, text) > 0; }

// Two tools: one with a required string parameter, one without parameters.
const char kTwoTools[] = R"("tools": [{"type": "function", "function": {"name": "get_weather", "description": "now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "ping"}}])";

TEST(OpenAiApi, ParsesStructuredOutputs) {
  CompletionRequest r;
  // A JSON schema keeps its properties' order when the caller passes the ordered parse.
  const std::string body = R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "p",
      "schema": {"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "string"}},
      "required": ["zeta", "alpha"]}}}})";
  const auto ordered = nlohmann::ordered_json::parse(body);
  auto e = ParseCompletionRequest(json::parse(body), false, &r, &ordered);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(r.grammar_param, "response_format.json_schema.schema");
  EXPECT_TRUE(Accepts(r.grammar, R"({"zeta": 1, "alpha": "x"})"));
  EXPECT_FALSE(Accepts(r.grammar, R"({"alpha": "x", "zeta": 1})"));
  ASSERT_FALSE(Parse(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})",
                     true, &r));
  EXPECT_EQ(r.grammar_param, "response_format");
  EXPECT_NE(r.grammar.find("root ::= object"), std::string::npos);
  ASSERT_FALSE(Parse(R"({"prompt": "x", "guided_choice": ["yes", "n\"o"]})", false, &r));
  EXPECT_EQ(r.grammar, "root ::= \"yes\" | \"n\\\"o\"\n");
  ASSERT_FALSE(Parse(R"({"prompt": "x", "guided_json": "{\"type\": \"boolean\"}"})", false, &r));
  EXPECT_EQ(r.grammar_param, "guided_json");
  ASSERT_FALSE(Parse(R"({"prompt": "x", "guided_grammar": "root ::= [a-z]+\n"})", false, &r));
  EXPECT_EQ(r.grammar, "root ::= [a-z]+\n");
  ASSERT_FALSE(Parse(R"({"prompt": "x", "response_format": {"type": "text"}})", false, &r));
  EXPECT_TRUE(r.grammar.empty());
  // vLLM >= 0.10 groups them under structured_outputs.
  ASSERT_FALSE(Parse(R"({"prompt": "x", "structured_outputs": {"choice": ["a", "b"]}})", false, &r));
  EXPECT_EQ(r.grammar, "root ::= \"a\" | \"b\"\n");
  EXPECT_EQ(r.grammar_param, "structured_outputs.choice");
  ASSERT_FALSE(Parse(R"({"prompt": "x", "structured_outputs": {"json": {"type": "integer"}}})", false, &r));
  EXPECT_EQ(r.grammar_param, "structured_outputs.json");
  ASSERT_FALSE(Parse(R"({"prompt": "x", "structured_outputs": {"json_object": true}})", false, &r));
  EXPECT_NE(r.grammar.find("root ::= object"), std::string::npos);
  // A regular expression: the whole output is one match.
  for (const char* body : {R"({"prompt": "x", "guided_regex": "[0-9]{3}-(ab|c)+"})",
                           R"({"prompt": "x", "structured_outputs": {"regex": "[0-9]{3}-(ab|c)+"}})"}) {
    ASSERT_FALSE(Parse(body, false, &r)) << body;
    EXPECT_TRUE(Accepts(r.grammar, "123-abcab"));
    EXPECT_EQ(Verdict(r.grammar, "12-ab"), -1);
  }
}

TEST(OpenAiApi, ParsesForcedToolCalls) {
  const std::string tools = kTwoTools;
  CompletionRequest r;
  // "required": one or more calls of the tools, as a list of {"name", "arguments"}.
  ASSERT_FALSE(Parse(R"({"messages": [{"role": "user", "content": "Paris?"}], )" + tools + R"(, "tool_choice": "required"})",
                     true, &r));
  EXPECT_EQ(r.tool_mode, "required");
  EXPECT_TRUE(Accepts(r.grammar, R"([{"name": "get_weather", "arguments": {"city": "Paris"}}])"));
  EXPECT_TRUE(Accepts(r.grammar, R"([{"name": "ping", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}])"));
  EXPECT_FALSE(Accepts(r.grammar, R"([])"));
  EXPECT_FALSE(Accepts(r.grammar, R"({"name": "ping", "arguments": {}})"));
  EXPECT_FALSE(Accepts(r.grammar, R"([{"name": "ping", "arguments": {"city": "Paris"}}])"));
  EXPECT_FALSE(Accepts(r.grammar, R"([{"name": "other", "arguments": {}}])"));
  EXPECT_NE(r.tools_prompt.find(R"("name": "get_weather")"), std::string::npos) << r.tools_prompt;
  // The server reads the list back as it streams (ToolCallReader's list mode).
  for (size_t step : {1, 4, 1000}) {
    auto [content, calls] = ReadToolCalls(
        R"([{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "ping", "arguments": {}}])", step, nullptr,
        ToolFormat::kHermes, nullptr, /*list=*/true);
    EXPECT_EQ(content, "");
    ASSERT_EQ(calls.size(), 2u);
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(calls[0].arguments, R"({"city":"Paris"})");
    EXPECT_EQ(calls[1].name, "ping");
    EXPECT_EQ(calls[1].id, "call_x_1");
    EXPECT_EQ(calls[1].index, 1);
  }
  // The length ran out inside the list: the calls that closed, and one cut inside its arguments with what it has;
  // one cut before its arguments began comes back as content.
  auto [rest, calls] = ReadToolCalls(R"([{"name": "ping", "arguments": {"s": "}{"}}, {"name": "get_weather", "argu)", 3,
                                     nullptr, ToolFormat::kHermes, nullptr, true);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "ping");
  EXPECT_EQ(calls[0].arguments, R"({"s":"}{"})");
  EXPECT_EQ(rest, R"({"name": "get_weather", "argu)");
  calls = ReadToolCalls(R"([{"name": "get_weather", "arguments": {"city": "Pa)", 3, nullptr, ToolFormat::kHermes, nullptr,
                        true)
              .second;
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].arguments, R"({"city":"Pa)");
  EXPECT_EQ(ReadToolCalls(R"([{"name": "get_weather", "argu)", 3, nullptr, ToolFormat::kHermes, nullptr, true).first,
            R"([{"name": "get_weather", "argu)");
  // parallel_tool_calls false: exactly one.
  ASSERT_FALSE(Parse(R"({"messages": [{"role": "user", "content": "Paris?"}], "parallel_tool_calls": false, )" + tools +
                         R"(, "tool_choice": "required"})",
                     true, &r));
  EXPECT_TRUE(Accepts(r.grammar, R"([{"name": "ping", "arguments": {}}])"));
  EXPECT_FALSE(Accepts(r.grammar, R"([{"name": "ping", "arguments": {}}, {"name": "ping", "arguments": {}}])"));
  // A named function: the output is its arguments.
  ASSERT_FALSE(Parse(R"({"messages": [{"role": "user", "content": "Paris?"}], )" + tools +
                         R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})",
                     true, &r));
  EXPECT_EQ(r.tool_mode, "named");
  EXPECT_NE(r.tools_prompt.find("Call the function \"get_weather\": reply with its arguments only"), std::string::npos);
  EXPECT_TRUE(Accepts(r.grammar, R"({"city": "Oslo"})"));
  EXPECT_FALSE(Accepts(r.grammar, R"({})"));
  // Its arguments stream (the server's JsonMinifier drops the blanks outside strings, piece by piece).
  JsonMinifier m;
  std::string minified = m.Push("{\"city\": \"Os");
  minified += m.Push("lo \\\" x\", \n  \"n\"");
  minified += m.Push(": [1, 2]}");
  EXPECT_EQ(minified, R"({"city":"Oslo \" x","n":[1,2]})");
  // "none": the tools are ignored.
  ASSERT_FALSE(Parse(R"({"messages": [{"role": "user", "content": "x"}], )" + tools + R"(, "tool_choice": "none"})", true,
                     &r));
  EXPECT_TRUE(r.tool_mode.empty() && r.grammar.empty());
  // Earlier tool turns render as Hermes / Qwen2.5 write them.
  ASSERT_FALSE(Parse(R"({"messages": [{"role": "user", "content": "Paris?"}, {"role": "assistant", "content": null,
      "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "18 C"}]})",
                     true, &r));
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1].content, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  EXPECT_EQ(r.messages[2].role, "user");
  EXPECT_EQ(r.messages[2].content, "<tool_response>\n18 C\n</tool_response>");
  // The response: content null, tool_calls with the arguments as a string.
  Choice c;
  c.tool_calls = {{"call_9", "ping", "{}"}};
  c.finish_reason = "tool_calls";
  json resp = CompletionResponse("id", 0, "m", {c}, Usage{}, true);
  EXPECT_TRUE(resp["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(resp["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "ping");
  EXPECT_EQ(resp["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{}");
  EXPECT_EQ(CompletionChunk("id", 0, "m", c, true, false)["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
}

TEST(OpenAiApi, ParsesAutoToolCalls) {
  const std::string tools = kTwoTools;
  // The lazy grammar is over the text after the first <tool_call>.
  CompletionRequest r;
  // No tool_choice: "auto", the default.
  ASSERT_FALSE(Parse(R"({"messages": [{"role": "user", "content": "Paris?"}], )" + tools + "}", true, &r));
  EXPECT_EQ(r.tool_mode, "auto");
  EXPECT_EQ(r.sampling.grammar_trigger, "<tool_call>");
  EXPECT_NE(r.tools_prompt.find("within <tool_call></tool_call> XML tags"), std::string::npos) << r.tools_prompt;
  const std::string call1 = "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  EXPECT_EQ(Verdict(r.grammar, call1), 1);
  EXPECT_EQ(Verdict(r.grammar, call1 + "\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n"), 1);
  EXPECT_EQ(Verdict(r.grammar, call1 + "\n<tool_call>\n{\"name\": \"ping\""), 0);
  EXPECT_EQ(Verdict(r.grammar, "{\"name\": \"nope\", \"arguments\": {}}"), -1);
  EXPECT_EQ(Verdict(r.grammar, call1 + " and then some text"), -1);
  // parallel_tool_calls false: one call, then the text is done.
  ASSERT_FALSE(Parse(R"({"messages": [{"role": "user", "content": "Paris?"}], "tool_choice": "auto",
                         "parallel_tool_calls": false, )" + tools + "}",
                     true, &r));
  EXPECT_EQ(Verdict(r.grammar, call1), 2);
  EXPECT_EQ(Verdict(r.grammar, call1 + "\n<tool_call>"), -1);
  // A response with content and calls: both.
  Choice c;
  c.text = "Checking.";
  c.tool_calls = {{"call_1_0_0", "ping", "{}", 0}, {"call_1_0_1", "get_weather", R"({"city":"Oslo"})", 1}};
  json resp = CompletionResponse("id", 0, "m", {c}, Usage{}, true);
  EXPECT_EQ(resp["choices"][0]["message"]["content"], "Checking.");
  EXPECT_EQ(resp["choices"][0]["message"]["tool_calls"][1]["function"]["name"], "get_weather");
  c.tool_calls.erase(c.tool_calls.begin());
  json chunk = CompletionChunk("id", 0, "m", c, true, false)["choices"][0]["delta"];
  EXPECT_EQ(chunk["tool_calls"][0]["index"], 1);
  EXPECT_EQ(chunk["content"], "Checking.");
}

TEST(OpenAiApi, ParsesLlama3ToolCalls) {
  const std::string tools = kTwoTools;
  CompletionRequest r;
  auto e = ParseCompletionRequest(json::parse(R"({"messages": [{"role": "user", "content": "Paris?"}], )" + tools + "}"),
                                  true, &r, nullptr, ToolFormat::kLlama3Json);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(r.tool_mode, "auto");
  EXPECT_EQ(r.sampling.grammar_trigger, "{");
  EXPECT_TRUE(r.sampling.grammar_trigger_at_start);
  auto llama = lathe::tokenizer::ChatTemplate::ByName("llama3");
  ASSERT_TRUE(llama.ok());
  const auto prompt = PromptMessages(r, *llama);  // tools in the first user message
  ASSERT_EQ(prompt.size(), 2u);
  EXPECT_EQ(prompt[0].role, "environment");
  EXPECT_EQ(prompt[1].content, r.tools_prompt + "Paris?");
  EXPECT_EQ(llama->Apply(prompt, true), "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: "
                                        "ipython<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n" +
                                            r.tools_prompt + "Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(r.tools_prompt.rfind("Given the following functions, please respond with a JSON", 0), 0u) << r.tools_prompt;
  EXPECT_NE(r.tools_prompt.find("    \"type\": \"function\""), std::string::npos) << r.tools_prompt;  // indent 4
  // The grammar covers the whole reply from its "{": calls joined by ";", with "parameters".
  const std::string call1 = R"({"name": "get_weather", "parameters": {"city": "Paris"}})";
  EXPECT_EQ(Verdict(r.grammar, call1), 1);
  EXPECT_EQ(Verdict(r.grammar, call1 + R"(; {"name": "ping", "parameters": {}})"), 1);
  EXPECT_EQ(Verdict(r.grammar, R"({"name": "get_weather", "arguments": {"city": "Paris"}})"), -1);
  e = ParseCompletionRequest(json::parse(R"({"messages": [{"role": "user", "content": "Paris?"}],
                                 "parallel_tool_calls": false, )" + tools + "}"),
                             true, &r, nullptr, ToolFormat::kLlama3Json);
  ASSERT_FALSE(e);
  EXPECT_EQ(Verdict(r.grammar, call1), 2);
  // History: calls as {"name", "parameters"} joined by "; ", results as ipython turns.
  e = ParseCompletionRequest(json::parse(R"({"messages": [{"role": "user", "content": "Paris?"}, {"role": "assistant",
      "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather",
      "arguments": "{\"city\": \"Paris\"}"}}, {"id": "c2", "type": "function", "function": {"name": "ping",
      "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "18 C"}]})"),
                             true, &r, nullptr, ToolFormat::kLlama3Json);
  ASSERT_FALSE(e);
  EXPECT_EQ(r.messages[1].content,
            R"({"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "ping", "parameters": {}})");
  EXPECT_EQ(r.messages[2].role, "ipython");
  EXPECT_EQ(r.messages[2].content, "18 C");
  // "required" reads "parameters" back.
  e = ParseCompletionRequest(json::parse(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required", )" +
                                         tools + "}"),
                             true, &r, nullptr, ToolFormat::kLlama3Json);
  ASSERT_FALSE(e);
  auto calls = ReadToolCalls("[" + call1 + "]", 2, nullptr, ToolFormat::kLlama3Json, nullptr, /*list=*/true).second;
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(ToolFormatFor(tokenizer::ChatTemplate::ByName("llama3").value()), ToolFormat::kLlama3Json);
  EXPECT_EQ(ToolFormatFor(tokenizer::ChatTemplate::ByName("chatml").value()), ToolFormat::kHermes);
}

TEST(OpenAiApi, ToolCallReaderStreamsArguments) {
  const std::string text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par is\", \"days\": [1, 2]}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>";
  for (ToolFormat format : {ToolFormat::kHermes, ToolFormat::kMistral, ToolFormat::kLlama3Json}) {
    std::string t = text;
    if (format == ToolFormat::kMistral) {
      t = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par is\", \"days\": [1, 2]}}, "
          "{\"name\": \"ping\", \"arguments\": {}}]";
    } else if (format == ToolFormat::kLlama3Json) {
      t = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Par is\", \"days\": [1, 2]}}; "
          "{\"name\": \"ping\", \"parameters\": {}}";
    }
    for (size_t step : {1, 2, 5, 1000}) {
      std::vector<std::vector<ToolCall>> deltas;
      auto [content, calls] = ReadToolCalls(t, step, nullptr, format, &deltas);
      const std::string what = t + " step " + std::to_string(step);
      EXPECT_EQ(content, "") << what;
      ASSERT_EQ(calls.size(), 2u) << what;
      // The arguments as generated, blanks outside strings dropped.
      EXPECT_EQ(calls[0].arguments, R"({"city":"Par is","days":[1,2]})") << what;
      EXPECT_EQ(calls[1].arguments, "{}") << what;
      EXPECT_EQ(calls[1].name, "ping");
      // Each call's first delta has its id and name; the rest only pieces of its arguments.
      int firsts = 0, pieces_of_first = 0;
      for (const auto& d : deltas) {
        for (const ToolCall& c : d) {
          if (!c.id.empty()) {
            ++firsts;
            EXPECT_EQ(c.id, calls[(size_t)c.index].id);
            EXPECT_EQ(c.name, calls[(size_t)c.index].name);
          } else {
            EXPECT_TRUE(c.name.empty() && !c.arguments.empty()) << what;
          }
          pieces_of_first += c.index == 0;
        }
      }
      EXPECT_EQ(firsts, 2) << what;
      if (step == 1) {
        EXPECT_GT(pieces_of_first, 20) << what;  // byte by byte: the arguments stream
      } else if (step == 1000) {
        EXPECT_EQ(pieces_of_first, 1) << what;
      }
    }
  }
  // Cut off inside the arguments: the call keeps what it has; nothing goes back as content.
  auto [cut, cut_calls] = ReadToolCalls("<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa", 3);
  EXPECT_EQ(cut, "");
  ASSERT_EQ(cut_calls.size(), 1u);
  EXPECT_EQ(cut_calls[0].arguments, R"({"city":"Pa)");
  // Another key order: the call goes out whole when its object closes.
  std::vector<std::vector<ToolCall>> deltas;
  auto [other, other_calls] = ReadToolCalls("<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>", 1,
                                            nullptr, ToolFormat::kHermes, &deltas);
  EXPECT_EQ(other, "");
  ASSERT_EQ(other_calls.size(), 1u);
  EXPECT_EQ(other_calls[0].name, "f");
  EXPECT_EQ(other_calls[0].arguments, R"({"a":1})");
  size_t n_deltas = 0;
  for (const auto& d : deltas) n_deltas += d.size();
  EXPECT_EQ(n_deltas, 1u);
  // A closing tag inside an argument's string is the argument's.
  auto [inner, inner_calls] =
      ReadToolCalls("<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"</tool_call>\"}}</tool_call>", 4);
  EXPECT_EQ(inner, "");
  ASSERT_EQ(inner_calls.size(), 1u);
  EXPECT_EQ(inner_calls[0].arguments, R"({"s":"</tool_call>"})");
  // A streamed piece's chunk: only the index and the arguments' piece.
  Choice c;
  c.tool_calls = {{"", "", R"("Pa)", 1}};
  json chunk = CompletionChunk("id", 0, "m", c, true, false)["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(chunk, json::parse(R"({"index": 1, "function": {"arguments": "\"Pa"}})"));
}

TEST(OpenAiApi, ToolCallReaderReadsContentAndCalls) {
  const std::string text =
      "Let me check a < b.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>\n";
  for (size_t step : {1, 2, 3, 7, 1000}) {
    std::vector<std::string> pieces;
    auto [content, calls] = ReadToolCalls(text, step, &pieces);
    EXPECT_EQ(content, "Let me check a < b.") << "step " << step;
    ASSERT_EQ(calls.size(), 2u) << "step " << step;
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(calls[0].arguments, R"({"city":"Paris"})");
    EXPECT_EQ(calls[0].id, "call_x_0");
    EXPECT_EQ(calls[1].name, "ping");
    EXPECT_EQ(calls[1].index, 1);
    for (const auto& p : pieces) EXPECT_EQ(p.find('\n'), std::string::npos) << "step " << step << ": " << p;
  }
  // Byte by byte, the content streams as it comes: "a <" waits for the next byte, " b" then goes out.
  std::vector<std::string> pieces;
  ReadToolCalls("a < b", 1, &pieces);
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "a", "", "", " <", " b"}));
  // No calls: the text as it is, a trailing partial tag and whitespace included.
  EXPECT_EQ(ReadToolCalls("Hello.\n<tool_ca", 1).first, "Hello.\n<tool_ca");
  EXPECT_TRUE(ReadToolCalls("Hello.\n<tool_ca", 1).second.empty());
  // A block the end cut off, or one that is not a call: given back as content, after the calls before it.
  auto [cut, cut_calls] = ReadToolCalls("Hi<tool_call>{\"name\": \"ping\", \"arguments\": {}}</tool_call><tool_call>{\"na",
                                        4);
  EXPECT_EQ(cut, "Hi<tool_call>{\"na");
  EXPECT_EQ(cut_calls.size(), 1u);
  auto [bad, bad_calls] = ReadToolCalls("<tool_call>[1, 2]</tool_call>", 5);
  EXPECT_EQ(bad, "<tool_call>[1, 2]</tool_call>");
  EXPECT_TRUE(bad_calls.empty());
}

TEST(OpenAiApi, ToolCallReaderReadsLlama3Calls) {
  const std::string text = "\n {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Pa}r\\\"is\"}}; "
                           "{\"name\": \"ping\", \"parameters\": {\"list\": [1, {\"a\": 2}]}}";
  for (size_t step : {1, 3, 1000}) {
    std::vector<std::string> pieces;
    auto [content, calls] = ReadToolCalls(text, step, &pieces, ToolFormat::kLlama3Json);
    EXPECT_EQ(content, "") << "step " << step;
    ASSERT_EQ(calls.size(), 2u) << "step " << step;
    EXPECT_EQ(calls[0].arguments, R"({"city":"Pa}r\"is"})");
    EXPECT_EQ(calls[1].name, "ping");
    EXPECT_EQ(calls[1].index, 1);
  }
  // A reply that does not begin with "{" is content, streamed as it comes.
  std::vector<std::string> pieces;
  auto [content, calls] = ReadToolCalls("Hi {there}", 1, &pieces, ToolFormat::kLlama3Json);
  EXPECT_EQ(content, "Hi {there}");
  EXPECT_TRUE(calls.empty());
  EXPECT_EQ(pieces[2], "i");
  // Cut off, or not a call: the text comes back as content.
  EXPECT_EQ(ReadToolCalls(R"({"name": "ping", "parameters": {}}; {"name)", 4, nullptr, ToolFormat::kLlama3Json).first,
            R"({"name)");
  EXPECT_EQ(ReadToolCalls(R"({"x": 1})", 2, nullptr, ToolFormat::kLlama3Json).first, R"({"x": 1})");
  EXPECT_EQ(ReadToolCalls(R"({"name": "ping", "parameters": {}} and more)", 2, nullptr, ToolFormat::kLlama3Json).first,
            "and more");
}

TEST(OpenAiApi, ParsesMistralToolCalls) {
  const std::string tools = kTwoTools;
  CompletionRequest r;
  auto e = ParseCompletionRequest(json::parse(R"({"messages": [{"role": "user", "content": "Paris?"}], )" + tools + "}"),
                                  true, &r, nullptr, ToolFormat::kMistral);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(r.tool_mode, "auto");
  // The grammar starts at the [TOOL_CALLS] control token (the server resolves its id).
  EXPECT_EQ(r.sampling.grammar_trigger, "[TOOL_CALLS]");
  EXPECT_TRUE(r.sampling.grammar_trigger_is_token);
  EXPECT_FALSE(r.sampling.grammar_trigger_at_start);
  // The tools as Python's json.dumps writes them, and nothing else: no instructions in the prompt.
  EXPECT_EQ(r.tools_prompt.rfind(R"([{"type": "function", "function": {"name": "get_weather", "description": )", 0), 0u)
      << r.tools_prompt;
  // What follows the token: " [" calls "]".
  const std::string call1 = R"({"name": "get_weather", "arguments": {"city": "Paris"}})";
  EXPECT_EQ(Verdict(r.grammar, " [" + call1 + "]"), 2);  // complete, and nothing may follow but the end
  EXPECT_EQ(Verdict(r.grammar, " [" + call1 + R"(, {"name": "ping", "arguments": {}}])"), 2);
  EXPECT_EQ(Verdict(r.grammar, call1), -1);
  EXPECT_EQ(Verdict(r.grammar, " [" + call1), 0);
  e = ParseCompletionRequest(json::parse(R"({"messages": [{"role": "user", "content": "Paris?"}],
                                 "parallel_tool_calls": false, )" + tools + "}"),
                             true, &r, nullptr, ToolFormat::kMistral);
  ASSERT_FALSE(e);
  EXPECT_EQ(Verdict(r.grammar, " [" + call1 + "]"), 2);
  EXPECT_EQ(Verdict(r.grammar, " [" + call1 + R"(, {"name": "ping", "arguments": {}}])"), -1);
  // History: the calls as one [TOOL_CALLS] list with their ids, results as {"content", "call_id"} (JSON content
  // as its value, other text as a string), keys in the order the request wrote them.
  e = ParseCompletionRequest(json::parse(R"({"messages": [{"role": "user", "content": "Paris?"}, {"role": "assistant",
      "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather",
      "arguments": "{\"z\": 1, \"a\": \"Paris\"}"}}, {"id": "c2", "type": "function", "function": {"name": "ping",
      "arguments": ""}}]}, {"role": "tool", "tool_call_id": "c1", "content": "{\"t\": 18}"},
      {"role": "tool", "tool_call_id": "c2", "content": "pong"}]})"),
                             true, &r, nullptr, ToolFormat::kMistral);
  ASSERT_FALSE(e) << e->message;
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[1].content, R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"z": 1, "a": "Paris"}, "id": )"
                                   R"("c1"}, {"name": "ping", "arguments": {}, "id": "c2"}])");
  EXPECT_EQ(r.messages[2].role, "tool");
  EXPECT_EQ(r.messages[2].content, R"({"content": {"t": 18}, "call_id": "c1"})");
  EXPECT_EQ(r.messages[3].content, R"({"content": "pong", "call_id": "c2"})");
  EXPECT_EQ(ToolFormatFor(tokenizer::ChatTemplate::ByName("mistral-v3").value()), ToolFormat::kMistral);
  EXPECT_EQ(ToolFormatFor(tokenizer::ChatTemplate::ByName("mistral").value()), ToolFormat::kHermes);
}

TEST(OpenAiApi, ToolCallReaderReadsMistralCalls) {
  const std::string text = "Checking.[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa]r\\\"is\"}}, "
                           "{\"name\": \"ping\", \"arguments\": {\"list\": [1, {\"a\": 2}]}}]";
  for (size_t step : {1, 2, 5, 1000}) {
    std::vector<std::string> pieces;
    auto [content, calls] = ReadToolCalls(text, step, &pieces, ToolFormat::kMistral);
    EXPECT_EQ(content, "Checking.") << "step " << step;
    ASSERT_EQ(calls.size(), 2u) << "step " << step;
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(calls[0].arguments, R"({"city":"Pa]r\"is"})");
    EXPECT_EQ(calls[1].arguments, R"({"list":[1,{"a":2}]})");
    EXPECT_EQ(calls[1].index, 1);
    // Mistral's ids: 9 letters and digits, one per call, the same for the same prefix.
    for (const auto& c : calls) {
      ASSERT_EQ(c.id.size(), 9u) << c.id;
      for (char ch : c.id) EXPECT_TRUE(std::isalnum((unsigned char)ch)) << c.id;
    }
    EXPECT_NE(calls[0].id, calls[1].id);
    for (const auto& p : pieces) EXPECT_EQ(p.find('['), std::string::npos) << "step " << step << ": " << p;
  }
  EXPECT_EQ(ReadToolCalls(text, 3, nullptr, ToolFormat::kMistral).second[0].id,
            ReadToolCalls(text, 1000, nullptr, ToolFormat::kMistral).second[0].id);
  // No calls: all of it is content, streamed as it comes (a tail that may begin the marker waits).
  std::vector<std::string> pieces;
  auto [plain, none] = ReadToolCalls("a [TOOL", 1, &pieces, ToolFormat::kMistral);
  EXPECT_EQ(plain, "a [TOOL");
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(pieces[1], "a");
  // A list the end cut off, or text after the marker that is not a list of calls: given back as content.
  EXPECT_EQ(ReadToolCalls(R"([TOOL_CALLS] [{"name": "ping", "arguments": {}}, {"na)", 4, nullptr, ToolFormat::kMistral).first,
            R"({"na)");
  EXPECT_EQ(ReadToolCalls(R"([TOOL_CALLS] [{"name": "ping", "arguments": {}}, {"na)", 4, nullptr, ToolFormat::kMistral)
                .second.size(),
            1u);
  EXPECT_EQ(ReadToolCalls(R"([TOOL_CALLS] sorry)", 2, nullptr, ToolFormat::kMistral).first, "sorry");
  EXPECT_EQ(ReadToolCalls(R"([TOOL_CALLS] [{"x": 1}])", 2, nullptr, ToolFormat::kMistral).first, R"([{"x": 1}])");
  EXPECT_EQ(ReadToolCalls(R"([TOOL_CALLS] [{"na)", 3, nullptr, ToolFormat::kMistral).first, R"([{"na)");
}

TEST(OpenAiApi, ParsesChatRequest) {
  CompletionRequest r;
  auto e = Parse(R"({"model": "m", "messages": [{"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}],
      "temperature": 0.5, "top_p": 0.9, "max_tokens": 20, "n": 2, "stream": true,
      "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 3, "stop": ["\n"], "seed": 7,
      "logit_bias": {"17": -100, "4": 2.5}, "unknown_field": {"ignored": true}})",
                 true, &r);
  ASSERT_FALSE(e) << e->message;
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].content, "hi there");
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.max_tokens, 20);
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_TRUE(r.sampling.has_seed);
  using Bias = std::vector<std::pair<int32_t, float>>;
  Bias bias = r.sampling.logit_bias;
  std::sort(bias.begin(), bias.end());
  EXPECT_EQ(bias, (Bias{{4, 2.5f}, {17, -100.0f}}));
}

// The accepted forms of those fields: what they ask for is what lathe does anyway.
TEST(OpenAiApi, AcceptsTheNoOpFormsOfUnsupportedFields) {
  CompletionRequest r;
  for (const char* body : {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "text"}})",
                           R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}],
                               "tool_choice": "none"})",
                           R"({"messages": [{"role": "user", "content": "x"}], "tools": [], "tool_choice": "auto"})",
                           R"({"messages": [{"role": "user", "content": "x"}], "tools": null})"}) {
    auto e = Parse(body, true, &r);
    EXPECT_FALSE(e) << body << ": " << e->message;
  }
  for (const char* body : {R"({"prompt": "x", "suffix": ""})", R"({"prompt": "x", "best_of": 1})",
                           R"({"prompt": "x", "best_of": 2, "n": 2})", R"({"prompt": "x", "suffix": null})"}) {
    auto e = Parse(body, false, &r);
    EXPECT_FALSE(e) << body << ": " << e->message;
  }
}

TEST(OpenAiApi, ParsesCompletionPromptForms) {
  CompletionRequest r;
  ASSERT_FALSE(Parse(R"({"prompt": "Once upon"})", false, &r));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "Once upon");
  EXPECT_FALSE(r.prompts[0].is_ids);
  EXPECT_EQ(r.max_tokens, 16);  // OpenAI's default for completions
  CompletionRequest ids;
  ASSERT_FALSE(Parse(R"({"prompt": [1, 2, 3], "logprobs": 2, "echo": true})", false, &ids));
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_TRUE(ids.prompts[0].is_ids);
  EXPECT_EQ(ids.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ids.logprobs, 2);
  EXPECT_TRUE(ids.echo);
  // Batches: a list of texts, or of token-id lists (what lm-eval's local-completions sends).
  CompletionRequest texts;
  ASSERT_FALSE(Parse(R"({"prompt": ["a", "b c"], "n": 2})", false, &texts));
  ASSERT_EQ(texts.prompts.size(), 2u);
  EXPECT_EQ(texts.prompts[1].text, "b c");
  CompletionRequest lists;
  ASSERT_FALSE(Parse(R"({"prompt": [[5, 6], [7]]})", false, &lists));
  ASSERT_EQ(lists.prompts.size(), 2u);
  EXPECT_EQ(lists.prompts[0].ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(lists.prompts[1].ids, (std::vector<int32_t>{7}));
  EXPECT_TRUE(lists.prompts[1].is_ids);
}

TEST(OpenAiApi, ErrorsNameTheField) {
  CompletionRequest r;
  struct Case {
    const char* body;
    bool chat;
    const char* param;
  } cases[] = {
      {R"({"messages": "hi"})", true, "messages"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", true, "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": 5}]})", true, "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})", true, "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": 3})", true, "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1})", true, "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 0})", true, "n"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", true, "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})", true, "stop"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})", true, "stream"},
      {R"({})", false, "prompt"},
      {R"({"prompt": []})", false, "prompt"},
      {R"({"prompt": ["a", 5]})", false, "prompt[1]"},
      {R"({"prompt": [[1], []]})", false, "prompt[1]"},
      {R"({"prompt": [[1], [-2]]})", false, "prompt[1]"},
      {R"({"prompt": ["a", "b"], "n": 600})", false, "n"},
      {R"({"prompt": "x", "logprobs": 9})", false, "logprobs"},
      {R"({"prompt": "x", "logit_bias": [1, 2]})", false, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"abc": 1}})", false, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"-3": 1}})", false, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"12x": 1}})", false, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"": 1}})", false, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"99999999999": 1}})", false, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"5": 101}})", false, "logit_bias"},
      {R"({"prompt": "x", "logit_bias": {"5": "up"}})", false, "logit_bias"},
      // Known OpenAI fields lathe does not implement: refused rather than ignored.
      {R"({"prompt": "x", "response_format": "json"})", false, "response_format"},
      {R"({"prompt": "x", "response_format": {"type": "yaml"}})", false, "response_format.type"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema"}})", false, "response_format.json_schema"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "n",
          "schema": {"type": "string", "pattern": "a\\bc"}}}})", false, "response_format.json_schema.schema"},
      {R"({"prompt": "x", "guided_json": "{not json"})", false, "guided_json"},
      {R"({"prompt": "x", "guided_choice": ["a", 1]})", false, "guided_choice"},
      {R"({"prompt": "x", "guided_choice": []})", false, "guided_choice"},
      {R"({"prompt": "x", "guided_grammar": 5})", false, "guided_grammar"},
      {R"({"prompt": "x", "guided_regex": "a\\b"})", false, "guided_regex"},
      {R"({"prompt": "x", "guided_regex": ["a+"]})", false, "guided_regex"},
      {R"({"prompt": "x", "structured_outputs": {"regex": "a{2"}, "guided_choice": ["a"]})", false,
       "structured_outputs.regex"},
      {R"({"prompt": "x", "structured_outputs": "json"})", false, "structured_outputs"},
      {R"({"prompt": "x", "structured_outputs": {"grammar": "root ::= x"}, "guided_choice": ["a"]})", false,
       "structured_outputs.grammar"},
      {R"({"prompt": "x", "response_format": {"type": "json_object"}, "guided_choice": ["a"]})", false,
       "guided_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}],
          "tool_choice": "required"})", true, "tools[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", true, "tool_choice"},
      // A "type" that is not a string (found by openai_request_fuzz: it threw from nlohmann's value()).
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": {"a": 1}, "function": {"name": "f"}}]})",
       true, "tools[0]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": 7, "function": {"name": "f"}}})", true, "tool_choice"},
      // Tool calling: tool_choice is one of four forms; a named function must be among the tools.
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": "sometimes"})", true, "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
          "parallel_tool_calls": "yes"})", true, "parallel_tool_calls"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
          "response_format": {"type": "json_object"}})", true, "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}}})", true, "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}},
          {"type": "function", "function": {"name": "f"}}], "tool_choice": "required"})", true, "tools[1].function.name"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f",
          "parameters": {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 3}}}}}],
          "tool_choice": "required"})", true, "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": "required", "response_format": {"type": "json_object"}})", true, "tool_choice"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function"}]}]})", true,
       "messages[0].tool_calls[0]"},
      {R"({"prompt": "x", "suffix": "end"})", false, "suffix"},
      {R"({"prompt": "x", "best_of": 3})", false, "best_of"},
      // Found by openai_request_fuzz / review: these threw (type_error) or wrapped around.
      {R"({"messages": [{"role": "user", "content": [{"type": 1, "text": "x"}]}]})", true, "messages[0].content"},
      {R"({"prompt": "x", "max_tokens": 18446744073709551615})", false, "max_tokens"},
      {R"({"prompt": "x", "top_k": 18446744073709551615})", false, "top_k"},
      {R"({"prompt": [1, 18446744073709551615]})", false, "prompt"},
  };
  for (const Case& c : cases) {
    auto e = Parse(c.body, c.chat, &r);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body << ": " << e->message;
    EXPECT_EQ(e->http_status, 400);
    json j = e->ToJson();
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["param"], c.param);
  }
}

TEST(OpenAiApi, ResponseShapes) {
  Choice c;
  c.text = "Paris";
  c.finish_reason = "stop";
  c.has_logprobs = true;
  c.logprobs = {{"Paris", -0.1f, {{"Paris", -0.1f}, {"Lyon", -3.0f}}}};
  json chat = CompletionResponse("chatcmpl-1", 1, "m", {c}, {10, 1}, true);
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], "Paris");
  EXPECT_EQ(chat["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1]["token"], "Lyon");
  EXPECT_EQ(chat["usage"]["total_tokens"], 11);
  json comp = CompletionResponse("cmpl-1", 1, "m", {c}, {10, 1}, false);
  EXPECT_EQ(comp["choices"][0]["text"], "Paris");
  EXPECT_EQ(comp["choices"][0]["logprobs"]["tokens"][0], "Paris");
  // echo: the prompt's first token has null logprob and top_logprobs; offsets run over the text.
  Choice e = c;
  e.logprobs.insert(e.logprobs.begin(), TokenLogprobInfo{"The capital is ", 0, {}, true});
  json echo = CompletionResponse("cmpl-2", 1, "m", {e}, {10, 1}, false)["choices"][0]["logprobs"];
  EXPECT_TRUE(echo["token_logprobs"][0].is_null());
  EXPECT_TRUE(echo["top_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(echo["token_logprobs"][1].get<float>(), -0.1f);
  EXPECT_EQ(echo["top_logprobs"][1]["Lyon"], -3.0f);
  EXPECT_EQ(echo["text_offset"][1], 15);
  json chunk = CompletionChunk("chatcmpl-1", 1, "m", c, true, true);
  EXPECT_EQ(chunk["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(SseEvent(json{{"a", 1}}), "data: {\"a\":1}\n\n");
}

}  // namespace
}  // namespace lathe::server

namespace lathe::server {
namespace {

// A reply split by the reasoning reader, fed in pieces of `step` bytes.
std::pair<std::string, std::string> SplitReasoning(const std::string& text, size_t step) {
  ReasoningReader reader;
  std::string reasoning, content;
  for (size_t i = 0; i < text.size(); i += step) {
    const bool last = i + step >= text.size();
    reader.Update(text.substr(i, step), last, &reasoning, &content);
  }
  if (text.empty()) reader.Update("", true, &reasoning, &content);
  return {reasoning, content};
}

TEST(OpenAiApi, ReasoningReaderSplitsThinkBlocksAtAnyPieceSize) {
  struct Case {
    std::string text, reasoning, content;
  };
  const Case cases[] = {
      {"<think>\nLet me see: 2 < 3.\n</think>\n\nYes.", "\nLet me see: 2 < 3.\n", "\n\nYes."},
      {"Plain answer <think> not at the start", "", "Plain answer <think> not at the start"},
      {"<think>cut off before the end</thi", "cut off before the end</thi", ""},  // length ran out: all reasoning
      {"<think></think>", "", ""},
      {"<thin", "", "<thin"},   // ends as a prefix of the tag: content
      {"", "", ""},
      {"<think>a</think>b</think>c", "a", "b</think>c"},  // the first close ends the reasoning
      {"<think>x <tool_call> y</think><tool_call>{}", "x <tool_call> y", "<tool_call>{}"},
  };
  for (const Case& c : cases) {
    for (size_t step : {1, 2, 3, 7, 8, 1000}) {
      auto [reasoning, content] = SplitReasoning(c.text, step);
      EXPECT_EQ(reasoning, c.reasoning) << c.text << " step " << step;
      EXPECT_EQ(content, c.content) << c.text << " step " << step;
    }
  }
  // Nothing of a possible tag is given out early: "</th" waits for the next piece.
  ReasoningReader r;
  std::string reasoning, content;
  r.Update("<think>abc</th", false, &reasoning, &content);
  EXPECT_EQ(reasoning, "abc");
  r.Update("ink>done", true, &reasoning, &content);
  EXPECT_EQ(reasoning, "abc");
  EXPECT_EQ(content, "done");
  EXPECT_EQ(CheckReasoningParser("qwen3"), "");
  EXPECT_EQ(CheckReasoningParser("deepseek_r1"), "");
  EXPECT_NE(CheckReasoningParser("deepseek").find("lathe has: qwen3"), std::string::npos);
}

TEST(OpenAiApi, ReasoningFromTheReplysStart) {
  // deepseek_r1, or a prompt that opened the block (QwQ, Qwen3-Thinking-2507, Qwen3.5): reasoning from the start, a
  // "<think>" there dropped, up to "</think>"; cut off before it, all reasoning.
  auto split = [](const std::string& parser, bool open, const std::string& text, size_t step) {
    ReasoningReader r(parser, open);
    std::string reasoning, content;
    for (size_t i = 0; i < text.size(); i += step) {
      r.Update(text.substr(i, step), i + step >= text.size(), &reasoning, &content);
    }
    return std::make_pair(reasoning, content);
  };
  for (size_t step : {1, 3, 100}) {
    EXPECT_EQ(split("deepseek_r1", false, "<think>abc</think>\n\nx", step), std::make_pair(std::string("abc"),
                                                                                           std::string("\n\nx")));
    EXPECT_EQ(split("deepseek_r1", false, "abc</think>x", step), std::make_pair(std::string("abc"), std::string("x")));
    EXPECT_EQ(split("deepseek_r1", false, "abc", step), std::make_pair(std::string("abc"), std::string()));
    EXPECT_EQ(split("qwen3", true, "abc</think>x", step), std::make_pair(std::string("abc"), std::string("x")));
    EXPECT_EQ(split("qwen3", false, "abc</think>x", step), std::make_pair(std::string(), std::string("abc</think>x")));
  }
  EXPECT_TRUE(ReasoningOpenAtEnd("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(ReasoningOpenAtEnd("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(ReasoningOpenAtEnd("<|im_start|>assistant\n"));
  // The gate starts inside the block then.
  CompletionRequest r;
  ASSERT_FALSE(Parse(R"({"messages": [{"role": "user", "content": "Q"}], "response_format": {"type": "json_object"}})",
                     true, &r));
  SetReasoningGate("qwen3", false, true, /*open_in_prompt=*/true, &r);
  EXPECT_TRUE(r.sampling.reasoning_open);
  r.sampling = {};
  SetReasoningGate("deepseek_r1", false, true, /*open_in_prompt=*/false, &r);
  EXPECT_TRUE(r.sampling.reasoning_open && r.sampling.reasoning_start == "<think>");
  r.sampling = {};
  SetReasoningGate("qwen3", false, true, /*open_in_prompt=*/false, &r);
  EXPECT_FALSE(r.sampling.reasoning_open);
}

TEST(OpenAiApi, ReasoningGateOnlyForChatGrammarsWithAParserAndThinking) {
  auto gated = [](const std::string& body, bool chat, const std::string& parser, bool in_reasoning) {
    CompletionRequest r;
    EXPECT_FALSE(Parse(body, chat, &r)) << body;
    SetReasoningGate(parser, in_reasoning, chat, /*open_in_prompt=*/false, &r);
    EXPECT_EQ(r.sampling.reasoning_start.empty(), r.sampling.reasoning_end.empty());
    return r.sampling.reasoning_start == "<think>" && r.sampling.reasoning_end == "</think>";
  };
  const std::string json_mode = R"({"messages": [{"role": "user", "content": "Q"}],
      "response_format": {"type": "json_object"}})";
  const std::string tools = R"({"messages": [{"role": "user", "content": "Q"}], "tools": [{"type": "function",
      "function": {"name": "f", "parameters": {"type": "object"}}}]})";
  EXPECT_TRUE(gated(json_mode, true, "qwen3", false));
  EXPECT_TRUE(gated(tools, true, "qwen3", false));  // tool_choice "auto": its lazy grammar
  EXPECT_FALSE(gated(json_mode, true, "", false));     // no parser
  EXPECT_FALSE(gated(json_mode, true, "qwen3", true));  // --structured-outputs-in-reasoning
  EXPECT_FALSE(gated(R"({"messages": [{"role": "user", "content": "Q"}]})", true, "qwen3", false));  // no grammar
  EXPECT_FALSE(gated(R"({"prompt": "Q", "response_format": {"type": "json_object"}})", false, "qwen3", false));
  EXPECT_FALSE(gated(R"({"messages": [{"role": "user", "content": "Q"}], "response_format": {"type": "json_object"},
      "chat_template_kwargs": {"enable_thinking": false}})", true, "qwen3", false));
}

TEST(OpenAiApi, ReasoningFieldsInAndOut) {
  // Out: message.reasoning_content and .reasoning (vLLM's old and new names); content null when only reasoning.
  Choice c;
  c.reasoning = "think";
  c.finish_reason = "length";
  json resp = CompletionResponse("id", 0, "m", {c}, Usage{}, true);
  EXPECT_EQ(resp["choices"][0]["message"]["reasoning_content"], "think");
  EXPECT_EQ(resp["choices"][0]["message"]["reasoning"], "think");
  EXPECT_TRUE(resp["choices"][0]["message"]["content"].is_null());
  json chunk = CompletionChunk("id", 0, "m", c, true, true);
  EXPECT_EQ(chunk["choices"][0]["delta"]["reasoning_content"], "think");
  EXPECT_FALSE(chunk["choices"][0]["delta"].contains("content"));
  c.reasoning.clear();
  c.text = "hi";
  EXPECT_FALSE(CompletionResponse("id", 0, "m", {c}, Usage{}, true)["choices"][0]["message"].contains("reasoning"));
  // In: an assistant turn's reasoning_content is kept apart, for the template to write where its jinja does;
  // chat_template_kwargs.enable_thinking.
  CompletionRequest r;
  ASSERT_FALSE(Parse(R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A",
      "reasoning_content": "because"}], "chat_template_kwargs": {"enable_thinking": false}})", true, &r));
  EXPECT_EQ(r.messages[1].content, "A");
  EXPECT_EQ(r.messages[1].reasoning, "because");
  // A template without think blocks leaves it out (SmolLM2's chatml), as its jinja does.
  EXPECT_EQ(tokenizer::ChatTemplate::ByName("chatml")->Apply(r.messages, false), "<|im_start|>user\nQ<|im_end|>\n"
            "<|im_start|>assistant\nA<|im_end|>\n");
  EXPECT_FALSE(r.enable_thinking);
  auto e = Parse(R"({"messages": [{"role": "user", "content": "Q"}], "chat_template_kwargs": {"enable_thinking": 1}})",
                 true, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "chat_template_kwargs.enable_thinking");
  e = Parse(R"({"messages": [{"role": "assistant", "content": "A", "reasoning": 3}]})", true, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "messages[0].reasoning");
}

}  // namespace
}  // namespace lathe::server
