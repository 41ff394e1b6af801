// GGUF reader on real files from ../shared and on corrupted copies of them.
#include "formats/gguf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/mapped_file.h"
#include "test_util.h"

namespace lathe::formats {
namespace {

using lathe::testing::SharedPath;

TEST(Gguf, ReadsStories260K) {
  std::string path = SharedPath("models/stories260K/stories260K.gguf");
  LATHE_REQUIRE_FILE(path);
  auto g = GgufFile::Open(path);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ((*g)->version(), 3u);
  EXPECT_EQ((*g)->GetString("general.architecture").value(), "llama");
  EXPECT_EQ((*g)->GetInt("llama.embedding_length").value(), 64);
  EXPECT_EQ((*g)->GetInt("llama.block_count").value(), 5);
  const GgufValue* toks = (*g)->Find("tokenizer.ggml.tokens");
  ASSERT_NE(toks, nullptr);
  EXPECT_EQ(toks->strings.size(), 512u);
  auto t = (*g)->GetTensor("token_embd.weight");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->dtype, DType::kF32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{512, 64}));
  auto missing = (*g)->GetTensor("nope");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
  auto wrong = (*g)->GetString("llama.block_count");
  EXPECT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("expected string"), std::string::npos);
}

TEST(Gguf, ReadsF16TinyRandom) {
  std::string path = SharedPath("models/tiny-random-llama2-gguf/llama-2-tiny-random.gguf");
  LATHE_REQUIRE_FILE(path);
  auto g = GgufFile::Open(path);
  ASSERT_TRUE(g.ok()) << g.status().message();
  bool saw_f16 = false;
  for (const auto& ti : (*g)->tensors()) saw_f16 |= ti.supported && ti.dtype == DType::kF16;
  EXPECT_TRUE(saw_f16);
}

TEST(Gguf, EveryTruncationIsAnErrorNotACrash) {
  std::string path = SharedPath("models/stories260K/stories260K.gguf");
  LATHE_REQUIRE_FILE(path);
  auto mf = MappedFile::Open(path);
  ASSERT_TRUE(mf.ok());
  const uint8_t* d = (*mf)->data();
  size_t n = (*mf)->size();
  // Cut at many points through the header and into the data.
  for (size_t cut = 0; cut < n; cut += (cut < 20000 ? 97 : 9973)) {
    std::vector<uint8_t> buf(d, d + cut);
    auto g = GgufFile::Parse(buf.data(), buf.size(), "cut.gguf");
    ASSERT_FALSE(g.ok()) << "cut at " << cut;
    EXPECT_NE(g.status().message().find("cut.gguf"), std::string::npos) << g.status().message();
  }
}

TEST(Gguf, BadMagicAndHugeCounts) {
  std::vector<uint8_t> buf = {'G', 'G', 'U', 'X', 3, 0, 0, 0};
  auto g = GgufFile::Parse(buf.data(), buf.size(), "x.gguf");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("not a GGUF file"), std::string::npos);
  std::vector<uint8_t> h = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
  uint64_t big = ~0ull;
  h.insert(h.end(), (uint8_t*)&big, (uint8_t*)&big + 8);
  h.insert(h.end(), (uint8_t*)&big, (uint8_t*)&big + 8);
  g = GgufFile::Parse(h.data(), h.size(), "y.gguf");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("more than"), std::string::npos) << g.status().message();
}

}  // namespace
}  // namespace lathe::formats
