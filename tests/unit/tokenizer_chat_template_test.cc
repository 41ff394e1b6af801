// ChatTemplate against transformers' jinja renderings (fixture from
// tools/ref/gen_chat_template_fixtures.py): detection by markers, default system prompt, text.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "formats/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lathe::tokenizer {
namespace {

TEST(ChatTemplate, MatchesTransformersRenderings) {
  std::ifstream f(lathe::testing::SourceDir() + "/tests/golden/fixtures/chat_templates/renderings.json");
  ASSERT_TRUE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str());
  int total = 0, passed = 0;
  for (const auto& t : j["templates"]) {
    ChatTemplate ct = ChatTemplate::Detect(t["jinja"].get<std::string>());
    EXPECT_EQ(ct.name(), t["family"].get<std::string>()) << t["name"];
    for (const auto& c : t["cases"]) {
      std::vector<ChatMessage> msgs;
      for (const auto& m : c["messages"]) msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
      std::string got = ct.Apply(msgs, c["add_generation_prompt"].get<bool>());
      std::string want = c["text"].get<std::string>();
      EXPECT_EQ(got, want) << t["name"] << " case " << total;
      ++total;
      passed += got == want;
    }
  }
  std::printf("[chat templates] %d/%d renderings match transformers\n", passed, total);
  EXPECT_GE(total, 30);
}

TEST(ChatTemplate, SmolLM2DefaultSystemFromGguf) {
  std::string path = lathe::testing::SmolLM2Path();
  LATHE_REQUIRE_FILE(path);
  auto g = formats::GgufFile::Open(path);
  ASSERT_TRUE(g.ok());
  auto tok = Tokenizer::FromGguf(**g);
  ASSERT_TRUE(tok.ok());
  ChatTemplate ct = ChatTemplate::Detect(tok.value()->chat_template());
  EXPECT_EQ(ct.name(), "chatml");
  EXPECT_EQ(ct.default_system(), "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  std::string text = ct.Apply({{"user", "Hi"}}, true);
  EXPECT_EQ(text,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // The markup tokenizes to single special ids.
  auto ids = tok.value()->Encode(text, false, true);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);
  EXPECT_FALSE(ct.text_has_bos());
}

TEST(ChatTemplate, ByNameAndStops) {
  for (const char* n : {"chatml", "llama3", "llama2", "mistral", "alpaca"}) {
    auto t = ChatTemplate::ByName(n);
    ASSERT_TRUE(t.ok()) << n;
    EXPECT_EQ(t->name(), n);
    EXPECT_FALSE(t->StopStrings().empty());
  }
  auto bad = ChatTemplate::ByName("vicuna");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("chatml, llama3"), std::string::npos);
  EXPECT_EQ(ChatTemplate::Detect("").name(), "chatml");
  EXPECT_EQ(ChatTemplate::ByName("llama3")->StopStrings()[0], "<|eot_id|>");
  EXPECT_TRUE(ChatTemplate::ByName("llama3")->text_has_bos());
  // DeepSeek-R1's distills: the sentence tokens end a reply, and the text opens with BOS.
  auto r1 = ChatTemplate::ByName("deepseek-r1");
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->StopStrings(), std::vector<std::string>{"<\uFF5Cend\u2581of\u2581sentence\uFF5C>"});
  EXPECT_TRUE(r1->text_has_bos());
  EXPECT_NE(bad.status().message().find("deepseek-r1"), std::string::npos);
}

// --chat-template / --template: a name, or a jinja file detected from its markers (Qwen3.5's: chatml with XML tool
// calls and the think block opened in the prompt); a file lathe cannot render, or neither, is refused by the flag.
TEST(ChatTemplate, FromFlagTakesANameOrAJinjaFile) {
  auto named = ChatTemplate::FromFlag("--chat-template", "llama3");
  ASSERT_TRUE(named.ok()) << named.status().message();
  EXPECT_EQ(named->name(), "llama3");
  lathe::testing::ScopedTempDir dir;
  const std::string jinja = dir.path + "/t.jinja";
  std::ofstream(jinja) << "{%- for message in messages %}{{- '<|im_start|>' + message.role }}{%- endfor %}"
                          "{%- if tools %}<tool_call>\\n<function=x>\\n<parameter=y>{%- endif %}"
                          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}"
                          "{%- set r = message.reasoning_content %}{%- endif %}";
  auto file = ChatTemplate::FromFlag("--chat-template", jinja);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->name(), "chatml");
  EXPECT_TRUE(file->xml_tool_calls());
  EXPECT_TRUE(file->think_in_prompt());
  const std::string other = dir.path + "/other.jinja";
  std::ofstream(other) << "{{ bos_token }}<|User|>{{ messages[0].content }}";
  auto e = ChatTemplate::FromFlag("--template", other);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--template " + other + ": a jinja chat template in a format lathe does not"),
            std::string::npos) << e.status().message();
  e = ChatTemplate::FromFlag("--chat-template", "chatmlx");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--chat-template 'chatmlx': neither a chat template name (chatml, llama3"),
            std::string::npos) << e.status().message();
}

}  // namespace
}  // namespace lathe::tokenizer
