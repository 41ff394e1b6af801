// LLaMA-Factory's `template:` names as LLaMA-Factory encodes them: for each case of
// tests/golden/fixtures/llamafactory_templates.json (tools/ref/make_llamafactory_template_fixture.py: LLaMA-Factory
// 0.9.5's SupervisedDatasetProcessor on sharegpt records), lathe's sharegpt loader and train::EncodeConversation
// with ChatTemplate::ByName(template) give the same input ids and labels.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "model/loader.h"
#include "sharegpt_util.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "train/dataset.h"

namespace lathe {
namespace {

TEST(LlamaFactoryTemplates, SharegptRecordsEncodeAsLlamaFactoryDoes) {
  std::ifstream in(lathe::testing::SourceDir() + "/tests/golden/fixtures/llamafactory_templates.json");
  ASSERT_TRUE(in) << "fixture missing";
  const nlohmann::ordered_json fixture = nlohmann::ordered_json::parse(in);
  size_t checked = 0;
  std::map<std::string, std::unique_ptr<tokenizer::Tokenizer>> toks;  // each loaded once (Qwen's: ~1 s)
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["template"].get<std::string>();
    const bool thinking = c["enable_thinking"].get<bool>();
    const std::string what = name + (thinking ? "" : " (enable_thinking false)") + ": " + c["text"].dump();
    const std::string tok_path = lathe::testing::SharedPath(c["tokenizer"].get<std::string>());
    LATHE_REQUIRE_FILE(tok_path);
    std::unique_ptr<tokenizer::Tokenizer>& tok = toks[tok_path];
    if (!tok) {
      auto loaded = model::LoadTokenizer(tok_path);
      ASSERT_TRUE(loaded.ok()) << loaded.status().message();
      tok = std::move(*loaded);
    }
    auto tmpl = tokenizer::ChatTemplate::ByName(name);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status().message();
    tmpl->set_enable_thinking(thinking);
    lathe::testing::ScopedTempDir dir;
    auto examples = lathe::testing::LoadSharegptRecords(dir.path, nlohmann::ordered_json::array({c["record"]}));
    ASSERT_TRUE(examples.ok()) << examples.status().message();
    ASSERT_EQ(examples->size(), 1u);
    bool truncated = false;
    auto s = train::EncodeConversation((*examples)[0], *tok, *tmpl, 4096, false, false, &truncated);
    ASSERT_TRUE(s.ok()) << what << ": " << s.status().message();
    EXPECT_FALSE(truncated);
    EXPECT_EQ(s->input_ids, c["input_ids"].get<std::vector<int32_t>>()) << what;
    EXPECT_EQ(s->labels, c["labels"].get<std::vector<int32_t>>()) << what;
    ++checked;
  }
  EXPECT_EQ(checked, 24u);
}

// Names lathe does not render are refused with the list, LLaMA-Factory's included.
TEST(LlamaFactoryTemplates, UnknownNameListsTheNames) {
  auto t = tokenizer::ChatTemplate::ByName("qwen2_vl");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("qwen3_nothink"), std::string::npos) << t.status().message();
}

}  // namespace
}  // namespace lathe
