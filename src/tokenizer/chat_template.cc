// Chat templates: the prompt formats of the common chat models, rendered in C++ (no jinja).
#include "tokenizer/chat_template.h"

#include "core/strings.h"

namespace lathe::tokenizer {

namespace {

const char* const kNames[] = {"chatml", "llama3", "llama2", "mistral", "alpaca"};

const char kAlpacaSystem[] =
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.";

// The system prompt a chatml jinja template inserts when the conversation has none: the
// literal between "<|im_start|>system\n" and "<|im_end|>" in a string constant (SmolLM2's
// "You are a helpful AI assistant named SmolLM, trained by Hugging Face").
std::string DefaultChatmlSystem(const std::string& jinja) {
  for (const std::string& open : {std::string("<|im_start|>system\\n"), std::string("<|im_start|>system\n")}) {
    size_t p = jinja.find(open);
    while (p != std::string::npos) {
      size_t start = p + open.size();
      size_t end = jinja.find("<|im_end|>", start);
      if (end == std::string::npos) break;
      std::string text = jinja.substr(start, end - start);
      // A literal default, not an expression such as "' + message['content'] + '".
      if (text.find("{{") == std::string::npos && text.find('\'') == std::string::npos &&
          text.find("message") == std::string::npos && !text.empty()) {
        return text;
      }
      p = jinja.find(open, end);
    }
  }
  return "";
}

}  // namespace

Result<ChatTemplate> ChatTemplate::ByName(const std::string& name) {
  std::vector<std::string> names(std::begin(kNames), std::end(kNames));
  for (const std::string& n : names) {
    if (n == name) {
      ChatTemplate t;
      t.name_ = n;
      if (n == "alpaca") t.default_system_ = kAlpacaSystem;
      return t;
    }
  }
  std::string near = Nearest(name, names);
  return Status::Error("unknown chat template '" + name + "'" + (near.empty() ? "" : " (did you mean '" + near + "'?)") +
                       "; known: chatml, llama3, llama2, mistral, alpaca");
}

ChatTemplate ChatTemplate::Detect(const std::string& jinja) {
  ChatTemplate t;
  if (jinja.find("<|start_header_id|>") != std::string::npos) {
    t.name_ = "llama3";
  } else if (jinja.find("<<SYS>>") != std::string::npos) {
    t.name_ = "llama2";
  } else if (jinja.find("[INST]") != std::string::npos) {
    t.name_ = "mistral";
  } else if (jinja.find("### Instruction") != std::string::npos) {
    t.name_ = "alpaca";
    t.default_system_ = kAlpacaSystem;
  } else {
    t.name_ = "chatml";
    t.default_system_ = DefaultChatmlSystem(jinja);
  }
  return t;
}

std::string ChatTemplate::Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string system = default_system_;
  bool has_system = !messages.empty() && messages[0].role == "system";
  if (has_system) system = messages[0].content;
  size_t first = has_system ? 1 : 0;
  std::string out;
  if (name_ == "chatml") {
    if (has_system || !system.empty()) out += "<|im_start|>system\n" + system + "<|im_end|>\n";
    for (size_t i = first; i < messages.size(); ++i) {
      out += "<|im_start|>" + messages[i].role + "\n" + messages[i].content + "<|im_end|>\n";
    }
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
  } else if (name_ == "llama3") {
    out += "<|begin_of_text|>";
    if (has_system) out += "<|start_header_id|>system<|end_header_id|>\n\n" + system + "<|eot_id|>";
    for (size_t i = first; i < messages.size(); ++i) {
      out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n" + messages[i].content + "<|eot_id|>";
    }
    if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  } else if (name_ == "llama2" || name_ == "mistral") {
    // Meta's format: the system prompt rides in the first user turn; each exchange is
    // "<s>[INST] user [/INST] assistant </s>". Mistral has no <<SYS>> block.
    bool pending_system = has_system;
    for (size_t i = first; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if (m.role == "user") {
        std::string content = m.content;
        if (pending_system) {
          content = name_ == "llama2" ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content : system + "\n\n" + content;
          pending_system = false;
        }
        out += (name_ == "llama2" || out.empty() ? "<s>" : "") + std::string("[INST] ") + content + " [/INST]";
      } else if (m.role == "assistant") {
        out += (name_ == "llama2" ? " " : "") + m.content + (name_ == "llama2" ? " </s>" : "</s>");
      }
    }
  } else {  // alpaca, as LLaMA-Factory renders it
    if (!system.empty()) out += system + "\n\n";
    for (size_t i = first; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if (m.role == "user") out += "### Instruction:\n" + m.content + "\n\n### Response:\n";
      else if (m.role == "assistant") out += m.content + "\n\n";
    }
  }
  return out;
}

std::vector<std::string> ChatTemplate::StopStrings() const {
  if (name_ == "chatml") return {"<|im_end|>"};
  if (name_ == "llama3") return {"<|eot_id|>"};
  if (name_ == "alpaca") return {"### Instruction:"};
  return {"</s>"};
}

}  // namespace lathe::tokenizer
