// Chat templates (chatml, llama3, llama2, mistral, mistral-v3, alpaca, deepseek-r1) rendered in C++ to match what
// each family's jinja produces, detection from a jinja's markers, and default system prompt extraction.
#include "tokenizer/chat_template.h"

#include <cstdio>
#include <ctime>
#include <fstream>
#include <iterator>
#include <string_view>

#include "core/strings.h"
#include "tokenizer/tool_turns.h"

namespace lathe::tokenizer {
namespace {

constexpr const char* kNames[] = {"chatml", "llama3", "llama2", "mistral", "mistral-v3", "alpaca", "deepseek-r1"};
// LLaMA-Factory's template names (src/llamafactory/data/template.py) that render as chatml, and how they differ.
struct LlamaFactoryChatml {
  const char* name;
  const char* default_system;
  bool reasoning;  // ReasoningTemplate: empty think blocks before the replies
};
constexpr LlamaFactoryChatml kLlamaFactoryChatml[] = {
    {"qwen", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", false},
    {"qwen3", "", true},
    {"qwen3_nothink", "", false},
    {"smollm", "", false},
    {"smollm2", "You are a helpful AI assistant named SmolLM, trained by Hugging Face.", false},
};
constexpr char kTemplateNames[] =
    "chatml, llama3, llama2, mistral, mistral-v3, alpaca, deepseek-r1, and LLaMA-Factory's qwen, qwen3, "
    "qwen3_nothink, smollm, smollm2";
// DeepSeek-R1's special tokens (fullwidth bars, U+2581 in the sentence tokens).
constexpr char kDeepSeekBos[] = "<\uFF5Cbegin\u2581of\u2581sentence\uFF5C>";
constexpr char kDeepSeekEos[] = "<\uFF5Cend\u2581of\u2581sentence\uFF5C>";
constexpr char kDeepSeekUser[] = "<\uFF5CUser\uFF5C>";
constexpr char kDeepSeekAssistant[] = "<\uFF5CAssistant\uFF5C>";
constexpr char kAlpacaPreamble[] =
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.";


// Python's lstrip(chars) / rstrip(chars) for ASCII characters (strip() is Trim in core/strings.h).
std::string LStrip(const std::string& s, char c) {
  size_t b = 0;
  while (b < s.size() && s[b] == c) ++b;
  return s.substr(b);
}

// LLaMA-Factory's remove_thought: every "<think>\n...\n</think>\n\n" (shortest match) removed, then leading newlines.
std::string RemoveThoughts(const std::string& s) {
  static constexpr std::string_view kOpen = "<think>\n", kClose = "\n</think>\n\n";
  std::string out;
  size_t at = 0;
  for (;;) {
    const size_t open = s.find(kOpen, at);
    const size_t close = open == std::string::npos ? open : s.find(kClose, open + kOpen.size());
    if (close == std::string::npos) break;
    out.append(s, at, open - at);
    at = close + kClose.size();
  }
  out.append(s, at, std::string::npos);
  return LStrip(out, '\n');
}

std::string RStrip(const std::string& s, char c) {
  size_t e = s.size();
  while (e > 0 && s[e - 1] == c) --e;
  return s.substr(0, e);
}
std::string Strip(const std::string& s, char c) { return LStrip(RStrip(s, c), c); }

// A system prompt written as a literal in the jinja: the text between "<|im_start|>system\n" and
// "<|im_end|>" when it contains no jinja expression (no quotes, braces or concatenation).
std::string ExtractDefaultSystem(const std::string& jinja) {
  const std::string start = "<|im_start|>system";
  size_t pos = 0;
  while ((pos = jinja.find(start, pos)) != std::string::npos) {
    size_t p = pos + start.size();
    pos = p;
    if (jinja.compare(p, 1, "\n") == 0) {
      p += 1;
    } else if (jinja.compare(p, 2, "\\n") == 0) {
      p += 2;
    } else {
      continue;
    }
    size_t end = jinja.find("<|im_end|>", p);
    if (end == std::string::npos) continue;
    std::string raw = jinja.substr(p, end - p);
    if (raw.empty() || raw.find_first_of("'\"{}+") != std::string::npos) continue;
    std::string text;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\\' && i + 1 < raw.size()) {
        char n = raw[++i];
        text.push_back(n == 'n' ? '\n' : n == 't' ? '\t' : n);
      } else {
        text.push_back(raw[i]);
      }
    }
    return text;
  }
  return {};
}

// Mistral's v3 instruct format (Mistral-7B-Instruct-v0.3, Mixtral-8x22B), as mistral_common's InstructTokenizerV3
// encodes a request after its normalizer: the system messages joined by "\n\n" go before the last user message's
// text; runs of user (or assistant) messages are merged with "\n\n"; a conversation that does not open with a
// user turn gets an empty one. Control tokens are written without spaces around them: each text piece between
// them gets SentencePiece's leading "\u2581" from the tokenizer, as mistral_common's encode(piece) does.
// Roles: "tools" (the [AVAILABLE_TOOLS] JSON, written before the last user turn), "tool" (a [TOOL_RESULTS] JSON),
// and assistant content that opens with [TOOL_CALLS] (written as is).
std::string ApplyMistralV3(const std::vector<ChatMessage>& messages, std::vector<std::pair<size_t, size_t>>* replies) {
  std::string system, tools;
  struct Turn {
    std::string role, content;
  };
  std::vector<Turn> turns;
  std::string run_role;  // the role of the run the last turn belongs to ("" after a system message)
  for (const ChatMessage& m : messages) {
    if (m.role == "system") {
      if (!m.content.empty()) system += (system.empty() ? "" : "\n\n") + m.content;
      run_role.clear();
      continue;
    }
    if (m.role == "tools") {
      tools = m.content;
      continue;
    }
    const bool merge = (m.role == "user" || m.role == "assistant") && run_role == m.role && !turns.empty();
    if (merge) {
      turns.back().content += "\n\n" + m.content;
    } else {
      turns.push_back({m.role, m.content});
    }
    run_role = m.role;
  }
  if (turns.empty() || turns[0].role != "user") turns.insert(turns.begin(), {"user", ""});
  size_t last_user = 0;
  for (size_t i = 0; i < turns.size(); ++i)
    if (turns[i].role == "user") last_user = i;
  std::string out = "<s>";
  for (size_t i = 0; i < turns.size(); ++i) {
    const Turn& t = turns[i];
    if (t.role == "user") {
      if (i == last_user && !tools.empty()) out += "[AVAILABLE_TOOLS]" + tools + "[/AVAILABLE_TOOLS]";
      std::string content = t.content;
      if (i == last_user && !system.empty()) content = system + "\n\n" + content;
      out += "[INST]" + content + "[/INST]";
    } else if (t.role == "assistant") {
      const size_t begin = out.size();
      out += RStrip(t.content, ' ') + "</s>";
      if (replies) replies->push_back({begin, out.size()});
    } else if (t.role == "tool") {
      out += "[TOOL_RESULTS]" + t.content + "[/TOOL_RESULTS]";
    }
  }
  return out;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::ByName(const std::string& name) {
  for (const char* n : kNames) {
    if (name == n) {
      ChatTemplate t;
      t.name_ = name;
      return t;
    }
  }
  for (const LlamaFactoryChatml& lf : kLlamaFactoryChatml) {
    if (name == lf.name) {
      ChatTemplate t;
      t.name_ = "chatml";
      t.default_system_ = lf.default_system;
      t.reasoning_replies_ = lf.reasoning;
      return t;
    }
  }
  return Status::Error("unknown chat template '" + name + "'; valid: " + kTemplateNames);
}

Result<ChatTemplate> ChatTemplate::FromFlag(const std::string& flag, const std::string& value) {
  if (auto by_name = ByName(value); by_name.ok()) return by_name;
  std::ifstream f(value, std::ios::binary);
  if (!f) {
    return Status::Error(flag + " '" + value + "': neither a chat template name (" + kTemplateNames +
                         ") nor a readable jinja file");
  }
  const std::string jinja((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  bool known = false;
  for (const char* marker : {"<|im_start|>", "<|start_header_id|>", "[INST]", "### Instruction", kDeepSeekUser})
    known = known || jinja.find(marker) != std::string::npos;
  if (!known) {
    return Status::Error(flag + " " + value + ": a jinja chat template in a format lathe does not render (it knows "
                         "chatml <|im_start|>, Llama 3 <|start_header_id|>, Llama 2 / Mistral [INST], alpaca "
                         "### Instruction and DeepSeek-R1 templates)");
  }
  return Detect(jinja);
}

ChatTemplate ChatTemplate::Detect(const std::string& jinja) {
  ChatTemplate t;
  if (jinja.find("<|im_start|>") != std::string::npos) {
    t.name_ = "chatml";
    t.default_system_ = ExtractDefaultSystem(jinja);
    t.think_blocks_ = jinja.find("<think>") != std::string::npos && jinja.find("reasoning_content") != std::string::npos;
    t.thinking_switch_ = jinja.find("enable_thinking") != std::string::npos;
    t.xml_tool_calls_ = jinja.find("<function=") != std::string::npos && jinja.find("<parameter=") != std::string::npos;
    // Qwen3's jinja: {%- if loop.last or (not loop.last and reasoning_content) %} inside the last-query test.
    t.think_after_query_ = t.think_blocks_ && jinja.find("last_query_index") != std::string::npos &&
                           jinja.find("loop.last or") == std::string::npos;
    // Qwen3.5 trims every message's text: {%- set content = render_content(message.content, true)|trim %}.
    for (size_t at = jinja.find("set content ="); at != std::string::npos; at = jinja.find("set content =", at + 1)) {
      const std::string stmt = jinja.substr(at, jinja.find("%}", at) - at);
      if (stmt.find("message.content") != std::string::npos && stmt.find("|trim") != std::string::npos) {
        t.trims_content_ = true;
      }
    }
    // The generation prompt's text, after the jinja's last add_generation_prompt: a string literal that ends the
    // prompt with "<think>\n" (written with the escape "\n" in the jinja source), not the closed empty block.
    const size_t gen = jinja.rfind("add_generation_prompt");
    if (gen != std::string::npos) {
      const std::string tail = jinja.substr(gen);
      t.think_in_prompt_ = tail.find("<think>\\n'") != std::string::npos || tail.find("<think>\\n\"") != std::string::npos;
    }
  } else if (jinja.find("<|start_header_id|>") != std::string::npos) {
    t.name_ = "llama3";
    if (jinja.find("Cutting Knowledge Date") != std::string::npos) {
      t.date_ = "26 Jul 2024";
      if (jinja.find("strftime_now") != std::string::npos) {
        char buf[32];
        const std::time_t now = std::time(nullptr);
        std::tm tm{};
        gmtime_r(&now, &tm);
        static const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                        "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
        std::snprintf(buf, sizeof buf, "%02d %s %04d", tm.tm_mday, kMonths[tm.tm_mon], tm.tm_year + 1900);
        t.date_ = buf;
      }
    }
  } else if (jinja.find("[INST]") != std::string::npos) {
    t.name_ = jinja.find("<<SYS>>") != std::string::npos           ? "llama2"
              : jinja.find("[AVAILABLE_TOOLS]") != std::string::npos ? "mistral-v3"
                                                                     : "mistral";
  } else if (jinja.find(kDeepSeekUser) != std::string::npos && jinja.find(kDeepSeekAssistant) != std::string::npos) {
    t.name_ = "deepseek-r1";  // the R1 distills (Qwen, Llama); their newer jinja opens the think block in the prompt
    const size_t gen = jinja.rfind("add_generation_prompt");
    t.think_in_prompt_ = gen != std::string::npos && jinja.find("<think>\\n'", gen) != std::string::npos;
  } else if (jinja.find("### Instruction") != std::string::npos) {
    t.name_ = "alpaca";
  } else {
    t.name_ = "chatml";
  }
  return t;
}

std::string ChatTemplate::Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                std::vector<std::pair<size_t, size_t>>* replies) const {
  std::string out;
  if (replies) replies->clear();
  size_t begin = 0;  // where the assistant turn being written starts its reply
  auto reply_ends = [&] {
    if (replies) replies->push_back({begin, out.size()});
  };
  const size_t n = messages.size();
  const bool has_system = n > 0 && messages[0].role == "system";
  if (name_ == "chatml") {
    if (n > 0 && !has_system && !default_system_.empty()) {
      out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
    }
    // Qwen3's jinja: the last user turn that is not a tool's result (a user turn in <tool_response> tags).
    size_t last_query = n == 0 ? 0 : n - 1;
    for (size_t i = n; i-- > 0;) {
      const std::string& c = messages[i].content;
      const bool tool_result = c.rfind("<tool_response>", 0) == 0 && c.size() >= 16 &&
                               c.compare(c.size() - 16, 16, "</tool_response>") == 0;
      if (messages[i].role == "user" && !tool_result) {
        last_query = i;
        break;
      }
    }
    for (size_t i = 0; i < n; ++i) {
      const ChatMessage& m = messages[i];
      std::string content = trims_content_ ? Trim(m.content) : m.content;
      if (reasoning_replies_ && m.role == "assistant") {  // LLaMA-Factory's ReasoningTemplate
        if (!enable_thinking_) content = RemoveThoughts(content);
        out += "<|im_start|>assistant\n";
        const bool empty_block = content.find("<think>") == std::string::npos &&
                                 content.find("</think>") == std::string::npos;
        if (empty_block && !enable_thinking_) out += "<think>\n\n</think>\n\n";
        begin = out.size();
        if (empty_block && enable_thinking_) out += "<think>\n\n</think>\n\n";
        out += content + "<|im_end|>\n";
        reply_ends();
        continue;
      }
      if (think_blocks_ && m.role == "assistant") {
        std::string reasoning = m.reasoning;
        size_t close = content.find("</think>");
        if (m.reasoning.empty() && close != std::string::npos) {
          size_t last_close = content.rfind("</think>");
          std::string before = RStrip(content.substr(0, close), '\n');
          size_t open = before.rfind("<think>");
          reasoning = LStrip(open == std::string::npos ? before : before.substr(open + 7), '\n');
          content = LStrip(content.substr(last_close + 8), '\n');
        }
        out += "<|im_start|>assistant\n";
        begin = out.size();
        if (i > last_query && (think_after_query_ || i + 1 == n || !reasoning.empty())) {
          out += "<think>\n" + (trims_content_ ? Trim(reasoning) : Strip(reasoning, '\n')) + "\n</think>\n\n" +
                 LStrip(content, '\n');
        } else {
          out += content;
        }
        out += "<|im_end|>\n";
        reply_ends();
        continue;
      }
      out += "<|im_start|>" + m.role + "\n";
      begin = out.size();
      out += content + "<|im_end|>\n";
      if (m.role == "assistant") reply_ends();
    }
    if (add_generation_prompt) {
      out += think_in_prompt_ ? "<|im_start|>assistant\n<think>\n" : "<|im_start|>assistant\n";
      if (reasoning_replies_ && !enable_thinking_) out += "<think>\n\n</think>\n\n";
    }
  } else if (name_ == "llama3") {
    out += "<|begin_of_text|>";
    size_t i = 0;
    const bool ipython = n > 0 && messages[0].role == "environment";
    if (ipython) ++i;
    const bool system = i < n && messages[i].role == "system";
    const std::string env = ipython ? "Environment: ipython\n" : "";
    if (!date_.empty()) {  // Llama 3.1-3.3's jinja: a system turn always, the cutoff and date lines before the text
      out += "<|start_header_id|>system<|end_header_id|>\n\n" + env + "Cutting Knowledge Date: December 2023\nToday Date: " +
             date_ + "\n\n" + (system ? Trim(messages[i].content) : std::string()) + "<|eot_id|>";
    } else if (ipython || system) {
      out += "<|start_header_id|>system<|end_header_id|>\n\n" + Trim(env + (system ? messages[i].content : "")) +
             "<|eot_id|>";
    }
    if (system) ++i;
    for (; i < n; ++i) {
      const ChatMessage& m = messages[i];
      out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
      begin = out.size();
      // Llama 3.1's jinja writes a tool's result with tojson: a string result becomes a JSON string.
      out += (m.role == "ipython" && !date_.empty() ? PyJson(nlohmann::ordered_json(m.content)) : Trim(m.content)) +
             "<|eot_id|>";
      if (m.role == "assistant") reply_ends();
    }
    if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  } else if (name_ == "deepseek-r1") {
    // DeepSeek-R1's jinja: BOS and the last system message's text, then user and assistant turns; an earlier reply
    // keeps only its text after the last "</think>". Other roles are written as user turns.
    std::string system;
    for (const ChatMessage& m : messages)
      if (m.role == "system") system = m.content;
    out += kDeepSeekBos + system;
    for (const ChatMessage& m : messages) {
      if (m.role == "system") continue;
      if (m.role == "assistant") {
        out += kDeepSeekAssistant;
        begin = out.size();
        const size_t close = m.content.rfind("</think>");
        out += (close == std::string::npos ? m.content : m.content.substr(close + 8)) + kDeepSeekEos;
        reply_ends();
      } else {
        out += kDeepSeekUser + m.content;
      }
    }
    if (add_generation_prompt) out += std::string(kDeepSeekAssistant) + (think_in_prompt_ ? "<think>\n" : "");
  } else if (name_ == "mistral-v3") {
    out = ApplyMistralV3(messages, replies);
  } else if (name_ == "llama2" || name_ == "mistral") {
    const bool llama2 = name_ == "llama2";
    if (!llama2) out += "<s>";
    bool first = true;
    for (size_t i = has_system ? 1 : 0; i < n; ++i) {
      const ChatMessage& m = messages[i];
      std::string content = m.content;
      if (m.role == "user") {
        if (first && has_system) {
          content = llama2 ? "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n" + content
                           : messages[0].content + "\n\n" + content;
        }
        if (llama2) {
          out += "<s>[INST] " + Trim(content) + " [/INST]";
        } else {
          out += "[INST] " + content + " [/INST]";
        }
      } else if (m.role == "assistant") {
        begin = out.size();
        out += llama2 ? " " + Trim(content) + " </s>" : content + "</s>";
        reply_ends();
      }
      first = false;
    }
  } else {  // alpaca
    out += (has_system ? messages[0].content : std::string(kAlpacaPreamble)) + "\n\n";
    for (size_t i = has_system ? 1 : 0; i < n; ++i) {
      const ChatMessage& m = messages[i];
      if (m.role == "user") out += "### Instruction:\n" + m.content + "\n\n";
      if (m.role == "assistant") {
        out += "### Response:\n";
        begin = out.size();
        out += m.content + "\n\n";
        reply_ends();
      }
    }
    if (add_generation_prompt) out += "### Response:\n";
  }
  return out;
}

std::vector<std::string> ChatTemplate::StopStrings() const {
  if (name_ == "chatml") return {"<|im_end|>", "<|endoftext|>"};
  if (name_ == "llama3") return {"<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"};
  if (name_ == "alpaca") return {"### Instruction:", "</s>"};
  if (name_ == "deepseek-r1") return {kDeepSeekEos};
  return {"</s>"};
}

}  // namespace lathe::tokenizer
