// stories260K validation NLL on ../shared/data/tinystories/validation_100.txt matches the
// float64 reference (1.3196 nats/token over 35351 tokens) to 3 decimals.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "model/loader.h"
#include "tools/eval.h"
#include "test_util.h"

namespace lathe::tools {
namespace {

using lathe::testing::SharedPath;

TEST(Stories260KNll, MatchesReference) {
  std::string model_path = SharedPath("models/stories260K/stories260K.bin");
  std::string data_path = SharedPath("data/tinystories/validation_100.txt");
  LATHE_REQUIRE_FILE(model_path);
  LATHE_REQUIRE_FILE(data_path);
  std::ifstream in(SharedPath("models/stories260K/reference/stories260K_reference.json"));
  nlohmann::json ref = nlohmann::json::parse(in)["validation_100"];
  model::LoadOptions opts;
  opts.tokenizer_path = SharedPath("models/stories260K/tok512.model");
  auto lm = model::LoadModel(model_path, opts);
  ASSERT_TRUE(lm.ok()) << lm.status().message();
  auto text = ReadFileToString(data_path);
  ASSERT_TRUE(text.ok());
  std::vector<std::string> docs = SplitDocuments(*text, "<|endoftext|>");
  ASSERT_EQ((int64_t)docs.size(), ref["stories"].get<int64_t>());
  ThreadPool pool(2);
  model::Transformer tf((*lm)->weights, pool);
  auto r = EvaluateNll(tf, *(*lm)->tokenizer, docs, 512);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->tokens, ref["tokens_scored"].get<int64_t>());
  EXPECT_NEAR(r->mean_nll(), ref["mean_nll_nats"].get<double>(), 5e-4);
}

}  // namespace
}  // namespace lathe::tools
