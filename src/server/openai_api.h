// The OpenAI wire schema: parses /v1/completions and /v1/chat/completions request bodies into
// plain structs (validating every known field's type and range; unknown fields are ignored, as
// OpenAI does) and builds response / streaming-chunk / error bodies. No HTTP and no engine here.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "serve/sampler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tool_turns.h"

namespace lathe::tokenizer {
class Tokenizer;
}  // namespace lathe::tokenizer

namespace lathe::server {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, if any
  std::string code;
  nlohmann::json ToJson() const;
};

// How a model family writes tool calls (tokenizer/tool_turns.h): kHermes (the default), kLlama3Json, kMistral. Call
// ids are 9 letters and digits for kMistral, as Mistral's models were trained on.
using tokenizer::ToolFormat;
using tokenizer::ToolFormatFor;

struct CompletionRequest {
  bool chat = false;
  std::string model;
  // completions: one or more prompts (a list is a batch: prompt i's n choices get indices
  // i*n .. i*n + n-1, as OpenAI's API), each text or token ids; chat: messages.
  struct Prompt {
    std::string text;
    std::vector<int32_t> ids;
    bool is_ids = false;
  };
  std::vector<Prompt> prompts;
  std::vector<tokenizer::ChatMessage> messages;
  int64_t max_tokens = -1;  // -1: until the context is full (chat) / 16 (completions)
  int n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // completions: logprobs = number of alternatives (0-5), -1 = off; chat: logprobs bool +
  // top_logprobs (0-20) map to the same two fields.
  int logprobs = -1;
  bool echo = false;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int priority = 0;
  serve::SamplingParams sampling;
  // Structured outputs (response_format json_object / json_schema, vLLM's guided_json / guided_choice /
  // guided_grammar): the GBNF grammar the output must follow, empty when unconstrained, and the field it came
  // from (for errors the grammar gives later).
  std::string grammar;
  std::string grammar_param;
  // Tool calling (chat). "auto" (tool_choice absent or "auto"): free text with <tool_call>{"name": ...,
  // "arguments": {...}}</tool_call> blocks, which the grammar above (lazy: sampling.grammar_trigger is
  // "<tool_call>") holds to the tools' shapes from the first tag on; ToolCallReader reads them back. "required"
  // (one call of any tool; the output is {"name": ..., "arguments": {...}}) or a named function (the output is
  // its arguments object): the grammar holds the whole output. `tools_prompt` describes the tools to the model
  // (added to the system message). Empty tool_mode: no tool call.
  std::string tool_mode;   // "" | "auto" | "required" | "named"
  std::string tool_name;   // named: the function
  std::string tools_prompt;
  ToolFormat tool_format = ToolFormat::kHermes;
  // Each tool's parameters schema by the tool's name: kQwen3Coder's calls give their arguments as text, read as the
  // types these declare.
  nlohmann::ordered_json tool_parameters = nlohmann::ordered_json::object();
  // chat_template_kwargs.enable_thinking (Qwen3's switch): false closes an empty think block in the prompt, so the
  // reply is the answer alone.
  bool enable_thinking = true;
  // Where it goes: tokenizer::WithToolsPrompt (PromptMessages).
};

// Whether the body has fields whose key order matters (structured outputs, tools: a schema's members are generated
// in the order it lists them), so the caller should pass ParseCompletionRequest the order-keeping parse.
bool NeedsKeyOrder(const nlohmann::json& body);
// REQUIRES: body is a JSON object (the caller reports unparsable JSON). `ordered` is the same body parsed
// keeping each object's key order, which a JSON schema's `properties` need (generation follows it); without it
// the keys are taken in sorted order.
// `tool_format`: the model's (ToolFormatFor its chat template).
std::optional<ApiError> ParseCompletionRequest(const nlohmann::json& body, bool chat, CompletionRequest* out,
                                               const nlohmann::ordered_json* ordered = nullptr,
                                               ToolFormat tool_format = ToolFormat::kHermes);
// The chat messages the template renders for a parsed request: its messages with the tools described where the
// model family expects them (tools_prompt: in the system message, before the first user text, or as mistral-v3's
// "tools" message).
std::vector<tokenizer::ChatMessage> PromptMessages(const CompletionRequest& r, const tokenizer::ChatTemplate& tmpl);
// The chat prompt's text: PromptMessages rendered with the generation prompt, closed with an empty think block when
// the request turns thinking off (enable_thinking false) on a template with think blocks, as Qwen3's jinja does.
std::string PromptText(const CompletionRequest& r, const tokenizer::ChatTemplate& tmpl);
// Sets sampling.grammar_trigger_token when the trigger is a control token (grammar_trigger_is_token: Mistral's
// [TOOL_CALLS]); an error naming "tools" when the tokenizer has no such single control token.
std::optional<ApiError> ResolveTriggerToken(const tokenizer::Tokenizer& tok, CompletionRequest* r);

struct TokenLogprobInfo {
  std::string token;                                          // the token's text
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;             // alternatives, best first
  bool first_prompt_token = false;  // echo: the prompt's first token has no logprob (JSON null)
};

struct ToolCall {
  // arguments: the JSON text as generated, less the blanks outside strings. A streamed call's first delta has its
  // id and name; the deltas after it (id and name empty) carry the next pieces of its arguments.
  std::string id, name, arguments;
  int index = 0;  // the call's place in its message (streamed deltas name it)
};
// Drops the blanks outside strings from JSON text that arrives in pieces (a call's arguments as they stream).
class JsonMinifier {
 public:
  std::string Push(std::string_view piece);

 private:
  bool in_string_ = false, escaped_ = false;
};
// Appends streamed call deltas to the calls they belong to (a delta without an id extends the call of its index).
void AppendToolCalls(const std::vector<ToolCall>& deltas, std::vector<ToolCall>* calls);

struct Choice {
  int index = 0;
  std::string text;
  std::string reasoning;  // chat with a reasoning parser: the reply's reasoning (message.reasoning_content)
  std::vector<ToolCall> tool_calls;  // chat: the message's tool calls (an empty text is a null content then)
  std::string finish_reason;  // "stop" | "length" | "" (still running, in chunks)
  std::vector<TokenLogprobInfo> logprobs;  // one per generated token when requested (echo: prompt tokens first)
  bool has_logprobs = false;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// Full (non-streaming) response bodies.
nlohmann::json CompletionResponse(const std::string& id, int64_t created, const std::string& model,
                                  const std::vector<Choice>& choices, const Usage& usage, bool chat);
// tool_choice "auto": the tags around each call (kHermes), and the grammar of the text from the first tag on: the call
// (`call_gbnf`, a grammar whose root is one {"name", "arguments"} object), its closing tag, and with `parallel`
// more calls in tags. Whitespace (at most two spaces or newlines) may stand around the JSON and between calls.
// kLlama3Json: the grammar of the whole reply once it starts with "{": calls joined by ";" (one without
// `parallel`). kMistral: what follows the [TOOL_CALLS] token: a JSON list of calls (of one without `parallel`).
inline constexpr char kToolCallOpen[] = "<tool_call>";
inline constexpr char kToolCallClose[] = "</tool_call>";
inline constexpr char kMistralToolCalls[] = "[TOOL_CALLS]";
std::string ToolCallGbnf(const std::string& call_gbnf, bool parallel, ToolFormat format = ToolFormat::kHermes);
// tool_choice "auto" for kQwen3Coder (Qwen3.5): the grammar after the "<tool_call>" trigger, a call of one of `tools`
// (name, parameters schema) as XML, "<function=NAME>" and then each parameter in the order `properties` lists them
// (the required ones always, the others optional): "<parameter=KEY>\nVALUE\n</parameter>\n" and "</function>", and
// the closing tag (more calls in tags with `parallel`). A string parameter's value is its text (any text without
// "</parameter>" or "</function>" in it; an enum or const of strings: one of them), a boolean is true or false (or
// Python's True / False, as the jinja writes them), other values are JSON of their schema (JsonSchemaExpression),
// which XmlParameterValue reads back.
Result<std::string> XmlToolCallGbnf(const std::vector<std::pair<std::string, nlohmann::ordered_json>>& tools,
                                    bool parallel);
// A kQwen3Coder call's parameter text as the JSON value the tool's schema declares, as vLLM's qwen3_coder parser
// converts it: "null" (any case) -> null; a key the schema does not list, or a string type -> the text; integer types
// -> an integer; number types -> a number (an integer when whole); boolean -> text == "true" (any case); other types
// (object, array, a list of types) -> the JSON (or Python literal: True, False, None) it holds, else the text. Text
// that is not of its type stays a string.
nlohmann::ordered_json XmlParameterValue(const std::string& text, const nlohmann::ordered_json& parameters,
                                         const std::string& key);
// tool_choice "required": a JSON list of calls, one or more (exactly one without `parallel`).
std::string RequiredCallsGbnf(const std::string& call_gbnf, bool parallel);

// tool_choice "auto": reads one choice's growing text as content and <tool_call> blocks, as vLLM's "hermes" tool
// parser does. Content streams as it comes, except a tail that may be the start of a tag (and whitespace before
// it, which content before a call does not keep); each call is read once its closing tag arrives. A block that
// is not a call ({"name": string, "arguments": object}) or that the end cuts off is given back as content, so no
// text is lost.
//
// kLlama3Json: a reply whose first non-blank character is "{" is read as calls ({"name", "parameters"} objects
// joined by ";"), any other reply is content and streams as it comes.
//
// kMistral: the text before [TOOL_CALLS] is content; after it, a JSON list of {"name", "arguments"} objects,
// each call read once its object closes. Ids are 9 letters and digits (id_prefix is the seed they are drawn
// from: the same prefix gives the same ids).
// vLLM's reasoning parsers (`--reasoning-parser`): the names lathe knows, "" when `name` is one of them, else an error
// text that lists them.
std::string CheckReasoningParser(const std::string& name);

// With a reasoning parser, a chat request's grammar (structured outputs, tool calls) starts after the reply's think
// block, as vLLM runs structured outputs (SamplingParams::reasoning_start): unless `in_reasoning`
// (--structured-outputs-in-reasoning, vLLM's enable_in_reasoning) or the request turned thinking off.
// `open_in_prompt` (or deepseek_r1): the reply starts inside the block.
void SetReasoningGate(const std::string& reasoning_parser, bool in_reasoning, bool chat, bool open_in_prompt,
                      CompletionRequest* r);
// Whether a prompt's text ends inside an open think block ("<think>" with no "</think>" after it): the template's
// generation prompt opened it (ChatTemplate::think_in_prompt).
bool ReasoningOpenAtEnd(const std::string& prompt_text);

// Splits a chat reply into reasoning and content as it streams, for `--reasoning-parser qwen3` (Qwen3, QwQ and other
// models that think in <think>...</think>): a reply that opens with "<think>" is reasoning up to "</think>" and
// content after it (the text after the tag as written, vLLM's split); a reply that does not is all content; one cut
// off before "</think>" is all reasoning. Text that may still become a tag is held back until the next piece shows
// what it is, so streamed pieces join to exactly what the whole reply gives.
class ReasoningReader {
 public:
  static constexpr std::string_view kOpen = "<think>", kClose = "</think>";
  // `parser`: "qwen3" as above; "deepseek_r1" (vLLM's, for models whose prompt opens the block): the reply is
  // reasoning from its start (a "<think>" there is dropped) up to "</think>". `open_in_prompt`: the prompt ends
  // inside an open think block (ReasoningOpenAtEnd), so the reply starts in its reasoning, as for deepseek_r1.
  explicit ReasoningReader(const std::string& parser = "qwen3", bool open_in_prompt = false)
      : state_(open_in_prompt || parser == "deepseek_r1" ? State::kInBlock : State::kStart) {}
  // `piece`: the reply's next text; `final`: it is the last. Appends what can be given out now.
  void Update(const std::string& piece, bool final, std::string* reasoning, std::string* content);

 private:
  // kInBlock: reasoning from the start, a leading "<think>" dropped.
  enum class State { kStart, kInBlock, kReasoning, kContent } state_;
  std::string held_;
};

class ToolCallReader {
 public:
  // list: the reply is a JSON list of calls from its start, [{...}, ...] (tool_choice "required"), whatever the
  // format (which gives the arguments' key and the ids).
  // `parameters`: each tool's parameters schema by name (CompletionRequest::tool_parameters), for kQwen3Coder.
  explicit ToolCallReader(std::string id_prefix, ToolFormat format = ToolFormat::kHermes, bool list = false,
                          nlohmann::ordered_json parameters = nlohmann::ordered_json::object())
      : id_prefix_(std::move(id_prefix)), format_(format), list_(list), in_calls_(list),
        parameters_(std::move(parameters)) {}
  // `text` is everything generated so far (each call extends the last); `finished`: nothing more will come.
  // Appends what can be sent now. A call goes out once its object has given its name and the start of its
  // arguments ({"name": "...", "arguments": { -- "parameters" for Llama 3), then its arguments as they come (see
  // ToolCall); cut off by the end, it keeps the arguments it has. An object in another key order goes out whole
  // when it closes.
  void Update(const std::string& text, bool finished, std::string* content, std::vector<ToolCall>* calls);
  int calls() const { return n_calls_; }
  // Where the JSON object starting at text[p] ("{") ends (one past its "}"), or npos when it is not complete.
  static size_t ObjectEnd(const std::string& text, size_t p);

 private:
  // kLlama3Json's Update.
  void UpdateJson(const std::string& text, bool finished, std::string* content, std::vector<ToolCall>* calls);
  // kHermes and kQwen3Coder: the content before the first <tool_call> (ContentUpTo); true once the tag has come.
  bool FirstTag(const std::string& text, bool finished, std::string* content);
  // kHermes and kQwen3Coder at the end: a call cut off keeps what it has; text after the calls that is not one is
  // content (blanks after the calls dropped).
  void FinishTagged(const std::string& text, std::string* content);
  // kQwen3Coder's Update: content, then <tool_call> blocks of XML calls. A call goes out at "<function=NAME>" with
  // arguments "{", each parameter once its value has ended (",", the key and the value as compact JSON) and "}" at
  // "</function>". Read leniently, as vLLM's qwen3_coder parser: a value ends at "</parameter>" or at
  // "</function>"; other text inside a call is skipped.
  void UpdateXml(const std::string& text, bool finished, std::string* content, std::vector<ToolCall>* calls);
  // kMistral's Update.
  void UpdateMistral(const std::string& text, bool finished, std::string* content, std::vector<ToolCall>* calls);
  // Reads the calls after sent_: {...} objects, `sep` between them, until `close` (none when '\0').
  void ReadCalls(const std::string& text, char sep, char close, std::vector<ToolCall>* calls);
  // At the end: text[from, end) as content, less leading blanks and (after calls) a `sep`.
  void GiveBack(const std::string& text, char sep, size_t from, std::string* content);
  // Content up to `at` (the end when npos), holding back (unless finished) a tail that may begin `marker` and the
  // whitespace before it.
  void ContentUpTo(const std::string& text, size_t at, bool finished, const std::string& marker, std::string* content);
  std::string NextId();
  // The key of a call's arguments: "parameters" for Llama 3's JSON calls, else "arguments".
  const char* ArgumentsKey() const { return format_ == ToolFormat::kLlama3Json ? "parameters" : "arguments"; }
  bool Emit(const std::string& json_text, std::vector<ToolCall>* calls);  // false: not a call
  // Reads the call object at text[p] ("{"), whole (end: one past its "}") or as far as it has come (end npos).
  enum class CallRead { kMore, kDone, kNotCall };
  CallRead ReadCall(const std::string& text, size_t p, size_t end, std::vector<ToolCall>* calls);
  // Sends the open call's arguments up to text[upto], blanks outside strings dropped.
  void SendArguments(const std::string& text, size_t upto, std::vector<ToolCall>* calls);
  bool call_open_ = false;  // a call's header is sent; its arguments stream from args_sent_
  size_t args_at_ = 0, args_sent_ = 0;
  JsonMinifier args_minifier_;
  std::string id_prefix_;
  ToolFormat format_;
  bool list_ = false;
  bool in_calls_ = false;
  size_t sent_ = 0;     // text[0, sent_) is read (sent as content, or calls)
  bool in_content_ = false;  // kLlama3Json: the reply is not a call
  bool failed_ = false;  // a block was not a call: the rest is content
  bool list_open_ = false, list_closed_ = false;  // kMistral: the calls' "[" and "]"
  size_t marker_end_ = 0;  // kMistral: where the text after [TOOL_CALLS] starts
  int n_calls_ = 0;
  nlohmann::ordered_json parameters_;  // kQwen3Coder: the tools' parameters schemas by name
  std::string xml_name_;        // kQwen3Coder: the open call's function
  nlohmann::ordered_json xml_schema_;  // and its parameters' schema (null when the tool is not listed)
  int xml_params_ = 0;          // its parameters sent so far
  bool xml_after_fn_ = false;   // after a call's "</function>": its "</tool_call>" may follow
};

// One streaming chunk (the `data:` payload). For chat, `first` adds the assistant role delta.
nlohmann::json CompletionChunk(const std::string& id, int64_t created, const std::string& model, const Choice& choice,
                               bool chat, bool first);
// The final usage-only chunk of stream_options.include_usage.
nlohmann::json UsageChunk(const std::string& id, int64_t created, const std::string& model, const Usage& usage,
                          bool chat);
// "data: <json>\n\n"
std::string SseEvent(const nlohmann::json& payload);

}  // namespace lathe::server
