// `lathe merge` (tools/merge.cc) against PEFT: merging the committed PEFT adapters into the random llama fixture gives
// PEFT merge_and_unload()'s weights (tools/ref/make_lora_fixture.py) and PEFT's logits with the adapter; a GGUF base
// (stories260K, Meta's interleaved Q/K rows) merged gives the logits of the base with the adapter applied at run time;
// HF shards, dtypes and the copied files; errors name what is wrong and leave nothing half-written.
#include "tools/merge.h"

#include "tools/export.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/mapped_file.h"
#include "core/strings.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/load_gguf.h"
#include "model/load_hf.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "test_util.h"

namespace lathe::tools {
namespace {

namespace fs = std::filesystem;
using lathe::testing::ScopedTempDir;

std::string Fixtures() { return lathe::testing::SourceDir() + "/tests/golden/fixtures/"; }
std::string Stories() { return lathe::testing::SharedPath("models/stories260K/stories260K.gguf"); }

std::vector<float> Logits(const model::ModelWeights& w, const model::LoraAdapter* a, const std::vector<int32_t>& ids) {
  ThreadPool pool(2);
  model::TransformerOptions o;
  o.adapter = a;
  model::Transformer tf(w, pool, o);
  model::KvCache cache(w.config, 1, (int64_t)ids.size());
  std::vector<float> lg;
  model::SeqInput in{0, ids, true};
  EXPECT_TRUE(tf.Forward(cache, {&in, 1}, &lg).ok());
  return lg;
}

double MaxAbs(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, (double)std::fabs(a[i] - b[i]));
  return m;
}

// ||a - b|| / ||b||.
double RelRms(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    n += (double)b[i] * b[i];
  }
  return std::sqrt(e / n);
}

std::vector<float> F32(const Tensor& t) {
  std::vector<float> v(t.numel());
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = t.dtype == DType::kF32 ? t.as<float>()[i] : BF16ToF32(t.as<uint16_t>()[i]);
  return v;
}

std::string Read(const std::string& path) {
  auto s = ReadFileToString(path);
  EXPECT_TRUE(s.ok()) << path;
  return s.ok() ? *s : "";
}

class MergePeft : public ::testing::TestWithParam<std::string> {};

// The merged linears equal PEFT's merge_and_unload() (f32: within 1e-6 of weights up to ~0.5, the rank-4 sums'
// rounding), every other tensor and file is the base's, and the merged folder alone gives PEFT's adapter logits.
TEST_P(MergePeft, HfFolderEqualsPeftMergeAndUnload) {
  const std::string name = GetParam(), base = Fixtures() + "llama_gqa_tied/model";
  ScopedTempDir tmp;
  const std::string out = tmp.path + "/merged";
  ThreadPool pool(2);
  auto r = MergeLora(base, {Fixtures() + name + "/adapter"}, out, {}, pool);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->format, "hf");
  EXPECT_EQ(r->merged, 14);  // 2 layers x 7 linears
  EXPECT_EQ(r->files, 3);    // model.safetensors, config.json, generation_config.json

  auto got = formats::SafetensorsFile::Open(out + "/model.safetensors");
  auto peft = formats::SafetensorsFile::Open(Fixtures() + name + "/merged.safetensors");
  auto orig = formats::SafetensorsFile::Open(base + "/model.safetensors");
  ASSERT_TRUE(got.ok() && peft.ok() && orig.ok());
  ASSERT_EQ((*got)->tensors().size(), (*orig)->tensors().size());
  int compared = 0;
  for (const auto& ti : (*got)->tensors()) {
    Tensor t = (*got)->GetTensor(ti.name).value();
    Tensor o = (*orig)->GetTensor(ti.name).value();
    ASSERT_EQ(t.dtype, DType::kF32) << ti.name;
    if ((*peft)->FindTensor(ti.name)) {
      EXPECT_LT(MaxAbs(F32(t), F32((*peft)->GetTensor(ti.name).value())), 1e-6) << ti.name;
      EXPECT_GT(MaxAbs(F32(t), F32(o)), 1e-3) << ti.name << " unchanged";
      ++compared;
    } else {
      EXPECT_EQ(std::memcmp(t.data, o.data, t.nbytes()), 0) << ti.name;
    }
  }
  EXPECT_EQ(compared, 14);
  for (const char* f : {"config.json", "generation_config.json"}) EXPECT_EQ(Read(out + "/" + f), Read(base + "/" + f));

  auto w = model::LoadHfModelDir(out);
  ASSERT_TRUE(w.ok()) << w.status().message();
  auto exp = formats::SafetensorsFile::Open(Fixtures() + name + "/expected.safetensors");
  ASSERT_TRUE(exp.ok());
  Tensor ids_t = (*exp)->GetTensor("input_ids").value();
  std::vector<int32_t> ids(ids_t.as<int64_t>(), ids_t.as<int64_t>() + ids_t.numel());
  EXPECT_LT(MaxAbs(Logits(*w, nullptr, ids), F32((*exp)->GetTensor("logits").value())), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MergePeft, ::testing::Values("lora_llama_gqa_tied", "rslora_llama_gqa_tied"));

// --dtype bf16: every tensor bf16 (the merged ones PEFT's f32 merge rounded once), config.json says so.
TEST(MergeHf, Bf16Output) {
  const std::string base = Fixtures() + "llama_gqa_tied/model", name = "lora_llama_gqa_tied";
  ScopedTempDir tmp;
  ThreadPool pool(2);
  MergeOptions o;
  o.dtype = "bf16";
  auto r = MergeLora(base, {Fixtures() + name + "/adapter"}, tmp.path, o, pool);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->dtype, "bfloat16");
  auto got = formats::SafetensorsFile::Open(tmp.path + "/model.safetensors");
  auto peft = formats::SafetensorsFile::Open(Fixtures() + name + "/merged.safetensors");
  ASSERT_TRUE(got.ok() && peft.ok());
  for (const auto& ti : (*got)->tensors()) ASSERT_EQ(ti.dtype, DType::kBF16) << ti.name;
  for (const auto& ti : (*peft)->tensors()) {
    std::vector<float> want = F32((*peft)->GetTensor(ti.name).value());
    std::vector<float> have = F32((*got)->GetTensor(ti.name).value());
    double worst = 0;  // in bf16 steps of the value: at most one (PEFT's f32 and ours differ in the last bits)
    for (size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::fabs(have[i] - want[i]) / std::max(std::ldexp((double)std::fabs(want[i]), -8), 1e-30));
    EXPECT_LE(worst, 1.0) << ti.name;
  }
  const std::string cfg = Read(tmp.path + "/config.json");
  EXPECT_NE(cfg.find("\"dtype\": \"bfloat16\""), std::string::npos) << cfg;
  EXPECT_EQ(cfg.find("float32"), std::string::npos) << cfg;
  auto w = model::LoadHfModelDir(tmp.path);
  ASSERT_TRUE(w.ok()) << w.status().message();
}

// A sharded base (model.safetensors.index.json) keeps its shards and index; the weights are those of the
// single-file merge.
TEST(MergeHf, ShardedBaseKeepsItsShards) {
  const std::string base = Fixtures() + "llama_gqa_tied/model", adapter = Fixtures() + "lora_llama_gqa_tied/adapter";
  ScopedTempDir tmp;
  const std::string sharded = tmp.path + "/base";
  fs::create_directories(sharded);
  for (const char* f : {"config.json", "generation_config.json"}) fs::copy_file(base + "/" + f, sharded + "/" + f);
  auto src = formats::SafetensorsFile::Open(base + "/model.safetensors");
  ASSERT_TRUE(src.ok());
  std::vector<formats::SafetensorsWriteEntry> shard[2];
  std::string map;
  for (const auto& ti : (*src)->tensors()) {
    const int s = ti.name.find("layers.1.") != std::string::npos ? 1 : 0;
    Tensor t = (*src)->GetTensor(ti.name).value();
    shard[s].push_back({ti.name, ti.dtype, ti.shape, t.data, (size_t)ti.nbytes});
    map += std::string(map.empty() ? "" : ",") + "\"" + ti.name + "\": \"model-0000" + std::to_string(s + 1) +
           "-of-00002.safetensors\"";
  }
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(formats::WriteSafetensors(sharded + "/model-0000" + std::to_string(s + 1) + "-of-00002.safetensors",
                                          shard[s], {{"format", "pt"}})
                    .ok());
  }
  std::ofstream(sharded + "/model.safetensors.index.json")
      << "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {" << map << "}}";
  ThreadPool pool(2);
  auto one = MergeLora(base, {adapter}, tmp.path + "/one", {}, pool);
  auto two = MergeLora(sharded, {adapter}, tmp.path + "/two", {}, pool);
  ASSERT_TRUE(one.ok() && two.ok()) << one.status().message() << two.status().message();
  EXPECT_EQ(two->files, 5);  // 2 shards, the index, config.json, generation_config.json
  for (int s = 1; s <= 2; ++s)
    EXPECT_TRUE(fs::exists(tmp.path + "/two/model-0000" + std::to_string(s) + "-of-00002.safetensors"));
  const std::string index = Read(tmp.path + "/two/model.safetensors.index.json");
  EXPECT_NE(index.find("\"total_size\": " + std::to_string(two->bytes_out)), std::string::npos) << index;
  auto a = formats::SafetensorsSet::Open(tmp.path + "/one");
  auto b = formats::SafetensorsSet::Open(tmp.path + "/two");
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
  ASSERT_EQ((*a)->TensorNames(), (*b)->TensorNames());
  for (const std::string& n : (*a)->TensorNames()) {
    Tensor x = (*a)->GetTensor(n).value(), y = (*b)->GetTensor(n).value();
    ASSERT_EQ(x.nbytes(), y.nbytes());
    EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes()), 0) << n;
  }
}

// Two adapters merge in order, their changes summed in f32 and rounded once: the same weights, within f32 rounding,
// as merging the first and then the second into that result (what LLaMA-Factory's export does with a list).
TEST(MergeHf, SeveralAdaptersInOrder) {
  const std::string base = Fixtures() + "llama_gqa_tied/model";
  const std::string a1 = Fixtures() + "lora_llama_gqa_tied/adapter", a2 = Fixtures() + "rslora_llama_gqa_tied/adapter";
  ScopedTempDir tmp;
  ThreadPool pool(2);
  auto both = MergeLora(base, {a1, a2}, tmp.path + "/both", {}, pool);
  ASSERT_TRUE(both.ok()) << both.status().message();
  EXPECT_EQ(both->merged, 14);
  ASSERT_TRUE(MergeLora(base, {a1}, tmp.path + "/first", {}, pool).ok());
  ASSERT_TRUE(MergeLora(tmp.path + "/first", {a2}, tmp.path + "/second", {}, pool).ok());
  auto x = formats::SafetensorsFile::Open(tmp.path + "/both/model.safetensors");
  auto y = formats::SafetensorsFile::Open(tmp.path + "/second/model.safetensors");
  auto one = formats::SafetensorsFile::Open(tmp.path + "/first/model.safetensors");
  ASSERT_TRUE(x.ok() && y.ok() && one.ok());
  for (const auto& ti : (*x)->tensors()) {
    std::vector<float> a = F32((*x)->GetTensor(ti.name).value()), b = F32((*y)->GetTensor(ti.name).value());
    EXPECT_LT(MaxAbs(a, b), 1e-6) << ti.name;
    if (ti.name.find("proj") != std::string::npos) {  // the second adapter did change it
      EXPECT_GT(MaxAbs(a, F32((*one)->GetTensor(ti.name).value())), 1e-3) << ti.name;
    }
  }
}

// max_shard_bytes reshards as save_pretrained(max_shard_size=) does: tensors in the base's order, a new shard when
// the next one would pass the limit, model-0000i-of-0000n names and an index naming every tensor's shard; the
// weights are those of the unsharded merge.
TEST(MergeHf, ReshardsToAMaximumSize) {
  const std::string base = Fixtures() + "llama_gqa_tied/model", adapter = Fixtures() + "lora_llama_gqa_tied/adapter";
  ScopedTempDir tmp;
  ThreadPool pool(2);
  MergeOptions o;
  o.max_shard_bytes = 100000;
  auto r = MergeLora(base, {adapter}, tmp.path + "/sharded", o, pool);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(MergeLora(base, {adapter}, tmp.path + "/one", {}, pool).ok());
  const std::string index = Read(tmp.path + "/sharded/model.safetensors.index.json");
  EXPECT_NE(index.find("\"total_size\": " + std::to_string(r->bytes_out)), std::string::npos) << index;
  const int64_t n = r->files - 3;  // + index, config.json, generation_config.json
  ASSERT_GE(n, 3);
  uint64_t sum = 0;
  for (int64_t i = 1; i <= n; ++i) {
    const std::string name = StrFormat("model-%05lld-of-%05lld.safetensors", (long long)i, (long long)n);
    auto f = formats::SafetensorsFile::Open(tmp.path + "/sharded/" + name);
    ASSERT_TRUE(f.ok()) << name;
    uint64_t bytes = 0;
    for (const auto& ti : (*f)->tensors()) {
      bytes += ti.nbytes;
      EXPECT_NE(index.find("\"" + ti.name + "\": \"" + name + "\""), std::string::npos) << ti.name;
    }
    EXPECT_TRUE(bytes <= o.max_shard_bytes || (*f)->tensors().size() == 1) << name << " " << bytes;
    sum += bytes;
  }
  EXPECT_EQ(sum, r->bytes_out);
  auto a = formats::SafetensorsSet::Open(tmp.path + "/sharded");
  auto b = formats::SafetensorsSet::Open(tmp.path + "/one");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().message();
  ASSERT_EQ((*a)->TensorNames(), (*b)->TensorNames());
  for (const std::string& name : (*a)->TensorNames()) {
    Tensor x = (*a)->GetTensor(name).value(), y = (*b)->GetTensor(name).value();
    EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes()), 0) << name;
  }
  EXPECT_TRUE(model::LoadHfModelDir(tmp.path + "/sharded").ok());

  // Merged again into the same folder as one file: the earlier shards and index go (a loader would read the index
  // and the old weights), and the folder holds what the single-file merge holds.
  ASSERT_TRUE(MergeLora(base, {adapter}, tmp.path + "/sharded", {}, pool).ok());
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(tmp.path + "/sharded")) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors"}));
}

// A PEFT adapter for a model's shapes (r 4, alpha 8, all seven modules), seeded N(0, 0.1^2) A and B.
void WriteRandomAdapter(const std::string& dir, const model::ModelConfig& c) {
  fs::create_directories(dir);
  std::ofstream(dir + "/adapter_config.json")
      << R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj",
         "o_proj", "gate_proj", "up_proj", "down_proj"], "task_type": "CAUSAL_LM"})";
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.1f);
  std::deque<std::vector<float>> keep;
  std::vector<formats::SafetensorsWriteEntry> e;
  const int64_t r = 4;
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int m = 0; m < 7; ++m) {
      const int64_t in = m == 3 ? c.q_dim() : m == 6 ? c.ffn_dim : c.dim;
      const int64_t out = m == 0 ? c.q_dim() : m <= 2 ? c.kv_dim() : m <= 3 || m == 6 ? c.dim : c.ffn_dim;
      const std::string key = "base_model.model.model.layers." + std::to_string(l) + (m <= 3 ? ".self_attn." : ".mlp.") +
                              model::LoraModuleName((model::LoraModule)m);
      for (auto [suffix, shape] : {std::pair<const char*, std::vector<int64_t>>{".lora_A.weight", {r, in}},
                                   {".lora_B.weight", {out, r}}}) {
        keep.emplace_back(shape[0] * shape[1]);
        for (float& v : keep.back()) v = nd(rng);
        e.push_back({key + suffix, DType::kF32, shape, keep.back().data(), keep.back().size() * 4});
      }
    }
  ASSERT_TRUE(formats::WriteSafetensors(dir + "/adapter_model.safetensors", e).ok());
}

// A GGUF base: stories260K keeps Q/K in Meta's interleaved rows, which the adapter's B rows follow. The merged file
// (f32, the base's own type) alone gives the logits of the base with the adapter applied at run time; the tensors the
// adapter does not touch keep their bytes; --dtype q8_0 writes a q8_0 file whose logits stay near.
TEST(MergeGguf, EqualsTheBaseWithTheAdapter) {
  LATHE_REQUIRE_FILE(Stories());
  ScopedTempDir tmp;
  auto gg = formats::GgufFile::Open(Stories());
  ASSERT_TRUE(gg.ok());
  auto base = model::LoadGgufWeights(std::shared_ptr<formats::GgufFile>(std::move(*gg)));
  ASSERT_TRUE(base.ok()) << base.status().message();
  ASSERT_EQ(base->config.rope_style, model::RopeStyle::kInterleaved);
  WriteRandomAdapter(tmp.path + "/adapter", base->config);
  auto adapter = model::LoadPeftAdapter(tmp.path + "/adapter", base->config);
  ASSERT_TRUE(adapter.ok()) << adapter.status().message();
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 6, 15, 100, 300, 2};
  const std::vector<float> want = Logits(*base, adapter->get(), ids);
  ASSERT_GT(MaxAbs(want, Logits(*base, nullptr, ids)), 1e-2);  // the adapter matters

  ThreadPool pool(2);
  const std::string out = tmp.path + "/merged.gguf";
  auto r = MergeLora(Stories(), {tmp.path + "/adapter"}, out, {}, pool);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->format, "gguf");
  EXPECT_EQ(r->dtype, "f32");
  EXPECT_EQ(r->merged, 35);
  auto mg = formats::GgufFile::Open(out);
  ASSERT_TRUE(mg.ok());
  auto src = formats::GgufFile::Open(Stories());
  for (const char* n : {"token_embd.weight", "blk.0.attn_norm.weight", "output_norm.weight"}) {
    Tensor a = (*mg)->GetTensor(n).value(), b = (*src)->GetTensor(n).value();
    ASSERT_EQ(a.nbytes(), b.nbytes());
    EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0) << n;
  }
  auto merged = model::LoadGgufWeights(std::shared_ptr<formats::GgufFile>(std::move(*mg)));
  ASSERT_TRUE(merged.ok());
  // f32 both ways, summed in another order (x (W + s B A)^T against x W^T + s (x A^T) B^T): 2.5e-6 of the largest
  // logit (16.2) measured; a B row in the wrong place would move them by the adapter's share, ~1e-1.
  EXPECT_LT(MaxAbs(Logits(*merged, nullptr, ids), want), 1e-5 * MaxAbs(want, std::vector<float>(want.size())));

  MergeOptions q8;
  q8.dtype = "q8_0";
  auto rq = MergeLora(Stories(), {tmp.path + "/adapter"}, tmp.path + "/q8.gguf", q8, pool);
  ASSERT_TRUE(rq.ok()) << rq.status().message();
  auto qg = formats::GgufFile::Open(tmp.path + "/q8.gguf");
  ASSERT_TRUE(qg.ok());
  EXPECT_EQ((*qg)->GetInt("general.file_type").value(), 7);
  EXPECT_EQ((*qg)->FindTensor("blk.2.ffn_up.weight")->dtype, DType::kQ8_0);
  auto qm = model::LoadGgufWeights(std::shared_ptr<formats::GgufFile>(std::move(*qg)));
  ASSERT_TRUE(qm.ok());
  // Q8_0's rounding of every matrix: ~0.8% RMS of the logits here.
  const double q = RelRms(Logits(*qm, nullptr, ids), want);
  EXPECT_GT(q, 0.0);
  EXPECT_LT(q, 0.02);
}

// The other HF architectures of the fixtures (Qwen2 with q/k/v biases, Llama 3 rope scaling, Mistral, an untied head
// with GQA 4): the merged folder alone gives the logits of the base with the adapter applied at run time, and the
// biases, norms and head pass through unchanged.
class MergeArch : public ::testing::TestWithParam<std::string> {};

TEST_P(MergeArch, HfFolderEqualsTheBaseWithTheAdapter) {
  const std::string base = Fixtures() + GetParam() + "/model";
  ScopedTempDir tmp;
  auto w = model::LoadHfModelDir(base);
  ASSERT_TRUE(w.ok()) << w.status().message();
  WriteRandomAdapter(tmp.path + "/adapter", w->config);
  auto adapter = model::LoadPeftAdapter(tmp.path + "/adapter", w->config);
  ASSERT_TRUE(adapter.ok()) << adapter.status().message();
  const std::vector<int32_t> ids = {1, 17, 42, 99, 7, 150, 3, 64, 128, 200, 11, 5};
  const std::vector<float> want = Logits(*w, adapter->get(), ids);
  ASSERT_GT(MaxAbs(want, Logits(*w, nullptr, ids)), 1e-2);
  ThreadPool pool(2);
  auto r = MergeLora(base, {tmp.path + "/adapter"}, tmp.path + "/merged", {}, pool);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->merged, 7 * w->config.n_layers);
  auto m = model::LoadHfModelDir(tmp.path + "/merged");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_LT(MaxAbs(Logits(*m, nullptr, ids), want), 1e-5 * MaxAbs(want, std::vector<float>(want.size())));
  auto a = formats::SafetensorsSet::Open(base);
  auto b = formats::SafetensorsSet::Open(tmp.path + "/merged");
  ASSERT_TRUE(a.ok() && b.ok());
  for (const std::string& n : (*a)->TensorNames()) {
    if (n.find("_proj.weight") != std::string::npos) continue;
    Tensor x = (*a)->GetTensor(n).value(), y = (*b)->GetTensor(n).value();
    EXPECT_TRUE(x.nbytes() == y.nbytes() && std::memcmp(x.data, y.data, x.nbytes()) == 0) << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MergeArch,
                         ::testing::Values("qwen2_bias", "llama3_rope", "mistral", "llama_gqa4_untied"));

// LLaMA-Factory's export config runs the same merge: export_size in GB (10^9 bytes) as the shard size, infer_dtype
// as the dtype; a GGUF base writes export_dir/model.gguf.
TEST(Export, LlamaFactoryConfigIsTheMerge) {
  const std::string base = Fixtures() + "llama_gqa_tied/model", adapter = Fixtures() + "lora_llama_gqa_tied/adapter";
  ScopedTempDir tmp;
  ThreadPool pool(2);
  auto c = ParseExportConfig("model_name_or_path: " + base + "\nadapter_name_or_path: " + adapter +
                                 "\ntemplate: default\nfinetuning_type: lora\nexport_dir: " + tmp.path +
                                 "/exported\nexport_size: 0.0001\nexport_device: cpu\nexport_legacy_format: false\n"
                                 "infer_dtype: bfloat16\n",
                             "export.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  std::string written;
  auto r = RunExport(*c, pool, &written);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(written, tmp.path + "/exported");
  EXPECT_EQ(r->merged, 14);
  MergeOptions o;
  o.dtype = "bf16";
  o.max_shard_bytes = 100000;
  ASSERT_TRUE(MergeLora(base, {adapter}, tmp.path + "/merged", o, pool).ok());
  for (const auto& e : fs::directory_iterator(tmp.path + "/merged"))
    EXPECT_TRUE(Read(e.path().string()) == Read(tmp.path + "/exported/" + e.path().filename().string()))
        << e.path().filename();
  if (lathe::testing::FileExists(Stories())) {
    ExportConfig g;
    g.model_name_or_path = Stories();
    g.export_dir = tmp.path + "/gguf";
    g.finetuning_type = "full";
    auto rg = RunExport(g, pool, &written);
    ASSERT_TRUE(rg.ok()) << rg.status().message();
    EXPECT_EQ(written, tmp.path + "/gguf/model.gguf");
    EXPECT_EQ(rg->merged, 0);
    // f32 in, f32 out, nothing merged: every tensor's bytes as in the base (in llama-quantize's tensor order).
    auto in = formats::GgufFile::Open(Stories());
    auto outg = formats::GgufFile::Open(written);
    ASSERT_TRUE(in.ok() && outg.ok());
    ASSERT_EQ((*in)->tensors().size(), (*outg)->tensors().size());
    for (const auto& ti : (*in)->tensors()) {
      Tensor a = (*in)->GetTensor(ti.name).value(), b = (*outg)->GetTensor(ti.name).value();
      EXPECT_TRUE(a.nbytes() == b.nbytes() && std::memcmp(a.data, b.data, a.nbytes()) == 0) << ti.name;
    }
  }
}

TEST(MergeErrors, NameWhatIsWrong) {
  const std::string base = Fixtures() + "llama_gqa_tied/model", adapter = Fixtures() + "lora_llama_gqa_tied/adapter";
  ScopedTempDir tmp;
  ThreadPool pool(1);
  auto msg = [&](const std::string& b, const std::string& a, const std::string& o, const std::string& dtype) {
    MergeOptions opt;
    opt.dtype = dtype;
    auto r = MergeLora(b, {a}, o, opt, pool);
    EXPECT_FALSE(r.ok()) << b << " " << o;
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(msg(base, adapter, base, "").find("base model's own folder"), std::string::npos);
  EXPECT_NE(msg(base, adapter, tmp.path + "/x", "q4_0").find("--dtype 'q4_0'"), std::string::npos);
  EXPECT_NE(msg(tmp.path + "/nothing", adapter, tmp.path + "/x", "").find("no such model"), std::string::npos);
  const std::string text = tmp.path + "/text.gguf";
  std::ofstream(text) << "not a model";
  EXPECT_NE(msg(text, adapter, tmp.path + "/x", "").find("GGUF file or an HF model folder"), std::string::npos);
  if (lathe::testing::FileExists(Stories())) {
    // An adapter made for other shapes names its file; a folder is no GGUF output.
    EXPECT_NE(msg(Stories(), adapter, tmp.path + "/s.gguf", "").find("adapter_model.safetensors"), std::string::npos);
    EXPECT_NE(msg(Stories(), adapter, tmp.path, "").find("not a folder"), std::string::npos);
  }
  // A base without a tensor the adapter changes: the error names it and nothing is written.
  const std::string partial = tmp.path + "/partial";
  fs::create_directories(partial);
  fs::copy_file(base + "/config.json", partial + "/config.json");
  auto src = formats::SafetensorsFile::Open(base + "/model.safetensors");
  ASSERT_TRUE(src.ok());
  std::vector<formats::SafetensorsWriteEntry> keep;
  for (const auto& ti : (*src)->tensors()) {
    if (ti.name == "model.layers.1.mlp.down_proj.weight") continue;
    keep.push_back({ti.name, ti.dtype, ti.shape, (*src)->GetTensor(ti.name).value().data, (size_t)ti.nbytes});
  }
  ASSERT_TRUE(formats::WriteSafetensors(partial + "/model.safetensors", keep).ok());
  const std::string m = msg(partial, adapter, tmp.path + "/out", "");
  EXPECT_NE(m.find("'model.layers.1.mlp.down_proj.weight'"), std::string::npos) << m;
  EXPECT_NE(m.find(adapter), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(tmp.path + "/out"));
}

}  // namespace
}  // namespace lathe::tools
