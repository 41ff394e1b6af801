// llama.cpp's tokenizer test vectors (test-tokenizer-0): every case of *.gguf.inp must encode to
// exactly the ids of *.gguf.out, with add_special = false and parse_special = false as
// test-tokenizer-0 calls it.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <thread>
#include <sstream>

#include "formats/gguf.h"
#include "test_util.h"
#include "tokenizer/hf_export.h"
#include "tokenizer/tokenizer.h"

namespace lathe::tokenizer {
namespace {

using lathe::testing::SharedPath;

using lathe::testing::ReadAll;
struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<Case> LoadCases(const std::string& vocab) {
  std::string base = SharedPath("models/vocab-llamacpp/ggml-vocab-" + vocab + ".gguf");
  std::string inp = ReadAll(base + ".inp"), out = ReadAll(base + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t pos = 0;
  while (true) {
    size_t next = inp.find(sep, pos);
    if (next == std::string::npos) break;
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<Case> cases;
  std::istringstream lines(out);
  std::string line;
  for (const std::string& t : texts) {
    if (!std::getline(lines, line)) break;
    Case c{t, {}};
    std::istringstream ids(line);
    int32_t id;
    while (ids >> id) c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  EXPECT_EQ(cases.size(), texts.size());
  return cases;
}

// Returns the number of cases that pass; reports each failure.
int RunCases(const Tokenizer& tok, const std::string& vocab) {
  auto cases = LoadCases(vocab);
  int passed = 0;
  for (const Case& c : cases) {
    auto ids = tok.Encode(c.text, /*add_bos=*/false, /*parse_special=*/false);
    if (ids == c.ids) {
      ++passed;
    } else {
      std::string got, want;
      for (int32_t i : ids) got += " " + std::to_string(i);
      for (int32_t i : c.ids) want += " " + std::to_string(i);
      ADD_FAILURE() << vocab << ": '" << c.text << "'\n  got: " << got << "\n want: " << want;
    }
  }
  EXPECT_EQ(passed, static_cast<int>(cases.size())) << vocab;
  std::printf("[vocab %s] %d/%zu cases pass\n", vocab.c_str(), passed, cases.size());
  return passed;
}

std::unique_ptr<Tokenizer> FromGgufPath(const std::string& path) {
  auto g = formats::GgufFile::Open(path);
  EXPECT_TRUE(g.ok()) << g.status().message();
  if (!g.ok()) return nullptr;
  auto t = Tokenizer::FromGguf(**g);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? std::move(t).value() : nullptr;
}

TEST(TokenizerVocab, LlamaSpmGguf) {
  std::string path = SharedPath("models/vocab-llamacpp/ggml-vocab-llama-spm.gguf");
  LATHE_REQUIRE_FILE(path);
  auto tok = FromGgufPath(path);
  ASSERT_TRUE(tok);
  EXPECT_STREQ(tok->kind(), "spm");
  RunCases(*tok, "llama-spm");
}

TEST(TokenizerVocab, LlamaSpmTokenizerModel) {
  std::string path = SharedPath("models/llama2-tokenizer/tokenizer.model");
  LATHE_REQUIRE_FILE(path);
  auto tok = Tokenizer::FromSentencePieceModel(path);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  RunCases(**tok, "llama-spm");
}

TEST(TokenizerVocab, LlamaSpmTokenizerBin) {
  std::string path = SharedPath("models/llama2-tokenizer/tokenizer.bin");
  LATHE_REQUIRE_FILE(path);
  auto tok = Tokenizer::FromLlama2cBin(path, 32000);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  RunCases(**tok, "llama-spm");
}

TEST(TokenizerVocab, Gpt2Gguf) {
  std::string path = SharedPath("models/vocab-llamacpp/ggml-vocab-gpt-2.gguf");
  LATHE_REQUIRE_FILE(path);
  auto tok = FromGgufPath(path);
  ASSERT_TRUE(tok);
  EXPECT_STREQ(tok->kind(), "bpe");
  RunCases(*tok, "gpt-2");
}

// The HF tokenizer files written from a GGUF's byte-level vocabulary (HfTokenizerFilesFromGguf), read back by our
// tokenizer.json loader: the llama.cpp vectors again, the same special tokens, BOS / EOS settings and chat template.
// (tools/ref/check_tokenizer_export.py and tests/e2e/train_test.sh read them with HF's own `tokenizers`.)
std::unique_ptr<Tokenizer> ExportedAndReadBack(const std::string& gguf_path, const lathe::testing::ScopedTempDir& dir) {
  auto g = formats::GgufFile::Open(gguf_path);
  EXPECT_TRUE(g.ok()) << g.status().message();
  if (!g.ok()) return nullptr;
  auto files = HfTokenizerFilesFromGguf(**g);
  EXPECT_TRUE(files.ok()) << files.status().message();
  if (!files.ok()) return nullptr;
  std::vector<std::string> names;
  for (const auto& [name, text] : *files) {
    names.push_back(name);
    std::ofstream(dir.path + "/" + name, std::ios::binary) << text;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}));
  auto t = Tokenizer::FromTokenizerJson(dir.path + "/tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? std::move(t).value() : nullptr;
}

void ExpectSameTokenizer(const Tokenizer& a, const Tokenizer& b, const std::string& text) {
  EXPECT_EQ(a.vocab_size(), b.vocab_size());
  EXPECT_EQ(a.bos_id(), b.bos_id());
  EXPECT_EQ(a.eos_id(), b.eos_id());
  EXPECT_EQ(a.add_bos(), b.add_bos());
  EXPECT_EQ(a.add_eos(), b.add_eos());
  EXPECT_EQ(a.chat_template(), b.chat_template());
  for (bool special : {false, true}) {
    EXPECT_EQ(a.Encode(text, true, special), b.Encode(text, true, special)) << special;
  }
  for (int32_t id = 0; id < a.vocab_size(); ++id) ASSERT_EQ(a.TokenBytes(id), b.TokenBytes(id)) << id;
}

// Exports `path`'s vocabulary, reads it back, runs llama.cpp's `cases` vectors on it (when named) and compares it
// with the GGUF's own tokenizer on `text`.
void CheckExport(const std::string& path, const std::string& cases, const std::string& text) {
  lathe::testing::ScopedTempDir dir;
  auto back = ExportedAndReadBack(path, dir);
  ASSERT_TRUE(back);
  if (!cases.empty()) RunCases(*back, cases);
  auto orig = FromGgufPath(path);
  ASSERT_TRUE(orig);
  ExpectSameTokenizer(*orig, *back, text);
}

TEST(TokenizerVocab, Gpt2GgufAsTokenizerJson) {
  std::string path = SharedPath("models/vocab-llamacpp/ggml-vocab-gpt-2.gguf");
  LATHE_REQUIRE_FILE(path);
  CheckExport(path, "gpt-2", "Hello <|endoftext|> world 123 \n\n  tabs\tand caf\xC3\xA9");
}

TEST(TokenizerVocab, SmolLM2GgufAsTokenizerJson) {
  const std::string path = lathe::testing::SmolLM2Path();
  LATHE_REQUIRE_FILE(path);
  CheckExport(path, "",
              "<|im_start|>user\nWhat is 12345 + 678?<|im_end|>\n" +
                  ReadAll(SharedPath("data/tinystories/validation_100.txt")).substr(0, 4000));
}

// A SentencePiece GGUF vocabulary (no merges in the file): the merges its scores imply (as transformers derives
// them), U+2581 and the space prefix as HF's legacy Llama tokenizer.json writes them, byte fallback: llama.cpp's
// llama-spm vectors from the exported file, and stories260K's 512-piece vocabulary on TinyStories text.
TEST(TokenizerVocab, LlamaSpmGgufAsTokenizerJson) {
  std::string path = SharedPath("models/vocab-llamacpp/ggml-vocab-llama-spm.gguf");
  LATHE_REQUIRE_FILE(path);
  CheckExport(path, "llama-spm", " Hello</s><s> world  123 \n\n\ttabs caf\xC3\xA9 \xF0\x9F\xA6\x99 [INST]");
}

TEST(TokenizerVocab, Stories260KGgufAsTokenizerJson) {
  std::string path = SharedPath("models/stories260K/stories260K.gguf");
  LATHE_REQUIRE_FILE(path);
  CheckExport(path, "", ReadAll(SharedPath("data/tinystories/validation_100.txt")).substr(0, 20000));
}

TEST(TokenizerVocab, LlamaBpeTokenizerJson) {
  std::string path = SharedPath("models/llama3-tokenizer/tokenizer.json");
  LATHE_REQUIRE_FILE(path);
  auto tok = Tokenizer::FromTokenizerJson(path);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  RunCases(**tok, "llama-bpe");
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.bos_id(), 128000);
  EXPECT_EQ(t.eos_id(), 128001);
  EXPECT_TRUE(t.add_bos());
  auto stops = t.stop_ids();
  EXPECT_NE(std::find(stops.begin(), stops.end(), 128009), stops.end());  // <|eot_id|>
  EXPECT_NE(std::find(stops.begin(), stops.end(), 128001), stops.end());
  auto ids = t.Encode("<|start_header_id|>user<|end_header_id|>", true, true);
  EXPECT_EQ(ids.front(), 128000);
  EXPECT_EQ(ids[1], 128006);
  EXPECT_EQ(ids.back(), 128007);
  EXPECT_GT(t.Encode("<|eot_id|>", false, false).size(), 1u);
}

TEST(TokenizerVocab, Qwen2TokenizerJson) {
  std::string path = SharedPath("models/qwen3-tokenizer/tokenizer.json");
  LATHE_REQUIRE_FILE(path);
  auto tok = Tokenizer::FromTokenizerJson(path);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  RunCases(**tok, "qwen2");
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.bos_id(), -1);
  EXPECT_FALSE(t.add_bos());
  EXPECT_EQ(t.Piece(t.eos_id()), "<|im_end|>");
  auto stops = t.stop_ids();
  EXPECT_NE(std::find(stops.begin(), stops.end(), 151643), stops.end());  // <|endoftext|>
  EXPECT_NE(t.chat_template().find("<|im_start|>"), std::string::npos);
  // NFC: a decomposed e + U+0301 encodes like the precomposed U+00E9.
  EXPECT_EQ(t.Encode("cafe\xCC\x81", false), t.Encode("caf\xC3\xA9", false));
  // Non-special added tokens (<think>) are matched even without parse_special.
  EXPECT_EQ(t.Encode("<think>", false, false).size(), 1u);
  // Thread safety: the same texts from several threads give the same ids.
  auto cases = LoadCases("qwen2");
  std::vector<std::vector<int32_t>> want;
  for (const Case& c : cases) want.push_back(t.Encode(c.text, false, false));
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep) {
        for (size_t i = 0; i < cases.size(); ++i) bad += t.Encode(cases[i].text, false, false) != want[i];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace lathe::tokenizer
