// Helpers for the TrainModel tests: the fixtures of tools/ref/make_train_fixture.py, base models,
// HF <-> Meta q/k row order, normalized errors.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "model/load_hf.h"
#include "model/load_llama2c.h"
#include "core/thread_pool.h"
#include "model/train_model.h"
#include "test_util.h"

namespace lathe::model::train_test {

// A TrainModel over `w`, or nullptr (a failed expectation) when its options are refused.
inline std::unique_ptr<TrainModel> Make(const ModelWeights& w, ThreadPool& pool, TrainModelOptions o) {
  auto m = TrainModel::Create(w, pool, o);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(*m) : nullptr;
}

// Appended, not `SourceDir() + "..."`: GCC 12 warns falsely (-Warray-bounds) on that temporary here.
inline std::string Fixtures() {
  std::string dir = lathe::testing::SourceDir();
  dir += "/tests/golden/fixtures/";
  return dir;
}
inline std::string StoriesBin() { return lathe::testing::SharedPath("models/stories260K/stories260K.bin"); }

// Base weights by fixture name ("stories260k" = the llama2.c .bin, Meta layout).
inline Result<ModelWeights> LoadBase(const std::string& name) {
  if (name == "stories260k") return LoadLlama2cBin(StoriesBin());
  return LoadHfModelDir(Fixtures() + name + "/model");
}

class Fixture {
 public:
  explicit Fixture(const std::string& dir) {
    auto f = formats::SafetensorsFile::Open(Fixtures() + dir + "/expected.safetensors");
    EXPECT_TRUE(f.ok()) << f.status().message();
    if (f.ok()) file_ = std::move(*f);
  }
  bool ok() const { return file_ != nullptr; }
  bool Has(const std::string& n) const { return file_ && file_->FindTensor(n); }
  std::vector<float> F32(const std::string& n) const {
    Tensor t = Get(n);
    if (t.dtype == DType::kF64) {
      std::vector<float> v(t.numel());
      for (size_t i = 0; i < v.size(); ++i) v[i] = (float)t.as<double>()[i];
      return v;
    }
    return std::vector<float>(t.as<float>(), t.as<float>() + t.numel());
  }
  double F64(const std::string& n) const {
    Tensor t = Get(n);
    if (t.dtype == DType::kI64) return (double)t.as<int64_t>()[0];
    return t.dtype == DType::kF64 ? t.as<double>()[0] : (double)t.as<float>()[0];
  }
  std::vector<int32_t> I32(const std::string& n) const {
    Tensor t = Get(n);
    std::vector<int32_t> v(t.numel());
    for (size_t i = 0; i < v.size(); ++i) v[i] = (int32_t)t.as<int64_t>()[i];
    return v;
  }
  std::vector<int64_t> Shape(const std::string& n) const { return Get(n).shape; }

 private:
  Tensor Get(const std::string& n) const {
    auto t = file_->GetTensor(n);
    EXPECT_TRUE(t.ok()) << n;
    return t.ok() ? *t : Tensor{};
  }
  std::unique_ptr<formats::SafetensorsFile> file_;
};

// Rows of a (heads * hd, cols) q/k matrix: HF half-split order -> Meta interleaved, and back.
inline std::vector<float> HfToMeta(const float* src, int64_t heads, int64_t hd, int64_t cols) {
  std::vector<float> p(heads * hd * cols);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < hd / 2; ++j) {
      std::memcpy(&p[(h * hd + 2 * j) * cols], &src[(h * hd + j) * cols], cols * 4);
      std::memcpy(&p[(h * hd + 2 * j + 1) * cols], &src[(h * hd + hd / 2 + j) * cols], cols * 4);
    }
  return p;
}
inline std::vector<float> MetaToHf(const float* src, int64_t heads, int64_t hd, int64_t cols) {
  std::vector<float> p(heads * hd * cols);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < hd / 2; ++j) {
      std::memcpy(&p[(h * hd + j) * cols], &src[(h * hd + 2 * j) * cols], cols * 4);
      std::memcpy(&p[(h * hd + hd / 2 + j) * cols], &src[(h * hd + 2 * j + 1) * cols], cols * 4);
    }
  return p;
}

// Heads of a q/k output dimension named by a parameter ("...q_proj.lora_B..." / "...k_proj.weight"),
// 0 when the tensor's rows are not q/k outputs.
inline int64_t QkHeads(const std::string& name, const ModelConfig& c) {
  bool rows_out = name.find("lora_A") == std::string::npos;
  if (!rows_out) return 0;
  if (name.find("q_proj") != std::string::npos) return c.n_heads;
  if (name.find("k_proj") != std::string::npos) return c.n_kv_heads;
  return 0;
}

// A parameter's value or gradient in HF layout (q/k rows permuted back for interleaved bases).
inline std::vector<float> ToHfLayout(const TrainableTensor& t, const float* v, const ModelConfig& c) {
  int64_t heads = QkHeads(t.name, c);
  if (c.rope_style != RopeStyle::kInterleaved || heads == 0) return std::vector<float>(v, v + t.n);
  return MetaToHf(v, heads, c.head_dim, t.n / (heads * c.head_dim));
}

// Sets every LoRA parameter from "<prefix><name>" (HF layout).
inline void SetParams(TrainModel& m, const Fixture& f, const std::string& prefix) {
  const ModelConfig& c = m.config();
  for (const TrainableTensor& t : m.params()) {
    std::vector<float> v = f.F32(prefix + t.name);
    ASSERT_EQ((int64_t)v.size(), t.n) << t.name;
    int64_t heads = QkHeads(t.name, c);
    if (c.rope_style == RopeStyle::kInterleaved && heads) v = HfToMeta(v.data(), heads, c.head_dim, t.n / (heads * c.head_dim));
    std::memcpy(t.data, v.data(), t.n * 4);
  }
}

inline double NormErr(const float* a, const float* b, int64_t n) {
  double d = 0, s = 0;
  for (int64_t i = 0; i < n; ++i) {
    d = std::max(d, (double)std::fabs((double)a[i] - (double)b[i]));
    s = std::max(s, (double)std::fabs((double)b[i]));
  }
  return s > 0 ? d / s : d;
}

struct Batch {
  std::vector<int32_t> ids, labels, seg;
  int64_t B = 0, T = 0;
  TrainBatch View() const { return TrainBatch{ids, labels, seg, B, T}; }
};

inline Batch FixtureBatch(const Fixture& f, const std::string& ids = "input_ids", const std::string& labels = "labels",
                          const std::string& seg = "") {
  Batch b;
  b.ids = f.I32(ids);
  b.labels = f.I32(labels);
  if (!seg.empty()) b.seg = f.I32(seg);
  auto shape = f.Shape(ids);
  b.B = shape[0];
  b.T = shape[1];
  return b;
}


}  // namespace lathe::model::train_test
