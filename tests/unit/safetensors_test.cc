// safetensors reader/writer: files written by the Python library, byte-identical writing,
// round trips, sharded sets, and corrupt headers that must give errors (never crashes).
#include "formats/safetensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "test_util.h"

namespace lathe::formats {
namespace {

using ::lathe::testing::FormatsFixture;

// Temp folders, removed at exit.
struct TempDirs {
  ~TempDirs() {
    for (const std::string& d : dirs) std::filesystem::remove_all(d);
  }
  std::vector<std::string> dirs;
} temp_dirs;

std::string MakeTempDir() {
  std::string t = ::testing::TempDir() + "lathe_st_XXXXXX";
  char* p = mkdtemp(t.data());
  EXPECT_NE(p, nullptr);
  temp_dirs.dirs.push_back(t);
  return t;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), (std::streamsize)bytes.size());
}

// 8-byte length + header + data, as a byte string.
std::string Build(const std::string& header, const std::string& data) {
  uint64_t n = header.size();
  std::string out((const char*)&n, 8);
  return out + header + data;
}

Status ParseString(const std::string& bytes, const std::string& name = "t.safetensors") {
  auto f = SafetensorsFile::Parse((const uint8_t*)bytes.data(), bytes.size(), name);
  return f.status();
}

TEST(Safetensors, ReadsPythonWrittenFile) {
  auto f = SafetensorsFile::Open(FormatsFixture("python_written.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  EXPECT_EQ((*f)->tensors().size(), 11u);
  auto b = (*f)->GetTensor("b.i64");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->dtype, DType::kI64);
  EXPECT_EQ(b->shape, std::vector<int64_t>{5});
  for (int i = 0; i < 5; ++i) EXPECT_EQ(b->as<int64_t>()[i], i);
  auto c = (*f)->GetTensor("c.f64");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(c->as<double>()[1], -2.25);
  auto s = (*f)->GetTensor("scalar.f32");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->as<float>()[0], 3.25f);
  auto e = (*f)->GetTensor("empty.f32");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(e->nbytes(), 0u);
  auto h = (*f)->GetTensor("h.bool");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->dtype, DType::kBool);
  EXPECT_EQ(h->as<uint8_t>()[0], 1);
  EXPECT_EQ(h->as<uint8_t>()[1], 0);
  for (const auto& ti : (*f)->tensors()) {
    auto t = (*f)->GetTensor(ti.name);
    ASSERT_TRUE(t.ok());
    EXPECT_TRUE(t->aligned()) << ti.name;
  }
  auto missing = (*f)->GetTensor("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'nope'"), std::string::npos);

  auto bf = SafetensorsFile::Open(FormatsFixture("python_written_bf16.safetensors"));
  ASSERT_TRUE(bf.ok()) << bf.status().message();
  auto w = (*bf)->GetTensor("w.bf16");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->dtype, DType::kBF16);
  EXPECT_EQ(BF16ToF32(w->as<uint16_t>()[1]), -2.5f);
  EXPECT_EQ(BF16ToF32(w->as<uint16_t>()[2]), 3.140625f);
}

// Re-serializing what Python wrote must give the same bytes: same data order, same JSON layout,
// same padding. This is also how we know the Python library reads our files.
TEST(Safetensors, WriterIsByteIdenticalToPython) {
  for (const char* name : {"python_written.safetensors", "python_written_bf16.safetensors"}) {
    auto f = SafetensorsFile::Open(FormatsFixture(name));
    ASSERT_TRUE(f.ok()) << f.status().message();
    std::vector<SafetensorsWriteEntry> entries;
    // Insert in reverse name order so the writer has to sort.
    for (auto it = (*f)->tensors().rbegin(); it != (*f)->tensors().rend(); ++it) {
      auto t = (*f)->GetTensor(it->name);
      ASSERT_TRUE(t.ok());
      entries.push_back({it->name, t->dtype, t->shape, t->data, t->nbytes()});
    }
    auto bytes = SerializeSafetensors(entries, (*f)->metadata());
    ASSERT_TRUE(bytes.ok()) << bytes.status().message();
    std::string got((const char*)bytes->data(), bytes->size());
    std::string want((const char*)(*f)->base(), (*f)->size());
    EXPECT_EQ(got, want) << name;

    std::string dir = MakeTempDir();
    std::string out = dir + "/out.safetensors";
    ASSERT_TRUE(WriteSafetensors(out, entries, (*f)->metadata()).ok());
    auto back = ReadFileToString(out);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, want);
    EXPECT_FALSE(lathe::testing::FileExists(out + ".tmp." + std::to_string(getpid()) + ".0"));
  }
}

// Entries filled as the file is written (fill instead of data) give the Python library's bytes too; a failing fill
// stops the write and leaves no file.
TEST(Safetensors, FilledEntriesWriteTheSameBytes) {
  auto f = SafetensorsFile::Open(FormatsFixture("python_written.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  std::vector<SafetensorsWriteEntry> entries;
  int fills = 0;
  for (const auto& ti : (*f)->tensors()) {
    Tensor t = (*f)->GetTensor(ti.name).value();
    entries.push_back({ti.name, t.dtype, t.shape, nullptr, t.nbytes(), [t, &fills](uint8_t* dst) {
                         std::memcpy(dst, t.data, t.nbytes());
                         ++fills;
                         return Status::Ok();
                       }});
  }
  const std::string want((const char*)(*f)->base(), (*f)->size());
  auto bytes = SerializeSafetensors(entries, (*f)->metadata());
  ASSERT_TRUE(bytes.ok()) << bytes.status().message();
  EXPECT_EQ(std::string((const char*)bytes->data(), bytes->size()), want);
  std::string dir = MakeTempDir();
  ASSERT_TRUE(WriteSafetensors(dir + "/out.safetensors", entries, (*f)->metadata()).ok());
  EXPECT_EQ(ReadFileToString(dir + "/out.safetensors").value(), want);
  EXPECT_EQ(fills, 2 * (int)entries.size());
  entries.back().fill = [](uint8_t*) { return Status::Error("tensor: the source ran out"); };
  Status st = WriteSafetensors(dir + "/bad.safetensors", entries, (*f)->metadata());
  EXPECT_NE(st.message().find("the source ran out"), std::string::npos);
  EXPECT_FALSE(lathe::testing::FileExists(dir + "/bad.safetensors"));
}

TEST(Safetensors, RoundTrip) {
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b = {F32ToBF16(0.5f), F32ToBF16(-1.0f)};
  std::vector<uint16_t> c = {F32ToF16(0.25f)};
  std::vector<SafetensorsWriteEntry> entries = {
      {"layer.a", DType::kF32, {2, 3}, a.data(), a.size() * 4},
      {"b\"quoted\\name", DType::kBF16, {2}, b.data(), 4},
      {"c", DType::kF16, {1, 1}, c.data(), 2},
  };
  std::string path = MakeTempDir() + "/rt.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, entries, {{"format", "pt"}, {"note", "ünïcode"}}).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ((*f)->metadata().at("note"), "ünïcode");
  EXPECT_EQ((*f)->data_offset() % 8, 0u);
  for (const auto& e : entries) {
    auto t = (*f)->GetTensor(e.name);
    ASSERT_TRUE(t.ok()) << e.name;
    EXPECT_EQ(t->dtype, e.dtype);
    EXPECT_EQ(t->shape, e.shape);
    ASSERT_EQ(t->nbytes(), e.nbytes);
    EXPECT_EQ(std::memcmp(t->data, e.data, e.nbytes), 0);
  }
  // Writer input errors.
  EXPECT_FALSE(SerializeSafetensors({{"x", DType::kF32, {3}, a.data(), 8}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"x", DType::kF32, {1}, a.data(), 4}, {"x", DType::kF32, {1}, a.data(), 4}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"q", DType::kQ8_0, {32}, a.data(), 34}}).ok());
  EXPECT_FALSE(SerializeSafetensors({{"bad\xff", DType::kF32, {1}, a.data(), 4}}).ok());
}

TEST(Safetensors, CorruptHeadersAreErrors) {
  std::string ok_entry = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_TRUE(ParseString(Build(ok_entry, std::string(8, '\0'))).ok());
  ASSERT_TRUE(ParseString(Build(ok_entry + std::string(2, '\0'), std::string(8, '\0'))).ok());  // NUL padding
  struct Case {
    std::string bytes;
    std::string expect;  // substring of the error
  };
  std::string eight(8, '\0');
  std::vector<Case> cases = {
      {"", "truncated at offset 0"},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "exceeds"},
      {std::string("\x40\x00\x00\x00\x00\x00\x00\x00", 8) + "{}", "past the end"},
      {Build("{\"w\":", ""), "not valid JSON (offset"},
      {Build("[1,2]   ", ""), "not a JSON object"},
      {Build(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight), "needs 12 bytes"},
      {Build(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", eight), "past the end of the data"},
      {Build(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight), "end before they begin"},
      {Build(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight), "non-negative"},
      {Build(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", eight), "non-negative"},
      {Build(R"({"w":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})", eight), "unknown dtype"},
      {Build(R"({"w":{"dtype":"F32","shape":[2]}})", eight), "data_offsets"},
      {Build(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", eight), "dtype"},
      {Build(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})", eight),
       "overflows"},
      {Build(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", std::string(12, '\0')),
       "overlaps"},
      {Build("{\"w\":[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]}", ""), "nests too deeply"},
      {Build(R"({"__metadata__":[1]})", ""), "__metadata__"},
  };
  for (const Case& c : cases) {
    Status s = ParseString(c.bytes, "bad.safetensors");
    ASSERT_FALSE(s.ok()) << c.expect;
    EXPECT_NE(s.message().find("bad.safetensors"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << s.message();
  }
  // Errors about a tensor name it; unsupported dtypes open but GetTensor refuses them.
  Status s = ParseString(Build(R"({"w.q":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight));
  EXPECT_NE(s.message().find("'w.q'"), std::string::npos);
  std::string fp8 = Build(R"({"f8":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", eight);
  auto f = SafetensorsFile::Parse((const uint8_t*)fp8.data(), fp8.size(), "fp8.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_FALSE((*f)->GetTensor("f8").ok());
}

// A header whose length is not a multiple of 8 leaves f32 data misaligned; Tensor::aligned says so
// (the HF loader copies such tensors instead of handing out misaligned float pointers).
TEST(Safetensors, MisalignedDataIsReported) {
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_NE((8 + header.size()) % 4, 0u);
  std::vector<uint64_t> storage(16);  // 8-byte aligned base
  std::string bytes = Build(header, std::string(8, '\0'));
  std::memcpy(storage.data(), bytes.data(), bytes.size());
  auto f = SafetensorsFile::Parse((const uint8_t*)storage.data(), bytes.size(), "odd.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().message();
  auto t = (*f)->GetTensor("w");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->aligned());
}

TEST(Safetensors, EveryTruncationIsAnError) {
  auto mf = MappedFile::Open(FormatsFixture("python_written.safetensors"));
  ASSERT_TRUE(mf.ok());
  for (size_t cut = 0; cut < (*mf)->size(); ++cut) {
    std::vector<uint8_t> buf((*mf)->data(), (*mf)->data() + cut);
    auto f = SafetensorsFile::Parse(buf.data(), buf.size(), "cut.safetensors");
    ASSERT_FALSE(f.ok()) << "cut at " << cut;
  }
}

TEST(SafetensorsSet, ShardedDirectory) {
  std::string dir = FormatsFixture("tiny_qwen2_hf_sharded");
  auto set = SafetensorsSet::Open(dir);
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ((*set)->files().size(), 3u);
  EXPECT_NE((*set)->source().find("model.safetensors.index.json"), std::string::npos);
  std::set<const SafetensorsFile*> shards;
  for (const std::string& n : (*set)->TensorNames()) {
    auto t = (*set)->GetTensor(n);
    ASSERT_TRUE(t.ok()) << t.status().message();
    shards.insert((*set)->FileFor(n));
  }
  EXPECT_EQ(shards.size(), 3u);
  EXPECT_TRUE((*set)->Has("model.layers.1.self_attn.k_proj.bias"));
  auto missing = (*set)->GetTensor("lm_head.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("index.json: missing tensor 'lm_head.weight'"), std::string::npos)
      << missing.status().message();

  // A single file and a folder holding model.safetensors work too.
  auto single = SafetensorsSet::Open(FormatsFixture("tiny_llama_hf"));
  ASSERT_TRUE(single.ok()) << single.status().message();
  EXPECT_TRUE((*single)->Has("lm_head.weight"));
  EXPECT_FALSE(SafetensorsSet::Open(FormatsFixture("")).ok());
}

TEST(SafetensorsSet, BadIndexes) {
  std::string dir = MakeTempDir();
  std::string shard = FormatsFixture("tiny_qwen2_hf_sharded/model-00001-of-00003.safetensors");
  ASSERT_EQ(symlink(shard.c_str(), (dir + "/a.safetensors").c_str()), 0);
  auto open_with = [&](const std::string& index) {
    WriteFile(dir + "/model.safetensors.index.json", index);
    return SafetensorsSet::Open(dir).status();
  };
  Status s = open_with(R"({"weight_map":{"model.embed_tokens.weight":"missing.safetensors"}})");
  EXPECT_NE(s.message().find("missing.safetensors"), std::string::npos) << s.message();
  s = open_with(R"({"weight_map":{"model.norm.weight":"a.safetensors"}})");
  EXPECT_NE(s.message().find("does not contain it"), std::string::npos) << s.message();
  s = open_with(R"({"weight_map":{"x":"../a.safetensors"}})");
  EXPECT_NE(s.message().find("not a plain file name"), std::string::npos) << s.message();
  s = open_with(R"({"nothing":{}})");
  EXPECT_NE(s.message().find("weight_map"), std::string::npos) << s.message();
  s = open_with(R"({"weight_map":{"model.embed_tokens.weight":"a.safetensors"}})");
  EXPECT_TRUE(s.ok()) << s.message();
}

}  // namespace
}  // namespace lathe::formats
