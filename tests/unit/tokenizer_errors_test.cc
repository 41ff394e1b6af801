// Malformed tokenizer files give a Status naming the file and the field, never a crash:
// truncated / corrupted tokenizer.bin, tokenizer.model, tokenizer.json and GGUF metadata.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "formats/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace lathe::tokenizer {
namespace {

using lathe::testing::SharedPath;

using lathe::testing::ReadAll;
// The directory WriteTemp writes into, removed when the test binary exits.
::lathe::testing::ScopedTempDir g_temp_dir("lathe_tok_");

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  std::string path = g_temp_dir.path + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

void ExpectError(const Status& st, const std::vector<std::string>& needles) {
  ASSERT_FALSE(st.ok());
  for (const auto& n : needles) EXPECT_NE(st.message().find(n), std::string::npos) << st.message() << " lacks " << n;
}

TEST(TokenizerErrors, TruncatedLlama2cBin) {
  std::string src = SharedPath("models/stories260K/tok512.bin");
  LATHE_REQUIRE_FILE(src);
  std::string bytes = ReadAll(src);
  std::string path = WriteTemp("tok512_cut.bin", bytes.substr(0, 1000));
  auto t = Tokenizer::FromLlama2cBin(path, 512);
  ExpectError(t.status(), {path, "token"});
  // A length field that runs past the end.
  std::string bad = bytes.substr(0, 12);
  int32_t huge = 1 << 30;
  std::memcpy(&bad[8], &huge, 4);
  path = WriteTemp("tok512_len.bin", bad);
  ExpectError(Tokenizer::FromLlama2cBin(path, 512).status(), {path, "length"});
  // Asking for more tokens than the file has.
  ExpectError(Tokenizer::FromLlama2cBin(src, 600).status(), {src, "token 512"});
  ExpectError(Tokenizer::FromLlama2cBin("/nonexistent/tokenizer.bin", 512).status(), {"/nonexistent/tokenizer.bin"});
}

TEST(TokenizerErrors, CorruptSentencePieceModel) {
  std::string src = SharedPath("models/stories260K/tok512.model");
  LATHE_REQUIRE_FILE(src);
  std::string bytes = ReadAll(src);
  std::string path = WriteTemp("empty.model", "");
  ExpectError(Tokenizer::FromSentencePieceModel(path).status(), {path, "pieces"});
  path = WriteTemp("cut.model", bytes.substr(0, 2001));
  ExpectError(Tokenizer::FromSentencePieceModel(path).status(), {path, "field"});
  // Every truncation point and a sweep of flipped bytes: an error or a tokenizer, never a crash.
  for (size_t cut = 0; cut < bytes.size(); cut += 101) {
    path = WriteTemp("sweep.model", bytes.substr(0, cut));
    auto t = Tokenizer::FromSentencePieceModel(path);
    if (t.ok()) (void)t.value()->Encode("hello world", true);
  }
  for (size_t pos = 0; pos < bytes.size(); pos += 131) {
    std::string flipped = bytes;
    flipped[pos] = static_cast<char>(flipped[pos] ^ 0xA5);
    path = WriteTemp("flip.model", flipped);
    auto t = Tokenizer::FromSentencePieceModel(path);
    if (t.ok()) (void)t.value()->Encode("hello world", true);
  }
}

TEST(TokenizerErrors, BadTokenizerJson) {
  std::string path = WriteTemp("tokenizer.json", "{\"model\": ");
  ExpectError(Tokenizer::FromTokenizerJson(path).status(), {path, "JSON"});
  path = WriteTemp("tokenizer.json", "{\"version\": \"1.0\"}");
  ExpectError(Tokenizer::FromTokenizerJson(path).status(), {path, "model"});
  path = WriteTemp("tokenizer.json", R"({"model": {"type": "WordPiece", "vocab": {}}})");
  ExpectError(Tokenizer::FromTokenizerJson(path).status(), {path, "model.type", "WordPiece"});
  path = WriteTemp("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b", 7]}})");
  ExpectError(Tokenizer::FromTokenizerJson(path).status(), {path, "model.merges[1]"});
  path = WriteTemp("tokenizer.json",
                   R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "BertPreTokenizer"}})");
  ExpectError(Tokenizer::FromTokenizerJson(path).status(), {path, "pre_tokenizer.type", "BertPreTokenizer"});
  path = WriteTemp("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})");
  ExpectError(Tokenizer::FromTokenizerJson(path).status(), {path, "pre_tokenizer.pattern", "(unclosed"});
  path = WriteTemp("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": -3}, "merges": []}})");
  ExpectError(Tokenizer::FromTokenizerJson(path).status(), {path, "model.vocab[\"a\"]"});
  path = WriteTemp("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": [{"id": 1}]})");
  ExpectError(Tokenizer::FromTokenizerJson(path).status(), {path, "added_tokens[0]"});
  // Found by tokenizer_fuzz: flags and strings of the wrong JSON type threw (json::value) instead of
  // giving an error (the crash input is kept in the fuzz corpus).
  path = WriteTemp("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "added_tokens": [{"id": 1, "content": "<s>", "special": 1}]})");
  ExpectError(Tokenizer::FromTokenizerJson(path).status(), {path, "added_tokens[0].special", "true or false"});
  path = WriteTemp("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "byte_fallback": "yes"}})");
  ExpectError(Tokenizer::FromTokenizerJson(path).status(), {path, "model.byte_fallback"});
  path = WriteTemp("tokenizer.json", R"({"model": {"type": 5, "vocab": {"a": 0}, "merges": []}})");
  ExpectError(Tokenizer::FromTokenizerJson(path).status(), {path, "model.type", "a string"});
  path = WriteTemp("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "pre_tokenizer": {"type": "Metaspace", "replacement": 3}})");
  ExpectError(Tokenizer::FromTokenizerJson(path).status(), {path, "pre_tokenizer.replacement"});
}

// A GGUF buffer with the given string / string-array / int-array metadata.
class GgufBuilder {
 public:
  void Str(const std::string& key, const std::string& v) {
    Key(key);
    U32(8);
    S(v);
    ++n_;
  }
  void StrArray(const std::string& key, const std::vector<std::string>& v) {
    Key(key);
    U32(9);
    U32(8);
    U64(v.size());
    for (const auto& s : v) S(s);
    ++n_;
  }
  void I32Array(const std::string& key, const std::vector<int32_t>& v) {
    Key(key);
    U32(9);
    U32(5);
    U64(v.size());
    for (int32_t x : v) U32(static_cast<uint32_t>(x));
    ++n_;
  }
  std::string Bytes() const {
    std::string out = "GGUF";
    auto put = [&](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
    uint32_t version = 3;
    uint64_t tensors = 0, kv = n_;
    put(&version, 4);
    put(&tensors, 8);
    put(&kv, 8);
    return out + body_;
  }

 private:
  void U32(uint32_t v) { body_.append(reinterpret_cast<const char*>(&v), 4); }
  void U64(uint64_t v) { body_.append(reinterpret_cast<const char*>(&v), 8); }
  void S(const std::string& s) {
    U64(s.size());
    body_ += s;
  }
  void Key(const std::string& k) { S(k); }
  std::string body_;
  uint64_t n_ = 0;
};

Status FromGgufBytes(const std::string& bytes) {
  auto g = formats::GgufFile::Parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "test.gguf");
  if (!g.ok()) return g.status();
  auto t = Tokenizer::FromGguf(**g);
  return t.ok() ? Status::Ok() : t.status();
}

TEST(TokenizerErrors, BadGgufMetadata) {
  {
    GgufBuilder b;
    b.Str("tokenizer.ggml.model", "llama");
    ExpectError(FromGgufBytes(b.Bytes()), {"test.gguf", "tokenizer.ggml.tokens"});
  }
  {
    GgufBuilder b;
    b.Str("tokenizer.ggml.model", "bert");
    b.StrArray("tokenizer.ggml.tokens", {"a", "b"});
    ExpectError(FromGgufBytes(b.Bytes()), {"test.gguf", "tokenizer.ggml.model", "bert"});
  }
  {
    GgufBuilder b;
    b.Str("tokenizer.ggml.model", "llama");
    b.StrArray("tokenizer.ggml.tokens", {"a", "b"});
    b.I32Array("tokenizer.ggml.token_type", {1, 9});
    ExpectError(FromGgufBytes(b.Bytes()), {"test.gguf", "tokenizer.ggml.token_type[1]"});
  }
  {
    GgufBuilder b;
    b.Str("tokenizer.ggml.model", "gpt2");
    b.StrArray("tokenizer.ggml.tokens", {"a", "b", "ab"});
    ExpectError(FromGgufBytes(b.Bytes()), {"test.gguf", "tokenizer.ggml.merges"});
    b.StrArray("tokenizer.ggml.merges", {"ab"});
    ExpectError(FromGgufBytes(b.Bytes()), {"test.gguf", "tokenizer.ggml.merges[0]"});
  }
  {
    // A minimal valid byte-level vocabulary still works.
    GgufBuilder b;
    b.Str("tokenizer.ggml.model", "gpt2");
    b.StrArray("tokenizer.ggml.tokens", {"a", "b", "ab", "<|endoftext|>"});
    b.I32Array("tokenizer.ggml.token_type", {1, 1, 1, 3});
    b.StrArray("tokenizer.ggml.merges", {"a b"});
    std::string bytes = b.Bytes();
    auto g = formats::GgufFile::Parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "test.gguf");
    ASSERT_TRUE(g.ok()) << g.status().message();
    auto t = Tokenizer::FromGguf(**g);
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(t.value()->Encode("abab<|endoftext|>b", false), (std::vector<int32_t>{2, 2, 3, 1}));
    EXPECT_EQ(t.value()->stop_ids(), std::vector<int32_t>{3});
  }
}

}  // namespace
}  // namespace lathe::tokenizer
