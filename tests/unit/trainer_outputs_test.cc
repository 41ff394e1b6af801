// Trainer outputs: trainer_state.json in HF's schema, JSONL log lines, atomic checkpoints,
// save_total_limit rotation and the output_dir overwrite guard.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/mapped_file.h"
#include "monitor/progress.h"
#include "test_util.h"
#include "train/train_outputs.h"

namespace lathe::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using TempDir = ::lathe::testing::ScopedTempDir;

TEST(TrainerState, HfSchemaKeysAndTypes) {
  TrainerState s;
  s.global_step = 30;
  s.max_steps = 30;
  s.epoch = 3.0;
  s.num_train_epochs = 3;
  s.logging_steps = 10;
  s.eval_steps = 10;
  s.save_steps = 500;
  s.train_batch_size = 2;
  s.total_flos = 1.5e9;
  s.log_history.push_back(
      {{"epoch", 1.0}, {"grad_norm", 0.5}, {"learning_rate", 3e-5}, {"loss", 2.25}, {"step", 10}});
  json j = s.ToJson();
  for (const char* k :
       {"best_metric", "best_model_checkpoint", "epoch", "eval_steps", "global_step", "is_hyper_param_search",
        "is_local_process_zero", "is_world_process_zero", "log_history", "logging_steps", "max_steps",
        "num_input_tokens_seen", "num_train_epochs", "save_steps", "stateful_callbacks", "total_flos",
        "train_batch_size", "trial_name", "trial_params"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_TRUE(j["best_metric"].is_null());
  EXPECT_EQ(j["global_step"], 30);
  EXPECT_EQ(j["max_steps"], 30);
  EXPECT_EQ(j["train_batch_size"], 2);
  EXPECT_TRUE(j["global_step"].is_number_integer());
  EXPECT_TRUE(j["total_flos"].is_number());
  ASSERT_EQ(j["log_history"].size(), 1u);
  EXPECT_EQ(j["log_history"][0]["step"], 10);
  EXPECT_EQ(j["log_history"][0]["loss"], 2.25);
  EXPECT_EQ(j["stateful_callbacks"]["TrainerControl"]["args"]["should_save"], true);
  // Written sorted, indent 2, newline-terminated, as transformers' save_to_json.
  TempDir d;
  ASSERT_TRUE(WriteJsonFile(d.path + "/trainer_state.json", j).ok());
  std::string text = ReadFileToString(d.path + "/trainer_state.json").value();
  EXPECT_EQ(text.rfind("{\n  \"best_global_step\": null,\n", 0), 0u) << text.substr(0, 60);
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(json::parse(text), j);
}

TEST(TrainerJsonl, OneObjectPerLineWithLlamaFactoryAndLatheKeys) {
  TempDir d;
  JsonlLog log;
  ASSERT_TRUE(log.Open(d.path + "/trainer_log.jsonl").ok());
  TrainLogLine l{10, 40, 0.256, 2.5, 4.5e-5, 1.25, 65.0, 1234.5, 80000, 100 << 20};
  ASSERT_TRUE(log.Append(TrainLogJson(l)).ok());
  l.step = 20;
  ASSERT_TRUE(log.Append(TrainLogJson(l)).ok());
  std::ifstream in(d.path + "/trainer_log.jsonl");
  std::string line;
  std::vector<json> lines;
  while (std::getline(in, line)) lines.push_back(json::parse(line));
  ASSERT_EQ(lines.size(), 2u);
  const json& j = lines[0];
  EXPECT_EQ(j["current_steps"], 10);
  EXPECT_EQ(j["step"], 10);
  EXPECT_EQ(j["total_steps"], 40);
  EXPECT_DOUBLE_EQ(j["loss"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(j["lr"].get<double>(), 4.5e-5);
  EXPECT_DOUBLE_EQ(j["grad_norm"].get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(j["epoch"].get<double>(), 0.26);
  EXPECT_DOUBLE_EQ(j["percentage"].get<double>(), 25.0);
  EXPECT_EQ(j["elapsed_time"], "0:01:05");
  EXPECT_EQ(j["remaining_time"], "0:03:15");
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 1234.5);
  EXPECT_EQ(j["rss_bytes"], 100 << 20);
  EXPECT_EQ(j["total_tokens"], 80000);
  EXPECT_EQ(lines[1]["current_steps"], 20);
}

TEST(TrainerOutputDir, RefusesNonEmptyWithoutOverwrite) {
  TempDir d;
  std::string out = d.path + "/run";
  ASSERT_TRUE(PrepareOutputDir(out, false).ok());  // created
  EXPECT_TRUE(fs::is_directory(out));
  ASSERT_TRUE(PrepareOutputDir(out, false).ok());  // empty: fine
  std::ofstream(out + "/adapter_config.json") << "{}";
  Status st = PrepareOutputDir(out, false);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("overwrite_output_dir"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("output_dir"), std::string::npos);
  EXPECT_TRUE(PrepareOutputDir(out, true).ok());
  std::ofstream(d.path + "/file") << "x";
  st = PrepareOutputDir(d.path + "/file", true);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("not a directory"), std::string::npos);
}

TEST(TrainerCheckpoint, WrittenUnderTempNameThenRenamed) {
  TempDir d;
  std::string seen_dir;
  auto cp = WriteCheckpoint(d.path, 7, [&](const std::string& dir) {
    seen_dir = dir;
    EXPECT_FALSE(fs::exists(d.path + "/checkpoint-7"));  // not visible while being written
    std::ofstream(dir + "/a.json") << "{}";
    return Status::Ok();
  });
  ASSERT_TRUE(cp.ok()) << cp.status().message();
  EXPECT_EQ(*cp, d.path + "/checkpoint-7");
  EXPECT_NE(seen_dir, *cp);
  EXPECT_TRUE(fs::exists(*cp + "/a.json"));
  EXPECT_FALSE(fs::exists(seen_dir));
  // A failing writer leaves nothing behind, and an existing checkpoint of that number survives.
  auto bad = WriteCheckpoint(d.path, 7, [](const std::string& dir) {
    std::ofstream(dir + "/partial") << "x";
    return Status::Error("disk full");
  });
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("disk full"), std::string::npos);
  EXPECT_TRUE(fs::exists(d.path + "/checkpoint-7/a.json"));
  int entries = 0;
  for (auto& e : fs::directory_iterator(d.path)) entries += !e.path().empty();
  EXPECT_EQ(entries, 1);
}

TEST(TrainerCheckpoint, RotationKeepsNewestAndSortsNumerically) {
  TempDir d;
  for (int step : {5, 10, 15, 20, 100})
    fs::create_directories(d.path + "/checkpoint-" + std::to_string(step));
  fs::create_directories(d.path + "/checkpoint-abc");  // not a checkpoint
  std::ofstream(d.path + "/checkpoint-3") << "file";   // not a directory
  auto list = ListCheckpoints(d.path);
  ASSERT_EQ(list.size(), 5u);
  EXPECT_EQ(list.back(), d.path + "/checkpoint-100");  // 100 > 20 although "100" < "20" as text
  auto deleted = RotateCheckpoints(d.path, 2);
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(deleted->size(), 3u);
  list = ListCheckpoints(d.path);
  EXPECT_EQ(list, (std::vector<std::string>{d.path + "/checkpoint-20", d.path + "/checkpoint-100"}));
  // limit 1 keeps only the newest; 0 keeps all.
  ASSERT_TRUE(RotateCheckpoints(d.path, 0).ok());
  EXPECT_EQ(ListCheckpoints(d.path).size(), 2u);
  ASSERT_TRUE(RotateCheckpoints(d.path, 1).ok());
  EXPECT_EQ(ListCheckpoints(d.path), (std::vector<std::string>{d.path + "/checkpoint-100"}));
  EXPECT_TRUE(fs::exists(d.path + "/checkpoint-abc"));
}

TEST(TrainerTokenizerFiles, FromHfDirTokenizerJsonOrSentencePieceModel) {
  TempDir src, dst;
  for (const char* n :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "model.safetensors"}) {
    std::ofstream(src.path + "/" + n) << n;
  }
  std::ofstream(src.path + "/tok512.model") << "spm";
  auto files = TokenizerFiles(src.path);
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0].second, "tokenizer.json");
  ASSERT_TRUE(CopyFiles(files, dst.path).ok());
  EXPECT_TRUE(fs::exists(dst.path + "/tokenizer.json"));
  EXPECT_TRUE(fs::exists(dst.path + "/special_tokens_map.json"));
  EXPECT_FALSE(fs::exists(dst.path + "/model.safetensors"));
  // A tokenizer.json path brings its config along; a .model is renamed to tokenizer.model.
  EXPECT_EQ(TokenizerFiles(src.path + "/tokenizer.json").size(), 3u);
  auto spm = TokenizerFiles(src.path + "/tok512.model");
  ASSERT_EQ(spm.size(), 1u);
  EXPECT_EQ(spm[0].second, "tokenizer.model");
  EXPECT_TRUE(TokenizerFiles(src.path + "/model.gguf").empty());
  EXPECT_TRUE(TokenizerFiles("").empty());
  Status st = CopyFiles({{src.path + "/missing.json", "x.json"}}, dst.path);
  EXPECT_FALSE(st.ok());
}

}  // namespace
}  // namespace lathe::train
