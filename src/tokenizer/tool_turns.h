// Tool turns as each model family writes them: the tools described to the model, an assistant turn that calls
// tools, and a tool's result coming back. The server (OpenAI requests) and the trainer (sharegpt function_call /
// observation data) both build their chat messages here, so a model is fine-tuned on exactly the text it is served
// with, and that text is what the family's own chat template (jinja, or mistral_common) renders.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/chat_template.h"

namespace lathe::tokenizer {

// kHermes (Hermes, Qwen2.5 / Qwen3, and the default): tools in the system message inside <tools></tools>, calls as
// <tool_call>{"name", "arguments"}</tool_call> blocks, results in <tool_response> tags in a user turn (consecutive
// results share one turn).
// kLlama3Json (Llama 3.1-3.3's JSON tool calling): tools before the first user message's text and
// "Environment: ipython" in the system message; a call is {"name": ..., "parameters": {...}} (several joined by
// "; "), results are "ipython" turns.
// kMistral (Mistral's v3 instruct format, mistral_common's InstructTokenizerV3): the tools as [AVAILABLE_TOOLS] JSON
// before the last user message, calls as [TOOL_CALLS] and a JSON list of {"name", "arguments"[, "id"]}, results as
// [TOOL_RESULTS] {"content", "call_id"} blocks.
// kQwen3Coder (Qwen3.5, whose jinja writes XML calls; vLLM's "qwen3_coder" tool parser): the tools as JSON lines in
// <tools></tools> at the top of the system message, its own instructions after them and the system text last;
// a call is "<tool_call>\n<function=NAME>\n" then "<parameter=KEY>\nVALUE\n</parameter>\n" per argument (a string
// as is, an object or a list as JSON, other values as Python's str() writes them) and "</function>\n</tool_call>";
// results as kHermes.
enum class ToolFormat { kHermes, kLlama3Json, kMistral, kQwen3Coder };

// The format for a chat template: llama3 -> kLlama3Json, mistral-v3 -> kMistral, a chatml jinja that writes
// <function=...> calls (ChatTemplate::xml_tool_calls) -> kQwen3Coder, others kHermes.
ToolFormat ToolFormatFor(const ChatTemplate& tmpl);
// A call argument's text in a kQwen3Coder call: a string as is, an object or a list as JSON (PyJson), true / false /
// null as True / False / None, a number as Python's str() writes it (jinja's `string` filter).
std::string XmlParameterText(const nlohmann::ordered_json& value);

// JSON text as Python's json.dumps(x, ensure_ascii=False) writes it (", " and ": " between items), keys in the
// object's order: how jinja's `tojson` (transformers' renderer) and mistral_common write JSON into prompts.
std::string PyJson(const nlohmann::ordered_json& j);
// Python's json.dumps(x, indent=4, ensure_ascii=False) (Llama 3's tool list).
std::string PyJsonIndent4(const nlohmann::ordered_json& j);
// The JSON value a call's arguments or a tool's result text holds, else the text itself as a JSON string; empty
// text is {} (mistral_common's reading; vLLM parses call arguments the same way before rendering).
nlohmann::ordered_json JsonOrText(const std::string& text);
// A call's "arguments" as given (null when absent): null -> {}, a string -> JsonOrText of it, else the value. Both
// OpenAI tool_calls and sharegpt function_call turns are read this way.
nlohmann::ordered_json CallArguments(const nlohmann::ordered_json& arguments);

struct ToolCallTurn {
  std::string name;
  nlohmann::ordered_json arguments;  // usually an object; a string when the given arguments were not JSON
  std::string id;                    // kMistral writes it when set
};

// The text of an assistant turn that calls tools: its content (may be empty) and then the calls. Hermes: content,
// "\n" when there is content, <tool_call> blocks joined by "\n" (Qwen's jinja); Llama 3: the calls alone, joined
// by "; "; Mistral: [TOOL_CALLS] and the list (mistral_common writes only the calls when a turn has both).
std::string ToolCallsText(ToolFormat format, const std::string& content, const std::vector<ToolCallTurn>& calls);

// Appends a tool's result to `messages`. Hermes: a user turn "<tool_response>\n...\n</tool_response>", merged into
// the previous one when `follows_tool_result` (Qwen's jinja writes consecutive results in one turn); Llama 3: an
// "ipython" turn; Mistral: a "tool" turn of {"content": the result's JSON value or text, "call_id"} (call_id when
// not empty).
void AppendToolResult(ToolFormat format, const std::string& content, const std::string& call_id,
                      bool follows_tool_result, std::vector<ChatMessage>* messages);

// What tool_choice asks of the output; the tools description says it in the family's words.
enum class ToolMode { kAuto, kRequired, kNamed };
// The tools described to the model, as its template writes them. `tools`: a list of OpenAI tools
// ({"type": "function", "function": {"name", "description", "parameters"}}, description and parameters optional).
// Hermes: the "# Tools" block of Qwen's jinja (its closing instruction replaced for kRequired / kNamed); Llama 3:
// the JSON-calling instructions and each tool indented by 4; Mistral: the [AVAILABLE_TOOLS] list itself (a
// missing description is "", as mistral_common's Function has).
std::string ToolsPrompt(ToolFormat format, const nlohmann::ordered_json& tools, ToolMode mode = ToolMode::kAuto,
                        const std::string& named = "");

// The messages a template renders for a conversation with tools: `tools_prompt` (from ToolsPrompt) put where the
// family expects it. Hermes: appended to the system message (the template's default system prompt when there is
// none) after a blank line; Llama 3: before the first user message's text, with "Environment: ipython" opening the
// system message; Mistral: a "tools" message, which the mistral-v3 template writes before the last user turn.
std::vector<ChatMessage> WithToolsPrompt(std::vector<ChatMessage> messages, ToolFormat format,
                                         const std::string& tools_prompt, const ChatTemplate& tmpl);

}  // namespace lathe::tokenizer
