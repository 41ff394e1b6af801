// Packed NF4/FP4 (+double quant) and LLM.int8 weights against bitsandbytes' own CPU path
// (tools/ref/make_quant_fixture.py): quantized bytes, statistics and dequantized values.
#include "kernels/cpu/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "formats/safetensors.h"
#include "kernels/quant.h"
#include "test_util.h"
#include "train/optimizer_bnb.h"

namespace lathe::kernels {
namespace {

class QuantGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto st = formats::SafetensorsFile::Open(lathe::testing::SourceDir() +
                                             "/tests/golden/fixtures/quant/expected.safetensors");
    ASSERT_TRUE(st.ok()) << st.status().message();
    st_ = std::move(*st).release();
  }
  static void TearDownTestSuite() {
    delete st_;
    st_ = nullptr;
  }
  static Tensor T(const std::string& name) {
    auto t = st_->GetTensor(name);
    EXPECT_TRUE(t.ok()) << name << ": " << t.status().message();
    return *t;
  }
  template <typename V>
  static std::vector<V> Vec(const std::string& name) {
    Tensor t = T(name);
    return std::vector<V>(t.as<V>(), t.as<V>() + t.numel());
  }
  static formats::SafetensorsFile* st_;
};
formats::SafetensorsFile* QuantGolden::st_ = nullptr;

struct Variant {
  DType t;
  const char* key;
};

TEST_F(QuantGolden, FourBitBytesAndDequantizedValuesMatchBitsandbytes) {
  const Variant variants[] = {
      {DType::kNF4, "nf4"}, {DType::kFP4, "fp4"}, {DType::kNF4DQ, "nf4_dq"}, {DType::kFP4DQ, "fp4_dq"}};
  for (const char* src : {"f32", "bf16"}) {
    const Tensor w = T(std::string(src) == "f32" ? "w" : "w_bf16");
    for (const Variant& v : variants) {
      const std::string key = std::string(v.key) + "_" + src;
      SCOPED_TRACE(key);
      auto pw = QuantizeWeight(w, v.t, key.c_str());
      ASSERT_TRUE(pw.ok()) << pw.status().message();
      const Tensor q = pw->view();
      ASSERT_TRUE(ValidatePacked(q).ok());
      const QuantHeader* h = (const QuantHeader*)q.data;
      const uint8_t* base = (const uint8_t*)q.data;
      const std::vector<uint8_t> codes = Vec<uint8_t>(key + "_codes");
      ASSERT_EQ(codes.size(), (size_t)(w.numel() / 2));
      int64_t code_diff = 0;
      for (size_t i = 0; i < codes.size(); ++i) code_diff += base[h->codes_offset + i] != codes[i];
      EXPECT_EQ(code_diff, 0) << "packed code bytes differ from bitsandbytes";
      const int64_t nb = w.numel() / 64;
      if (!IsDoubleQuant(v.t)) {
        const std::vector<float> am = Vec<float>(key + "_absmax");
        ASSERT_EQ((int64_t)am.size(), nb);
        EXPECT_EQ(std::memcmp(base + h->absmax_offset, am.data(), 4 * nb), 0) << "absmax differs";
      } else {
        const std::vector<uint8_t> qa = Vec<uint8_t>(key + "_absmax");
        const std::vector<float> a2 = Vec<float>(key + "_absmax2");
        const float off = Vec<float>(key + "_offset")[0];
        // torch's mean sums in another order than our double sum: 1 ulp at most.
        EXPECT_LE(std::fabs(h->offset - off), std::nextafter(off, INFINITY) - off)
            << h->offset << " vs " << off;
        int64_t qa_diff = 0;
        for (int64_t b = 0; b < nb; ++b) qa_diff += base[h->absmax_offset + b] != qa[b];
        EXPECT_EQ(qa_diff, 0) << "double-quantized absmax codes differ";
        ASSERT_EQ(a2.size(), (size_t)((nb + 255) / 256));
        EXPECT_EQ(std::memcmp(base + h->absmax2_offset, a2.data(), 4 * a2.size()), 0) << "absmax2 differs";
      }
      if (std::string(src) == "f32" && (IsDoubleQuant(v.t) || v.t == DType::kNF4)) {
        const std::vector<float> deq = Vec<float>(key + "_deq");
        std::vector<float> ours((size_t)w.numel());
        DequantizePacked(q, ours.data());
        int64_t diff = 0;
        for (size_t i = 0; i < deq.size(); ++i) diff += ours[i] != deq[i];
        EXPECT_EQ(diff, 0) << "dequantized values differ (first: " << ours[0] << " vs " << deq[0] << ")";
        // The dequantizer the kernels use (per ISA tier) equals the reference.
        for (IsaTier tier : {IsaTier::kScalar, IsaTier::kAvx2}) {
          if (tier == IsaTier::kAvx2 && BestIsaTier() == IsaTier::kScalar) continue;
          std::vector<float> blk((size_t)w.numel());
          quant::DequantPackedBlock(quant::QuantKernelsFor(tier), q, 0, w.dim(0), 0, w.dim(1), blk.data(),
                                    w.dim(1));
          EXPECT_EQ(std::memcmp(blk.data(), deq.data(), 4 * deq.size()), 0) << IsaTierName(tier);
        }
      }
    }
  }
}

TEST_F(QuantGolden, Int8RowsAndOutlierProductMatchBitsandbytes) {
  const Tensor w = T("w");
  auto pw = QuantizeWeight(w, DType::kI8Row, "w");
  ASSERT_TRUE(pw.ok()) << pw.status().message();
  const Tensor q = pw->view();
  const QuantHeader* h = (const QuantHeader*)q.data;
  const std::vector<int8_t> cb = Vec<int8_t>("int8_cb");
  const std::vector<float> scb = Vec<float>("int8_scb");
  EXPECT_EQ(std::memcmp((const uint8_t*)q.data + h->codes_offset, cb.data(), cb.size()), 0);
  EXPECT_EQ(std::memcmp((const uint8_t*)q.data + h->absmax_offset, scb.data(), 4 * scb.size()), 0);
  const std::vector<float> x = Vec<float>("int8_x"), y_ref = Vec<float>("int8_y");
  const std::vector<int64_t> cols = Vec<int64_t>("int8_outlier_cols");
  ASSERT_EQ(cols.size(), 2u);  // the fixture's two outlier columns (|x| >= 6)
  ThreadPool pool(1);
  for (IsaTier tier : {IsaTier::kScalar, IsaTier::kAvx2}) {
    if (tier == IsaTier::kAvx2 && BestIsaTier() == IsaTier::kScalar) continue;
    std::vector<float> y(y_ref.size());
    quant::Int8DecomposedMatMul(quant::QuantKernelsFor(tier), pool, x.data(), 4, q, y.data(),
                                kInt8OutlierThreshold);
    double num = 0, den = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      num += (y[i] - y_ref[i]) * (double)(y[i] - y_ref[i]);
      den += (double)y_ref[i] * y_ref[i];
    }
    // bitsandbytes' int8_mm_dequant multiplies by 6.200124e-05 where 1 / 127^2 = 6.2000124e-05 (a
    // 1.8e-5 relative slip in its constant); lathe uses 1 / 127^2, so the int8 part differs by that.
    EXPECT_LT(std::sqrt(num / den), 3e-5) << IsaTierName(tier);
    EXPECT_GT(std::sqrt(num / den), 1e-7) << "expected the constant's 1.8e-5 offset";
  }
}

// bitsandbytes.optim.AdamW8bit on CPU (blockwise 256, dynamic maps) for 8 steps.
TEST_F(QuantGolden, AdamW8bitMatchesBitsandbytes) {
  std::vector<std::vector<float>> p(2), base(2), g(2);
  std::vector<train::ParamRef> refs(2);
  for (int i = 0; i < 2; ++i) {
    p[i] = Vec<float>("adam_p0_" + std::to_string(i));
    base[i] = Vec<float>("adam_grad_base_" + std::to_string(i));
    g[i].resize(p[i].size());
    refs[i] = {"p", p[i].data(), g[i].data(), (int64_t)p[i].size(), true};
  }
  train::BnbAdamW::Options o;
  o.bits = 8;
  o.beta1 = 0.9;
  o.beta2 = 0.995;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  train::BnbAdamW opt(std::move(o));
  ASSERT_TRUE(opt.Prepare(refs).ok());
  for (int k = 0; k < 8; ++k) {
    for (int i = 0; i < 2; ++i) {  // the fixture's gradient of step k: base rolled by 97 k
      const size_t n = base[i].size();
      for (size_t j = 0; j < n; ++j) g[i][j] = base[i][(j + 97 * k) % n] * (k % 3 == 0 ? 0.05f : 1.0f);
    }
    opt.Step(refs, 1e-2);
    if (k == 0 || k == 7) {
      for (int i = 0; i < 2; ++i) {
        const std::vector<float> want = Vec<float>("adam_p_" + std::to_string(k) + "_" + std::to_string(i));
        double worst = 0;
        for (size_t j = 0; j < want.size(); ++j)
          worst = std::max(worst, (double)std::fabs(p[i][j] - want[j]));
        // The same f32 operations as bitsandbytes' CPU kernel (torch may fuse a multiply-add where
        // we do not, or the reverse): measured max 1.2e-7 after 8 steps.
        EXPECT_LT(worst, 1e-6) << "step " << k << " param " << i;
        if (k == 7) std::printf("param %d after 8 steps: max |ours - bitsandbytes| %.3g\n", i, worst);
      }
    }
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(opt.Is8Bit(i));
    const std::vector<uint8_t> s1 = Vec<uint8_t>("adam_state1_" + std::to_string(i));
    const std::vector<uint8_t> s2 = Vec<uint8_t>("adam_state2_" + std::to_string(i));
    const std::vector<float> a1 = Vec<float>("adam_absmax1_" + std::to_string(i));
    const std::vector<float> a2 = Vec<float>("adam_absmax2_" + std::to_string(i));
    int64_t d1 = 0, d2 = 0, far = 0;
    for (size_t j = 0; j < s1.size(); ++j) {
      d1 += opt.MCodes(i)[j] != s1[j];
      d2 += opt.VCodes(i)[j] != s2[j];
      far += std::abs(opt.MCodes(i)[j] - s1[j]) > 1 || std::abs(opt.VCodes(i)[j] - s2[j]) > 1;
    }
    // The quantizer replicates bitsandbytes' 65536-entry lookup (quant.h): codes identical; an f32
    // moment one ulp off could still move a value across a table cell edge, so allow a few.
    EXPECT_LE(d1 + d2, 4) << "param " << i << ": " << d1 << " m / " << d2 << " v codes differ";
    EXPECT_EQ(far, 0);
    double amax_err = 0;
    for (size_t b = 0; b < a1.size(); ++b) {
      amax_err = std::max(amax_err, std::fabs(opt.MAbsmax(i)[b] - a1[b]) / (double)a1[b]);
      amax_err = std::max(amax_err, std::fabs(opt.VAbsmax(i)[b] - a2[b]) / (double)a2[b]);
    }
    EXPECT_LT(amax_err, 1e-5) << "param " << i;
    std::printf("param %d: %lld m / %lld v codes differ (%lld by > 1), absmax rel err %.3g\n", i,
                (long long)d1, (long long)d2, (long long)far, amax_err);
  }
}

// bitsandbytes.optim.PagedAdamW (32-bit state; unpaged on CPU) = our paged_adamw_32bit math.
TEST_F(QuantGolden, PagedAdamW32bitMatchesBitsandbytes) {
  std::vector<std::vector<float>> p(2), base(2), g(2);
  std::vector<train::ParamRef> refs(2);
  for (int i = 0; i < 2; ++i) {
    p[i] = Vec<float>("adam_p0_" + std::to_string(i));
    base[i] = Vec<float>("adam_grad_base_" + std::to_string(i));
    g[i].resize(p[i].size());
    refs[i] = {"p", p[i].data(), g[i].data(), (int64_t)p[i].size(), true};
  }
  train::BnbAdamW::Options o;
  o.bits = 32;
  o.beta2 = 0.995;
  o.weight_decay = 0.1;
  auto pool = train::PagedStatePool::Create(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp", 16 << 10);
  ASSERT_TRUE(pool.ok());
  o.pool = std::move(*pool);  // a 16 KiB cap: most of the 68 KiB state is paged out between uses
  train::BnbAdamW opt(std::move(o));
  for (int k = 0; k < 8; ++k) {
    for (int i = 0; i < 2; ++i) {
      const size_t n = base[i].size();
      for (size_t j = 0; j < n; ++j) g[i][j] = base[i][(j + 97 * k) % n] * (k % 3 == 0 ? 0.05f : 1.0f);
    }
    opt.Step(refs, 1e-2);
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_FALSE(opt.Is8Bit(i));
    const std::vector<float> want = Vec<float>("adam32_p_7_" + std::to_string(i));
    double worst = 0;
    for (size_t j = 0; j < want.size(); ++j) worst = std::max(worst, (double)std::fabs(p[i][j] - want[j]));
    EXPECT_LT(worst, 1e-6) << "param " << i;
    std::printf("32-bit param %d after 8 steps: max |ours - bitsandbytes| %.3g\n", i, worst);
  }
}

}  // namespace
}  // namespace lathe::kernels
