// Training data: LLaMA-Factory's registry and formats on ../shared/data/llamafactory, label
// masks on rendered conversations, its truncation rule, packing, and the seeded split.
#include "train/dataset.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "model/loader.h"
#include "test_util.h"

namespace lathe::train {
namespace {

std::string DataDir() { return lathe::testing::SharedPath("data/llamafactory"); }

std::unique_ptr<tokenizer::Tokenizer> Qwen() {
  auto t = model::LoadTokenizer(lathe::testing::SharedPath("models/qwen3-tokenizer/tokenizer.json"));
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(*t);
}

std::pair<int64_t, int64_t> Len(int64_t a, int64_t b) { return {a, b}; }

TEST(Dataset, InferSeqLenMatchesLlamaFactory) {
  // The cases of LLaMA-Factory's tests/data/processor/test_processor_utils.py.
  EXPECT_EQ(InferSeqLen(3000, 2000, 1000), Len(600, 400));
  EXPECT_EQ(InferSeqLen(2000, 3000, 1000), Len(400, 600));
  EXPECT_EQ(InferSeqLen(1000, 100, 1000), Len(900, 100));
  EXPECT_EQ(InferSeqLen(100, 1000, 1000), Len(100, 900));
  EXPECT_EQ(InferSeqLen(100, 500, 1000), Len(100, 500));
  EXPECT_EQ(InferSeqLen(500, 100, 1000), Len(500, 100));
  EXPECT_EQ(InferSeqLen(10, 10, 1000), Len(10, 10));
}

TEST(Dataset, LoadsRegistryFormats) {
  LATHE_REQUIRE_FILE(DataDir() + "/dataset_info.json");
  auto alpaca = LoadExamples(DataDir(), "alpaca_en_demo", "sft", 0);
  ASSERT_TRUE(alpaca.ok()) << alpaca.status().message();
  EXPECT_EQ(alpaca->size(), 999u);
  const Example& a = (*alpaca)[0];
  ASSERT_EQ(a.messages.size(), 2u);
  EXPECT_EQ(a.messages[0].role, "user");
  EXPECT_EQ(a.messages[1].role, "assistant");
  auto limited = LoadExamples(DataDir(), "identity", "sft", 10);
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->size(), 10u);
  EXPECT_EQ((*limited)[0].messages[0].content, "hi");
  auto glaive = LoadExamples(DataDir(), "glaive_toolcall_en_demo", "sft", 0);
  ASSERT_TRUE(glaive.ok()) << glaive.status().message();
  std::set<std::string> roles;
  for (const auto& ex : *glaive)
    for (const auto& m : ex.messages) roles.insert(m.role);
  EXPECT_EQ(roles, (std::set<std::string>{"user", "assistant", "function_call", "observation"}));
  EXPECT_FALSE((*glaive)[0].tools.empty());
  auto pt = LoadExamples(DataDir(), "c4_demo", "pt", 0);
  ASSERT_TRUE(pt.ok()) << pt.status().message();
  EXPECT_EQ(pt->size(), 300u);
  EXPECT_FALSE((*pt)[0].text.empty());
  auto kto = LoadExamples(DataDir(), "kto_en_demo", "sft", 5);  // messages/role/content tags
  ASSERT_TRUE(kto.ok()) << kto.status().message();
  auto bad = LoadExamples(DataDir(), "alpaca_en_dem", "sft", 0);
  EXPECT_NE(bad.status().message().find("did you mean 'alpaca_en_demo'"), std::string::npos) << bad.status().message();
  auto hub = LoadExamples(DataDir(), "alpaca_gpt4_en", "sft", 0);
  EXPECT_NE(hub.status().message().find("local files only"), std::string::npos) << hub.status().message();
}

TEST(Dataset, TextFilesGiveOneRecordPerLine) {
  const std::string stories = lathe::testing::SharedPath("data/tinystories/validation_100.txt");
  LATHE_REQUIRE_FILE(stories);
  std::string dir = ::testing::TempDir() + "/lathe_txt_registry";
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir + "/dataset_info.json") << "{\"stories\": {\"file_name\": \"" << stories << "\"}}";
    std::ofstream(dir + "/crlf.txt") << "first line\r\n\r\n  \nsecond line\r\n";
  }
  auto pt = LoadExamples(dir, "stories", "pt", 0);
  ASSERT_TRUE(pt.ok()) << pt.status().message();
  // 548 lines in the file, one of them blank: one record per other line, the text exactly the line.
  ASSERT_EQ(pt->size(), 547u);
  EXPECT_EQ((*pt)[1].text, "<|endoftext|>");
  EXPECT_EQ((*pt)[0].text.rfind("u don't have to be scared", 0), 0u);
  std::ofstream(dir + "/dataset_info.json") << "{\"crlf\": {\"file_name\": \"crlf.txt\"}}";
  auto crlf = LoadExamples(dir, "crlf", "pt", 0);
  ASSERT_TRUE(crlf.ok()) << crlf.status().message();
  ASSERT_EQ(crlf->size(), 2u);  // blank and whitespace-only lines dropped, \r stripped
  EXPECT_EQ((*crlf)[0].text, "first line");
  EXPECT_EQ((*crlf)[1].text, "second line");
  // Registry values of the wrong JSON type give an error naming the dataset (json::value threw).
  std::ofstream(dir + "/dataset_info.json") << "{\"crlf\": {\"file_name\": \"crlf.txt\", \"formatting\": 3}}";
  auto bad = LoadExamples(dir, "crlf", "sft", 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("dataset 'crlf' has formatting '3'"), std::string::npos)
      << bad.status().message();
  std::filesystem::remove_all(dir);
}

TEST(Dataset, LabelsCoverExactlyTheAssistantTurns) {
  auto tok = Qwen();
  auto tmpl = tokenizer::ChatTemplate::ByName("chatml").value();
  Example ex;
  ex.source = "test";
  ex.messages = {{"user", "Hi"}, {"assistant", "Hello there."}, {"user", "Bye"}, {"assistant", "Goodbye!"}};
  bool truncated = false;
  auto s = EncodeConversation(ex, *tok, tmpl, 1024, false, false, &truncated);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_FALSE(truncated);
  // The whole sequence is the template's rendering, tokenized.
  EXPECT_EQ(s->input_ids, tok->Encode(tmpl.Apply(ex.messages, false), false, true));
  std::vector<int32_t> learned;
  for (size_t i = 0; i < s->labels.size(); ++i) {
    if (s->labels[i] != kIgnoreIndex) {
      EXPECT_EQ(s->labels[i], s->input_ids[i]);
      learned.push_back(s->labels[i]);
    }
  }
  EXPECT_EQ(tok->Decode(learned), "Hello there.<|im_end|>\nGoodbye!<|im_end|>\n");
  auto last = EncodeConversation(ex, *tok, tmpl, 1024, false, /*mask_history=*/true, &truncated);
  learned.clear();
  for (int32_t l : last->labels) if (l != kIgnoreIndex) learned.push_back(l);
  EXPECT_EQ(tok->Decode(learned), "Goodbye!<|im_end|>\n");
  auto all = EncodeConversation(ex, *tok, tmpl, 1024, /*train_on_prompt=*/true, false, &truncated);
  EXPECT_EQ(all->target_tokens(), (int64_t)all->input_ids.size());
  auto cut = EncodeConversation(ex, *tok, tmpl, 12, false, false, &truncated);
  EXPECT_TRUE(truncated);
  EXPECT_LE(cut->input_ids.size(), 12u);
  EXPECT_GT(cut->target_tokens(), 0);
}

TEST(Dataset, PackingKeepsEveryTokenInItsOwnSegment) {
  std::vector<TokenizedSample> in;
  for (int n : {5, 3, 7, 2, 6, 1}) {
    TokenizedSample s;
    for (int i = 0; i < n; ++i) {
      s.input_ids.push_back(n * 100 + i);
      s.labels.push_back(i == 0 ? kIgnoreIndex : n * 100 + i);
    }
    s.segment_ids.assign(n, 0);
    in.push_back(s);
  }
  auto packed = Pack(in, 8);
  size_t tokens = 0;
  for (const auto& b : packed) {
    EXPECT_LE(b.input_ids.size(), 8u);
    tokens += b.input_ids.size();
    for (size_t i = 1; i < b.input_ids.size(); ++i) {
      bool same_sample = b.input_ids[i] / 100 == b.input_ids[i - 1] / 100;
      EXPECT_EQ(same_sample, b.segment_ids[i] == b.segment_ids[i - 1]);
    }
  }
  EXPECT_EQ(tokens, 24u);
  EXPECT_EQ(packed.size(), 3u);  // 7+1, 6+2, 5+3
}

TEST(Dataset, BuildIsSeededAndSplits) {
  LATHE_REQUIRE_FILE(DataDir() + "/dataset_info.json");
  auto tok = Qwen();
  auto tmpl = tokenizer::ChatTemplate::ByName("chatml").value();
  TrainConfig c;
  c.dataset = {"identity", "alpaca_en_demo"};
  c.dataset_dir = DataDir();
  c.max_samples = 50;
  c.cutoff_len = 256;
  c.val_size = 0.1;
  auto a = BuildDatasets(c, *tok, tmpl);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->examples, 100);
  EXPECT_EQ(a->train.size() + a->eval.size() + a->dropped, 100u);
  EXPECT_EQ(a->eval.size(), 10u);
  auto b = BuildDatasets(c, *tok, tmpl);
  ASSERT_EQ(a->train.size(), b->train.size());
  for (size_t i = 0; i < a->train.size(); ++i) EXPECT_EQ(a->train[i].input_ids, b->train[i].input_ids);
  c.seed = 7;
  auto d = BuildDatasets(c, *tok, tmpl);
  bool differs = false;
  for (size_t i = 0; i < a->train.size(); ++i) differs |= a->train[i].input_ids != d->train[i].input_ids;
  EXPECT_TRUE(differs);
  for (const auto& s : a->train) EXPECT_LE(s.input_ids.size(), 256u);
  c.stage = "pt";
  c.dataset = {"c4_demo"};
  c.val_size = 0;
  auto pt = BuildDatasets(c, *tok, tmpl);
  ASSERT_TRUE(pt.ok()) << pt.status().message();
  for (const auto& s : pt->train) {
    EXPECT_EQ(s.input_ids.size(), 256u);
    EXPECT_EQ(s.labels, s.input_ids);
  }
}

}  // namespace
}  // namespace lathe::train
