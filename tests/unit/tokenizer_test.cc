// Tokenizer behaviour on real files: stories260K's three tokenizer files agree with each other
// and with sentencepiece; SmolLM2's GGUF matches transformers (fixture from
// tools/ref/gen_tokenizer_fixtures.py); decode round-trips; streaming decode of split UTF-8.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "formats/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lathe::tokenizer {
namespace {

using lathe::testing::SharedPath;

using lathe::testing::ReadAll;
std::unique_ptr<Tokenizer> LoadGguf(const std::string& path) {
  auto g = formats::GgufFile::Open(path);
  EXPECT_TRUE(g.ok()) << g.status().message();
  if (!g.ok()) return nullptr;
  auto t = Tokenizer::FromGguf(**g);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? std::move(t).value() : nullptr;
}

std::string Strip(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n\v\f");
  if (b == std::string::npos) return {};
  size_t e = s.find_last_not_of(" \t\r\n\v\f");
  return s.substr(b, e - b + 1);
}

// The 100 validation stories, split as the reference did (on <|endoftext|>, stripped).
std::vector<std::string> ValidationStories() {
  std::string text = ReadAll(SharedPath("data/tinystories/validation_100.txt"));
  std::vector<std::string> stories;
  size_t pos = 0;
  const std::string sep = "<|endoftext|>";
  while (pos <= text.size()) {
    size_t next = text.find(sep, pos);
    std::string s = Strip(text.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
    if (!s.empty()) stories.push_back(s);
    if (next == std::string::npos) break;
    pos = next + sep.size();
  }
  return stories;
}

TEST(Tokenizer, Stories260KFilesAgreeWithSentencePiece) {
  std::string model = SharedPath("models/stories260K/tok512.model");
  std::string bin = SharedPath("models/stories260K/tok512.bin");
  std::string gguf = SharedPath("models/stories260K/stories260K.gguf");
  std::string ref = SharedPath("models/stories260K/reference/stories260K_reference.json");
  LATHE_REQUIRE_FILE(model);
  LATHE_REQUIRE_FILE(bin);
  LATHE_REQUIRE_FILE(gguf);
  LATHE_REQUIRE_FILE(ref);
  auto a = Tokenizer::FromSentencePieceModel(model);
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = Tokenizer::FromLlama2cBin(bin, 512);
  ASSERT_TRUE(b.ok()) << b.status().message();
  auto c = LoadGguf(gguf);
  ASSERT_TRUE(c);
  std::vector<const Tokenizer*> toks = {a->get(), b->get(), c.get()};
  for (const Tokenizer* t : toks) {
    EXPECT_EQ(t->vocab_size(), 512);
    EXPECT_EQ(t->bos_id(), 1);
    EXPECT_EQ(t->eos_id(), 2);
    EXPECT_TRUE(t->add_bos());
    EXPECT_STREQ(t->kind(), "spm");
  }
  for (int32_t id = 0; id < 512; ++id) {
    EXPECT_EQ(a.value()->Piece(id), c->Piece(id)) << id;
    EXPECT_EQ(a.value()->TokenBytes(id), b.value()->TokenBytes(id)) << id;
  }
  // Prompts from the numpy reference (ids made by sentencepiece, with BOS).
  nlohmann::json j = nlohmann::json::parse(ReadAll(ref));
  for (const auto& p : j["greedy_prompts"]) {
    auto want = p["prompt_ids_with_bos"].get<std::vector<int32_t>>();
    for (const Tokenizer* t : toks) EXPECT_EQ(t->Encode(p["prompt"].get<std::string>(), true), want);
  }
  // Greedy continuation decodes to the reference text.
  auto greedy = j["greedy_from_bos"]["tokens"].get<std::vector<int32_t>>();
  std::string text = j["greedy_from_bos"]["text"].get<std::string>();
  for (const Tokenizer* t : toks) EXPECT_EQ(t->Decode(greedy), text);
  // 100 stories: sentencepiece gives 39244 tokens in all (without BOS). tok512.model asks for
  // remove_extra_whitespaces (runs of spaces collapse); the .bin and .gguf cannot say so, so
  // they agree on the text once it is collapsed.
  size_t total = 0;
  int mismatches = 0;
  for (const std::string& s : ValidationStories()) {
    std::string collapsed;
    for (char ch : s) {
      if (ch == ' ' && !collapsed.empty() && collapsed.back() == ' ') continue;
      collapsed.push_back(ch);
    }
    auto ia = toks[0]->Encode(s, false);
    mismatches += ia != toks[1]->Encode(collapsed, false);
    mismatches += ia != toks[2]->Encode(collapsed, false);
    EXPECT_TRUE(toks[0]->Decode(ia) == collapsed);
    total += ia.size();
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(total, 39244u);
}

TEST(Tokenizer, Llama2ModelAndBinAgree) {
  std::string model = SharedPath("models/llama2-tokenizer/tokenizer.model");
  std::string bin = SharedPath("models/llama2-tokenizer/tokenizer.bin");
  LATHE_REQUIRE_FILE(model);
  LATHE_REQUIRE_FILE(bin);
  auto a = Tokenizer::FromSentencePieceModel(model);
  auto b = Tokenizer::FromLlama2cBin(bin, 32000);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int32_t id = 0; id < 32000; ++id) ASSERT_EQ(a.value()->Piece(id), b.value()->Piece(id)) << id;
  for (const char* s : {"Hello world", "  two  spaces\n\nand\ttabs", "Ünïcödé 🦙 中文", "<s>not special</s>"}) {
    EXPECT_EQ(a.value()->Encode(s, true, false), b.value()->Encode(s, true, false)) << s;
    EXPECT_EQ(a.value()->Decode(a.value()->Encode(s, true, false)), s);
  }
  // With parse_special, "<s>" is BOS; the text after it gets the dummy space prefix (llama.cpp).
  auto ids = a.value()->Encode("<s>Hi", false, true);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(a.value()->Encode("Hi", false), std::vector<int32_t>(ids.begin() + 1, ids.end()));
  EXPECT_EQ(a.value()->stop_ids(), std::vector<int32_t>{2});
}

TEST(Tokenizer, SmolLM2GgufMatchesTransformers) {
  std::string path = lathe::testing::SmolLM2Path();
  LATHE_REQUIRE_FILE(path);
  auto tok = LoadGguf(path);
  ASSERT_TRUE(tok);
  EXPECT_STREQ(tok->kind(), "bpe");
  EXPECT_EQ(tok->vocab_size(), 49152);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_NE(tok->chat_template().find("<|im_start|>"), std::string::npos);
  auto stops = tok->stop_ids();
  EXPECT_NE(std::find(stops.begin(), stops.end(), 2), stops.end());  // <|im_end|>
  EXPECT_NE(std::find(stops.begin(), stops.end(), 0), stops.end());  // <|endoftext|>
  nlohmann::json j =
      nlohmann::json::parse(ReadAll(lathe::testing::SourceDir() + "/tests/golden/fixtures/tokenizer/smollm2_gguf.json"));
  int passed = 0;
  for (const auto& c : j["cases"]) {
    std::string text = c["text"].get<std::string>();
    auto want = c["ids"].get<std::vector<int32_t>>();
    auto got = tok->Encode(text, /*add_bos=*/true, /*parse_special=*/true);
    EXPECT_EQ(got, want) << text;
    EXPECT_EQ(tok->Decode(got), c["decoded"].get<std::string>()) << text;
    passed += got == want;
  }
  std::printf("[smollm2 gguf] %d/%zu cases match transformers\n", passed, j["cases"].size());
  // Without parse_special, chat markup is ordinary text.
  auto plain = tok->Encode("<|im_start|>", false, false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(tok->Decode(plain), "<|im_start|>");
  EXPECT_EQ(tok->Encode("<|im_start|>", false, true), std::vector<int32_t>{1});
}

TEST(Tokenizer, DecodeRoundTripsVocabTestInputs) {
  std::string inp = ReadAll(SharedPath("models/vocab-llamacpp/ggml-vocab-gpt-2.gguf.inp"));
  std::string gpt2 = SharedPath("models/vocab-llamacpp/ggml-vocab-gpt-2.gguf");
  std::string spm = SharedPath("models/vocab-llamacpp/ggml-vocab-llama-spm.gguf");
  std::string qwen = SharedPath("models/qwen3-tokenizer/tokenizer.json");
  LATHE_REQUIRE_FILE(gpt2);
  LATHE_REQUIRE_FILE(spm);
  LATHE_REQUIRE_FILE(qwen);
  auto t1 = LoadGguf(gpt2);
  auto t2 = LoadGguf(spm);
  auto t3 = Tokenizer::FromTokenizerJson(qwen);
  ASSERT_TRUE(t1 && t2 && t3.ok());
  std::vector<const Tokenizer*> toks = {t1.get(), t2.get(), t3->get()};
  const std::string sep = "\n__ggml_vocab_test__\n";
  size_t pos = 0;
  while (true) {
    size_t next = inp.find(sep, pos);
    if (next == std::string::npos) break;
    std::string text = inp.substr(pos, next - pos);
    pos = next + sep.size();
    for (const Tokenizer* t : toks) {
      auto ids = t->Encode(text, true, false);
      EXPECT_EQ(t->Decode(ids), text) << t->kind() << ": " << text;
      // Streaming gives the same text, whatever the token boundaries.
      StreamDecoder sd(*t);
      std::string streamed;
      for (int32_t id : ids) streamed += sd.Push(id);
      streamed += sd.Flush();
      EXPECT_EQ(streamed, text) << t->kind() << ": " << text;
    }
  }
}

TEST(Tokenizer, StreamDecoderHoldsSplitCharacters) {
  std::string spm = SharedPath("models/llama2-tokenizer/tokenizer.model");
  LATHE_REQUIRE_FILE(spm);
  auto t = Tokenizer::FromSentencePieceModel(spm);
  ASSERT_TRUE(t.ok());
  const Tokenizer& tok = **t;
  // U+1F999 has no piece in Llama-2: byte fallback gives four byte tokens.
  auto ids = tok.Encode("\xF0\x9F\xA6\x99", true, false);
  ASSERT_EQ(ids.size(), 6u);  // BOS, "▁", 4 bytes
  StreamDecoder sd(tok);
  EXPECT_EQ(sd.Push(ids[0]), "");  // BOS
  EXPECT_EQ(sd.Push(ids[1]), "");  // the dummy-prefix space after BOS is stripped
  EXPECT_EQ(sd.Push(ids[2]), "");
  EXPECT_EQ(sd.Push(ids[3]), "");
  EXPECT_EQ(sd.Push(ids[4]), "");
  EXPECT_EQ(sd.Push(ids[5]), "\xF0\x9F\xA6\x99");
  EXPECT_EQ(sd.Flush(), "");
  // Without a BOS (continuing after a prompt) the leading space is kept.
  StreamDecoder cont(tok);
  auto world = tok.Encode("Hello world", false, false);
  EXPECT_EQ(cont.Push(world[0]), " Hello");
  // An incomplete sequence at the end flushes as U+FFFD; a stray byte is replaced at once.
  StreamDecoder bad(tok);
  EXPECT_EQ(bad.Push(ids[2]), "");
  EXPECT_EQ(bad.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(bad.Push(ids[3]), "\xEF\xBF\xBD");  // 0x9F alone is a continuation byte
}

TEST(Tokenizer, EncodesLongTextQuickly) {
  std::string path = SharedPath("models/qwen3-tokenizer/tokenizer.json");
  LATHE_REQUIRE_FILE(path);
  auto t = Tokenizer::FromTokenizerJson(path);
  ASSERT_TRUE(t.ok());
  std::string text = ReadAll(SharedPath("data/tinystories/validation_100.txt"));
  std::string big;
  while (big.size() < (4u << 20)) big += text;
  auto start = std::chrono::steady_clock::now();
  auto ids = t.value()->Encode(big, false);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[bpe speed] %.1f MB/s (%zu tokens)\n", big.size() / s / 1e6, ids.size());
  EXPECT_TRUE(t.value()->Decode(ids) == big);
  EXPECT_LT(s, 20.0);
  // SentencePiece on one long line (no pre-tokenizer: the whole text is one merge problem).
  std::string spm_path = SharedPath("models/llama2-tokenizer/tokenizer.model");
  auto sp = Tokenizer::FromSentencePieceModel(spm_path);
  ASSERT_TRUE(sp.ok());
  start = std::chrono::steady_clock::now();
  auto sids = sp.value()->Encode(big, false);
  s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[spm speed] %.1f MB/s (%zu tokens)\n", big.size() / s / 1e6, sids.size());
  EXPECT_TRUE(sp.value()->Decode(sids) == big);
  EXPECT_LT(s, 20.0);
}

}  // namespace
}  // namespace lathe::tokenizer

namespace lathe::tokenizer {
namespace {

// An HF tokenizer.json of a SentencePiece vocab (BPE over code points, byte_fallback, Metaspace
// with prepend_scheme "first"), as transformers converts stories260K's vocab.
TEST(Tokenizer, SentencePieceStyleTokenizerJsonMatchesHf) {
  std::string dir = lathe::testing::SourceDir() + "/tests/golden/fixtures/tokenizer/stories260K_hf";
  auto tok = Tokenizer::FromTokenizerJson(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok.value()->vocab_size(), 512);
  EXPECT_TRUE(tok.value()->add_space_prefix());
  nlohmann::json j = nlohmann::json::parse(ReadAll(dir + "/expected.json"));
  int passed = 0;
  for (const auto& c : j["cases"]) {
    std::string text = c["text"].get<std::string>();
    auto want = c["ids"].get<std::vector<int32_t>>();
    auto got = tok.value()->Encode(text, false, true);
    EXPECT_EQ(got, want) << text;
    passed += got == want;
  }
  std::printf("[stories260K tokenizer.json] %d/%zu cases match HF tokenizers\n", passed, j["cases"].size());
  EXPECT_EQ(tok.value()->Decode(tok.value()->Encode("Hello world", false)), "Hello world");
}

}  // namespace
}  // namespace lathe::tokenizer
