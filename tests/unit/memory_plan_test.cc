// MemoryPlan against hand-computed figures and the familiar rules of thumb.
#include "train/memory_plan.h"

#include <gtest/gtest.h>

#include <tuple>

#include "core/cpu.h"
#include "core/strings.h"

#include <map>
#include <random>

#include "core/thread_pool.h"
#include "kernels/cpu/train_dispatch.h"
#include "model/train_model.h"
#include "random_model.h"
#include "train/quantize_base.h"

namespace lathe::train {
namespace {

model::ModelConfig Arch(const std::string& name) { return NamedArchitecture(name).value(); }

TEST(MemoryPlan, FamiliarWeightFigures) {
  model::ModelConfig c = Arch("llama-7b");
  EXPECT_EQ(c.ParamCount(), 6738415616);  // Llama-2-7B's published parameter count
  // Qwen3's model cards: 0.6B (0.44B non-embedding), 8.2B (6.95B non-embedding); head_dim 128 and the q/k norms.
  for (auto [name, total, non_embedding] : {std::tuple{"qwen3-0.6b", 0.6e9, 0.44e9}, {"qwen3-8b", 8.2e9, 6.95e9}}) {
    model::ModelConfig q = Arch(name);
    const double emb = (double)q.vocab_size * q.dim * (q.tied_embeddings ? 1 : 2);
    EXPECT_NEAR((double)q.ParamCount(), total, 0.05e9) << name;
    EXPECT_NEAR((double)q.ParamCount() - emb, non_embedding, 0.005e9) << name;
  }
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

// lathe mode: the plan of a run against what TrainModel reports it allocated, category by category,
// on a random SmolLM2-like model (GQA, tied head, ffn > dim) after one micro-batch.
namespace lathe::train {
namespace {

model::ModelWeights RandomWeights(const model::ModelConfig& c) { return testing::RandomModelWeights(c); }

struct Setting {
  const char* method;
  bool bf16, ckpt;
  std::vector<std::string> targets;
  double dropout = 0;
  int64_t row_group_tokens = 512;  // 24 = one row (T) at a time
};

// A 2-layer GQA model with a tied head, small enough to train in a unit test.
model::ModelConfig TinyConfig(int64_t ffn_dim) { return testing::SmallLlamaConfig(2, 64, 4, 2, 16, ffn_dim); }

// LoRA keeps an f32 copy of the frozen head for the loss's dx (PackedHeadBytes), but not over a
// quantized base: a QLoRA / 8-bit run is saving memory (the plan agrees: PackedBaseWeightsUseLathesLayouts).
TEST(MemoryPlanLathe, PackedHeadOnlyOverAnUnquantizedBase) {
  const model::ModelConfig c = TinyConfig(128);  // NF4 needs in-dims that are multiples of 64
  const int64_t B = 1, T = 16;
  std::vector<int32_t> ids(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = (int32_t)((i * 37) % c.vocab_size);
  ThreadPool pool(2);
  for (DType q : {DType::kF32, DType::kNF4DQ, DType::kI8Row}) {
    SCOPED_TRACE(DTypeName(q));
    model::ModelWeights w = RandomWeights(c);
    if (q != DType::kF32) {
      ASSERT_TRUE(QuantizeBaseWeights(&w, q, c.n_layers).ok());
    }
    model::TrainModelOptions o;
    o.method = model::FinetuneMethod::kLora;
    o.lora_rank = 4;
    auto tm = model::TrainModel::Create(w, pool, o);
    ASSERT_TRUE(tm.ok()) << tm.status().message();
    model::TrainBatch b{ids, ids, {}, B, T};
    ASSERT_TRUE((*tm)->ForwardBackward(b, 1.0).ok());
    const int64_t want = q == DType::kF32 ? model::PackedHeadBytes(c.vocab_size, c.dim, false, false) : 0;
    EXPECT_EQ((*tm)->AllocatedBytes().weights, want);
    if (q == DType::kF32) {
      EXPECT_GT(want, 0);
    }
  }
}

// The plan of every setting equals what TrainModel allocates for model c (run by the tests below).
void CheckPlanMatchesTrainModelAllocations(const model::ModelConfig& c) {
  model::ModelWeights w = RandomWeights(c);
  ASSERT_TRUE(w.Validate("random").ok()) << w.Validate("random").message();
  const int64_t B = 2, T = 24;
  std::vector<int32_t> ids(B * T), labels(B * T);
  for (int64_t i = 0; i < B * T; ++i) ids[i] = labels[i] = (int32_t)((i * 37) % c.vocab_size);
  ThreadPool pool(2);
  const std::vector<Setting> settings = {
      {"lora", false, false, {"q", "k", "v", "o", "gate", "up", "down"}},
      {"lora", true, false, {"q", "v"}},
      {"lora", true, false, {"q", "k", "v", "o", "gate", "up", "down"}, 0.1},
      {"lora", false, false, {"o", "down"}, 0.1},
      {"lora", false, true, {"q", "k", "v", "o", "gate", "up", "down"}},
      {"full", false, false, {}},
      {"full", true, true, {}},
      {"freeze", true, false, {}},
      {"lora", false, false, {"q", "k", "v", "o", "gate", "up", "down"}, 0.1, 24},
      {"lora", true, true, {"q", "v"}, 0, 24},
      {"full", false, false, {}, 0, 24},
      {"full", true, true, {}, 0, 24},
      {"freeze", false, false, {}, 0, 24},  // two groups on two workers
  };
  for (const Setting& st : settings) {
    SCOPED_TRACE(StrFormat("%s bf16=%d ckpt=%d targets=%zu dropout=%g row_group_tokens=%lld", st.method, st.bf16,
                           st.ckpt, st.targets.size(), st.dropout, (long long)st.row_group_tokens));
    model::TrainModelOptions o;
    o.method = std::string(st.method) == "lora"   ? model::FinetuneMethod::kLora
               : std::string(st.method) == "full" ? model::FinetuneMethod::kFull
                                                  : model::FinetuneMethod::kFreeze;
    o.bf16 = st.bf16;
    o.gradient_checkpointing = st.ckpt;
    o.lora_rank = 4;
    o.lora_dropout = st.dropout;
    o.freeze_trainable_layers = 1;
    o.row_group_tokens = st.row_group_tokens;
    o.lora_targets.clear();
    for (const std::string& t : st.targets)
      for (int m = 0; m < (int)model::LoraModule::kCount; ++m)
        if (std::string(model::LoraModuleName((model::LoraModule)m)) == t + "_proj")
          o.lora_targets.push_back((model::LoraModule)m);
    auto tm = model::TrainModel::Create(w, pool, o);
    ASSERT_TRUE(tm.ok()) << tm.status().message();
    model::TrainBatch b{ids, labels, {}, B, T};
    ASSERT_TRUE((*tm)->ForwardBackward(b, 1.0).ok());
    model::TrainMemory got = (*tm)->AllocatedBytes();

    TrainSetup s;
    s.lathe = true;
    s.method = st.method;
    s.precision = st.bf16 ? "bf16" : "fp32";
    s.batch_size = B;
    s.seq_len = T;
    s.grad_checkpointing = st.ckpt;
    s.lora_rank = 4;
    s.lora_dropout = st.dropout;
    s.lora_targets = st.targets;
    s.freeze_trainable_layers = 1;
    s.loss_chunk_tokens = o.loss_chunk_tokens;
    s.threads = (int)pool.size();
    s.row_group_tokens = st.row_group_tokens;
    s.base_weight_bytes = 1000;  // a marker: the weights line as given
    s.base_released_bytes = 0;   // anonymous buffers: Create copies and cannot drop them
    s.frozen_copy_bytes = 0;     // nor keep frozen f32 linears as bf16 copies (their f32 pages would stay)
    EXPECT_EQ(got.base_released, 0);
    EXPECT_EQ(got.frozen_copies, 0);
    MemoryPlan p = PlanTraining(c, s).value();
    // The plan's row-group workers are the model's: two groups on two threads run on two workers, but full
    // fine-tuning's on one.
    EXPECT_EQ(LatheWorkers(c, s), (*tm)->MaxRowGroupWorkers(B));
    if (st.row_group_tokens == T) {
      EXPECT_EQ((*tm)->MaxRowGroupWorkers(B), std::string(st.method) == "full" ? 1 : 2);
    }
    EXPECT_EQ(p.trainable_params, (*tm)->trainable_count());
    EXPECT_DOUBLE_EQ(p.Bytes("gradients"), (double)got.gradients);
    EXPECT_DOUBLE_EQ(p.Bytes("lora"), (double)got.lora);
    EXPECT_DOUBLE_EQ(p.Bytes("weights") - 1000, (double)got.weights);
    EXPECT_DOUBLE_EQ(p.Bytes("activations"), (double)got.activations);
    // The model's own scratch; the cross-entropy chunk, the matmul panels and the kernels'
    // per-thread tiles live inside kernel calls, the save copy inside SaveHfModel / SavePeftAdapter.
    double own = 0;
    int others = 0;
    for (const PlanLine& l : p.lines) {
      if (l.category != "temporary") continue;
      bool kernel = l.formula.rfind("cross-entropy", 0) == 0 || l.formula.rfind("per-thread", 0) == 0 ||
                    l.formula.rfind("matmul B panels", 0) == 0 || l.formula.rfind("matmul A micro-panels", 0) == 0 ||
                    l.formula.rfind("while saving", 0) == 0 || l.formula.rfind("bf16 dot product", 0) == 0;
      if (kernel) {
        others++;
      } else {
        own += l.bytes;
      }
    }
    // The A micro-panels line: on CPUs whose training kernels have a panel tile (AVX-512).
    // The bf16 dot product's operand pairs and the attention's: bf16 mode where the CPU uses it.
    EXPECT_EQ(others, (kernels::cpu::TrainBest().gemm_panel ? 5 : 4) + (st.bf16 && UsesBf16Dot() ? 2 : 0));
    EXPECT_NEAR(own, (double)got.temporary, 0.02 * (double)got.temporary);
    std::printf("%-6s bf16=%d ckpt=%d: plan temporary %.0f vs model %lld\n", st.method, st.bf16, st.ckpt, own,
                (long long)got.temporary);
    const bool lora = std::string(st.method) == "lora", bf16_dot = st.bf16 && UsesBf16Dot();
    if (lora && !bf16_dot) continue;
    // Handed over (the bench's CreateInPlace, all-f32 base). Full / freeze: the plan's default assumption that
    // every trainable base tensor leaves memory holds exactly, and no f32 copy is made. LoRA in bf16 mode on the
    // bf16 dot product: every frozen linear becomes a bf16 copy and its f32 pages (the whole ones) are dropped.
    model::ModelWeights own_w = RandomWeights(c);
    auto ip = model::TrainModel::CreateInPlace(own_w, pool, o);
    ASSERT_TRUE(ip.ok()) << ip.status().message();
    ASSERT_TRUE((*ip)->ForwardBackward(b, 1.0).ok());
    model::TrainMemory in_place = (*ip)->AllocatedBytes();
    s.base_weight_bytes = 4.0 * c.ParamCount();
    s.base_released_bytes = -1;
    s.frozen_copy_bytes = -1;
    if (lora) {
      const int64_t lin = c.n_layers * (2 * c.dim * c.q_dim() + 2 * c.dim * c.kv_dim() + 3 * c.dim * c.ffn_dim);
      EXPECT_EQ(in_place.frozen_copies, 2 * lin);
      EXPECT_LE(in_place.base_released, 4 * lin);
      EXPECT_GE(in_place.base_released, 4 * lin - 7 * c.n_layers * 8192);  // partial pages at the edges stay
      // The plan from the measured figures (as `lathe train` makes it) matches the model exactly; its estimate
      // (a file-backed base: every frozen f32 linear byte released, and the head's, which the handed-over
      // anonymous head keeps for the embedding) within those edge pages.
      const double est = PlanTraining(c, s).value().Bytes("weights");
      const double head = 4.0 * c.vocab_size * c.dim;  // the f32 head, taken as a bf16 copy (FrozenHeadAsBf16)
      s.base_released_bytes = (double)in_place.base_released;
      s.frozen_copy_bytes = (double)in_place.frozen_copies;
      EXPECT_NEAR(est + head, PlanTraining(c, s).value().Bytes("weights"), 7 * c.n_layers * 8192);
    } else {
      EXPECT_EQ(in_place.base_released, (*ip)->trainable_count() * 4);
      EXPECT_EQ(in_place.frozen_copies, 0);  // freeze: the frozen layers are read again when saving
      s.frozen_copy_bytes = 0;  // anonymous frozen layers: no copies (a file-backed base would have them)
    }
    MemoryPlan pi = PlanTraining(c, s).value();
    EXPECT_DOUBLE_EQ(pi.Bytes("weights"), s.base_weight_bytes - (double)in_place.base_released + (double)in_place.weights);
  }
}

TEST(MemoryPlanLathe, MatchesTrainModelAllocations) { CheckPlanMatchesTrainModelAllocations(TinyConfig(160)); }

// qwen3: the q / k norms' saved inputs, their gradients' scratch, and a head_dim (32) above dim / heads.
TEST(MemoryPlanLathe, MatchesTrainModelAllocationsWithQkNorms) {
  model::ModelConfig c = testing::SmallLlamaConfig(2, 64, 4, 2, 32, 160);
  c.arch = "qwen3";
  c.qk_norm = true;
  CheckPlanMatchesTrainModelAllocations(c);
}

}  // namespace
}  // namespace lathe::train

namespace lathe::train {
namespace {

TEST(MemoryPlanLathe, PackedBaseWeightsUseLathesLayouts) {
  model::ModelConfig c = NamedArchitecture("smollm2-135m").value();
  TrainSetup s;
  s.lathe = true;
  const double lin = 30.0 * (576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536), other = c.ParamCount() - lin;
  std::map<std::string, double> w;
  for (const char* q : {"none", "int8", "nf4", "nf4_dq"}) {
    s.base_quant = q;
    // Minus the frozen head's packed f32 copy (a LoRA setup over an unquantized base keeps one for
    // the loss's dx).
    w[q] = PlanTraining(c, s)->Bytes("weights") -
           (double)model::PackedHeadBytes(c.vocab_size, c.dim, false, std::string(q) != "none");
  }
  EXPECT_EQ(model::PackedHeadBytes(c.vocab_size, c.dim, false, false), 4 * c.vocab_size * c.dim);
  // A trained head changes every step: never packed (the loss pairs its rows a chunk at a time), as f32 or pairs.
  EXPECT_EQ(model::PackedHeadBytes(c.vocab_size, c.dim, true, false), 0);
  EXPECT_EQ(model::PackedHeadBytes(c.vocab_size, c.dim, true, false, true), 0);
  // A frozen bf16 head as pairs: half the f32 copy's bytes, not over a quantized base.
  EXPECT_LT(model::PackedHeadBytes(c.vocab_size, c.dim, false, false, true), 4 * c.vocab_size * c.dim);
  EXPECT_GE(model::PackedHeadBytes(c.vocab_size, c.dim, false, false, true), 2 * c.vocab_size * c.dim);
  EXPECT_EQ(model::PackedHeadBytes(c.vocab_size, c.dim, false, true, true), 0);
  EXPECT_EQ(model::PackedHeadBytes(c.vocab_size, c.dim, false, true), 0);  // QLoRA / int8: saving memory
  EXPECT_DOUBLE_EQ(w["none"], c.ParamCount() * 2.0);  // bf16 base
  // int8 rows: 1 B + an f32 scale per row; NF4: 0.5 B + an f32 absmax per 64; DQ: a u8 per 64.
  EXPECT_NEAR(w["int8"] - other * 2, lin * 1.0, lin * 0.01);
  EXPECT_NEAR(w["nf4"] - other * 2, lin * (0.5 + 4.0 / 64), lin * 0.002);
  EXPECT_NEAR(w["nf4_dq"] - other * 2, lin * (0.5 + 1.0 / 64), lin * 0.002);
}

// One mapping between base_quant names and packed dtypes for the plan, `lathe estimate` and `lathe train`.
TEST(MemoryPlanLathe, BaseQuantNamesAndPackedDTypes) {
  for (const char* q : {"int8", "nf4", "nf4_dq"}) EXPECT_EQ(BaseQuantName(BaseQuantDType(q)), q);
  EXPECT_EQ(BaseQuantName(DType::kFP4), "nf4");  // the same bytes
  EXPECT_EQ(BaseQuantName(DType::kFP4DQ), "nf4_dq");
  TrainSetup s;
  s.method = "qlora";
  EXPECT_EQ(BaseQuantOf(s), "nf4_dq");  // qlora implies NF4 + double quant
  s.base_quant = "int8";
  EXPECT_EQ(BaseQuantOf(s), "int8");
  s.method = "lora";
  s.base_quant = "none";
  EXPECT_EQ(BaseQuantOf(s), "none");
  EXPECT_TRUE(PackableAs(DType::kI8Row, 172));
  EXPECT_FALSE(PackableAs(DType::kNF4DQ, 172));
  EXPECT_TRUE(PackableAs(DType::kNF4DQ, 192));
}

// A linear whose in_features the 4-bit blocks cannot take stays as stored (QuantizeBaseWeights keeps
// it), as stories260K's down_proj (in 172): planned at its f32 bytes, not packed.
TEST(MemoryPlanLathe, UnpackableLinearsPlannedAsStored) {
  model::ModelConfig c = NamedArchitecture("smollm2-135m").value();
  c.ffn_dim = 1540;  // 1540 % 64 = 4
  TrainSetup s;
  s.lathe = true;
  s.precision = "fp32";
  s.base_quant = "int8";
  const double int8 = PlanTraining(c, s)->Bytes("weights");
  s.base_quant = "nf4";
  const double nf4 = PlanTraining(c, s)->Bytes("weights");
  // int8 packs every linear (~1 B each); nf4 keeps down (dim x hidden) at 4 B, packs the rest (~0.56 B).
  const double down = (double)c.n_layers * c.dim * c.ffn_dim;
  const double lin = (double)c.n_layers * (2.0 * c.dim * c.dim + 2.0 * c.dim * c.kv_dim() + 3 * down / c.n_layers);
  EXPECT_NEAR(nf4 - int8, down * 3.0 - (lin - down) * (1.0 - 0.5625), lin * 0.05);
  bool said = false;  // the weights line says so
  const MemoryPlan plan = PlanTraining(c, s).value();  // held: a range-for over a temporary's member dangles
  for (const PlanLine& l : plan.lines)
    said = said || l.formula.find(StrFormat("%lld kept as stored", (long long)down)) != std::string::npos;
  EXPECT_TRUE(said);
}

}  // namespace
}  // namespace lathe::train

namespace lathe::train {
namespace {

// TrainModel runs a micro-batch's rows in groups of model::RowGroupRows: the plan sizes
// activations for the largest group any padded length up to seq_len can form.
TEST(MemoryPlanLathe, ActivationsForOneRowGroup) {
  TrainSetup s;
  s.lathe = true;
  auto group = [&](int64_t B, int64_t S, int64_t G) {
    s.batch_size = B;
    s.seq_len = S;
    s.row_group_tokens = G;
    return LatheGroupTokens(s);
  };
  EXPECT_EQ(group(4, 512, 512), 512);
  EXPECT_EQ(group(4, 1024, 512), 1024);
  EXPECT_EQ(group(16, 128, 512), 512);
  EXPECT_EQ(group(2, 24, 512), 24);  // at most half the rows per group
  EXPECT_EQ(group(4, 300, 512), 512);  // padded to 256: two rows
  EXPECT_EQ(group(4, 512, 0), 2048);
  model::ModelConfig c = NamedArchitecture("smollm2-135m").value();
  s.method = "full";
  s.precision = "fp32";
  s.batch_size = 4;
  s.seq_len = 512;
  s.row_group_tokens = 0;
  const MemoryPlan whole = PlanTraining(c, s).value();
  s.row_group_tokens = 512;
  const MemoryPlan rows = PlanTraining(c, s).value();
  // All but the tied embedding's input-gradient rows (the whole micro-batch's either way).
  const double tied_rows = 4.0 * 4 * 512 * 576;
  EXPECT_NEAR(rows.Bytes("activations") - tied_rows, (whole.Bytes("activations") - tied_rows) / 4, 1e6);
  // One group: the backward hands activation pages back as gradients come in; several: the later
  // groups' activations sit next to every gradient.
  const double layer_grads = 4.0 * 30 * (576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536 + 2 * 576);
  // (Besides the loss's buffers against the block backward's scratch, which scales with the group's tokens.)
  auto loss_overlap = [](const MemoryPlan& p) {
    double b = 0;
    for (const PlanLine& l : p.lines)
      if (l.category == "overlap" && l.formula.rfind("-min(the loss's", 0) == 0) b += l.bytes;
    return b;
  };
  EXPECT_LT(loss_overlap(rows), 0);
  EXPECT_DOUBLE_EQ(whole.Bytes("overlap") - loss_overlap(whole) - rows.Bytes("overlap") + loss_overlap(rows),
                   -layer_grads);
  EXPECT_LT(rows.Total(), whole.Total());
  // The run hands pages back exactly when the plan counts that overlap: not with accumulated
  // micro-batches (the second one's forward holds every gradient), LoRA or checkpointing.
  s.row_group_tokens = 0;
  EXPECT_TRUE(LatheHandsBackPages(s));
  s.grad_accum = 2;
  EXPECT_FALSE(LatheHandsBackPages(s));
  EXPECT_DOUBLE_EQ(PlanTraining(c, s).value().Bytes("overlap") - whole.Bytes("overlap"), layer_grads);
  s.grad_accum = 1;
  s.row_group_tokens = 512;
  EXPECT_FALSE(LatheHandsBackPages(s));
  s.batch_size = 1;
  EXPECT_TRUE(LatheHandsBackPages(s));
  s.grad_checkpointing = true;
  EXPECT_FALSE(LatheHandsBackPages(s));
  s.grad_checkpointing = false;
  s.method = "lora";
  EXPECT_FALSE(LatheHandsBackPages(s));
}

}  // namespace
}  // namespace lathe::train
