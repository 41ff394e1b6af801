// LoadGgufWeights on small hand-built GGUF files (GgufWriter): the hyper-parameters checked against the tensors
// before anything is sized from them, only weight dtypes the kernels read, and tensors that a small
// general.alignment leaves misaligned for their type copied to aligned memory (a forward then runs on them).
// Cases model_fuzz found as crashes: block_count 2^32 - 1 (a layer table of terabytes), an i32 attn_q (the forward
// aborted in the dequantizer).
#include "model/load_gguf.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "model/transformer.h"

namespace lathe::model {
namespace {

constexpr int64_t kDim = 8, kFfn = 8, kVocab = 8;

struct Built {
  std::vector<uint8_t> bytes;
  std::map<std::string, std::vector<float>> values;  // every f32 tensor's values, by name
};

// A one-block Llama (dim 8, 2 heads, 1 KV head), f32 unless q_dtype says otherwise for attn_q; pad_bytes of an
// f16 tensor first shift every later tensor by that much from the data start.
Built Build(int64_t block_count, DType q_dtype = DType::kF32, uint32_t alignment = 32, int pad_bytes = 0) {
  formats::GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("llama.block_count", (uint32_t)block_count);
  w.SetUint32("llama.embedding_length", kDim);
  w.SetUint32("llama.feed_forward_length", kFfn);
  w.SetUint32("llama.attention.head_count", 2);
  w.SetUint32("llama.attention.head_count_kv", 1);
  w.SetUint32("llama.context_length", 16);
  if (alignment != 32) w.SetUint32("general.alignment", alignment);
  Built b;
  // The writer reads tensor data at Serialize: what is not kept in b.values lives here until then.
  std::vector<uint16_t> pad(pad_bytes / 2, 0x3c00);
  std::vector<int32_t> ints;
  if (pad_bytes) {
    EXPECT_TRUE(w.AddTensor("pad.weight", DType::kF16, {(int64_t)pad.size()}, pad.data(), pad_bytes).ok());
  }
  uint32_t seed = 1;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, DType dt = DType::kF32) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n);
    for (float& x : v) x = (float)((seed = seed * 1664525u + 1013904223u) >> 8) / (float)(1 << 24) - 0.5f;
    if (dt == DType::kI32) {
      ints.assign(n, 7);
      EXPECT_TRUE(w.AddTensor(name, dt, shape, ints.data(), ints.size() * 4).ok());
      return;
    }
    EXPECT_TRUE(w.AddTensor(name, dt, shape, v.data(), v.size() * 4).ok());
    b.values[name] = std::move(v);
  };
  add("token_embd.weight", {kVocab, kDim});
  add("blk.0.attn_norm.weight", {kDim});
  add("blk.0.attn_q.weight", {kDim, kDim}, q_dtype);
  add("blk.0.attn_k.weight", {kDim / 2, kDim});
  add("blk.0.attn_v.weight", {kDim / 2, kDim});
  add("blk.0.attn_output.weight", {kDim, kDim});
  add("blk.0.ffn_norm.weight", {kDim});
  add("blk.0.ffn_gate.weight", {kFfn, kDim});
  add("blk.0.ffn_up.weight", {kFfn, kDim});
  add("blk.0.ffn_down.weight", {kDim, kFfn});
  add("output_norm.weight", {kDim});
  auto bytes = w.Serialize();
  EXPECT_TRUE(bytes.ok()) << bytes.status().message();
  if (bytes.ok()) b.bytes = std::move(*bytes);
  return b;
}

Result<ModelWeights> Load(const std::vector<uint8_t>& bytes) {
  auto g = formats::GgufFile::Parse(bytes.data(), bytes.size(), "tiny.gguf");
  if (!g.ok()) return g.status();
  return LoadGgufWeights(std::shared_ptr<formats::GgufFile>(std::move(*g)));
}

// Logits of a two-token prompt (both rows) through a KV cache.
Result<std::vector<float>> TwoTokens(const ModelWeights& w) {
  ThreadPool pool(1);
  Transformer tf(w, pool);
  KvCache cache(w.config, 1, 4);
  const int32_t ids[2] = {1, 5};
  SeqInput in{0, {ids, 2}, true};
  std::vector<float> logits;
  LATHE_RETURN_IF_ERROR(tf.Forward(cache, {&in, 1}, &logits));
  return logits;
}

TEST(LoadGguf, TinyModelLoadsAndRuns) {
  Built b = Build(1);
  auto w = Load(b.bytes);
  ASSERT_TRUE(w.ok()) << w.status().message();
  auto logits = TwoTokens(*w);
  ASSERT_TRUE(logits.ok()) << logits.status().message();
  EXPECT_EQ((int64_t)logits->size(), 2 * kVocab);
}

TEST(LoadGguf, BlockCountBeyondTheTensorsIsAnError) {
  for (int64_t n : {int64_t{0}, int64_t{2}, int64_t{1000}, int64_t{0xffffffff}}) {
    auto w = Load(Build(n).bytes);
    ASSERT_FALSE(w.ok()) << n;
    // 2: the count passes the tensor-count bound, and the missing block's tensors are named instead.
    const std::string want = n == 2 ? "blk.1.attn_norm.weight" : "llama.block_count is " + std::to_string(n);
    EXPECT_NE(w.status().message().find(want), std::string::npos) << w.status().message();
  }
}

TEST(LoadGguf, IntegerWeightIsAnError) {
  auto w = Load(Build(1, DType::kI32).bytes);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("tensor layer 0 q has dtype i32"), std::string::npos) << w.status().message();
}

TEST(LoadGguf, TensorsMisalignedByTheFileAreCopiedAligned) {
  // general.alignment 2 with a 2-byte tensor first: whichever parity the header leaves, one of the two layouts puts
  // f32 tensors at addresses that are not multiples of 4.
  bool saw_misaligned = false;
  for (int pad : {0, 2}) {
    Built b = Build(1, DType::kF32, 2, pad);
    std::vector<uint64_t> buf(b.bytes.size() / 8 + 1);  // an aligned base, as a mapping gives
    std::memcpy(buf.data(), b.bytes.data(), b.bytes.size());
    auto g = formats::GgufFile::Parse((const uint8_t*)buf.data(), b.bytes.size(), "tiny.gguf");
    ASSERT_TRUE(g.ok()) << g.status().message();
    for (const auto& ti : (*g)->tensors())
      if (ti.name != "pad.weight" && ((uintptr_t)(*g)->base() + ti.offset) % 4 != 0) saw_misaligned = true;
    auto w = LoadGgufWeights(std::shared_ptr<formats::GgufFile>(std::move(*g)));
    ASSERT_TRUE(w.ok()) << w.status().message();
    const Tensor* ts[] = {&w->tok_embd, &w->layers[0].wq, &w->layers[0].w_down, &w->layers[0].attn_norm};
    const char* names[] = {"token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight",
                           "blk.0.attn_norm.weight"};
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ((uintptr_t)ts[i]->data % 4, 0u) << names[i] << " pad " << pad;
      const std::vector<float>& want = b.values[names[i]];
      EXPECT_EQ(std::vector<float>(ts[i]->as<float>(), ts[i]->as<float>() + want.size()), want) << names[i];
    }
    auto logits = TwoTokens(*w);
    ASSERT_TRUE(logits.ok()) << logits.status().message();
  }
  EXPECT_TRUE(saw_misaligned);
}

}  // namespace
}  // namespace lathe::model
