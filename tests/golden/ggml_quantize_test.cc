// `lathe convert` writes what llama.cpp's llama-quantize writes (tools/ref/make_quantize_fixture.py):
// the quantizers give its bytes for rows of many distributions, and the per-tensor type choice of
// each file type (q4_k_m's q6_k layers, the output head, the fallbacks for rows that are not whole
// blocks) equals its choice on two model layouts.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "kernels/kernels.h"
#include "test_util.h"
#include "tools/convert.h"

namespace lathe::tools {
namespace {

std::vector<std::string> SplitWords(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string QuantizeFixtureDir() { return lathe::testing::SourceDir() + "/tests/golden/fixtures/ggml_quantize/"; }

TEST(GgmlQuantizeGolden, RowsEqualLlamaQuantizeBytes) {
  auto st = formats::SafetensorsFile::Open(QuantizeFixtureDir() + "rows.safetensors");
  ASSERT_TRUE(st.ok()) << st.status().message();
  Tensor input = (*st)->GetTensor("input").value();
  ASSERT_EQ(input.shape.size(), 2u);
  const int64_t rows = input.shape[0], K = input.shape[1];
  int checked = 0;
  for (const char* name : {"q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_0", "q4_0", "q4_1"}) {
    DType dt;
    ASSERT_TRUE(ParseDType(name, &dt)) << name;
    Tensor want = (*st)->GetTensor(name).value();
    const size_t row_bytes = DTypeBytes(dt, K);
    ASSERT_EQ((size_t)want.numel(), row_bytes * rows) << name;
    std::vector<uint8_t> got(row_bytes * rows, 0xAA);
    for (int64_t r = 0; r < rows; ++r) kernels::QuantizeRow(dt, input.as<float>() + r * K, K, got.data() + r * row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* g = got.data() + r * row_bytes;
      const uint8_t* w = (const uint8_t*)want.data + r * row_bytes;
      if (std::memcmp(g, w, row_bytes) != 0) {
        size_t at = 0;
        while (g[at] == w[at]) ++at;
        ADD_FAILURE() << name << " row " << r << ": first differing byte " << at << " (block "
                      << at / GetDTypeInfo(dt).block_bytes << "): " << (int)g[at] << " vs llama-quantize's " << (int)w[at];
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 10);
}

TEST(GgmlQuantizeGolden, MixTypesEqualLlamaQuantizeChoice) {
  std::ifstream f(QuantizeFixtureDir() + "mixes.json");
  ASSERT_TRUE(f.good());
  nlohmann::json mixes = nlohmann::json::parse(f);
  int compared = 0;
  for (const auto& [layout, m] : mixes.items()) {
    ConvertModel model{m["hparams"]["arch"], m["hparams"]["n_layer"], m["hparams"]["n_head"], m["hparams"]["n_head_kv"]};
    std::vector<ConvertTensor> tensors;
    for (const auto& t : m["tensors"]) {
      const int64_t k = t[1];
      // The row length is what matters; 1-D tensors have none.
      tensors.push_back({t[0], k ? std::vector<int64_t>{8, k} : std::vector<int64_t>{64}, DType::kF32});
    }
    for (const auto& [ftype, types] : m["types"].items()) {
      auto target = ParseConvertTarget(ftype);
      ASSERT_TRUE(target.ok()) << target.status().message();
      std::vector<DType> planned = PlanConvertedDTypes(*target, tensors, model);
      std::vector<std::string> want = SplitWords(types.get<std::string>());
      ASSERT_EQ(want.size(), tensors.size()) << layout << " " << ftype;
      for (size_t i = 0; i < tensors.size(); ++i) {
        EXPECT_EQ(DTypeName(planned[i]), want[i]) << layout << " " << ftype << " " << tensors[i].name;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 2000);
}

}  // namespace
}  // namespace lathe::tools
