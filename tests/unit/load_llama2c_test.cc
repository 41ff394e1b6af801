// llama2.c .bin loader: stories260K against the same weights in GGUF, and truncated/bad files.
#include "model/load_llama2c.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "core/mapped_file.h"
#include "formats/gguf.h"
#include "test_util.h"

namespace lathe::model {
namespace {

using lathe::testing::SharedPath;

void ExpectSameBits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.dtype, b.dtype) << what;
  ASSERT_EQ(a.shape, b.shape) << what;
  EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0) << what << " differs";
}

// stories260K.bin and stories260K.gguf hold the same weights. Finding: the GGUF's Q and K are
// NOT permuted relative to the .bin (both are in Meta's interleaved-pair RoPE layout, which is
// what GGUF "llama" expects; llama.cpp's converter only permutes when starting from HF
// half-split checkpoints). Every tensor is bit-identical; the GGUF additionally stores a copy of
// the tied classifier as output.weight.
TEST(LoadLlama2c, Stories260KMatchesGgufBitForBit) {
  std::string bin = SharedPath("models/stories260K/stories260K.bin");
  std::string gguf = SharedPath("models/stories260K/stories260K.gguf");
  LATHE_REQUIRE_FILE(bin);
  LATHE_REQUIRE_FILE(gguf);
  auto w = LoadLlama2cBin(bin);
  ASSERT_TRUE(w.ok()) << w.status().message();
  const ModelConfig& c = w->config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.ffn_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.norm_eps, 1e-5f);
  EXPECT_EQ(w->output.data, w->tok_embd.data);

  auto g = formats::GgufFile::Open(gguf);
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto get = [&](const std::string& name) {
    auto t = (*g)->GetTensor(name);
    EXPECT_TRUE(t.ok()) << t.status().message();
    return t.ok() ? *t : Tensor();
  };
  ExpectSameBits(w->tok_embd, get("token_embd.weight"), "token_embd");
  ExpectSameBits(w->output, get("output.weight"), "output");
  ExpectSameBits(w->output_norm, get("output_norm.weight"), "output_norm");
  for (int l = 0; l < 5; ++l) {
    const LayerWeights& lw = w->layers[l];
    std::string p = "blk." + std::to_string(l) + ".";
    ExpectSameBits(lw.attn_norm, get(p + "attn_norm.weight"), p + "attn_norm");
    ExpectSameBits(lw.wq, get(p + "attn_q.weight"), p + "attn_q");
    ExpectSameBits(lw.wk, get(p + "attn_k.weight"), p + "attn_k");
    ExpectSameBits(lw.wv, get(p + "attn_v.weight"), p + "attn_v");
    ExpectSameBits(lw.wo, get(p + "attn_output.weight"), p + "attn_output");
    ExpectSameBits(lw.ffn_norm, get(p + "ffn_norm.weight"), p + "ffn_norm");
    ExpectSameBits(lw.w_gate, get(p + "ffn_gate.weight"), p + "ffn_gate");
    ExpectSameBits(lw.w_up, get(p + "ffn_up.weight"), p + "ffn_up");
    ExpectSameBits(lw.w_down, get(p + "ffn_down.weight"), p + "ffn_down");
  }
}

// Temp copies (about 1 MB each) removed when the test ends.
class TempFiles {
 public:
  ~TempFiles() {
    for (const std::string& p : paths_) unlink(p.c_str());
  }
  std::string Make(const std::string& bytes) {
    std::string path = ::testing::TempDir() + "lathe_l2c_XXXXXX";
    int fd = mkstemp(path.data());
    EXPECT_GE(fd, 0);
    close(fd);
    std::ofstream(path, std::ios::binary).write(bytes.data(), (std::streamsize)bytes.size());
    paths_.push_back(path);
    return path;
  }

 private:
  std::vector<std::string> paths_;
};

TEST(LoadLlama2c, TruncatedAndBadFiles) {
  std::string bin = SharedPath("models/stories260K/stories260K.bin");
  LATHE_REQUIRE_FILE(bin);
  auto text = ReadFileToString(bin);
  ASSERT_TRUE(text.ok());
  const std::string& full = *text;
  TempFiles tmp;
  // Without the freq_cis tables (newer exports) the file still loads.
  size_t freq_bytes = 512 * 8 * 4;
  auto nofreq = LoadLlama2cBin(tmp.Make(full.substr(0, full.size() - freq_bytes)));
  EXPECT_TRUE(nofreq.ok()) << nofreq.status().message();

  auto cut = LoadLlama2cBin(tmp.Make(full.substr(0, 1000)));
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("truncated"), std::string::npos) << cut.status().message();
  EXPECT_NE(cut.status().message().find("offset 1000"), std::string::npos) << cut.status().message();

  auto extra = LoadLlama2cBin(tmp.Make(full + "x"));
  ASSERT_FALSE(extra.ok());
  EXPECT_NE(extra.status().message().find("matches neither"), std::string::npos) << extra.status().message();

  auto tiny = LoadLlama2cBin(tmp.Make("abc"));
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("28 bytes"), std::string::npos);

  std::string bad = full;
  int32_t heads = 7;  // 64 % 7 != 0
  std::memcpy(bad.data() + 12, &heads, 4);
  EXPECT_FALSE(LoadLlama2cBin(tmp.Make(bad)).ok());
  int32_t huge = 0x7fffffff;
  for (int field = 0; field < 7; ++field) {
    std::string h = full;
    std::memcpy(h.data() + 4 * field, &huge, 4);
    auto r = LoadLlama2cBin(tmp.Make(h));
    EXPECT_FALSE(r.ok()) << field;
  }
  // Untied: negative vocab needs a classifier at the end.
  std::string untied = full;
  int32_t neg = -512;
  std::memcpy(untied.data() + 20, &neg, 4);
  auto u = LoadLlama2cBin(tmp.Make(untied));
  ASSERT_FALSE(u.ok());
  auto u2 = LoadLlama2cBin(tmp.Make(untied + std::string(512 * 64 * 4, '\0')));
  ASSERT_TRUE(u2.ok()) << u2.status().message();
  EXPECT_FALSE(u2->config.tied_embeddings);
  EXPECT_NE(u2->output.data, u2->tok_embd.data);
}

}  // namespace
}  // namespace lathe::model
