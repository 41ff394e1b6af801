// MemoryPlan against hand-computed figures and the familiar rules of thumb.
#include "train/memory_plan.h"

#include <gtest/gtest.h>

namespace lathe::train {
namespace {

model::ModelConfig Arch(const std::string& name) { return NamedArchitecture(name).value(); }

TEST(MemoryPlan, FamiliarWeightFigures) {
  model::ModelConfig c = Arch("llama-7b");
  EXPECT_EQ(c.ParamCount(), 6738415616);  // Llama-2-7B's published parameter count
  InferSetup s;
  s.param_count = 7'000'000'000;
  s.weight_dtype = DType::kF32;
  EXPECT_NEAR(PlanInference(c, s).Bytes("weights"), 28e9, 1e7);
  s.weight_dtype = DType::kF16;
  EXPECT_NEAR(PlanInference(c, s).Bytes("weights"), 14e9, 1e7);
  s.weight_dtype = DType::kQ8_0;  // 8.5 bits: int8 + an f16 scale per 32
  EXPECT_NEAR(PlanInference(c, s).Bytes("weights"), 7e9 * 34 / 32, 1e7);
  // Training base weights: int8 ~7 GB, nf4 ~3.5 GB + constants.
  TrainSetup t;
  t.param_count = 7'000'000'000;
  t.base_quant = "int8";
  double int8 = PlanTraining(c, t)->Bytes("weights");
  EXPECT_GT(int8, 7.0e9);
  EXPECT_LT(int8, 7.3e9);  // embeddings stay 16-bit
  t.base_quant = "nf4";
  double nf4 = PlanTraining(c, t)->Bytes("weights");
  t.base_quant = "nf4_dq";
  double nf4_dq = PlanTraining(c, t)->Bytes("weights");
  EXPECT_GT(nf4, 3.5e9);
  EXPECT_LT(nf4_dq, nf4);  // double quant saves ~0.37 bits/param on the linear layers
  EXPECT_NEAR(nf4 - nf4_dq, 6.74e9 * 7000.0 / 6738.4 * (4.0 / 64 - 1.0 / 64 - 4.0 / 16384) * 0.96, 0.05e9);
  EXPECT_NEAR(QuantBytesPerParam("nf4_dq", 4096), 0.5 + 1.0 / 64 + 4.0 / 16384, 1e-12);
}

TEST(MemoryPlan, FullFineTuningBytesPerParam) {
  model::ModelConfig c = Arch("smollm2-135m");
  const double P = (double)c.ParamCount();
  TrainSetup t;
  t.method = "full";
  t.precision = "fp32";
  auto fp32 = PlanTraining(c, t).value();
  // fp32: weights 4 + grads 4 + AdamW 8 (not 12: there is no separate master copy).
  EXPECT_DOUBLE_EQ(fp32.Bytes("weights") + fp32.Bytes("gradients") + fp32.Bytes("optimizer"), 16 * P);
  EXPECT_DOUBLE_EQ(fp32.Bytes("optimizer"), 8 * P);
  t.precision = "bf16";
  auto mixed = PlanTraining(c, t).value();
  // bf16 mixed: 2 B working copy + 4 B f32 master + 4 B grads + 8 B AdamW = 18 (the "12" of
  // the common tables is master + m + v).
  EXPECT_DOUBLE_EQ(mixed.Bytes("weights") + mixed.Bytes("gradients") + mixed.Bytes("optimizer"), 18 * P);
  t.precision = "pure_bf16";
  auto pure = PlanTraining(c, t).value();
  EXPECT_DOUBLE_EQ(pure.Bytes("weights") + pure.Bytes("gradients") + pure.Bytes("optimizer"), 8 * P);
  t.precision = "fp32";
  t.optimizer = "adamw_8bit";
  EXPECT_DOUBLE_EQ(PlanTraining(c, t)->Bytes("optimizer"), P * (2 + 8.0 / 256));
}

TEST(MemoryPlan, LoraParamsHandComputed) {
  model::ModelConfig c = Arch("smollm2-135m");  // dim 576, q 576, kv 192, ffn 1536, 30 layers
  int64_t per_layer = 16 * ((576 + 576) + (576 + 192) * 2 + (576 + 576) + (576 + 1536) * 3);
  EXPECT_EQ(LoraParams(c, {"q", "k", "v", "o", "gate", "up", "down"}, 16), 30 * per_layer);
  EXPECT_EQ(LoraParams(c, {"q", "v"}, 8), 30 * 8 * ((576 + 576) + (576 + 192)));
}

TEST(MemoryPlan, ZeroShardingAndOffload) {
  model::ModelConfig c = Arch("llama-7b");
  TrainSetup t;
  t.method = "full";
  t.precision = "fp32";
  t.world_size = 4;
  auto base = PlanTraining(c, t).value();
  t.zero_stage = 1;
  auto z1 = PlanTraining(c, t).value();
  EXPECT_DOUBLE_EQ(z1.Bytes("optimizer"), base.Bytes("optimizer") / 4);
  EXPECT_DOUBLE_EQ(z1.Bytes("gradients"), base.Bytes("gradients"));
  t.zero_stage = 3;
  auto z3 = PlanTraining(c, t).value();
  EXPECT_DOUBLE_EQ(z3.Bytes("gradients"), base.Bytes("gradients") / 4);
  EXPECT_DOUBLE_EQ(z3.Bytes("weights"), base.Bytes("weights") / 4);
  t.cpu_offload = true;
  auto off = PlanTraining(c, t).value();
  EXPECT_DOUBLE_EQ(off.Total("host"), off.Bytes("optimizer"));
}

TEST(MemoryPlan, CheckpointingShrinksActivations) {
  model::ModelConfig c = Arch("smollm2-135m");
  TrainSetup t;
  t.batch_size = 4;
  t.seq_len = 512;
  double full = ActivationBytes(c, t);
  t.grad_checkpointing = true;
  double ckpt = ActivationBytes(c, t);
  EXPECT_LT(ckpt * 5, full);
  // Hand count for one layer, bf16 saved tensors: 4*576 + 2*576 + 2*192 + 3*1536 + 8*7
  // = 8504 elements x 2 B + (2 + 9) x 4 B per token.
  t.grad_checkpointing = false;
  double per_layer_token = 8504 * 2 + 11 * 4;
  double final_norm = 2 * 576 * 2 + 4;
  EXPECT_DOUBLE_EQ(full, 2048 * (per_layer_token * 30 + final_norm));
}

TEST(MemoryPlan, BadSetupNamesTheKey) {
  model::ModelConfig c = Arch("smollm2-135m");
  TrainSetup t;
  t.optimizer = "adamw8bit";
  auto r = PlanTraining(c, t);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("did you mean 'adamw_8bit'"), std::string::npos) << r.status().message();
  auto a = NamedArchitecture("llama7b");
  EXPECT_NE(a.status().message().find("did you mean 'llama-7b'"), std::string::npos);
}

}  // namespace
}  // namespace lathe::train
