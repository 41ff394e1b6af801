// libFuzzer target for the tool-call reader (tool_choice "auto" and "required"), which reads a model's free text back
// as content and calls, streaming each call's arguments. Input: one byte choosing the format (Hermes <tool_call> tags,
// Llama 3 JSON, Mistral's [TOOL_CALLS] list, "required"'s bare list, or Qwen3.5's XML calls) and the streaming step,
// then the generated text. The text read in steps must give the content and calls (their streamed pieces joined) it
// gives read at once, and every call's arguments begin with "{" (the text of an object as the model wrote it: under
// the server's grammar valid JSON, here whatever the bytes are, and cut where they end). No crash, hang or UB.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "server/openai_api.h"

namespace {

using lathe::server::ToolCall;
using lathe::server::ToolCallReader;
using lathe::server::ToolFormat;

// Qwen3.5's XML calls read their parameters as the tools declare them: one tool with a parameter of each kind.
const nlohmann::ordered_json& Parameters() {
  static const auto* p = new nlohmann::ordered_json(nlohmann::ordered_json::parse(R"({"f": {"type": "object",
      "properties": {"s": {"type": "string"}, "i": {"type": "integer"}, "x": {"type": "number"},
                     "b": {"type": "boolean"}, "o": {"type": "object"}, "t": {"type": ["integer", "null"]}}}})"));
  return *p;
}

std::pair<std::string, std::vector<ToolCall>> Read(const std::string& text, size_t step, ToolFormat format, bool list) {
  ToolCallReader reader("call_", format, list, Parameters());
  std::string content;
  std::vector<ToolCall> calls;
  for (size_t n = 0;; n = std::min(text.size(), n + step)) {
    std::vector<ToolCall> deltas;
    reader.Update(text.substr(0, n), n == text.size(), &content, &deltas);
    lathe::server::AppendToolCalls(deltas, &calls);
    if (n == text.size()) break;
  }
  return {content, calls};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > 4096) return 0;
  const ToolFormat formats[] = {ToolFormat::kHermes, ToolFormat::kLlama3Json, ToolFormat::kMistral,
                                ToolFormat::kHermes, ToolFormat::kQwen3Coder};
  const ToolFormat format = formats[data[0] % 5];
  const bool list = data[0] % 5 == 3;
  const size_t step = 1 + (data[0] / 5) % 16;
  const std::string text((const char*)data + 1, size - 1);
  auto whole = Read(text, text.size() + 1, format, list);
  auto steps = Read(text, step, format, list);
  if (whole.first != steps.first || whole.second.size() != steps.second.size()) __builtin_trap();
  for (size_t i = 0; i < whole.second.size(); ++i) {
    const ToolCall& a = whole.second[i];
    const ToolCall& b = steps.second[i];
    if (a.name != b.name || a.arguments != b.arguments || a.id != b.id || a.index != (int)i) __builtin_trap();
    if (a.arguments.empty() || a.arguments[0] != '{') __builtin_trap();
  }
  return 0;
}
