// TrainConfig: LLaMA-Factory YAML as written by its examples, overrides, and errors that name
// the key and the nearest valid one.
#include "train/train_config.h"

#include <gtest/gtest.h>

namespace lathe::train {
namespace {

// LLaMA-Factory's examples/train_lora/llama3_lora_sft.yaml, unchanged apart from the paths.
const char kLlamaFactoryExample[] = R"(### model
model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct
trust_remote_code: true

### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all

### dataset
dataset: identity,alpaca_en_demo
template: llama3
cutoff_len: 2048
max_samples: 1000
overwrite_cache: true
preprocessing_num_workers: 16
dataloader_num_workers: 4

### output
output_dir: saves/llama3-8b/lora/sft
logging_steps: 10
save_steps: 500
plot_loss: true
overwrite_output_dir: true
save_only_model: false
report_to: none  # choices: [none, wandb, tensorboard, swanlab, mlflow]

### train
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
ddp_timeout: 180000000
resume_from_checkpoint: null
)";

TEST(TrainConfig, ParsesLlamaFactoryExample) {
  auto c = ParseTrainConfig(kLlamaFactoryExample, "llama3_lora_sft.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->finetuning_type, "lora");
  EXPECT_EQ(c->dataset, (std::vector<std::string>{"identity", "alpaca_en_demo"}));
  EXPECT_EQ(c->template_name, "llama3");
  EXPECT_EQ(c->cutoff_len, 2048);
  EXPECT_DOUBLE_EQ(c->learning_rate, 1e-4);
  EXPECT_DOUBLE_EQ(c->num_train_epochs, 3.0);
  EXPECT_EQ(c->lr_scheduler_type, "cosine");
  EXPECT_TRUE(c->bf16);
  EXPECT_EQ(c->gradient_accumulation_steps, 8);
  EXPECT_TRUE(c->resume_from_checkpoint.empty());
  EXPECT_EQ(c->ignored_keys.size(), 7u);  // trust_remote_code ... ddp_timeout
  EXPECT_TRUE(c->Validate().ok()) << c->Validate().message();
}

TEST(TrainConfig, YamlListsAndOverrides) {
  auto c = ParseTrainConfig("model_name_or_path: m\noutput_dir: o\ndataset: [a, b]\nlora_target:\n  - q_proj\n  - v_proj\n",
                            "x.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->dataset, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c->lora_target, (std::vector<std::string>{"q_proj", "v_proj"}));
  ASSERT_TRUE(ApplyOverrides(&*c, {{"--learning-rate", "3e-4"}, {"--max_steps", "20"}}).ok());
  EXPECT_DOUBLE_EQ(c->learning_rate, 3e-4);
  EXPECT_EQ(c->max_steps, 20);
  EXPECT_EQ(c->row_group_workers, 0);
  ASSERT_TRUE(ApplyOverrides(&*c, {{"--row_group_workers", "1"}}).ok());
  EXPECT_EQ(c->row_group_workers, 1);
  EXPECT_FALSE(ParseTrainConfig("row_group_workers: -1\n", "x.yaml").ok());
  EXPECT_FALSE(c->group_by_length);
  ASSERT_TRUE(ApplyOverrides(&*c, {{"--group_by_length", "true"}}).ok());
  EXPECT_TRUE(c->group_by_length);
}

TEST(TrainConfig, ErrorsNameKeyAndSuggest) {
  auto c = ParseTrainConfig("model_name_or_path: m\nlearning_rat: 1e-4\n", "bad.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("bad.yaml line 2: unknown key 'learning_rat' (did you mean 'learning_rate'?)"),
            std::string::npos)
      << c.status().message();
  c = ParseTrainConfig("lora_rank: eight\n", "bad.yaml");
  EXPECT_NE(c.status().message().find("key 'lora_rank': 'eight' is not an integer"), std::string::npos)
      << c.status().message();
  c = ParseTrainConfig("finetuning_type: loar\n", "bad.yaml");
  EXPECT_NE(c.status().message().find("did you mean 'lora'"), std::string::npos) << c.status().message();
  c = ParseTrainConfig("lr_scheduler_type: cosin\n", "bad.yaml");
  EXPECT_NE(c.status().message().find("did you mean 'cosine'"), std::string::npos) << c.status().message();
  c = ParseTrainConfig("a: [unclosed\n", "bad.yaml");
  EXPECT_NE(c.status().message().find("bad.yaml: invalid YAML at line"), std::string::npos) << c.status().message();
  TrainConfig t;
  EXPECT_NE(ApplyOverrides(&t, {{"--batch_size", "4"}}).message().find("unknown key 'batch_size'"), std::string::npos);
  t.model_name_or_path = "m";
  t.output_dir = "o";
  t.dataset = {"d"};
  t.bf16 = t.fp16 = true;
  EXPECT_FALSE(t.Validate().ok());
}

}  // namespace
}  // namespace lathe::train
