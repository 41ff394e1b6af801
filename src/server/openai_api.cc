// OpenAI schema parsing and response building.
#include "server/openai_api.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string_view>

#include "core/strings.h"
#include "server/json_schema.h"
#include "server/regex.h"
#include "tokenizer/tokenizer.h"

namespace lathe::server {

using nlohmann::json;

json ApiError::ToJson() const {
  json e = {{"message", message}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}};
  return json{{"error", e}};
}

namespace {

ApiError Bad(const std::string& param, const std::string& message) {
  ApiError e;
  e.param = param;
  e.message = message;
  return e;
}

std::string TypeName(const json& v) { return v.type_name(); }

// Reads an optional number field within [lo, hi].
std::optional<ApiError> Number(const json& b, const char* key, double lo, double hi, float* out) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return Bad(key, std::string("'") + key + "' must be a number, got " + TypeName(*it));
  double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {
    return Bad(key, std::string("'") + key + "' must be between " + json(lo).dump() + " and " + json(hi).dump() +
                        ", got " + it->dump());
  }
  *out = (float)v;
  return std::nullopt;
}

std::optional<ApiError> Integer(const json& b, const char* key, int64_t lo, int64_t hi, int64_t* out) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) return Bad(key, std::string("'") + key + "' must be an integer, got " + TypeName(*it));
  if (it->is_number_unsigned() && it->get<uint64_t>() > (uint64_t)INT64_MAX) {
    return Bad(key, std::string("'") + key + "' must be at most " + std::to_string(hi) + ", got " + it->dump());
  }
  int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) {
    return Bad(key, std::string("'") + key + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                        ", got " + std::to_string(v));
  }
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> Bool(const json& b, const char* key, bool* out) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return Bad(key, std::string("'") + key + "' must be a boolean, got " + TypeName(*it));
  *out = it->get<bool>();
  return std::nullopt;
}

// OpenAI content may be a string or a list of {type: "text", text} parts.
std::optional<ApiError> Content(const json& c, const std::string& param, std::string* out) {
  if (c.is_string()) {
    *out = c.get<std::string>();
    return std::nullopt;
  }
  if (c.is_array()) {
    out->clear();
    for (const json& part : c) {
      if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
          !part["text"].is_string()) {
        return Bad(param, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
      }
      *out += part["text"].get<std::string>();
    }
    return std::nullopt;
  }
  if (c.is_null()) {
    out->clear();
    return std::nullopt;
  }
  return Bad(param, param + " must be a string or a list of text parts, got " + TypeName(c));
}

// OpenAI fields that change what a client gets back and that lathe does not implement: a clear 400
// instead of an answer that silently ignores them (other unknown fields are ignored).
std::optional<ApiError> Unsupported(const json& b, bool chat) {
  if (chat) {
  } else {
    auto suffix = b.find("suffix");
    if (suffix != b.end() && !suffix->is_null() && !(suffix->is_string() && suffix->get<std::string>().empty()))
      return Bad("suffix", "'suffix' (insertion) is not supported");
    if (auto it = b.find("best_of"); it != b.end() && !it->is_null()) {
      const json* n = b.contains("n") ? &b["n"] : nullptr;
      if (!(*it == 1 || (n && *it == *n))) return Bad("best_of", "'best_of' other than 1 or n is not supported");
    }
  }
  return std::nullopt;
}

// Structured outputs: one of response_format (json_object, json_schema), guided_json, guided_choice,
// guided_grammar, structured_outputs, as a GBNF grammar.
std::optional<ApiError> StructuredOutput(const nlohmann::ordered_json& b, CompletionRequest* r) {
  using ojson = nlohmann::ordered_json;
  auto set = [&](const std::string& param, std::string grammar) -> std::optional<ApiError> {
    if (!r->grammar_param.empty()) {
      return Bad(param, "'" + param + "' and '" + r->grammar_param + "' both constrain the output; give one");
    }
    r->grammar = std::move(grammar);
    r->grammar_param = param;
    return std::nullopt;
  };
  auto schema_grammar = [&](const ojson& schema, const std::string& param) -> std::optional<ApiError> {
    auto g = JsonSchemaToGbnf(schema);
    if (!g.ok()) return Bad(param, g.status().message());
    return set(param, g.value());
  };
  if (auto it = b.find("response_format"); it != b.end() && !it->is_null()) {
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string()) {
      return Bad("response_format", "'response_format' must be an object with a string 'type' (text, json_object, "
                                    "json_schema)");
    }
    const std::string type = (*it)["type"].get<std::string>();
    if (type == "json_object") {
      if (auto e = set("response_format", JsonObjectGbnf())) return e;
    } else if (type == "json_schema") {
      auto js = it->find("json_schema");
      if (js == it->end() || !js->is_object()) {
        return Bad("response_format.json_schema", "'response_format' of type json_schema needs a 'json_schema' "
                                                  "object ({\"name\": ..., \"schema\": {...}})");
      }
      auto schema = js->find("schema");
      if (schema == js->end() || schema->is_null()) {
        if (auto e = set("response_format.json_schema.schema", JsonObjectGbnf())) return e;  // any object, as OpenAI
      } else if (auto e = schema_grammar(*schema, "response_format.json_schema.schema")) {
        return e;
      }
    } else if (type != "text") {
      return Bad("response_format.type", "'response_format.type' must be text, json_object or json_schema, got '" +
                                             type + "'");
    }
  }
  // vLLM's fields: guided_json / guided_choice / guided_grammar / guided_regex at the top level, or (vLLM >= 0.10)
  // structured_outputs: {json, choice, grammar, regex, json_object}.
  struct Keys {
    const char *json, *choice, *grammar, *regex;
  };
  auto vllm = [&](const ojson& o, const std::string& prefix, const Keys& k) -> std::optional<ApiError> {
    const std::string pj = prefix + k.json, pc = prefix + k.choice, pg = prefix + k.grammar, pr = prefix + k.regex;
    if (auto it = o.find(k.json); it != o.end() && !it->is_null()) {
      ojson schema;
      if (it->is_string()) {
        schema = ojson::parse(it->get<std::string>(), nullptr, /*allow_exceptions=*/false);
        if (schema.is_discarded()) return Bad(pj, "'" + pj + "' is a string that is not JSON");
      } else {
        schema = *it;
      }
      if (auto e = schema_grammar(schema, pj)) return e;
    }
    if (auto it = o.find(k.choice); it != o.end() && !it->is_null()) {
      std::vector<std::string> choices;
      if (it->is_array()) {
        for (const auto& c : *it) {
          if (!c.is_string()) break;
          choices.push_back(c.get<std::string>());
        }
      }
      if (!it->is_array() || it->empty() || choices.size() != it->size()) {
        return Bad(pc, "'" + pc + "' must be a non-empty list of strings");
      }
      for (const auto& c : choices)
        if (c.empty()) return Bad(pc, "'" + pc + "' may not contain an empty string");
      if (auto e = set(pc, ChoiceGbnf(choices))) return e;
    }
    if (auto it = o.find(k.grammar); it != o.end() && !it->is_null()) {
      if (!it->is_string()) return Bad(pg, "'" + pg + "' must be a GBNF grammar (a string)");
      if (auto e = set(pg, it->get<std::string>())) return e;
    }
    if (auto it = o.find(k.regex); it != o.end() && !it->is_null()) {
      if (!it->is_string()) return Bad(pr, "'" + pr + "' must be a regular expression (a string)");
      auto g = RegexToGbnf(it->get<std::string>());  // the whole output is one match
      if (!g.ok()) return Bad(pr, g.status().message());
      if (auto e = set(pr, "root ::= " + g.value() + "\n")) return e;
    }
    return std::nullopt;
  };
  if (auto e = vllm(b, "", {"guided_json", "guided_choice", "guided_grammar", "guided_regex"})) return e;
  if (auto so = b.find("structured_outputs"); so != b.end() && !so->is_null()) {
    if (!so->is_object()) {
      return Bad("structured_outputs", "'structured_outputs' must be an object ({\"json\": ...}, {\"choice\": [...]}, "
                                       "{\"grammar\": ...})");
    }
    if (auto e = vllm(*so, "structured_outputs.", {"json", "choice", "grammar", "regex"})) return e;
    if (auto it = so->find("json_object"); it != so->end() && *it == true) {
      if (auto e = set("structured_outputs.json_object", JsonObjectGbnf())) return e;
    }
  }
  return std::nullopt;
}

// Tool calling. The tools are described to the model in the system message, as Hermes / Qwen2.5's chat templates do;
// tool_choice says what the output is:
// - "auto" (the default): free text in which the model may call tools as <tool_call>{"name": ..., "arguments":
//   {...}}</tool_call> blocks (vLLM's "hermes" parser reads the same). A lazy grammar starts at the first
//   <tool_call> and holds each call to a listed tool's name and parameters; the text before it is the content.
// - "required": one or more calls of any tools (one with parallel_tool_calls false), the output is a JSON list
//   [{"name": ..., "arguments": {...}}, ...] (a grammar from the start, as vLLM's).
// - {"type": "function", "function": {"name": ...}}: the output is that function's arguments object.
// - "none": the tools are ignored.
// The tools as the model's template describes them, for the request's tool_mode.
std::optional<ApiError> ToolsPrompt(const nlohmann::ordered_json& tools, CompletionRequest* r) {
  r->tools_prompt = tokenizer::ToolsPrompt(r->tool_format, tools,
                                           r->tool_mode == "named"      ? tokenizer::ToolMode::kNamed
                                           : r->tool_mode == "required" ? tokenizer::ToolMode::kRequired
                                                                        : tokenizer::ToolMode::kAuto,
                                           r->tool_name);
  return std::nullopt;
}

std::optional<ApiError> ToolCalling(const nlohmann::ordered_json& b, CompletionRequest* r) {
  const bool llama = r->tool_format == ToolFormat::kLlama3Json;
  const bool mistral = r->tool_format == ToolFormat::kMistral;
  const bool xml = r->tool_format == ToolFormat::kQwen3Coder;
  const char* args_key = llama ? "parameters" : "arguments";
  using ojson = nlohmann::ordered_json;
  auto tools = b.find("tools");
  auto choice = b.find("tool_choice");
  const bool has_tools = tools != b.end() && !tools->is_null() && !(tools->is_array() && tools->empty());
  if (choice != b.end() && !choice->is_null() && *choice == "none") return std::nullopt;
  if (!has_tools) {
    if (choice != b.end() && !choice->is_null() && *choice != "auto") {
      return Bad("tool_choice", "'tool_choice' needs 'tools'");
    }
    return std::nullopt;
  }
  if (!tools->is_array()) return Bad("tools", "'tools' must be a list of {\"type\": \"function\", \"function\": {...}}");
  bool parallel = true;
  if (auto it = b.find("parallel_tool_calls"); it != b.end() && !it->is_null()) {
    if (!it->is_boolean()) return Bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    parallel = it->get<bool>();
  }
  std::vector<std::pair<std::string, ojson>> fns;  // name, parameters
  for (size_t i = 0; i < tools->size(); ++i) {
    const ojson& t = (*tools)[i];
    const std::string p = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("type") || t["type"] != "function" || !t.contains("function") ||
        !t["function"].is_object()) {
      return Bad(p, p + " must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}");
    }
    const ojson& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty()) {
      return Bad(p + ".function.name", p + ".function.name must be a non-empty string");
    }
    const std::string name = f["name"].get<std::string>();
    for (const auto& [prev, unused] : fns) {
      if (prev == name) return Bad(p + ".function.name", "two tools are named '" + name + "'");
    }
    ojson params = f.contains("parameters") && !f["parameters"].is_null() ? f["parameters"]
                                                                          : ojson{{"type", "object"}, {"properties", ojson::object()}};
    if (!params.is_object()) return Bad(p + ".function.parameters", p + ".function.parameters must be a JSON schema object");
    fns.push_back({name, params});
    r->tool_parameters[name] = params;
  }
  ojson schema;
  if (choice == b.end() || choice->is_null() || *choice == "auto" || *choice == "required") {
    // A call of any tool: {"name": one of them, "arguments": its parameters}.
    r->tool_mode = choice != b.end() && *choice == "required" ? "required" : "auto";
    ojson alts = ojson::array();
    for (const auto& [name, params] : fns) {
      if (xml && r->tool_mode == "auto") break;  // XML calls: a grammar per tool (below), no JSON union
      if (SafeDump(params).find("\"$ref\"") != std::string::npos && fns.size() > 1) {
        return Bad("tools", "tools whose parameters use $ref are supported one at a time (several tools, or "
                            "'tool_choice' \"auto\" / \"required\" over them, need the references inlined); name the "
                            "function in 'tool_choice' or inline the definitions");
      }
      alts.push_back({{"type", "object"},
                      {"properties", {{"name", {{"const", name}}}, {args_key, params}}},
                      {"required", {"name", args_key}}});
    }
    schema = alts.size() == 1 ? alts[0] : ojson{{"anyOf", alts}};
    if (fns.size() == 1) {  // its "#/$defs/..." references resolve against the call's schema now
      for (const char* k : {"$defs", "definitions"})
        if (fns[0].second.contains(k)) schema[k] = fns[0].second[k];
    }
  } else if (choice->is_object() && choice->contains("type") && (*choice)["type"] == "function" &&
             choice->contains("function") &&
             (*choice)["function"].is_object() && (*choice)["function"].contains("name") &&
             (*choice)["function"]["name"].is_string()) {
    r->tool_mode = "named";
    r->tool_name = (*choice)["function"]["name"].get<std::string>();
    for (const auto& [name, params] : fns)
      if (name == r->tool_name) schema = params;
    if (schema.is_null()) return Bad("tool_choice", "'tool_choice' names '" + r->tool_name + "', which is not in 'tools'");
  } else {
    return Bad("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                              "\"function\": {\"name\": ...}}");
  }
  if (!r->grammar_param.empty()) {
    return Bad(choice != b.end() && !choice->is_null() ? "tool_choice" : "tools",
               "tool calls and '" + r->grammar_param + "' both constrain the output; give one (or tool_choice \"none\")");
  }
  r->grammar_param = "tools";
  if (r->tool_mode == "auto" && xml) {  // Qwen3.5's XML calls after "<tool_call>"
    auto x = XmlToolCallGbnf(fns, parallel);
    if (!x.ok()) return Bad("tools", x.status().message());
    r->grammar = x.value();
    r->sampling.grammar_trigger = kToolCallOpen;
    return ToolsPrompt(*tools, r);
  }
  auto g = JsonSchemaToGbnf(schema);
  if (!g.ok()) return Bad("tools", g.status().message());
  if (r->tool_mode == "auto") {
    r->grammar = ToolCallGbnf(g.value(), parallel, r->tool_format);
    r->sampling.grammar_trigger = llama ? "{" : mistral ? kMistralToolCalls : kToolCallOpen;
    r->sampling.grammar_trigger_at_start = llama;
    r->sampling.grammar_trigger_is_token = mistral;  // a control token: the server resolves it to its id
  } else if (r->tool_mode == "required") {
    r->grammar = RequiredCallsGbnf(g.value(), parallel);
  } else {
    r->grammar = g.value();
  }
  return ToolsPrompt(*tools, r);
}

}  // namespace

std::vector<tokenizer::ChatMessage> PromptMessages(const CompletionRequest& r, const tokenizer::ChatTemplate& tmpl) {
  return tokenizer::WithToolsPrompt(r.messages, r.tool_format, r.tools_prompt, tmpl);
}

std::string PromptText(const CompletionRequest& r, const tokenizer::ChatTemplate& tmpl) {
  std::string text = tmpl.Apply(PromptMessages(r, tmpl), /*add_generation_prompt=*/true);
  if (!r.enable_thinking && tmpl.thinking_switch()) {  // as Qwen3's and Qwen3.5's jinja: an empty, closed block
    text += tmpl.think_in_prompt() ? "\n</think>\n\n" : "<think>\n\n</think>\n\n";
  }
  return text;
}

std::optional<ApiError> ResolveTriggerToken(const tokenizer::Tokenizer& tok, CompletionRequest* r) {
  if (!r->sampling.grammar_trigger_is_token) return std::nullopt;
  const auto ids = tok.Encode(r->sampling.grammar_trigger, /*add_bos=*/false, /*parse_special=*/true);
  r->sampling.grammar_trigger_token = ids.size() == 1 && tok.IsControl(ids[0]) ? ids[0] : -1;
  if (r->sampling.grammar_trigger_token >= 0) return std::nullopt;
  return Bad("tools", "this model's chat template writes tool calls after the " + r->sampling.grammar_trigger +
                          " token, which its vocabulary does not have as one control token");
}

bool NeedsKeyOrder(const json& body) {
  if (!body.is_object()) return false;
  for (const char* k : {"response_format", "guided_json", "guided_choice", "guided_grammar", "guided_regex",
                        "structured_outputs", "tools", "tool_choice"}) {
    if (body.contains(k)) return true;
  }
  return false;
}

std::optional<ApiError> ParseCompletionRequest(const json& b, bool chat, CompletionRequest* r,
                                               const nlohmann::ordered_json* ordered, ToolFormat tool_format) {
  *r = CompletionRequest();
  r->chat = chat;
  r->tool_format = tool_format;
  if (!b.is_object()) return Bad("", "the request body must be a JSON object");
  if (auto e = Unsupported(b, chat)) return e;
  if (NeedsKeyOrder(b)) {
    const nlohmann::ordered_json o = ordered ? nlohmann::ordered_json() : nlohmann::ordered_json::parse(SafeDump(b));
    const nlohmann::ordered_json& ob = ordered ? *ordered : o;
    if (auto e = StructuredOutput(ob, r)) return e;
    if (chat) {
      if (auto e = ToolCalling(ob, r)) return e;
    }
  }
  if (auto it = b.find("chat_template_kwargs"); chat && it != b.end() && !it->is_null()) {
    if (!it->is_object()) return Bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (auto e = Bool(*it, "enable_thinking", &r->enable_thinking)) {
      e->param = "chat_template_kwargs.enable_thinking";
      return e;
    }
  }
  if (auto it = b.find("model"); it != b.end() && !it->is_null()) {
    if (!it->is_string()) return Bad("model", "'model' must be a string");
    r->model = it->get<std::string>();
  }
  if (chat) {
    auto it = b.find("messages");
    if (it == b.end()) return Bad("messages", "'messages' is required");
    if (!it->is_array() || it->empty()) return Bad("messages", "'messages' must be a non-empty array");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& m = (*it)[i];
      std::string p = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) return Bad(p, p + " must be an object");
      if (!m.contains("role") || !m["role"].is_string()) return Bad(p + ".role", p + ".role must be a string");
      std::string role = m["role"].get<std::string>();
      if (role == "developer") role = "system";
      if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
        return Bad(p + ".role", p + ".role '" + role + "' is not supported (system, user, assistant, tool)");
      }
      tokenizer::ChatMessage msg;
      msg.role = role;
      if (auto e = Content(m.value("content", json(nullptr)), p + ".content", &msg.content)) return e;
      // An earlier reply's reasoning, as vLLM's reasoning_content / reasoning: a thinking template (Qwen3's) writes it
      // for the turns after the last user message and drops it before; the others leave it out, as their jinja.
      for (const char* key : {"reasoning_content", "reasoning"}) {
        auto rc = m.find(key);
        if (role != "assistant" || rc == m.end() || rc->is_null()) continue;
        if (!rc->is_string()) return Bad(p + "." + key, p + "." + key + " must be a string");
        msg.reasoning = rc->get<std::string>();
        break;
      }
      // Tool turns as the model family writes them (tokenizer/tool_turns.h).
      if (role == "tool") {
        std::string call_id;
        if (m.contains("tool_call_id") && m["tool_call_id"].is_string()) call_id = m["tool_call_id"].get<std::string>();
        tokenizer::AppendToolResult(tool_format, msg.content, call_id, i > 0 && (*it)[i - 1].value("role", "") == "tool",
                                    &r->messages);
        continue;
      }
      if (role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
        const json& calls = m["tool_calls"];
        if (!calls.is_array()) return Bad(p + ".tool_calls", p + ".tool_calls must be a list");
        std::vector<tokenizer::ToolCallTurn> turns;
        for (size_t k = 0; k < calls.size(); ++k) {
          const json& c = calls[k];
          const std::string q = p + ".tool_calls[" + std::to_string(k) + "]";
          if (!c.is_object() || !c.contains("function") || !c["function"].is_object() ||
              !c["function"].contains("name") || !c["function"]["name"].is_string()) {
            return Bad(q, q + " must be {\"type\": \"function\", \"function\": {\"name\": ..., \"arguments\": ...}}");
          }
          const json& f = c["function"];
          tokenizer::ToolCallTurn t;
          t.name = f["name"].get<std::string>();
          // The arguments' JSON value in its own key order (vLLM parses them before rendering); text that is not
          // JSON stays the string it is.
          t.arguments = tokenizer::CallArguments(
              f.contains("arguments") ? nlohmann::ordered_json::parse(SafeDump(f["arguments"])) : nullptr);
          if (c.contains("id") && c["id"].is_string() && c["id"] != "null") t.id = c["id"].get<std::string>();
          turns.push_back(std::move(t));
        }
        msg.content = tokenizer::ToolCallsText(tool_format, msg.content, turns);
      }
      r->messages.push_back(std::move(msg));
    }
  } else {
    auto it = b.find("prompt");
    if (it == b.end()) return Bad("prompt", "'prompt' is required");
    const json& p = *it;
    // One prompt as text or token ids, or a batch: a list of texts or of token-id lists.
    auto ids_of = [](const json& a, std::vector<int32_t>* out) {
      for (const json& t : a) {
        if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() > INT32_MAX) ||
            t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
          return false;
        }
        out->push_back((int32_t)t.get<int64_t>());
      }
      return !out->empty();
    };
    constexpr size_t kMaxPrompts = 256;
    const char* kShape = "'prompt' must be a string, a list of token ids, or a list (a batch) of strings or of token-id lists";
    if (p.is_string()) {
      r->prompts.push_back({p.get<std::string>(), {}, false});
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      CompletionRequest::Prompt q;
      q.is_ids = true;
      if (!ids_of(p, &q.ids)) return Bad("prompt", "'prompt' token arrays must hold non-negative integers");
      r->prompts.push_back(std::move(q));
    } else if (p.is_array() && !p.empty()) {
      if (p.size() > kMaxPrompts) {
        return Bad("prompt", StrFormat("a batch of %zu prompts; at most %zu per request", p.size(), kMaxPrompts));
      }
      for (size_t i = 0; i < p.size(); ++i) {
        const std::string where = "prompt[" + std::to_string(i) + "]";
        CompletionRequest::Prompt q;
        if (p[i].is_string()) {
          q.text = p[i].get<std::string>();
        } else if (p[i].is_array()) {
          q.is_ids = true;
          if (!ids_of(p[i], &q.ids)) return Bad(where, where + " must be a non-empty list of non-negative integer token ids");
        } else {
          return Bad(where, kShape);
        }
        r->prompts.push_back(std::move(q));
      }
    } else {
      return Bad("prompt", kShape);
    }
  }
  int64_t v;
  const char* max_key = chat && b.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  v = chat ? -1 : 16;
  if (auto e = Integer(b, max_key, 0, 1 << 30, &v)) return e;
  r->max_tokens = v;
  v = 1;
  if (auto e = Integer(b, "n", 1, 128, &v)) return e;
  r->n = (int)v;
  if (r->prompts.size() * (size_t)r->n > 1024) {
    return Bad("n", StrFormat("%zu prompts x n = %d is %zu choices; at most 1024 per request", r->prompts.size(), r->n,
                              r->prompts.size() * (size_t)r->n));
  }
  if (auto e = Bool(b, "stream", &r->stream)) return e;
  if (auto it = b.find("stream_options"); it != b.end() && !it->is_null()) {
    if (!it->is_object()) return Bad("stream_options", "'stream_options' must be an object");
    if (auto e = Bool(*it, "include_usage", &r->include_usage)) return e;
  }
  if (chat) {
    bool lp = false;
    if (auto e = Bool(b, "logprobs", &lp)) return e;
    v = 0;
    if (auto e = Integer(b, "top_logprobs", 0, 20, &v)) return e;
    if (b.contains("top_logprobs") && !b["top_logprobs"].is_null() && !lp) {
      return Bad("top_logprobs", "'top_logprobs' requires 'logprobs': true");
    }
    r->logprobs = lp ? (int)v : -1;
  } else {
    v = -1;
    if (auto e = Integer(b, "logprobs", 0, 5, &v)) return e;
    r->logprobs = (int)v;
    if (auto e = Bool(b, "echo", &r->echo)) return e;
  }
  if (auto it = b.find("stop"); it != b.end() && !it->is_null()) {
    if (it->is_string()) {
      r->stop.push_back(it->get<std::string>());
    } else if (it->is_array() && it->size() <= 4) {
      for (const json& s : *it) {
        if (!s.is_string()) return Bad("stop", "'stop' must be a string or a list of up to 4 strings");
        r->stop.push_back(s.get<std::string>());
      }
    } else {
      return Bad("stop", "'stop' must be a string or a list of up to 4 strings");
    }
  }
  serve::SamplingParams& s = r->sampling;
  if (auto e = Number(b, "temperature", 0, 2, &s.temperature)) return e;
  if (auto e = Number(b, "top_p", 1e-9, 1, &s.top_p)) return e;
  if (auto e = Number(b, "min_p", 0, 1, &s.min_p)) return e;
  if (auto e = Number(b, "presence_penalty", -2, 2, &s.presence_penalty)) return e;
  if (auto e = Number(b, "frequency_penalty", -2, 2, &s.frequency_penalty)) return e;
  if (auto e = Number(b, "repetition_penalty", 1e-3, 10, &s.repetition_penalty)) return e;
  v = 0;
  if (auto e = Integer(b, "top_k", -1, 1 << 20, &v)) return e;
  s.top_k = v < 0 ? 0 : (int)v;
  if (auto it = b.find("seed"); it != b.end() && !it->is_null()) {
    if (!it->is_number_integer()) return Bad("seed", "'seed' must be an integer");
    s.seed = (uint64_t)it->get<int64_t>();
    s.has_seed = true;
  }
  if (auto it = b.find("logit_bias"); it != b.end() && !it->is_null()) {
    // {"token id as a string": bias in [-100, 100]}, as OpenAI takes it (ids checked against the
    // vocabulary by the server, which knows it).
    if (!it->is_object()) return Bad("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
    for (const auto& [key, val] : it->items()) {
      const std::string where = "logit_bias." + key;
      char* end = nullptr;
      errno = 0;
      const long long id = key.empty() ? -1 : std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || errno != 0 || id < 0 || id > INT32_MAX) {
        return Bad("logit_bias", "'logit_bias' keys must be token ids (non-negative integers), got '" + key + "'");
      }
      if (!val.is_number()) return Bad("logit_bias", "'" + where + "' must be a number, got " + TypeName(val));
      const double bias = val.get<double>();
      if (!(bias >= -100 && bias <= 100)) {
        return Bad("logit_bias", "'" + where + "' must be between -100 and 100, got " + val.dump());
      }
      s.logit_bias.push_back({(int32_t)id, (float)bias});
    }
  }
  if (auto e = Bool(b, "ignore_eos", &r->ignore_eos)) return e;
  v = 0;
  if (auto e = Integer(b, "priority", -1000000, 1000000, &v)) return e;
  r->priority = (int)v;
  return std::nullopt;
}

namespace {

json LogprobsJson(const Choice& c, bool chat) {
  if (chat) {
    json content = json::array();
    for (const TokenLogprobInfo& t : c.logprobs) {
      json top = json::array();
      for (const auto& [tok, lp] : t.top) top.push_back({{"token", tok}, {"logprob", lp}, {"bytes", json(std::vector<uint8_t>(tok.begin(), tok.end()))}});
      content.push_back({{"token", t.token}, {"logprob", t.logprob},
                         {"bytes", json(std::vector<uint8_t>(t.token.begin(), t.token.end()))}, {"top_logprobs", top}});
    }
    return json{{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  int64_t off = 0;
  for (const TokenLogprobInfo& t : c.logprobs) {
    tokens.push_back(t.token);
    if (t.first_prompt_token) {
      lps.push_back(nullptr);
      tops.push_back(nullptr);
    } else {
      lps.push_back(t.logprob);
      json top = json::object();
      for (const auto& [tok, lp] : t.top) top[tok] = lp;
      tops.push_back(top);
    }
    offsets.push_back(off);
    off += (int64_t)t.token.size();
  }
  return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json UsageJson(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens}, {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

}  // namespace

namespace {
// The call's root becomes tool_call_json (JSON schema grammars never name a rule with '_', nor refer to root).
std::string CallRule(const std::string& call_gbnf) {
  return call_gbnf.rfind("root ::= ", 0) == 0 ? "tool_call_json" + call_gbnf.substr(4) : call_gbnf;
}
}  // namespace

std::string RequiredCallsGbnf(const std::string& call_gbnf, bool parallel) {
  return std::string("root ::= \"[\" tool_call_ws tool_call_json") +
         (parallel ? " ( tool_call_ws \",\" tool_call_ws tool_call_json )*" : "") + " tool_call_ws \"]\"\n" +
         "tool_call_ws ::= [ \\n]{0,2}\n" + CallRule(call_gbnf);
}

namespace {
// The rules of calls in <tool_call> tags after the first tag (the lazy grammar's trigger): the call (rule `call`), its
// closing tag, and with `parallel` more calls in tags; at most two spaces or newlines around each.
std::string TaggedCallsGbnf(const std::string& call, bool parallel) {
  std::string g = "root ::= tool_call_ws " + call + " tool_call_ws " + GbnfLiteral(kToolCallClose) +
                  (parallel ? " tool_call_more" : "") + "\n";
  g += "tool_call_ws ::= [ \\n]{0,2}\n";
  if (parallel) {
    g += "tool_call_more ::= ( tool_call_ws " + GbnfLiteral(kToolCallOpen) + " tool_call_ws " + call + " tool_call_ws " +
         GbnfLiteral(kToolCallClose) + " )* tool_call_ws\n";
  }
  return g;
}
}  // namespace

std::string ToolCallGbnf(const std::string& call_gbnf, bool parallel, ToolFormat format) {
  const std::string body = CallRule(call_gbnf);
  if (format == ToolFormat::kLlama3Json) {
    return std::string("root ::= tool_call_json") + (parallel ? " ( \";\" \" \"? tool_call_json )*" : "") + "\n" + body;
  }
  if (format == ToolFormat::kMistral) {  // after [TOOL_CALLS]: " [{...}, {...}]"
    return std::string("root ::= tool_call_ws \"[\" tool_call_ws tool_call_json") +
           (parallel ? " ( tool_call_ws \",\" tool_call_ws tool_call_json )*" : "") + " tool_call_ws \"]\"\n" +
           "tool_call_ws ::= [ \\n]{0,2}\n" + body;
  }
  return TaggedCallsGbnf("tool_call_json", parallel) + body;
}

namespace {

// Text without "</parameter>" or "</function>" in it, as states of a matcher of the two words: xml-text has matched
// nothing, xml-lt "<", xml-slash "</", xml-pK / xml-fK "</" and the first K letters of "parameter>" / "function>".
// Neither word has a "<" after its first character, so on a mismatch the matcher restarts at xml-lt ("<") or at
// xml-text. Each state may end the text.
std::string XmlTextRules() {
  std::string g = "xml-text ::= [^<] xml-text | \"<\" xml-lt | \"\"\n"
                  "xml-lt ::= \"/\" xml-slash | \"<\" xml-lt | [^/<] xml-text | \"\"\n"
                  "xml-slash ::= \"p\" xml-p1 | \"f\" xml-f1 | \"<\" xml-lt | [^pf<] xml-text | \"\"\n";
  for (const std::string word : {"parameter>", "function>"}) {
    for (size_t k = 1; k < word.size(); ++k) {
      const std::string state = "xml-" + std::string(1, word[0]) + std::to_string(k);
      const char c = word[k];
      g += state + " ::= ";
      if (k + 1 < word.size()) g += GbnfLiteral(std::string(1, c)) + " xml-" + word[0] + std::to_string(k + 1) + " | ";
      g += "\"<\" xml-lt | [^" + std::string(1, c) + "<] xml-text | \"\"\n";
    }
  }
  return g;
}

// A parameter schema whose value is written as text: a string, or a schema that says nothing of its type.
bool XmlTextParameter(const nlohmann::ordered_json& s) {
  if (s.is_boolean()) return true;
  if (!s.is_object()) return false;
  if (auto t = s.find("type"); t != s.end()) return *t == "string";
  for (const char* k : {"properties", "items", "anyOf", "oneOf", "allOf", "$ref", "enum", "const", "minimum", "maximum"})
    if (s.contains(k)) return false;
  return true;
}

}  // namespace

Result<std::string> XmlToolCallGbnf(const std::vector<std::pair<std::string, nlohmann::ordered_json>>& tools,
                                    bool parallel) {
  using ojson = nlohmann::ordered_json;
  std::string rules, calls;
  std::set<std::string> primitives;
  bool text_used = false;
  for (size_t i = 0; i < tools.size(); ++i) {
    const auto& [name, params] = tools[i];
    if (name.find_first_of("<>\n") != std::string::npos) {
      return Status::Error("tool name '" + name + "' cannot be written in an XML call (it has '<', '>' or a newline)");
    }
    std::string body = GbnfLiteral("<function=" + name + ">\n");
    const ojson props = params.contains("properties") && params["properties"].is_object() ? params["properties"] : ojson::object();
    std::set<std::string> required;
    if (params.contains("required") && params["required"].is_array()) {
      for (const auto& k : params["required"])
        if (k.is_string()) required.insert(k.get<std::string>());
    }
    size_t j = 0;
    for (auto it = props.begin(); it != props.end(); ++it, ++j) {
      const std::string& key = it.key();
      if (key.find_first_of("<>\n") != std::string::npos) {
        return Status::Error("tool '" + name + "': parameter name '" + key +
                             "' cannot be written in an XML call (it has '<', '>' or a newline)");
      }
      ojson sub = it.value();
      std::string value;
      std::vector<std::string> texts;  // a const or an enum of strings: the texts themselves
      if (sub.is_object() && sub.contains("const")) {
        if (sub["const"].is_string()) texts.push_back(GbnfLiteral(sub["const"].get<std::string>()));
      } else if (sub.is_object() && sub.contains("enum") && sub["enum"].is_array() && !sub["enum"].empty()) {
        for (const auto& v : sub["enum"]) {
          if (!v.is_string()) {
            texts.clear();
            break;
          }
          texts.push_back(GbnfLiteral(v.get<std::string>()));
        }
      } else if (sub.is_object() && sub.contains("type") && sub["type"] == "boolean") {
        // JSON's, or Python's as the jinja writes a call's booleans (str(True)); the reader takes both.
        texts = {"\"true\"", "\"false\"", "\"True\"", "\"False\""};
      }
      if (!texts.empty()) {
        value = GbnfAlternatives(texts);
      } else if (XmlTextParameter(sub)) {
        value = "xml-text";
        text_used = true;
      } else {
        if (sub.is_object()) {  // references into the parameters' definitions resolve from the parameter's schema
          for (const char* k : {"$defs", "definitions"})
            if (params.contains(k) && !sub.contains(k)) sub[k] = params[k];
        }
        auto e = JsonSchemaExpression(sub, "tc" + std::to_string(i) + "-" + std::to_string(j) + "-", &rules, &primitives);
        if (!e.ok()) return Status::Error("tool '" + name + "', parameter '" + key + "': " + e.status().message());
        value = e.value();
      }
      const std::string param = GbnfLiteral("<parameter=" + key + ">\n") + " " + value + " " +
                                GbnfLiteral("\n</parameter>\n");
      body += " " + (required.count(key) ? param : "( " + param + " )?");
    }
    body += " " + GbnfLiteral("</function>");
    rules += "tc" + std::to_string(i) + " ::= " + body + "\n";
    calls += (calls.empty() ? "" : " | ") + std::string("tc") + std::to_string(i);
  }
  std::string g = TaggedCallsGbnf("xml-call", parallel) + "xml-call ::= " + calls + "\n" + rules;
  if (text_used) g += XmlTextRules();
  return g + JsonPrimitiveRules(primitives);
}

nlohmann::ordered_json XmlParameterValue(const std::string& text, const nlohmann::ordered_json& parameters,
                                         const std::string& key) {
  using ojson = nlohmann::ordered_json;
  auto lower = [](std::string t) {
    for (char& c : t) c = (char)std::tolower((unsigned char)c);
    return t;
  };
  if (lower(text) == "null") return nullptr;
  const ojson* schema = nullptr;
  if (parameters.is_object() && parameters.contains("properties") && parameters["properties"].is_object() &&
      parameters["properties"].contains(key)) {
    schema = &parameters["properties"][key];
  }
  if (!schema) return text;
  std::string type = "string";
  if (schema->is_object() && schema->contains("type")) {
    const ojson& t = (*schema)["type"];
    type = t.is_string() ? lower(Trim(t.get<std::string>())) : "list of types";
  }
  auto starts = [&](const char* p) { return type.rfind(p, 0) == 0; };
  for (const char* t : {"string", "str", "text", "varchar", "char", "enum"})
    if (type == t) return text;
  const std::string trimmed = Trim(text);
  if (starts("int") || starts("uint") || starts("long") || starts("short") || starts("unsigned")) {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(trimmed.c_str(), &end, 10);
    if (!trimmed.empty() && errno == 0 && *end == '\0') return v;
    return text;
  }
  if (starts("num") || starts("float")) {
    char* end = nullptr;
    const double v = std::strtod(trimmed.c_str(), &end);
    if (trimmed.empty() || *end != '\0' || !std::isfinite(v)) return text;
    if (v == std::trunc(v) && std::fabs(v) < 9.2e18) return (long long)v;
    return v;
  }
  if (type == "boolean" || type == "bool" || type == "binary") return lower(text) == "true";
  // object, array and the rest: the JSON the text holds, or a Python literal, else the text.
  auto j = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) return j;
  if (trimmed == "True" || trimmed == "False") return trimmed == "True";
  if (trimmed == "None") return nullptr;
  return text;
}

namespace {
bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
// One character inside a JSON string (after its opening quote): false when it is the closing quote. `escaped`
// carries a backslash over to the next character.
bool StaysInJsonString(char c, bool* escaped) {
  if (*escaped) {
    *escaped = false;
    return true;
  }
  if (c == '\\') {
    *escaped = true;
    return true;
  }
  return c != '"';
}
}  // namespace

bool ToolCallReader::Emit(const std::string& json_text, std::vector<ToolCall>* calls) {
  auto j = nlohmann::ordered_json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  const char* key = ArgumentsKey();
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains(key) || !j[key].is_object()) {
    return false;
  }
  ToolCall call;
  call.id = NextId();
  call.index = n_calls_++;
  call.name = j["name"].get<std::string>();
  call.arguments = SafeDump(j[key]);
  calls->push_back(std::move(call));
  return true;
}

namespace {

// Whether `s` is at text[p]: 1 it is, 2 the text ends inside it (a prefix of it is there), 0 something else.
int MatchAt(const std::string& text, size_t p, const std::string& s) {
  const size_t n = std::min(s.size(), text.size() - p);
  if (text.compare(p, n, s, 0, n) != 0) return 0;
  return n < s.size() ? 2 : 1;
}

enum class Header { kMatch, kPartial, kMismatch };

// The header of a call object at text[p]: {"name": <string>, "<key>": { -- kMatch with the name and where the
// arguments' "{" is, kPartial while the text ends inside it, kMismatch for anything else.
Header ReadHeader(const std::string& text, size_t p, const std::string& key, std::string* name, size_t* args) {
  size_t i = p;
  // 1: matched (i moved past it); 2: the text ends inside it; 0: something else.
  auto expect = [&](const std::string& s) {
    const int m = MatchAt(text, i, s);
    if (m == 1) i += s.size();
    return m;
  };
  auto blanks = [&] {
    while (i < text.size() && IsSpace(text[i])) ++i;
    return i < text.size();
  };
  for (const std::string& part : {std::string("{"), std::string("\"name\""), std::string(":")}) {
    if (!blanks()) return Header::kPartial;
    if (const int m = expect(part); m != 1) return m == 2 ? Header::kPartial : Header::kMismatch;
  }
  if (!blanks()) return Header::kPartial;
  if (text[i] != '"') return Header::kMismatch;
  size_t q = i + 1;
  for (bool escaped = false; q < text.size() && StaysInJsonString(text[q], &escaped);) ++q;
  if (q == text.size()) return Header::kPartial;
  auto j = nlohmann::json::parse(text.begin() + (std::ptrdiff_t)i, text.begin() + (std::ptrdiff_t)q + 1, nullptr,
                                 /*allow_exceptions=*/false);
  if (!j.is_string()) return Header::kMismatch;
  i = q + 1;
  for (const std::string& part : {std::string(","), "\"" + key + "\"", std::string(":")}) {
    if (!blanks()) return Header::kPartial;
    if (const int m = expect(part); m != 1) return m == 2 ? Header::kPartial : Header::kMismatch;
  }
  if (!blanks()) return Header::kPartial;
  if (text[i] != '{') return Header::kMismatch;
  *name = j.get<std::string>();
  *args = i;
  return Header::kMatch;
}

}  // namespace

void AppendToolCalls(const std::vector<ToolCall>& deltas, std::vector<ToolCall>* calls) {
  for (const ToolCall& d : deltas) {
    if (d.id.empty() && !calls->empty() && calls->back().index == d.index) {
      calls->back().arguments += d.arguments;
    } else {
      calls->push_back(d);
    }
  }
}

ToolCallReader::CallRead ToolCallReader::ReadCall(const std::string& text, size_t p, size_t end,
                                                  std::vector<ToolCall>* calls) {
  if (!call_open_) {
    std::string name;
    size_t args = 0;
    const Header h = ReadHeader(text, p, ArgumentsKey(), &name, &args);
    if (h != Header::kMatch) {  // read whole once it closes (another key order, or not a call)
      if (end == std::string::npos) return CallRead::kMore;
      return Emit(text.substr(p, end - p), calls) ? CallRead::kDone : CallRead::kNotCall;
    }
    call_open_ = true;
    args_at_ = args_sent_ = args;
    args_minifier_ = JsonMinifier();
    ToolCall call;
    call.id = NextId();
    call.index = n_calls_++;
    call.name = std::move(name);
    AppendToolCalls({call}, calls);
  }
  const size_t args_end = ObjectEnd(text, args_at_);
  SendArguments(text, args_end == std::string::npos ? text.size() : args_end, calls);
  if (end == std::string::npos) return CallRead::kMore;
  call_open_ = false;
  return CallRead::kDone;
}

std::string JsonMinifier::Push(std::string_view piece) {
  std::string out;
  for (const char c : piece) {
    if (in_string_) {
      out += c;
      in_string_ = StaysInJsonString(c, &escaped_);
    } else if (!IsSpace(c)) {
      out += c;
      in_string_ = c == '"';
    }
  }
  return out;
}

void ToolCallReader::SendArguments(const std::string& text, size_t upto, std::vector<ToolCall>* calls) {
  if (upto <= args_sent_) return;
  ToolCall piece;
  piece.index = n_calls_ - 1;
  piece.arguments = args_minifier_.Push(std::string_view(text).substr(args_sent_, upto - args_sent_));
  args_sent_ = upto;
  if (!piece.arguments.empty()) AppendToolCalls({piece}, calls);
}

size_t ToolCallReader::ObjectEnd(const std::string& text, size_t p) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = p; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      in_string = StaysInJsonString(c, &escaped);
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return std::string::npos;
}

std::string ToolCallReader::NextId() {
  if (format_ != ToolFormat::kMistral) return id_prefix_ + std::to_string(n_calls_);
  // 9 letters and digits, from the prefix and the call's number (FNV-1a, then base 62).
  uint64_t h = 1469598103934665603ull;
  for (char c : id_prefix_ + "#" + std::to_string(n_calls_)) h = (h ^ (uint8_t)c) * 1099511628211ull;
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id;
  for (int i = 0; i < 9; ++i) {
    id += kAlnum[h % 62];
    h = h / 62 + (h % 62) * 0x9E3779B97F4A7C15ull;
  }
  return id;
}

void ToolCallReader::ContentUpTo(const std::string& text, size_t at, bool finished, const std::string& marker,
                                 std::string* content) {
  size_t end = at == std::string::npos ? text.size() : at;
  if (at == std::string::npos && !finished) {  // hold back a tail that may begin the marker
    end -= MarkerPrefixAtEnd(std::string_view(text).substr(sent_, end - sent_), marker);
  }
  // Whitespace before a call (or before what may be one) is not content.
  if (at != std::string::npos || !finished)
    while (end > sent_ && IsSpace(text[end - 1])) --end;
  content->append(text, sent_, end - sent_);
  sent_ = end;
}

void ToolCallReader::UpdateMistral(const std::string& text, bool finished, std::string* content,
                                   std::vector<ToolCall>* calls) {
  const std::string marker = kMistralToolCalls;
  if (!in_calls_) {
    const size_t at = text.find(marker, sent_);
    ContentUpTo(text, at, finished, marker, content);
    if (at == std::string::npos) return;
    sent_ = marker_end_ = at + marker.size();
    in_calls_ = true;
  }
  // " [" call ("," call)* "]"
  if (!list_open_) {
    size_t p = sent_;
    while (p < text.size() && IsSpace(text[p])) ++p;
    if (p < text.size() && text[p] != '[') failed_ = true;
    if (p < text.size() && text[p] == '[') {
      list_open_ = true;
      sent_ = p + 1;
    }
  }
  if (list_open_) ReadCalls(text, ',', ']', calls);
  if (finished && call_open_) {  // a call the end cut off keeps what it has
    call_open_ = false;
    sent_ = text.size();
  }
  if (finished && sent_ < text.size()) GiveBack(text, ',', n_calls_ == 0 ? marker_end_ : sent_, content);
}

void ToolCallReader::ReadCalls(const std::string& text, char sep, char close, std::vector<ToolCall>* calls) {
  while (!failed_ && !list_closed_) {
    size_t p = sent_;
    while (p < text.size() && IsSpace(text[p])) ++p;
    if (p == text.size()) break;
    const int before = n_calls_ - (call_open_ ? 1 : 0);  // calls that end before text[sent_]
    if (close && before > 0 && text[p] == close) {
      list_closed_ = true;
      sent_ = p + 1;
      break;
    }
    if (before > 0) {  // after a call: the separator, then the next
      if (text[p] != sep) {
        failed_ = true;
        break;
      }
      ++p;
      while (p < text.size() && IsSpace(text[p])) ++p;
      if (p == text.size()) break;
    }
    if (text[p] != '{') {
      failed_ = true;
      break;
    }
    const size_t end = ObjectEnd(text, p);
    const CallRead read = ReadCall(text, p, end, calls);
    if (read == CallRead::kMore) break;  // not complete yet (its header and arguments stream meanwhile)
    if (read == CallRead::kNotCall) {
      failed_ = true;
      break;
    }
    sent_ = end;
  }
}

void ToolCallReader::GiveBack(const std::string& text, char sep, size_t from, std::string* content) {
  size_t p = from;
  while (p < text.size() && IsSpace(text[p])) ++p;
  if (n_calls_ > 0 && p < text.size() && text[p] == sep) {
    ++p;
    while (p < text.size() && IsSpace(text[p])) ++p;
  }
  content->append(text, p, std::string::npos);
  sent_ = text.size();
}

void ToolCallReader::UpdateJson(const std::string& text, bool finished, std::string* content,
                                std::vector<ToolCall>* calls) {
  if (!in_calls_ && !in_content_) {
    size_t p = 0;
    while (p < text.size() && IsSpace(text[p])) ++p;
    if (p == text.size() && !finished) return;  // blanks so far: a call may follow
    (p < text.size() && text[p] == '{' ? in_calls_ : in_content_) = true;
    if (in_calls_) sent_ = p;
  }
  if (in_content_) {
    content->append(text, sent_, std::string::npos);
    sent_ = text.size();
    return;
  }
  // Calls: complete JSON objects (braces counted outside strings), joined by ";". What they leave at the end (a
  // call cut off, or text that is not one) comes back as content, without the ";" before it.
  ReadCalls(text, ';', '\0', calls);
  if (finished && call_open_) {  // a call the end cut off keeps what it has
    call_open_ = false;
    sent_ = text.size();
  }
  if (finished && sent_ < text.size()) GiveBack(text, ';', sent_, content);
}

bool ToolCallReader::FirstTag(const std::string& text, bool finished, std::string* content) {
  if (in_calls_) return true;
  const size_t at = text.find(kToolCallOpen, sent_);
  ContentUpTo(text, at, finished, kToolCallOpen, content);
  if (at == std::string::npos) return false;
  sent_ = at;
  in_calls_ = true;
  return true;
}

void ToolCallReader::FinishTagged(const std::string& text, std::string* content) {
  if (call_open_) {  // a call the end cut off keeps what it has
    call_open_ = false;
    sent_ = text.size();
  }
  if (sent_ < text.size()) {
    // A block the end cut off, or one that was not a call: its text as content. Whitespace after the calls is
    // dropped.
    size_t p = sent_;
    while (p < text.size() && IsSpace(text[p])) ++p;
    if (p < text.size() || n_calls_ == 0) content->append(text, sent_, std::string::npos);
    sent_ = text.size();
  }
}

void ToolCallReader::Update(const std::string& text, bool finished, std::string* content, std::vector<ToolCall>* calls) {
  if (format_ == ToolFormat::kMistral || list_) return UpdateMistral(text, finished, content, calls);
  if (format_ == ToolFormat::kLlama3Json) return UpdateJson(text, finished, content, calls);
  if (format_ == ToolFormat::kQwen3Coder) return UpdateXml(text, finished, content, calls);
  const std::string open = kToolCallOpen, close = kToolCallClose;
  if (!FirstTag(text, finished, content)) return;
  while (!failed_) {
    size_t p = sent_;
    while (p < text.size() && IsSpace(text[p])) ++p;
    if (p == text.size()) break;
    if (const int m = MatchAt(text, p, open); m != 1) {
      if (m == 0) failed_ = true;  // text after the calls that is not another call
      break;                       // (2: the tag itself is not complete yet)
    }
    size_t q = p + open.size();
    while (q < text.size() && IsSpace(text[q])) ++q;
    CallRead read = CallRead::kNotCall;
    size_t c = std::string::npos;
    if (q < text.size() && text[q] == '{') {
      // The closing tag after the object (a "</tool_call>" inside its strings is not it); until both have come, the
      // call's header and arguments as they come.
      const size_t end = ObjectEnd(text, q);
      if (end != std::string::npos) c = text.find(close, end);
      if (c == std::string::npos) {
        ReadCall(text, q, std::string::npos, calls);
        break;
      }
      // Text between the object and the tag: not a call, unless its header made it one already.
      std::string name;
      size_t args = 0;
      const bool tag_follows = text.find_first_not_of(" \t\r\n", end) == c;
      if (tag_follows || call_open_ || ReadHeader(text, q, ArgumentsKey(), &name, &args) == Header::kMatch) {
        read = ReadCall(text, q, end, calls);
      }
    } else {
      c = text.find(close, p + open.size());
      if (c == std::string::npos) break;  // not closed yet
    }
    if (read == CallRead::kNotCall) {
      failed_ = true;
      break;
    }
    sent_ = c + close.size();
  }
  if (finished) FinishTagged(text, content);
}

void ToolCallReader::UpdateXml(const std::string& text, bool finished, std::string* content,
                               std::vector<ToolCall>* calls) {
  static const std::string open = kToolCallOpen, close = kToolCallClose, fn = "<function=", fn_close = "</function>",
                           param = "<parameter=", param_close = "</parameter>";
  if (!FirstTag(text, finished, content)) return;
  auto at = [&](size_t p, const std::string& s) { return MatchAt(text, p, s); };
  auto send = [&](std::string piece) {
    ToolCall d;
    d.index = n_calls_ - 1;
    d.arguments = std::move(piece);
    AppendToolCalls({d}, calls);
  };
  while (!failed_) {
    size_t p = sent_;
    while (p < text.size() && IsSpace(text[p])) ++p;
    if (p == text.size()) break;
    if (call_open_) {
      if (const int m = at(p, param); m != 0) {
        if (m == 2) break;
        const size_t key_end = text.find('>', p + param.size());
        if (key_end == std::string::npos) break;
        const size_t v = key_end + 1;
        const size_t pe = text.find(param_close, v), fe = text.find(fn_close, v);
        const size_t end = std::min(pe, fe);
        if (end == std::string::npos) break;  // the value has not ended yet
        std::string value = text.substr(v, end - v);
        if (!value.empty() && value.front() == '\n') value.erase(0, 1);
        if (!value.empty() && value.back() == '\n') value.pop_back();
        const std::string key = text.substr(p + param.size(), key_end - p - param.size());
        send(std::string(xml_params_++ ? "," : "") + SafeDump(nlohmann::ordered_json(key)) + ":" +
             SafeDump(XmlParameterValue(value, xml_schema_, key)));
        sent_ = end == pe ? pe + param_close.size() : fe;
        continue;
      }
      if (const int m = at(p, fn_close); m != 0) {
        if (m == 2) break;
        send("}");
        call_open_ = false;
        xml_after_fn_ = true;
        sent_ = p + fn_close.size();
        continue;
      }
      // Other text inside the call: skipped up to the next parameter or the call's end.
      const size_t next = std::min(text.find(param, p), text.find(fn_close, p));
      if (next == std::string::npos) break;
      sent_ = next;
      continue;
    }
    if (xml_after_fn_) {
      xml_after_fn_ = false;
      if (const int m = at(p, close); m != 0) {
        if (m == 2) {
          xml_after_fn_ = true;
          break;
        }
        sent_ = p + close.size();
        continue;
      }
    }
    // A call's opening: "<tool_call>", blanks, "<function=NAME>".
    if (const int m = at(p, open); m != 1) {
      if (m == 0) failed_ = true;  // text after the calls that is not another call
      break;
    }
    size_t q = p + open.size();
    while (q < text.size() && IsSpace(text[q])) ++q;
    if (q == text.size()) break;
    if (const int m = at(q, fn); m != 1) {
      if (m == 0) failed_ = true;  // a block that is not an XML call: content
      break;
    }
    const size_t name_end = text.find('>', q + fn.size());
    if (name_end == std::string::npos) break;
    xml_name_ = text.substr(q + fn.size(), name_end - q - fn.size());
    if (xml_name_.empty() || xml_name_.find_first_of("<\n") != std::string::npos) {
      failed_ = true;
      break;
    }
    ToolCall call;
    call.id = NextId();
    call.index = n_calls_++;
    call.name = xml_name_;
    call.arguments = "{";
    AppendToolCalls({call}, calls);
    call_open_ = true;
    xml_params_ = 0;
    const auto schema = parameters_.find(xml_name_);
    xml_schema_ = schema == parameters_.end() ? nlohmann::ordered_json() : *schema;
    sent_ = name_end + 1;
  }
  if (finished) FinishTagged(text, content);
}

std::string CheckReasoningParser(const std::string& name) {
  if (name == "qwen3" || name == "deepseek_r1") return "";
  return "unknown reasoning parser '" + name +
         "'; lathe has: qwen3 (<think>...</think>, as vLLM's qwen3), deepseek_r1 (reasoning from the reply's start "
         "up to </think>, as vLLM's deepseek_r1)";
}

void SetReasoningGate(const std::string& reasoning_parser, bool in_reasoning, bool chat, bool open_in_prompt,
                      CompletionRequest* r) {
  if (!chat || reasoning_parser.empty() || in_reasoning || !r->enable_thinking || r->grammar.empty()) return;
  r->sampling.reasoning_start = ReasoningReader::kOpen;
  r->sampling.reasoning_end = ReasoningReader::kClose;
  r->sampling.reasoning_open = open_in_prompt || reasoning_parser == "deepseek_r1";
}

bool ReasoningOpenAtEnd(const std::string& prompt_text) {
  const size_t open = prompt_text.rfind(ReasoningReader::kOpen);
  return open != std::string::npos && prompt_text.find(ReasoningReader::kClose, open) == std::string::npos;
}

void ReasoningReader::Update(const std::string& piece, bool final, std::string* reasoning, std::string* content) {
  held_ += piece;
  if (state_ == State::kStart || state_ == State::kInBlock) {
    if (held_.size() < kOpen.size() && kOpen.compare(0, held_.size(), held_) == 0 && !final) return;  // may open
    if (held_.compare(0, kOpen.size(), kOpen) == 0) {
      state_ = State::kReasoning;
      held_.erase(0, kOpen.size());
    } else {
      state_ = state_ == State::kInBlock ? State::kReasoning : State::kContent;
    }
  }
  if (state_ == State::kReasoning) {
    const size_t close = held_.find(kClose);
    if (close != std::string::npos) {
      *reasoning += held_.substr(0, close);
      held_.erase(0, close + kClose.size());
      state_ = State::kContent;
    } else {
      const size_t keep = final ? 0 : MarkerPrefixAtEnd(held_, kClose);  // what may begin "</think>" waits
      *reasoning += held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return;
    }
  }
  *content += held_;
  held_.clear();
}

json CompletionResponse(const std::string& id, int64_t created, const std::string& model,
                        const std::vector<Choice>& choices, const Usage& usage, bool chat) {
  json arr = json::array();
  for (const Choice& c : choices) {
    json j = {{"index", c.index}, {"finish_reason", c.finish_reason.empty() ? json(nullptr) : json(c.finish_reason)},
              {"logprobs", c.has_logprobs ? LogprobsJson(c, chat) : json(nullptr)}};
    if (chat && !c.tool_calls.empty()) {
      json calls = json::array();
      for (const ToolCall& t : c.tool_calls) {
        calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
      }
      j["message"] = {{"role", "assistant"}, {"content", c.text.empty() ? json(nullptr) : json(c.text)},
                      {"tool_calls", calls}};
    } else if (chat) {
      j["message"] = {{"role", "assistant"},
                      {"content", c.text.empty() && !c.reasoning.empty() ? json(nullptr) : json(c.text)}};
    } else {
      j["text"] = c.text;
    }
    if (chat && !c.reasoning.empty()) {  // vLLM's field, under its old and new names
      j["message"]["reasoning_content"] = c.reasoning;
      j["message"]["reasoning"] = c.reasoning;
    }
    arr.push_back(j);
  }
  return json{{"id", id}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created},
              {"model", model}, {"choices", arr}, {"usage", UsageJson(usage)}};
}

json CompletionChunk(const std::string& id, int64_t created, const std::string& model, const Choice& c, bool chat,
                     bool first) {
  json j = {{"index", c.index}, {"finish_reason", c.finish_reason.empty() ? json(nullptr) : json(c.finish_reason)},
            {"logprobs", c.has_logprobs ? LogprobsJson(c, chat) : json(nullptr)}};
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!c.tool_calls.empty()) {
      json calls = json::array();
      for (size_t k = 0; k < c.tool_calls.size(); ++k) {
        const ToolCall& t = c.tool_calls[k];
        if (t.id.empty()) {  // the next piece of a call's arguments
          calls.push_back({{"index", t.index}, {"function", {{"arguments", t.arguments}}}});
        } else {
          calls.push_back({{"index", t.index}, {"id", t.id}, {"type", "function"},
                           {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
        }
      }
      delta["tool_calls"] = calls;
    }
    if (!c.reasoning.empty()) {
      delta["reasoning_content"] = c.reasoning;
      delta["reasoning"] = c.reasoning;
    }
    if (!c.text.empty() || (first && c.tool_calls.empty() && c.reasoning.empty())) delta["content"] = c.text;
    j["delta"] = delta;
  } else {
    j["text"] = c.text;
  }
  return json{{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
              {"model", model}, {"choices", json::array({j})}};
}

json UsageChunk(const std::string& id, int64_t created, const std::string& model, const Usage& usage, bool chat) {
  return json{{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
              {"model", model}, {"choices", json::array()}, {"usage", UsageJson(usage)}};
}

std::string SseEvent(const json& payload) {
  return "data: " + payload.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace lathe::server
