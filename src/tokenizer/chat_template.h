// Chat templates by name (chatml, llama3, llama2, mistral, mistral-v3, alpaca, deepseek-r1), chosen from a model's
// jinja template by its markers when it has one, overridable by name. Renders messages to the prompt
// text the model was trained on.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace lathe::tokenizer {

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
  // An assistant turn's reasoning given apart from its content (vLLM's reasoning_content): templates with think
  // blocks (Qwen3's) write it as the jinja writes message.reasoning_content, the others leave it out.
  std::string reasoning = {};
};

class ChatTemplate {
 public:
  // name: chatml | llama3 | llama2 | mistral | mistral-v3 | alpaca | deepseek-r1, or one of LLaMA-Factory's
  // template names that render as chatml, rendered as LLaMA-Factory renders them (its `template:` key):
  // qwen (Qwen2 / 2.5: Qwen's default system prompt), qwen3 (LLaMA-Factory's reasoning template: an empty think
  // block before every reply that has none, see set_enable_thinking), qwen3_nothink, smollm, smollm2 (SmolLM2's
  // default system prompt). Error lists the valid names.
  static Result<ChatTemplate> ByName(const std::string& name);
  // Picks the template matching a jinja chat template's markers; chatml when unrecognized or empty.
  // Keeps a default system prompt written into the jinja text (SmolLM2 has one).
  static ChatTemplate Detect(const std::string& jinja);
  // A command line's template (`--chat-template` / `--template`, as vLLM's --chat-template): a name (ByName), or the
  // path of a jinja file, detected from its markers (Detect). Errors name `flag` and list the names; a file whose
  // markers lathe does not know is refused, not served as chatml.
  static Result<ChatTemplate> FromFlag(const std::string& flag, const std::string& value);

  const std::string& name() const { return name_; }
  // The prompt text for the conversation, exactly as the model's jinja renders it; with
  // add_generation_prompt, ends where the assistant's reply begins. Templates whose jinja writes
  // BOS (llama3: "<|begin_of_text|>", llama2/mistral: "<s>") include it in the text: tokenize
  // with parse_special and without add_bos then (see text_has_bos()). Roles other than
  // system/user/assistant are rendered like user turns by chatml/llama3 and skipped by the rest, except
  // mistral-v3's "tool" ([TOOL_RESULTS]) and "tools" ([AVAILABLE_TOOLS], before the last user turn), and llama3's
  // "environment" (first, "ipython": the system turn opens with "Environment: ipython") and "ipython" (a result).
  // `replies`, when given, receives each assistant reply's [begin, end) in the text: what the model writes after
  // the generation prompt (the content as the template writes it, and the end-of-turn text after it). Consecutive
  // assistant messages a template merges into one turn (mistral-v3) are one reply.
  std::string Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                    std::vector<std::pair<size_t, size_t>>* replies = nullptr) const;
  // True when Apply's text already starts with the BOS token text.
  bool text_has_bos() const {
    return name_ == "llama3" || name_ == "llama2" || name_ == "mistral" || name_ == "mistral-v3" ||
           name_ == "deepseek-r1";
  }
  // Strings that end an assistant turn (e.g. "<|im_end|>"), for stop detection.
  std::vector<std::string> StopStrings() const;
  const std::string& default_system() const { return default_system_; }
  // Qwen3-style: replies after the last user turn carry <think> blocks.
  bool think_blocks() const { return think_blocks_; }
  // The generation prompt opens the think block ("<|im_start|>assistant\n<think>\n": QwQ, Qwen3-Thinking-2507,
  // Qwen3.5): the model's reply starts inside its reasoning.
  bool think_in_prompt() const { return think_in_prompt_; }
  // The jinja reads chat_template_kwargs.enable_thinking (Qwen3, Qwen3.5): false closes an empty think block in the
  // prompt.
  bool thinking_switch() const { return thinking_switch_; }
  // The jinja writes tool calls as XML <function=...> blocks (Qwen3.5; ToolFormat::kQwen3Coder).
  bool xml_tool_calls() const { return xml_tool_calls_; }
  // Llama 3.1-3.3 (a jinja that writes "Cutting Knowledge Date"): every prompt opens with a system turn holding the
  // knowledge cutoff and "Today Date: <date>", and tool results are written as JSON strings. The date is the
  // jinja's fixed "26 Jul 2024", or today's ("07 Dec 2026") for one that asks strftime_now (Llama 3.2), as
  // transformers renders it. Empty for other templates.
  const std::string& date() const { return date_; }
  // LLaMA-Factory's `qwen3` (ReasoningTemplate): every assistant reply without "<think>" / "</think>" in it gets
  // "<think>\n\n</think>\n\n" before it. With thinking on (LLaMA-Factory's enable_thinking, default true) that block
  // is part of the reply (a training target); off, every reply's <think>...</think> blocks are removed and the empty
  // block closes the prompt instead.
  bool reasoning_replies() const { return reasoning_replies_; }
  void set_enable_thinking(bool on) { enable_thinking_ = on; }
  // Pins the date (training pins the jinja's own fallback so a run's tokens do not change from day to day).
  void set_date(const std::string& date) {
    if (!date_.empty()) date_ = date;
  }

 private:
  std::string name_;
  std::string default_system_;
  // Qwen3-style chatml: the final assistant turn (after the last user turn) is written with a
  // <think>...</think> block, and reasoning in earlier turns is dropped.
  bool think_blocks_ = false;
  bool think_in_prompt_ = false;
  bool trims_content_ = false;  // Qwen3.5: every message's text is trimmed
  bool thinking_switch_ = false;
  bool xml_tool_calls_ = false;
  // Qwen3.5: every reply after the last user turn gets a think block (Qwen3: the last one, or one with reasoning).
  bool think_after_query_ = false;
  std::string date_;
  bool reasoning_replies_ = false;  // LLaMA-Factory's qwen3
  bool enable_thinking_ = true;
};

}  // namespace lathe::tokenizer
