// Tool turns against the model families' own chat templates: tests/golden/fixtures/chat_templates/
// tool_renderings.json (tools/ref/make_tool_chat_fixture.py) holds prompts that transformers' jinja renderer gives
// the published templates (Qwen2.5, Qwen3, ...) for chat requests with tools, calls and results, and whole
// conversations from LLaMA-Factory sharegpt records with function_call / observation turns.
// - Serving: each request parsed as `lathe serve` parses it for that template renders to the same prompt.
// - Training: each sharegpt record, loaded through the dataset registry as `lathe train` loads it, renders to the
//   same conversation, and its tokenized sample covers exactly that text with the labels on the assistant replies.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/loader.h"
#include "server/openai_api.h"
#include "sharegpt_util.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tool_turns.h"
#include "train/dataset.h"

namespace lathe {
namespace {

using ojson = nlohmann::ordered_json;

ojson ToolFixture() {
  std::ifstream f(lathe::testing::SourceDir() + "/tests/golden/fixtures/chat_templates/tool_renderings.json");
  EXPECT_TRUE(f.good());
  return ojson::parse(f);
}

// The template detected from the fixture's jinja, with the date the fixture was rendered with (Llama 3.2).
tokenizer::ChatTemplate FixtureTemplate(const ojson& t) {
  tokenizer::ChatTemplate tmpl = tokenizer::ChatTemplate::Detect(t["jinja"].get<std::string>());
  if (!t["date"].get<std::string>().empty()) tmpl.set_date(t["date"].get<std::string>());
  return tmpl;
}

TEST(ToolChatGolden, RequestsRenderAsTheFamilysJinja) {
  const ojson fixture = ToolFixture();
  ASSERT_GE(fixture["templates"].size(), 2u);
  size_t checked = 0;
  for (const auto& t : fixture["templates"]) {
    const std::string name = t["name"].get<std::string>();
    const tokenizer::ChatTemplate tmpl = FixtureTemplate(t);
    for (const auto& c : t["requests"]) {
      const std::string what = name + "/" + c["name"].get<std::string>();
      const ojson& body = c["body"];
      server::CompletionRequest r;
      auto err = server::ParseCompletionRequest(nlohmann::json::parse(body.dump()), /*chat=*/true, &r, &body,
                                                tokenizer::ToolFormatFor(tmpl));
      ASSERT_FALSE(err) << what << ": " << err->message;
      EXPECT_EQ(server::PromptText(r, tmpl), c["text"].get<std::string>()) << what;
      ++checked;
    }
  }
  EXPECT_GE(checked, 35u);
}

TEST(ToolChatGolden, SharegptToolDataRendersAsTheFamilysJinja) {
  const ojson fixture = ToolFixture();
  size_t checked = 0;
  for (const auto& t : fixture["templates"]) {
    const std::string name = t["name"].get<std::string>();
    if (t["training"].empty()) continue;  // a template held to its requests only (no tool format of ours)
    const std::string family = t["family"].get<std::string>();
    const bool hermes = family == "hermes", xml = family == "qwen3_coder";  // else llama3
    const std::string tok_path = lathe::testing::SharedPath(
        hermes || xml ? "models/qwen3-tokenizer/tokenizer.json" : "models/llama3-tokenizer/tokenizer.json");
    LATHE_REQUIRE_FILE(tok_path);
    auto tok = model::LoadTokenizer(tok_path);
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    const tokenizer::ChatTemplate tmpl = FixtureTemplate(t);
    // The records as a registered sharegpt dataset, read by the loader `lathe train` uses.
    lathe::testing::ScopedTempDir dir;
    ojson records = ojson::array();
    for (const auto& c : t["training"]) records.push_back(c["record"]);
    ASSERT_FALSE(records.empty());
    auto examples = lathe::testing::LoadSharegptRecords(dir.path, records);
    ASSERT_TRUE(examples.ok()) << examples.status().message();
    ASSERT_EQ(examples->size(), records.size());
    for (size_t i = 0; i < records.size(); ++i) {
      const auto& c = t["training"][i];
      const std::string what = name + "/" + c["name"].get<std::string>();
      const std::string want = c["text"].get<std::string>();
      auto messages = train::ChatMessages((*examples)[i], tmpl);
      ASSERT_TRUE(messages.ok()) << what << ": " << messages.status().message();
      std::vector<std::pair<size_t, size_t>> replies;
      EXPECT_EQ(tmpl.Apply(*messages, /*add_generation_prompt=*/false, &replies), want) << what;
      // The sample is that text, tokenized turn by turn; the labels are the assistant replies (content and the
      // end-of-turn text), nothing else.
      bool truncated = false;
      auto s = train::EncodeConversation((*examples)[i], **tok, tmpl, 4096, false, false, &truncated);
      ASSERT_TRUE(s.ok()) << what << ": " << s.status().message();
      EXPECT_FALSE(truncated);
      // (Decoding leaves out the BOS token that Llama's text opens with.)
      std::string decoded = (*tok)->Decode(s->input_ids);
      if (tmpl.text_has_bos()) {
        ASSERT_FALSE(s->input_ids.empty());
        EXPECT_EQ(s->input_ids[0], (*tok)->bos_id()) << what;
        decoded = "<|begin_of_text|>" + decoded;
      }
      EXPECT_EQ(decoded, want) << what;
      std::vector<int32_t> labelled;
      for (int32_t l : s->labels)
        if (l != train::kIgnoreIndex) labelled.push_back(l);
      std::string replies_text;
      for (const auto& [b, e] : replies) replies_text += want.substr(b, e - b);
      EXPECT_EQ((*tok)->Decode(labelled), replies_text) << what;
      // Calls are targets, results are not.
      EXPECT_NE(replies_text.find(hermes ? "<tool_call>\n{\"name\": " : xml ? "<tool_call>\n<function=" : "{\"name\": "),
                std::string::npos) << what;
      EXPECT_EQ(replies_text.find(hermes || xml ? "<tool_response>" : "ipython"), std::string::npos) << what;
      ++checked;
    }
  }
  EXPECT_GE(checked, 13u);
}

// Bad tool data names the record and what was expected, before any work.
TEST(ToolChatGolden, BadToolDataIsRefusedNamingTheRecord) {
  lathe::testing::ScopedTempDir dir;
  std::ofstream(dir.path + "/dataset_info.json")
      << R"({"bad": {"file_name": "bad.json", "formatting": "sharegpt", "columns": {"messages": "conversations",
            "tools": "tools"}}})";
  auto load = [&](const std::string& record) {
    std::ofstream(dir.path + "/bad.json") << "[" + record + "]";
    auto r = train::LoadExamples(dir.path, "bad", "sft", 0);
    return r.ok() ? std::string() : r.status().message();
  };
  const std::string turns = R"("conversations": [{"from": "human", "value": "hi"}, )";
  std::string e = load("{" + turns + R"j({"from": "function_call", "value": "get_weather(city=Paris)"}]})j");
  EXPECT_NE(e.find("bad.json record 0: a 'function_call' message must be JSON"), std::string::npos) << e;
  e = load("{" + turns + R"({"from": "function_call", "value": "{\"arguments\": {}}"}]})");
  EXPECT_NE(e.find("must be JSON: {\"name\""), std::string::npos) << e;
  e = load("{" + turns + R"({"from": "gpt", "value": "x"}], "tools": "[{\"description\": \"no name\"}]"})");
  EXPECT_NE(e.find("field 'tools' must be a JSON list of tools"), std::string::npos) << e;
  EXPECT_NE(e.find("tool 0 has no \"name\""), std::string::npos) << e;
  e = load("{" + turns + R"({"from": "gpt", "value": "x"}], "tools": "not json"})");
  EXPECT_NE(e.find("record 0: field 'tools'"), std::string::npos) << e;
  e = load("{" + turns + R"({"from": "gpt", "value": "x"}], "tools": "[{\"name\": \"f\", \"parameters\": 3}]"})");
  EXPECT_NE(e.find("tool 'f' has \"parameters\" that are not a JSON schema object"), std::string::npos) << e;
  EXPECT_TRUE(load("{" + turns + R"({"from": "gpt", "value": "x"}], "tools": ""})").empty());  // empty: no tools
}

}  // namespace
}  // namespace lathe
