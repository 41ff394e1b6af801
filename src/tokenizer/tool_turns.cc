// Tool turns per model family (see tool_turns.h): the tools prompt, call turns and result turns, written the way
// each family's chat template writes them.
#include "tokenizer/tool_turns.h"

#include <algorithm>

#include "core/strings.h"

namespace lathe::tokenizer {
namespace {

using ojson = nlohmann::ordered_json;

// nlohmann's dump, never throwing on invalid UTF-8 (replaced by U+FFFD).
std::string Dump(const ojson& j, int indent = -1) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
}

void PyJsonTo(const ojson& j, std::string* out) {
  if (j.is_object()) {
    *out += '{';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) *out += ", ";
      first = false;
      *out += Dump(ojson(it.key())) + ": ";
      PyJsonTo(it.value(), out);
    }
    *out += '}';
  } else if (j.is_array()) {
    *out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) *out += ", ";
      PyJsonTo(j[i], out);
    }
    *out += ']';
  } else {
    *out += Dump(j);
  }
}

// Qwen3.5's jinja, after the tools.
constexpr char kQwen3CoderInstructions[] =
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- "
    "Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural "
    "language BEFORE the function call, but NOT after\n- If there is no function call available, answer the "
    "question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>";

constexpr char kToolResponseOpen[] = "<tool_response>\n";
constexpr char kToolResponseClose[] = "\n</tool_response>";

}  // namespace

ToolFormat ToolFormatFor(const ChatTemplate& tmpl) {
  if (tmpl.name() == "llama3") return ToolFormat::kLlama3Json;
  if (tmpl.name() == "mistral-v3") return ToolFormat::kMistral;
  if (tmpl.name() == "chatml" && tmpl.xml_tool_calls()) return ToolFormat::kQwen3Coder;
  return ToolFormat::kHermes;
}

std::string XmlParameterText(const ojson& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() || value.is_array()) return PyJson(value);
  if (value.is_boolean()) return value.get<bool>() ? "True" : "False";
  if (value.is_null()) return "None";
  if (value.is_number_float()) {  // Python's repr of a float: shortest round trip, ".0" on whole numbers
    std::string t = Dump(value);
    if (t.find_first_of(".eEn") == std::string::npos) t += ".0";
    return t;
  }
  return Dump(value);
}

std::string PyJson(const ojson& j) {
  std::string out;
  PyJsonTo(j, &out);
  return out;
}

// Python's indent=4 output has the same shape as nlohmann's: one item per line, "," at line ends, ": " after keys,
// "[]" and "{}" for empty containers.
std::string PyJsonIndent4(const ojson& j) { return Dump(j, 4); }

ojson JsonOrText(const std::string& text) {
  if (text.empty()) return ojson::object();
  auto v = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  return v.is_discarded() ? ojson(text) : v;
}

ojson CallArguments(const ojson& arguments) {
  if (arguments.is_null()) return ojson::object();
  return arguments.is_string() ? JsonOrText(arguments.get<std::string>()) : arguments;
}

std::string ToolCallsText(ToolFormat format, const std::string& content, const std::vector<ToolCallTurn>& calls) {
  if (calls.empty()) return content;
  if (format == ToolFormat::kMistral) {  // the calls alone (mistral_common refuses a turn with both)
    ojson list = ojson::array();
    for (const ToolCallTurn& c : calls) {
      ojson call = {{"name", c.name}, {"arguments", c.arguments}};
      if (!c.id.empty()) call["id"] = c.id;
      list.push_back(std::move(call));
    }
    return "[TOOL_CALLS]" + PyJson(list);
  }
  std::string out;
  if (format == ToolFormat::kQwen3Coder) {  // Qwen3.5's jinja: the calls after "\n\n" when there is content
    out = Trim(content);
    for (size_t i = 0; i < calls.size(); ++i) {
      out += (i > 0 ? "\n" : out.empty() ? "" : "\n\n") + std::string("<tool_call>\n<function=") + calls[i].name + ">\n";
      if (calls[i].arguments.is_object()) {
        for (auto it = calls[i].arguments.begin(); it != calls[i].arguments.end(); ++it) {
          out += "<parameter=" + it.key() + ">\n" + XmlParameterText(it.value()) + "\n</parameter>\n";
        }
      }
      out += "</function>\n</tool_call>";
    }
    return out;
  }
  if (format == ToolFormat::kLlama3Json) {  // Llama 3.1's jinja: {"name": "...", "parameters": <tojson>}
    for (const ToolCallTurn& c : calls) {
      out += (out.empty() ? "" : "; ") + std::string("{\"name\": \"") + c.name + "\", \"parameters\": " +
             PyJson(c.arguments) + "}";
    }
    return out;
  }
  out = content;  // Qwen's jinja: content, then each call after a "\n" (the first only when there is content)
  for (const ToolCallTurn& c : calls) {
    if (!out.empty()) out += "\n";
    out += "<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " +
           (c.arguments.is_string() ? c.arguments.get<std::string>() : PyJson(c.arguments)) + "}\n</tool_call>";
  }
  return out;
}

void AppendToolResult(ToolFormat format, const std::string& content, const std::string& call_id,
                      bool follows_tool_result, std::vector<ChatMessage>* messages) {
  if (format == ToolFormat::kMistral) {
    ojson res = {{"content", JsonOrText(content)}};
    if (!call_id.empty()) res["call_id"] = call_id;
    messages->push_back({"tool", PyJson(res)});
    return;
  }
  if (format == ToolFormat::kLlama3Json) {
    messages->push_back({"ipython", content});
    return;
  }
  // Qwen3.5's jinja trims each message's text, a tool's result too.
  const std::string text = format == ToolFormat::kQwen3Coder ? Trim(content) : content;
  if (follows_tool_result && !messages->empty() && messages->back().role == "user") {
    messages->back().content += "\n" + std::string(kToolResponseOpen) + text + kToolResponseClose;
  } else {
    messages->push_back({"user", kToolResponseOpen + text + kToolResponseClose});
  }
}

std::string ToolsPrompt(ToolFormat format, const ojson& tools, ToolMode mode, const std::string& named) {
  ojson described = ojson::array();
  for (const ojson& t : tools) {
    const ojson& f = t.contains("function") ? t["function"] : t;
    const std::string name = f.contains("name") && f["name"].is_string() ? f["name"].get<std::string>() : "";
    ojson d = {{"type", "function"}, {"function", {{"name", name}}}};
    if (f.contains("description")) {
      d["function"]["description"] = f["description"];
    } else if (format == ToolFormat::kMistral) {  // mistral_common's Function has description "" by default
      d["function"]["description"] = "";
    }
    d["function"]["parameters"] = f.contains("parameters") && !f["parameters"].is_null()
                                      ? f["parameters"]
                                      : ojson{{"type", "object"}, {"properties", ojson::object()}};
    described.push_back(std::move(d));
  }
  if (format == ToolFormat::kMistral) return PyJson(described);  // the grammar says the rest
  if (format == ToolFormat::kQwen3Coder) {  // Qwen3.5's jinja
    std::string out = "# Tools\n\nYou have access to the following functions:\n\n<tools>";
    for (const ojson& d : described) out += "\n" + PyJson(d);
    out += "\n</tools>";
    if (mode == ToolMode::kNamed) {
      out += "\n\nCall the function \"" + named + "\": reply with its arguments only, as a JSON object.";
    } else if (mode == ToolMode::kRequired) {
      out += "\n\nCall one or more of the functions: return a JSON list of objects with function name and arguments: "
             "[{\"name\": <function-name>, \"arguments\": <args-json-object>}]";
    } else {
      out += kQwen3CoderInstructions;
    }
    return out;
  }
  const bool llama = format == ToolFormat::kLlama3Json;
  const std::string call_shape =
      std::string("{\"name\": <function-name>, \"") + (llama ? "parameters" : "arguments") + "\": <args-json-object>}";
  std::string out;
  if (llama) {  // Llama 3.1's jinja, tools in the first user message
    out = "Given the following functions, please respond with a JSON for a function call with its proper arguments "
          "that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
          "dictionary of argument name and its value}.Do not use variables.\n\n";
    for (const ojson& d : described) out += PyJsonIndent4(d) + "\n\n";
  } else {  // Qwen's jinja
    out = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
          "function signatures within <tools></tools> XML tags:\n<tools>";
    for (const ojson& d : described) out += "\n" + PyJson(d);
    out += "\n</tools>\n\n";
  }
  if (mode == ToolMode::kNamed) {  // the output is the arguments alone: say so
    out += "Call the function \"" + named + "\": reply with its arguments only, as a JSON object.";
  } else if (mode == ToolMode::kRequired) {
    out += "Call one or more of the functions: return a JSON list of objects with function name and arguments: [" +
           call_shape + "]";
  } else if (!llama) {
    out += "For each function call, return a json object with function name and arguments within "
           "<tool_call></tool_call> XML tags:\n<tool_call>\n" + call_shape + "\n</tool_call>";
  }
  if (llama && mode != ToolMode::kAuto) out += "\n\n";
  return out;
}

std::vector<ChatMessage> WithToolsPrompt(std::vector<ChatMessage> messages, ToolFormat format,
                                         const std::string& tools_prompt, const ChatTemplate& tmpl) {
  if (tools_prompt.empty()) return messages;
  if (format == ToolFormat::kMistral) {
    messages.push_back({"tools", tools_prompt});  // the template writes it before the last user message
    return messages;
  }
  if (format == ToolFormat::kLlama3Json) {  // Llama 3.1's jinja: tools_in_user_message (its default)
    auto user = std::find_if(messages.begin(), messages.end(), [](const auto& m) { return m.role == "user"; });
    if (user != messages.end()) {
      user->content = tools_prompt + Trim(user->content);
    } else {  // no user message (the jinja refuses): after the system text
      if (messages.empty() || messages[0].role != "system") messages.insert(messages.begin(), {"system", ""});
      messages[0].content += (messages[0].content.empty() ? "" : "\n\n") + tools_prompt;
    }
    messages.insert(messages.begin(), {"environment", "ipython"});
    return messages;
  }
  if (format == ToolFormat::kQwen3Coder) {  // Qwen3.5's jinja: the tools first, then the system text (no default)
    if (messages.empty() || messages[0].role != "system") messages.insert(messages.begin(), {"system", ""});
    const std::string system = Trim(messages[0].content);
    messages[0].content = tools_prompt + (system.empty() ? "" : "\n\n" + system);
    return messages;
  }
  if (messages.empty() || messages[0].role != "system") messages.insert(messages.begin(), {"system", tmpl.default_system()});
  messages[0].content += (messages[0].content.empty() ? "" : "\n\n") + tools_prompt;
  return messages;
}

}  // namespace lathe::tokenizer
