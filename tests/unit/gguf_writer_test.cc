// GGUF writer: byte-identical to the Python gguf package on the same inputs, round trips through
// our reader (every value type, custom alignment), and input errors.
#include "formats/gguf_writer.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>

#include "core/mapped_file.h"
#include "test_util.h"

namespace lathe::formats {
namespace {

using ::lathe::testing::FormatsFixture;

// python_written.gguf comes from tools/ref/make_format_fixtures.py (gguf package). Copying its
// metadata and tensors through our writer must reproduce it byte for byte, which also shows the
// Python reader accepts what we write.
TEST(GgufWriter, ByteIdenticalToPythonGguf) {
  auto g = GgufFile::Open(FormatsFixture("python_written.gguf"));
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ((*g)->keys().size(), 20u);
  EXPECT_EQ((*g)->keys().front(), "general.architecture");
  GgufWriter w;
  for (const std::string& k : (*g)->keys()) w.Set(k, *(*g)->Find(k));
  for (const GgufTensorInfo& ti : (*g)->tensors()) {
    auto t = (*g)->GetTensor(ti.name);
    ASSERT_TRUE(t.ok()) << t.status().message();
    ASSERT_TRUE(w.AddTensor(ti.name, t->dtype, t->shape, t->data, t->nbytes()).ok());
  }
  auto bytes = w.Serialize();
  ASSERT_TRUE(bytes.ok()) << bytes.status().message();
  ASSERT_EQ(bytes->size(), (*g)->size());
  EXPECT_EQ(std::memcmp(bytes->data(), (*g)->base(), bytes->size()), 0);

  std::string path = ::testing::TempDir() + "lathe_gguf_w_XXXXXX";
  int fd = mkstemp(path.data());
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_TRUE(w.Write(path).ok());
  auto back = ReadFileToString(path);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->size(), (*g)->size());
  EXPECT_EQ(std::memcmp(back->data(), (*g)->base(), back->size()), 0);
  unlink(path.c_str());
}

// Real files from ../shared rewritten through GgufFile -> GgufWriter come out byte-identical.
// (Vocab-only GGUFs from llama.cpp differ only in the trailing header padding: with no tensors,
// llama.cpp does not pad; the Python gguf package and we do. Both forms parse.)
TEST(GgufWriter, RewritesSharedModelsByteIdentically) {
  for (const char* rel : {"models/stories260K/stories260K.gguf",
                          "models/tiny-random-llama2-gguf/llama-2-tiny-random.gguf"}) {
    std::string path = lathe::testing::SharedPath(rel);
    LATHE_REQUIRE_FILE(path);
    auto g = GgufFile::Open(path);
    ASSERT_TRUE(g.ok()) << g.status().message();
    GgufWriter w;
    for (const std::string& k : (*g)->keys()) w.Set(k, *(*g)->Find(k));
    for (const GgufTensorInfo& ti : (*g)->tensors()) {
      ASSERT_TRUE(w.AddRawTensor(ti.name, ti.ggml_type, ti.shape, (*g)->base() + ti.offset, ti.nbytes).ok());
    }
    auto bytes = w.Serialize();
    ASSERT_TRUE(bytes.ok()) << bytes.status().message();
    ASSERT_EQ(bytes->size(), (*g)->size()) << rel;
    EXPECT_EQ(std::memcmp(bytes->data(), (*g)->base(), bytes->size()), 0) << rel;
  }
}

// Tensors filled as the file is written (AddTensorFilled) give the bytes AddTensor gives, in one buffer reused from
// one tensor to the next; an error from a fill stops the write and leaves no file.
TEST(GgufWriter, FilledTensorsWriteTheSameBytes) {
  std::string path = lathe::testing::SharedPath("models/stories260K/stories260K.gguf");
  LATHE_REQUIRE_FILE(path);
  auto g = GgufFile::Open(path);
  ASSERT_TRUE(g.ok()) << g.status().message();
  GgufWriter w;
  for (const std::string& k : (*g)->keys()) w.Set(k, *(*g)->Find(k));
  int fills = 0;
  for (const GgufTensorInfo& ti : (*g)->tensors()) {
    Tensor t = (*g)->GetTensor(ti.name).value();
    ASSERT_TRUE(w.AddTensorFilled(ti.name, t.dtype, t.shape, t.nbytes(), [t, &fills](uint8_t* dst) {
                   std::memcpy(dst, t.data, t.nbytes());
                   ++fills;
                   return Status::Ok();
                 }).ok());
  }
  auto bytes = w.Serialize();
  ASSERT_TRUE(bytes.ok()) << bytes.status().message();
  EXPECT_EQ(fills, (int)(*g)->tensors().size());
  ASSERT_EQ(bytes->size(), (*g)->size());
  EXPECT_EQ(std::memcmp(bytes->data(), (*g)->base(), bytes->size()), 0);

  lathe::testing::ScopedTempDir tmp;
  GgufWriter bad;
  ASSERT_TRUE(bad.AddTensorFilled("a", DType::kF32, {4}, 16, [](uint8_t*) { return Status::Ok(); }).ok());
  ASSERT_TRUE(bad.AddTensorFilled("b", DType::kF32, {4}, 16, [](uint8_t*) {
                   return Status::Error("tensor 'b': the source ran out");
                 }).ok());
  Status st = bad.Write(tmp.path + "/out.gguf");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("the source ran out"), std::string::npos);
  EXPECT_FALSE(lathe::testing::FileExists(tmp.path + "/out.gguf"));
  EXPECT_FALSE(bad.AddTensorFilled("c", DType::kF32, {4}, 12, [](uint8_t*) { return Status::Ok(); }).ok());
}

TEST(GgufWriter, RoundTripEveryTypeWithCustomAlignment) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("general.alignment", 64);
  w.SetUint8("u8", 255);
  w.SetInt8("i8", -128);
  w.SetUint16("u16", 65535);
  w.SetInt16("i16", -32768);
  w.SetUint32("u32", 4294967295u);
  w.SetInt32("i32", -5);
  w.SetUint64("u64", ~0ull);
  w.SetInt64("i64", INT64_MIN);
  w.SetFloat32("f32", 1.5f);
  w.SetFloat64("f64", -2.75);
  w.SetBool("b", true);
  w.SetString("s", std::string("with\0nul", 8));
  w.SetStringArray("tokens", {"<s>", "</s>", ""});
  w.SetIntArray("types", GgufValueType::kInt32, {1, 2, -3});
  w.SetIntArray("u64s", GgufValueType::kUint64, {(int64_t)~0ull, 7});
  w.SetIntArray("empty", GgufValueType::kUint8, {});
  w.SetFloatArray("scores", GgufValueType::kFloat32, {0.5, -1.0});
  w.SetFloatArray("doubles", GgufValueType::kFloat64, {1e-300});
  w.SetInt32("i32", 42);  // replaces in place
  std::vector<float> a(3 * 5);
  for (size_t i = 0; i < a.size(); ++i) a[i] = (float)i;
  std::vector<uint16_t> h(7, F32ToF16(1.0f));
  std::vector<BlockQ4_0> q(2 * 2);
  std::memset(q.data(), 0x5a, q.size() * sizeof(BlockQ4_0));
  ASSERT_TRUE(w.AddTensor("a", DType::kF32, {3, 5}, a.data(), a.size() * 4).ok());
  ASSERT_TRUE(w.AddTensor("h", DType::kF16, {7}, h.data(), h.size() * 2).ok());
  ASSERT_TRUE(w.AddTensor("q", DType::kQ4_0, {2, 64}, q.data(), q.size() * sizeof(BlockQ4_0)).ok());
  auto bytes = w.Serialize();
  ASSERT_TRUE(bytes.ok()) << bytes.status().message();
  auto g = GgufFile::Parse(bytes->data(), bytes->size(), "rt.gguf");
  ASSERT_TRUE(g.ok()) << g.status().message();
  const GgufFile& f = **g;
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.keys().size(), 20u);
  EXPECT_EQ(f.keys()[7], "i32");
  EXPECT_EQ(f.GetInt("u8").value(), 255);
  EXPECT_EQ(f.GetInt("i8").value(), -128);
  EXPECT_EQ(f.GetInt("u16").value(), 65535);
  EXPECT_EQ(f.GetInt("i16").value(), -32768);
  EXPECT_EQ(f.GetInt("u32").value(), 4294967295ll);
  EXPECT_EQ(f.GetInt("i32").value(), 42);
  EXPECT_EQ(f.Find("u64")->u, ~0ull);
  EXPECT_EQ(f.GetInt("i64").value(), INT64_MIN);
  EXPECT_EQ(f.GetFloat("f32").value(), 1.5);
  EXPECT_EQ(f.GetFloat("f64").value(), -2.75);
  EXPECT_EQ(f.GetBool("b").value(), true);
  EXPECT_EQ(f.GetString("s").value(), std::string("with\0nul", 8));
  EXPECT_EQ(f.Find("tokens")->strings, (std::vector<std::string>{"<s>", "</s>", ""}));
  EXPECT_EQ(f.Find("types")->ints, (std::vector<int64_t>{1, 2, -3}));
  EXPECT_EQ((uint64_t)f.Find("u64s")->ints[0], ~0ull);
  EXPECT_EQ(f.Find("empty")->array_size, 0u);
  EXPECT_EQ(f.Find("empty")->elem_type, GgufValueType::kUint8);
  EXPECT_EQ(f.Find("scores")->floats, (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(f.Find("doubles")->floats, (std::vector<double>{1e-300}));
  ASSERT_EQ(f.tensors().size(), 3u);
  for (const GgufTensorInfo& ti : f.tensors()) EXPECT_EQ(ti.offset % 64, 0u) << ti.name;
  auto ta = f.GetTensor("a");
  ASSERT_TRUE(ta.ok());
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(f.FindTensor("a")->ne, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(std::memcmp(ta->data, a.data(), a.size() * 4), 0);
  auto tq = f.GetTensor("q");
  ASSERT_TRUE(tq.ok());
  EXPECT_EQ(tq->dtype, DType::kQ4_0);
  EXPECT_EQ(std::memcmp(tq->data, q.data(), q.size() * sizeof(BlockQ4_0)), 0);
  EXPECT_EQ(bytes->size() % 64, 0u);
}

TEST(GgufWriter, InputErrors) {
  std::vector<float> a(64);
  GgufWriter w;
  EXPECT_TRUE(w.AddTensor("x", DType::kF32, {8, 8}, a.data(), 256).ok());
  EXPECT_FALSE(w.AddTensor("x", DType::kF32, {8, 8}, a.data(), 256).ok());        // duplicate
  EXPECT_FALSE(w.AddTensor("y", DType::kF32, {8, 8}, a.data(), 255).ok());        // size
  EXPECT_FALSE(w.AddTensor("z", DType::kF32, {}, a.data(), 4).ok());              // no dims
  EXPECT_FALSE(w.AddTensor("z", DType::kF32, {1, 1, 1, 1, 1}, a.data(), 4).ok()); // 5 dims
  EXPECT_FALSE(w.AddTensor("z", DType::kQ8_0, {2, 16}, a.data(), 34).ok());       // partial block
  EXPECT_FALSE(w.AddTensor("z", DType::kBool, {4}, a.data(), 4).ok());            // no GGML type
  EXPECT_FALSE(w.AddTensor(std::string(64, 'n'), DType::kF32, {1}, a.data(), 4).ok());
  // Raw GGML types lathe does not compute with: an IQ4_XS row is 256 elements in 136 bytes.
  constexpr uint32_t kIq4Xs = 23;
  std::vector<uint8_t> k(2 * 136);
  EXPECT_TRUE(w.AddRawTensor("k", kIq4Xs, {2, 256}, k.data(), k.size()).ok());
  EXPECT_FALSE(w.AddRawTensor("k2", kIq4Xs, {2, 128}, k.data(), 136).ok());
  EXPECT_FALSE(w.AddRawTensor("k3", 99, {4}, k.data(), 4).ok());
  Status s = w.AddTensor("w", DType::kF32, {0, 4}, a.data(), 0);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'w'"), std::string::npos);
  auto with_k = w.Serialize();
  ASSERT_TRUE(with_k.ok());
  auto gk = GgufFile::Parse(with_k->data(), with_k->size(), "k.gguf");
  ASSERT_TRUE(gk.ok()) << gk.status().message();
  const GgufTensorInfo* ki = (*gk)->FindTensor("k");
  ASSERT_NE(ki, nullptr);
  EXPECT_FALSE(ki->supported);
  EXPECT_TRUE(ki->known_size);
  EXPECT_EQ(ki->nbytes, 272u);
  EXPECT_STREQ(GgmlTypeName(ki->ggml_type), "IQ4_XS");
  EXPECT_FALSE((*gk)->GetTensor("k").ok());
  // A truncated tensor of such a type is caught at open time.
  auto cut = GgufFile::Parse(with_k->data(), with_k->size() - 200, "cut.gguf");
  EXPECT_FALSE(cut.ok());
  w.SetUint32("general.alignment", 48);
  auto bad = w.Serialize();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("general.alignment"), std::string::npos);
  GgufValue nested;
  nested.type = GgufValueType::kArray;
  nested.elem_type = GgufValueType::kArray;
  GgufWriter w2;
  w2.Set("nested", nested);
  EXPECT_FALSE(w2.Serialize().ok());
  EXPECT_FALSE(w2.Write("/nonexistent_dir/x.gguf").ok());
}

}  // namespace
}  // namespace lathe::formats
