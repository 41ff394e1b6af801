// llama.cpp's other block types (Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) against references
// nobody here wrote (tools/ref/make_kquant_fixture.py): random blocks decoded exactly as gguf-py
// decodes them, on every tier; and a model quantized by llama.cpp's llama-quantize (one type per
// tensor) whose logits match transformers reading the same file: prompt rows with f32
// activations within 2e-4, decode rows (the int8 GEMV kernels) within the int8 bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/cpu.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/reference.h"
#include "model/load_gguf.h"
#include "model/transformer.h"
#include "test_util.h"

namespace lathe::model {
namespace {

std::string QuantFixtureDir() { return lathe::testing::SourceDir() + "/tests/golden/fixtures/ggml_quant/"; }

const std::pair<const char*, DType> kTypes[] = {
    {"q5_0", DType::kQ5_0}, {"q5_1", DType::kQ5_1}, {"q2_k", DType::kQ2_K}, {"q3_k", DType::kQ3_K},
    {"q4_k", DType::kQ4_K}, {"q5_k", DType::kQ5_K}, {"q6_k", DType::kQ6_K},
};

TEST(GgmlQuantGolden, BlocksDecodeAsGgufPy) {
  auto st = formats::SafetensorsFile::Open(QuantFixtureDir() + "blocks.safetensors");
  ASSERT_TRUE(st.ok()) << st.status().message();
  for (const auto& [name, dt] : kTypes) {
    Tensor blocks = (*st)->GetTensor(std::string(name) + ".blocks").value();
    Tensor values = (*st)->GetTensor(std::string(name) + ".values").value();
    const DTypeInfo& info = GetDTypeInfo(dt);
    ASSERT_EQ(blocks.numel() % info.block_bytes, 0) << name;
    const int64_t n = blocks.numel() / info.block_bytes * info.block_size;
    ASSERT_EQ(values.numel(), n) << name;
    std::vector<float> out(n, -1.0f);
    kernels::ref::DequantizeRow(dt, blocks.data, n, out.data());
    EXPECT_EQ(std::memcmp(out.data(), values.data, n * sizeof(float)), 0) << name << ": not bit-identical";
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += out[i] != values.as<float>()[i];
    EXPECT_EQ(bad, 0) << name;
    // Every tier this CPU has: the dequantizing kernel (prefill and training panels) too.
    for (IsaTier tier : {IsaTier::kScalar, IsaTier::kAvx2, IsaTier::kAvx512}) {
      if (tier > BestIsaTier()) continue;
      std::vector<float> rows(n, -1.0f);
      const int64_t K = info.block_size * 2, rb = (int64_t)DTypeBytes(dt, K);
      kernels::cpu::KernelsFor(tier).mm.dequant_rows(dt, (const uint8_t*)blocks.data, rb, n / K, K, rows.data(), K);
      EXPECT_EQ(rows, out) << name << " " << IsaTierName(tier);
    }
  }
}

TEST(GgmlQuantGolden, LlamaQuantizeModelMatchesTransformers) {
  const std::string dir = QuantFixtureDir();
  std::ifstream in(lathe::testing::SourceDir() + "/tests/golden/fixtures/MANIFEST.json");
  const nlohmann::json fx = nlohmann::json::parse(in)["fixtures"]["ggml_quant"];
  auto st = formats::SafetensorsFile::Open(dir + "expected.safetensors");
  ASSERT_TRUE(st.ok()) << st.status().message();
  Tensor ids_t = (*st)->GetTensor("input_ids").value();
  Tensor want = (*st)->GetTensor("logits").value();
  std::vector<int32_t> ids(ids_t.as<int64_t>(), ids_t.as<int64_t>() + ids_t.numel());
  auto g = formats::GgufFile::Open(dir + "model.gguf");
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto w = LoadGgufWeights(std::shared_ptr<formats::GgufFile>(std::move(*g)));
  ASSERT_TRUE(w.ok()) << w.status().message();
  // The file holds every type (llama-quantize did what it was asked).
  std::vector<DType> seen;
  for (const Tensor* t : {&w->tok_embd, &w->output, &w->layers[0].wq, &w->layers[0].wk, &w->layers[0].wv,
                          &w->layers[0].wo, &w->layers[0].w_gate, &w->layers[0].w_up, &w->layers[0].w_down})
    seen.push_back(t->dtype);
  for (const auto& [name, dt] : kTypes) EXPECT_NE(std::find(seen.begin(), seen.end(), dt), seen.end()) << name;

  const int64_t V = w->config.vocab_size, T = (int64_t)ids.size();
  ASSERT_EQ(want.numel(), T * V);
  const float* ref = want.as<float>();
  ThreadPool pool(2);
  for (bool exact : {true, false}) {
    TransformerOptions opts;
    opts.exact_activations = exact;
    Transformer tf(*w, pool, opts);
    KvCache cache(w->config, 1, T);
    std::vector<float> lg;
    double worst = 0, num = 0, den = 0;
    int top1 = 0;
    if (exact) {  // the prompt in one pass
      SeqInput s{0, ids, true};
      ASSERT_TRUE(tf.Forward(cache, {&s, 1}, &lg).ok());
    } else {  // token by token: decode rows, int8 activations through the GEMV kernels
      std::vector<float> step;
      for (int64_t t = 0; t < T; ++t) {
        SeqInput s{0, {&ids[t], 1}, false, 1};
        ASSERT_TRUE(tf.Forward(cache, {&s, 1}, &step).ok());
        lg.insert(lg.end(), step.begin(), step.end());
      }
    }
    ASSERT_EQ((int64_t)lg.size(), T * V);
    for (int64_t t = 0; t < T; ++t) {
      const float* row = &lg[t * V];
      const float* r = ref + t * V;
      for (int64_t v = 0; v < V; ++v) {
        worst = std::max(worst, (double)std::fabs(row[v] - r[v]));
        num += ((double)row[v] - r[v]) * ((double)row[v] - r[v]);
        den += (double)r[v] * r[v];
      }
      top1 += (std::max_element(row, row + V) - row) == (std::max_element(r, r + V) - r);
    }
    const nlohmann::json& tol = fx["tolerances"][exact ? "f32_activations" : "int8_activations"];
    const double atol = tol["logits_atol"];
    EXPECT_LE(worst, atol) << (exact ? "f32" : "int8") << " activations";
    if (exact) {
      EXPECT_EQ(top1, T);
    } else {
      EXPECT_LE(std::sqrt(num / den), tol["normalized"].get<double>());
      EXPECT_GE(top1, tol["top1_min_agree"].get<int>());
    }
    std::printf("%s activations: max |logit - transformers| = %.3g (atol %.3g), normalized %.3g, top-1 agrees "
                "at %d of %d\n", exact ? "f32" : "int8", worst, atol, std::sqrt(num / den), top1, (int)T);
  }
}

}  // namespace
}  // namespace lathe::model
