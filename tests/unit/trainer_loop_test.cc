// The Trainer loop over a fake unigram TrainModel: HF step counts with epochs / max_steps /
// accumulation, exact accumulation (bs 1 x accum 4 == bs 4), logging / eval / checkpoint cadence,
// the files in output_dir, determinism, and config errors that name their key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/mapped_file.h"
#include "test_util.h"
#include "train/trainer.h"
#include "trainer_fake_model.h"

namespace lathe::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::FakeTrainModel;

using TempDir = ::lathe::testing::ScopedTempDir;

// n samples of varying length over a vocabulary of 16 where token 3 dominates, so the unigram
// model's loss falls as it learns.
DatasetSplit MakeData(int n_train, int n_eval) {
  DatasetSplit d;
  for (int i = 0; i < n_train + n_eval; ++i) {
    TokenizedSample s;
    int len = 3 + i % 5;
    for (int t = 0; t < len; ++t) {
      int32_t id = (t % 3 == 0) ? (int32_t)((i + t) % 16) : 3;
      s.input_ids.push_back(id);
      s.labels.push_back(t == 0 ? kIgnoreIndex : id);
    }
    s.segment_ids.assign(len, 0);
    (i < n_train ? d.train : d.eval).push_back(s);
  }
  return d;
}

TrainConfig BaseConfig(const std::string& out) {
  TrainConfig c;
  c.model_name_or_path = "fake";
  c.dataset = {"fake"};
  c.output_dir = out;
  c.learning_rate = 0.1;
  c.logging_steps = 1;
  c.save_steps = 1000;
  return c;
}

json ReadJson(const std::string& path) { return json::parse(ReadFileToString(path).value()); }

Result<TrainSummary> Train(const TrainConfig& c, FakeTrainModel& m, DatasetSplit data,
                           bool hand_back_pages = true) {
  LATHE_RETURN_IF_ERROR(PrepareOutputDir(c.output_dir, c.overwrite_output_dir));
  TrainerEnv env;
  env.log = nullptr;
  env.hand_back_pages = hand_back_pages;
  env.flops_params = 100;
  LATHE_ASSIGN_OR_RETURN(auto t, Trainer::Create(c, m, std::move(data), env));
  return t->Run();
}

TEST(TrainerLoop, StepsMicroBatchesAndNormalizers) {
  TempDir d;
  TrainConfig c = BaseConfig(d.path + "/out");
  c.per_device_train_batch_size = 3;
  c.gradient_accumulation_steps = 2;
  c.num_train_epochs = 2;
  FakeTrainModel m(16);
  auto s = Train(c, m, MakeData(10, 0));
  ASSERT_TRUE(s.ok()) << s.status().message();
  // 10 samples / 3 -> 4 micro-batches per epoch, 2 steps per epoch, 4 steps.
  EXPECT_EQ(s->global_step, 4);
  ASSERT_EQ(m.seen.size(), 8u);
  // Each step's normalizer is the target count of both its micro-batches.
  for (size_t k = 0; k < m.seen.size(); k += 2) {
    int64_t targets = 0;
    for (size_t j = k; j < k + 2; ++j) {
      for (int64_t r = 0; r < m.seen[j].B; ++r) {
        for (int64_t t = 1; t < m.seen[j].T; ++t) targets += m.seen[j].labels[r * m.seen[j].T + t] != -100;
      }
    }
    EXPECT_DOUBLE_EQ(m.seen[k].normalizer, (double)targets);
    EXPECT_DOUBLE_EQ(m.seen[k + 1].normalizer, (double)targets);
  }
  EXPECT_EQ(m.seen[3].B, 1);  // the epoch's last micro-batch holds the remainder
  EXPECT_DOUBLE_EQ(s->epoch, 2.0);
}

TEST(TrainerLoop, GradientPagesGoBackBeforeSavesOnly) {
  // A run whose gradients are zeroed in place (TrainerEnv::hand_back_pages false) still hands their
  // pages back before each save (steps 3 and 6) and the final one (step 7): the memory plan lets the
  // save's copy reuse them. The first call zeroes the never-written gradients before step 1.
  for (bool hand_back : {false, true}) {
    TempDir d;
    TrainConfig c = BaseConfig(d.path + "/out");
    c.max_steps = 7;
    c.save_steps = 3;
    FakeTrainModel m(16);
    auto s = Train(c, m, MakeData(6, 0), hand_back);
    ASSERT_TRUE(s.ok()) << s.status().message();
    std::vector<bool> want(8, true);
    if (!hand_back) want = {true, false, false, true, false, false, true, true};
    EXPECT_EQ(m.zero_grad_hand_back, want) << "hand_back_pages " << hand_back;
  }
}

TEST(TrainerLoop, MaxStepsOverridesEpochsAndWrapsData) {
  TempDir d;
  TrainConfig c = BaseConfig(d.path + "/out");
  c.per_device_train_batch_size = 2;
  c.max_steps = 7;
  c.num_train_epochs = 1;
  FakeTrainModel m(16);
  auto s = Train(c, m, MakeData(6, 0));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->global_step, 7);
  EXPECT_EQ(m.seen.size(), 7u);
  json st = ReadJson(c.output_dir + "/trainer_state.json");
  EXPECT_EQ(st["max_steps"], 7);
  EXPECT_EQ(st["num_train_epochs"], 3.0);  // ceil(7 / 3)
  EXPECT_NEAR(st["epoch"].get<double>(), 2.0 + 1.0 / 3.0, 1e-12);
}

TEST(TrainerLoop, AccumulationIsExact) {
  // Batch 4 x accum 1 and batch 1 x accum 4 see the same samples per step (the epoch order does
  // not depend on the batch size) and normalize by the same token count: same weights.
  std::vector<float> w[2];
  for (int k = 0; k < 2; ++k) {
    TempDir d;
    TrainConfig c = BaseConfig(d.path + "/out");
    c.per_device_train_batch_size = k == 0 ? 4 : 1;
    c.gradient_accumulation_steps = k == 0 ? 1 : 4;
    c.num_train_epochs = 2;
    c.optim = "sgd";
    FakeTrainModel m(16);
    auto s = Train(c, m, MakeData(16, 0));
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_EQ(s->global_step, 8);
    w[k] = m.weights();
  }
  for (size_t i = 0; i < w[0].size(); ++i) EXPECT_NEAR(w[0][i], w[1][i], 1e-6) << i;
  bool moved = false;
  for (float x : w[0]) moved |= x != 0;
  EXPECT_TRUE(moved);
}

TEST(TrainerLoop, DeterministicAndLossFalls) {
  std::vector<double> losses[2];
  for (int k = 0; k < 2; ++k) {
    TempDir d;
    TrainConfig c = BaseConfig(d.path + "/out");
    c.per_device_train_batch_size = 2;
    c.num_train_epochs = 3;
    c.eval_strategy = "steps";
    c.eval_steps = 5;
    FakeTrainModel m(16);
    auto s = Train(c, m, MakeData(20, 6));
    ASSERT_TRUE(s.ok()) << s.status().message();
    losses[k] = s->step_losses;
    ASSERT_EQ(s->eval_losses.size(), 6u);  // steps 5..30
    EXPECT_LT(s->eval_losses.back(), s->eval_losses.front());
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_LT(losses[0].back(), losses[0].front());
}

TEST(TrainerLoop, OutputsLogsAndCheckpoints) {
  TempDir d;
  TrainConfig c = BaseConfig(d.path + "/out");
  c.per_device_train_batch_size = 2;
  c.num_train_epochs = 1;  // 10 steps
  c.logging_steps = 3;
  c.save_steps = 4;
  c.save_total_limit = 1;
  c.val_size = 0.1;
  c.report_to = {"tensorboard"};
  c.lr_scheduler_type = "linear";
  c.learning_rate = 0.05;
  FakeTrainModel m(16);
  auto s = Train(c, m, MakeData(20, 4));
  ASSERT_TRUE(s.ok()) << s.status().message();
  const std::string& out = c.output_dir;
  // Checkpoints at steps 4 and 8; the limit keeps only the newest.
  EXPECT_FALSE(fs::exists(out + "/checkpoint-4"));
  EXPECT_TRUE(fs::exists(out + "/checkpoint-8/adapter_config.json"));
  EXPECT_TRUE(fs::exists(out + "/checkpoint-8/adapter_model.safetensors"));
  json cst = ReadJson(out + "/checkpoint-8/trainer_state.json");
  EXPECT_EQ(cst["global_step"], 8);
  // Final outputs.
  for (const char* f : {"adapter_config.json", "adapter_model.safetensors", "trainer_state.json",
                        "all_results.json", "train_results.json", "eval_results.json", "trainer_log.jsonl"}) {
    EXPECT_TRUE(fs::exists(out + "/" + f)) << f;
  }
  json st = ReadJson(out + "/trainer_state.json");
  EXPECT_EQ(st["global_step"], 10);
  EXPECT_EQ(st["logging_steps"], 3);
  EXPECT_EQ(st["save_steps"], 4);
  EXPECT_EQ(st["train_batch_size"], 2);
  EXPECT_GT(st["total_flos"].get<double>(), 0);
  const json& h = st["log_history"];
  // Logs at 3, 6, 9, then the end-of-training eval (no eval strategy, but eval data), then the summary.
  ASSERT_EQ(h.size(), 5u) << h.dump();
  EXPECT_EQ(h[0]["step"], 3);
  EXPECT_EQ(h[2]["step"], 9);
  for (int i = 0; i < 3; ++i) {
    for (const char* k : {"epoch", "loss", "learning_rate", "grad_norm", "step"})
      EXPECT_TRUE(h[i].contains(k)) << k;
  }
  // Linear decay from 0.05 over 10 steps: after step 3 the scheduler is at 0.05 * 7 / 10.
  EXPECT_NEAR(h[0]["learning_rate"].get<double>(), 0.035, 1e-12);
  EXPECT_NEAR(h[0]["epoch"].get<double>(), 0.3, 1e-12);
  EXPECT_NEAR(h[0]["loss"].get<double>(),
              std::round((s->step_losses[0] + s->step_losses[1] + s->step_losses[2]) / 3 * 1e4) / 1e4, 1e-12);
  EXPECT_TRUE(h[3].contains("eval_loss"));
  EXPECT_EQ(h[3]["step"], 10);
  EXPECT_TRUE(h[4].contains("train_loss"));
  EXPECT_TRUE(h[4].contains("train_runtime"));
  json all = ReadJson(out + "/all_results.json");
  for (const char* k : {"epoch", "train_loss", "train_runtime", "train_samples_per_second", "eval_loss"}) {
    EXPECT_TRUE(all.contains(k)) << k;
  }
  EXPECT_DOUBLE_EQ(all["eval_loss"].get<double>(), s->eval_losses.back());
  json tr = ReadJson(out + "/train_results.json");
  EXPECT_FALSE(tr.contains("eval_loss"));
  EXPECT_DOUBLE_EQ(tr["train_samples_per_second"].get<double>() > 0, true);
  // JSONL: three training lines and one eval line.
  std::ifstream in(out + "/trainer_log.jsonl");
  std::string line;
  std::vector<json> lines;
  while (std::getline(in, line)) lines.push_back(json::parse(line));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[1]["step"], 6);
  EXPECT_TRUE(lines[1].contains("tokens_per_s"));
  EXPECT_GT(lines[1]["rss_bytes"].get<int64_t>(), 0);
  EXPECT_TRUE(lines[3].contains("eval_loss"));
  // TensorBoard events under runs/<time>_<host>/.
  ASSERT_TRUE(fs::is_directory(out + "/runs"));
  int events = 0;
  for (auto& e : fs::recursive_directory_iterator(out + "/runs")) {
    events += e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  EXPECT_EQ(events, 1);
  // A second run into the same dir is refused without overwrite_output_dir.
  FakeTrainModel m2(16);
  auto again = Train(c, m2, MakeData(20, 4));
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("overwrite_output_dir"), std::string::npos);
  // With it, the run replaces the outputs and the old run's checkpoints go (they would outrank
  // this run's in save_total_limit).
  fs::create_directories(out + "/checkpoint-1000");
  fs::create_directories(out + "/.checkpoint-4.tmp.12345");  // left by a killed run
  c.overwrite_output_dir = true;
  c.save_steps = 100;
  FakeTrainModel m3(16);
  auto third = Train(c, m3, MakeData(20, 4));
  ASSERT_TRUE(third.ok()) << third.status().message();
  EXPECT_TRUE(ListCheckpoints(out).empty());
  EXPECT_FALSE(fs::exists(out + "/.checkpoint-4.tmp.12345"));
  EXPECT_EQ(ReadJson(out + "/trainer_state.json")["global_step"], 10);
}

TEST(TrainerLoop, EvalEveryEpochAndWarmup) {
  TempDir d;
  TrainConfig c = BaseConfig(d.path + "/out");
  c.per_device_train_batch_size = 4;
  c.num_train_epochs = 3;  // 2 steps per epoch
  c.eval_strategy = "epoch";
  c.logging_steps = 1;
  c.lr_scheduler_type = "constant_with_warmup";
  c.warmup_steps = 2;
  FakeTrainModel m(16);
  auto s = Train(c, m, MakeData(8, 3));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->global_step, 6);
  EXPECT_EQ(s->eval_losses.size(), 3u);  // after each epoch, none extra at the end
  json h = ReadJson(c.output_dir + "/trainer_state.json")["log_history"];
  std::vector<int64_t> eval_steps;
  std::vector<double> lrs;
  for (const json& e : h) {
    if (e.contains("eval_loss")) eval_steps.push_back(e["step"].get<int64_t>());
    if (e.contains("learning_rate")) lrs.push_back(e["learning_rate"].get<double>());
  }
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{2, 4, 6}));
  ASSERT_EQ(lrs.size(), 6u);
  EXPECT_NEAR(lrs[0], 0.05, 1e-12);  // warmup: lr(1) = 0.1 * 1 / 2
  EXPECT_NEAR(lrs[1], 0.1, 1e-12);
  EXPECT_NEAR(lrs[5], 0.1, 1e-12);
}

TEST(TrainerLoop, FullFinetuneWritesHfModelFiles) {
  TempDir d;
  TrainConfig c = BaseConfig(d.path + "/out");
  c.finetuning_type = "full";
  c.max_steps = 2;
  FakeTrainModel m(16);
  auto s = Train(c, m, MakeData(4, 0));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE(fs::exists(c.output_dir + "/config.json"));
  EXPECT_TRUE(fs::exists(c.output_dir + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(c.output_dir + "/adapter_config.json"));
  EXPECT_FALSE(fs::exists(c.output_dir + "/eval_results.json"));
}

TEST(TrainerConfigErrors, NameTheKey) {
  TrainConfig c = BaseConfig("/tmp/unused");
  auto expect_key = [](const TrainConfig& c, const std::string& key) {
    Status st = CheckTrainerConfig(c);
    ASSERT_FALSE(st.ok()) << key;
    EXPECT_NE(st.message().find("'" + key + "'"), std::string::npos) << st.message();
  };
  for (const char* o : {"adamw_torch", "adamw_hf", "adamw_torch_fused", "sgd", "adamw_8bit"}) {
    TrainConfig x = c;
    x.optim = o;
    EXPECT_TRUE(CheckTrainerConfig(x).ok()) << o;
    EXPECT_TRUE(MakeOptimizer(x).ok()) << o;
  }
  TrainConfig x = c;
  x.fp16 = true;
  EXPECT_TRUE(CheckTrainerConfig(x).ok());  // fp16 with dynamic loss scaling (e2e.fp16_test)
  x.bf16 = true;
  expect_key(x, "fp16");
  x = c;
  x.resume_from_checkpoint = "last";  // resolved when the run starts (checkpoint_test.cc)
  EXPECT_TRUE(CheckTrainerConfig(x).ok());
  x = c;
  x.finetuning_type = "full";
  x.quantization_bit = 4;
  expect_key(x, "quantization_bit");
  x = c;
  x.lora_target = {"q_proj", "qkv"};
  expect_key(x, "lora_target");
  x = c;
  x.finetuning_type = "lora";
  x.adapter_name_or_path = "some/dir";  // continued (checked when the run loads it, e2e.train_test)
  EXPECT_TRUE(CheckTrainerConfig(x).ok());
  x.adapter_name_or_path = "a,b";  // one adapter is continued
  expect_key(x, "adapter_name_or_path");
  x.adapter_name_or_path = "some/dir";
  x.finetuning_type = "full";
  expect_key(x, "adapter_name_or_path");
}

TEST(TrainerConfigErrors, LoraTargetsByNameAndShortName) {
  auto t = ParseLoraTargets({"q_proj", "v", "down_proj"});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, (std::vector<model::LoraModule>{model::LoraModule::kQ, model::LoraModule::kV,
                                                model::LoraModule::kDown}));
  EXPECT_EQ(ParseLoraTargets({"all"})->size(), (size_t)model::LoraModule::kCount);
  auto bad = ParseLoraTargets({"q_prj"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("did you mean 'q_proj'"), std::string::npos)
      << bad.status().message();
}

TEST(TrainerConfigErrors, DataProblemsNameTheKey) {
  FakeTrainModel m(16, /*max_seq_len=*/4);
  TrainConfig c = BaseConfig("/tmp/unused");
  auto t = Trainer::Create(c, m, MakeData(4, 0), TrainerEnv{});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("'cutoff_len'"), std::string::npos) << t.status().message();
  FakeTrainModel m2(16);
  c.eval_strategy = "steps";
  t = Trainer::Create(c, m2, MakeData(4, 0), TrainerEnv{});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("'eval_strategy'"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("val_size"), std::string::npos);
}

}  // namespace
}  // namespace lathe::train
