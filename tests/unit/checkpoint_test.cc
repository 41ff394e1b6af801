// Checkpoint integrity and training state: crc32c against the standard check value, sealed dirs
// verify and name a flipped or truncated file, 'last' skips unsealed dirs, rotation keeps the newest
// sealed checkpoint, AdamW / 8-bit AdamW state saved and restored continues bit-identically, and
// the fp16 loss scaler follows GradScaler (growth after 2000 clean steps, backoff, unscale).
#include "train/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "train/loss_scaler.h"
#include "train/optimizer_bnb.h"
#include "test_util.h"
#include "train/train_outputs.h"

namespace lathe::train {
namespace {

namespace fs = std::filesystem;

// One directory per test binary, removed (with everything in it) when the binary exits.
::lathe::testing::ScopedTempDir g_temp_root("lathe_ckpt_");

// An empty directory `name` under it.
std::string CleanDir(const std::string& name) {
  std::string d = (fs::path(g_temp_root.path) / name).string();
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(Checkpoint, Crc32cCheckValue) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  // Incremental equals one shot.
  EXPECT_EQ(Crc32c("6789", 4, Crc32c("12345", 5)), 0xE3069283u);
}

TEST(Checkpoint, SealVerifyAndDamageNamed) {
  std::string out = CleanDir("seal");
  auto cp = WriteCheckpoint(out, 3, [](const std::string& dir) {
    WriteFile(dir + "/a.bin", std::string(1000, 'x'));
    WriteFile(dir + "/b.json", "{}\n");
    return Status::Ok();
  });
  ASSERT_TRUE(cp.ok()) << cp.status().message();
  EXPECT_TRUE(IsSealedCheckpoint(*cp));
  EXPECT_TRUE(VerifyCheckpoint(*cp).ok());
  {  // flip one bit
    std::fstream f(*cp + "/a.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(500);
    f.put('y');
  }
  Status st = VerifyCheckpoint(*cp);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("a.bin' is damaged: crc32c"), std::string::npos) << st.message();
  fs::resize_file(*cp + "/a.bin", 10);
  st = VerifyCheckpoint(*cp);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("a.bin' is damaged: 10 bytes"), std::string::npos) << st.message();
  fs::remove(*cp + "/b.json");
  st = VerifyCheckpoint(*cp);
  ASSERT_FALSE(st.ok());
  fs::remove_all(out);
}

TEST(Checkpoint, LastSkipsUnsealedAndRotationKeepsNewestSealed) {
  std::string out = CleanDir("last");
  for (int step : {2, 4}) {
    ASSERT_TRUE(WriteCheckpoint(out, step, [](const std::string& dir) {
                  WriteFile(dir + "/w", "w");
                  return Status::Ok();
                }).ok());
  }
  fs::create_directories(out + "/checkpoint-6");  // a dir without a manifest: not complete
  auto last = ResolveResumeCheckpoint("last", out);
  ASSERT_TRUE(last.ok()) << last.status().message();
  EXPECT_EQ(fs::path(*last).filename(), "checkpoint-4");
  auto rotated = RotateCheckpoints(out, 1);
  ASSERT_TRUE(rotated.ok());
  EXPECT_TRUE(fs::exists(out + "/checkpoint-4"));  // newest sealed survives a limit of 1
  EXPECT_TRUE(fs::exists(out + "/checkpoint-6"));
  EXPECT_FALSE(fs::exists(out + "/checkpoint-2"));
  auto none = ResolveResumeCheckpoint("last", CleanDir("empty"));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("resume_from_checkpoint"), std::string::npos);
  fs::remove_all(out);
}

// Two identical parameter sets: one optimizer runs 6 steps; the other runs 3, is saved, restored
// into a fresh optimizer and runs 3 more. Parameters must match bit for bit.
template <typename MakeOpt>
void ResumeIsBitExact(MakeOpt make, const std::string& tag) {
  const int64_t n = 5000;  // > min_8bit_size: 8-bit state for BnbAdamW
  std::vector<float> w0(n), g(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& x : w0) x = nd(rng);
  auto grads = [&](int step) {
    std::mt19937 r(100 + step);
    for (auto& x : g) x = nd(r);
  };
  std::vector<float> a = w0, b = w0;
  std::vector<ParamRef> pa = {{"w", a.data(), g.data(), n, true}};
  std::vector<ParamRef> pb = {{"w", b.data(), g.data(), n, true}};
  auto oa = make();
  for (int s = 0; s < 6; ++s) {
    grads(s);
    oa->Step(pa, 1e-3);
  }
  auto ob = make();
  for (int s = 0; s < 3; ++s) {
    grads(s);
    ob->Step(pb, 1e-3);
  }
  std::string dir = CleanDir("state_" + tag);
  ASSERT_TRUE(SaveTrainingState(dir, pb, *ob, {{"x", 1}}).ok());
  std::fill(b.begin(), b.end(), 0.0f);
  auto oc = make();
  auto j = LoadTrainingState(dir, pb, *oc);
  ASSERT_TRUE(j.ok()) << j.status().message();
  EXPECT_EQ((*j)["x"], 1);
  EXPECT_EQ(oc->steps(), 3);
  for (int s = 3; s < 6; ++s) {
    grads(s);
    oc->Step(pb, 1e-3);
  }
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0) << tag;
  // A different parameter list is refused, naming the tensor.
  std::vector<float> other(10);
  std::vector<ParamRef> po = {{"v", other.data(), other.data(), 10, true}};
  auto od = make();
  auto bad = LoadTrainingState(dir, po, *od);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("param/v"), std::string::npos) << bad.status().message();
  fs::remove_all(dir);
}

TEST(Checkpoint, AdamWResumeBitExact) {
  ResumeIsBitExact([] { return std::make_unique<AdamW>(0.9, 0.999, 1e-8, 0.01); }, "adamw");
}

TEST(Checkpoint, Adam8BitResumeBitExact) {
  ResumeIsBitExact(
      [] {
        BnbAdamW::Options o;
        o.weight_decay = 0.01;
        return std::make_unique<BnbAdamW>(std::move(o));
      },
      "bnb8");
}

TEST(Checkpoint, OptimizerKindMismatchNamesOptim) {
  std::vector<float> w(8, 1.0f), g(8, 0.5f);
  std::vector<ParamRef> p = {{"w", w.data(), g.data(), 8, true}};
  AdamW a;
  a.Step(p, 1e-3);
  std::string dir = CleanDir("kind");
  ASSERT_TRUE(SaveTrainingState(dir, p, a, nlohmann::json::object()).ok());
  Sgd sgd;
  auto r = LoadTrainingState(dir, p, sgd);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'optim'"), std::string::npos) << r.status().message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lathe::train

namespace lathe::train {
namespace {

TEST(LossScaler, GradScalerRules) {
  LossScaler s;
  EXPECT_EQ(s.scale, 65536.0);
  for (int i = 0; i < LossScaler::kGrowthInterval - 1; ++i) s.Update(true);
  EXPECT_EQ(s.scale, 65536.0);
  s.Update(true);  // the 2000th clean step doubles
  EXPECT_EQ(s.scale, 131072.0);
  EXPECT_EQ(s.growth_tracker, 0);
  for (int i = 0; i < 10; ++i) s.Update(true);
  s.Update(false);  // backoff resets the tracker
  EXPECT_EQ(s.scale, 65536.0);
  EXPECT_EQ(s.growth_tracker, 0);
  EXPECT_EQ(s.skipped_steps, 1);
  std::vector<float> g = {65536.0f, -131072.0f};
  std::vector<float> w(2);
  std::vector<ParamRef> p = {{"w", w.data(), g.data(), 2, true}};
  EXPECT_TRUE(s.Unscale(p, 1.0));
  EXPECT_EQ(g[0], 1.0f);
  EXPECT_EQ(g[1], -2.0f);
  g[1] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(s.Unscale(p, 1.0));
  g[1] = 0;
  EXPECT_FALSE(s.Unscale(p, std::nan("")));
}

}  // namespace
}  // namespace lathe::train
