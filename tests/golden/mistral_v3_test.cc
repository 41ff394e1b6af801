// Mistral's v3 instruct format against mistral_common (Mistral's own request encoder): each OpenAI chat request of
// tests/golden/fixtures/mistral_v3/cases.json (tools/ref/make_mistral_fixture.py), parsed as `lathe serve` parses it
// for a mistral-v3 model (ToolFormat::kMistral: tools, calls and results included), rendered by the mistral-v3 chat
// template and tokenized with Mistral-7B-Instruct-v0.3's tokenizer.model, gives the token ids mistral_common gives.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "server/openai_api.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

TEST(MistralV3Golden, RequestsTokenizeAsMistralCommonEncodesThem) {
  const std::string path = lathe::testing::MistralV3TokenizerPath();
  LATHE_REQUIRE_FILE(path);
  auto tok = tokenizer::Tokenizer::FromSentencePieceModel(path);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  auto tmpl = tokenizer::ChatTemplate::ByName("mistral-v3");
  ASSERT_TRUE(tmpl.ok());
  std::ifstream f(lathe::testing::SourceDir() + "/tests/golden/fixtures/mistral_v3/cases.json");
  ASSERT_TRUE(f.good());
  const auto fixture = nlohmann::ordered_json::parse(f);
  ASSERT_GE(fixture["cases"].size(), 10u);
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["name"].get<std::string>();
    const nlohmann::ordered_json& body = c["request"];
    server::CompletionRequest r;
    auto err = server::ParseCompletionRequest(nlohmann::json::parse(body.dump()), /*chat=*/true, &r, &body,
                                              server::ToolFormatFor(tmpl->name()));
    ASSERT_FALSE(err) << name << ": " << err->message;
    const std::string text = tmpl->Apply(server::PromptMessages(r, *tmpl), /*add_generation_prompt=*/true);
    ASSERT_TRUE(tmpl->text_has_bos());
    const std::vector<int32_t> ids = (*tok)->Encode(text, /*add_bos=*/false, /*parse_special=*/true);
    const std::vector<int32_t> want = c["tokens"].get<std::vector<int32_t>>();
    EXPECT_EQ(ids, want) << name << "\nours:   " << text << "\ntheirs: " << c["text"].get<std::string>();
  }
}

// The grammar of tool_choice "auto" starts at the [TOOL_CALLS] control token: its id in the v3 vocabulary is 5.
// A tokenizer without it (SmolLM2's) refuses the request, naming "tools".
TEST(MistralV3Golden, ToolCallsTriggerIsTheControlToken) {
  const std::string path = lathe::testing::MistralV3TokenizerPath();
  LATHE_REQUIRE_FILE(path);
  auto tok = tokenizer::Tokenizer::FromSentencePieceModel(path);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const auto body = nlohmann::json::parse(R"({"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type":
      "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}]})");
  server::CompletionRequest r;
  ASSERT_FALSE(server::ParseCompletionRequest(body, true, &r, nullptr, server::ToolFormat::kMistral));
  ASSERT_FALSE(server::ResolveTriggerToken(**tok, &r));
  EXPECT_EQ(r.sampling.grammar_trigger_token, 5);
  // The llama2 tokenizer has no [TOOL_CALLS].
  auto llama = tokenizer::Tokenizer::FromSentencePieceModel(lathe::testing::SharedPath("models/llama2-tokenizer/tokenizer.model"));
  ASSERT_TRUE(llama.ok()) << llama.status().message();
  server::CompletionRequest r2;
  ASSERT_FALSE(server::ParseCompletionRequest(body, true, &r2, nullptr, server::ToolFormat::kMistral));
  auto e = server::ResolveTriggerToken(**llama, &r2);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "tools");
}

// A v3 model's jinja (it lists [AVAILABLE_TOOLS]) is detected as mistral-v3, which gives kMistral tool calls; the
// v0.1 template stays "mistral".
TEST(MistralV3Golden, DetectedFromTheJinja) {
  EXPECT_EQ(tokenizer::ChatTemplate::Detect("{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]"
                                            "{% endfor %}")
                .name(),
            "mistral");
  const auto v3 = tokenizer::ChatTemplate::Detect(
      "{%- if tools %}[AVAILABLE_TOOLS] {{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST] {{ m.content }}[/INST]");
  EXPECT_EQ(v3.name(), "mistral-v3");
  EXPECT_EQ(server::ToolFormatFor(v3.name()), server::ToolFormat::kMistral);
}

}  // namespace
}  // namespace lathe
