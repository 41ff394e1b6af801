// libFuzzer target for the OpenAI request parser (request bodies come from the network): any
// bytes must give a parsed request or an ApiError naming the field — no exception, crash or UB. Structured outputs
// and forced tool calls compile to a grammar, which is parsed too.
#include <cstddef>
#include <cstdint>
#include <string>

#include "serve/grammar.h"
#include "server/json_schema.h"
#include "server/openai_api.h"
#include "tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text((const char*)data, size);
  nlohmann::json body = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return 0;  // the server answers 400 before the parser runs
  static const auto tmpl = lathe::tokenizer::ChatTemplate::ByName("chatml");
  for (bool chat : {false, true}) {
    lathe::server::CompletionRequest r;
    auto err = lathe::server::ParseCompletionRequest(body, chat, &r);
    if (err) {
      (void)err->ToJson().dump();
      continue;
    }
    if (chat && tmpl.ok()) (void)tmpl->Apply(r.messages, true);
    (void)r.sampling.Validate();
    if (!r.grammar.empty()) {  // structured outputs / forced tool calls: the grammar the request compiles to
      auto g = lathe::serve::Grammar::Parse(r.grammar);
      (void)g.ok();
    }
    if (!r.tool_mode.empty()) {  // the body's text read back as a reply with calls
      lathe::server::Choice c;
      lathe::server::ToolCallReader reader("call_0", r.tool_format, /*list=*/r.tool_mode == "required");
      reader.Update(text, /*finished=*/true, &c.text, &c.tool_calls);
      (void)lathe::server::SafeDump(lathe::server::CompletionResponse("id", 0, r.model, {c}, {}, true));  // as the server
    }
    for (const auto& p : r.prompts) {
      lathe::server::Choice c;
      c.text = p.text;
      c.has_logprobs = r.logprobs >= 0;
      (void)lathe::server::SseEvent(lathe::server::CompletionChunk("id", 0, r.model, c, chat, true));
    }
  }
  return 0;
}
