// TrainModel properties beyond the golden gradients: freeze (vs the full fine-tuning fixture),
// frozen block-quantized bases (Q8_0 / Q4_1, gradients through MatMulBackwardInput), gradient
// accumulation, gradient checkpointing, LoRA dropout, bf16 mixed precision and input errors.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <cstdlib>
#include <deque>
#include <random>

#include "core/cpu.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "kernels/train_ops.h"
#include "model/loader.h"
#include "model/transformer.h"
#include "train/optimizer.h"
#include "random_model.h"
#include "train_test_util.h"

namespace lathe::model {
namespace {

using namespace train_test;

TrainModelOptions Lora(double dropout = 0) {
  TrainModelOptions o;
  o.lora_rank = 4;
  o.lora_alpha = 8;
  o.lora_dropout = dropout;
  return o;
}

TrainModelOptions Full() {
  TrainModelOptions o;
  o.method = FinetuneMethod::kFull;
  return o;
}

TrainModelOptions Freeze() {  // the last layer trains
  TrainModelOptions o;
  o.method = FinetuneMethod::kFreeze;
  o.freeze_trainable_layers = 1;
  return o;
}

// Gives every LoRA B a deterministic non-zero value (PEFT's B = 0 would make dA zero).
void NonZeroB(TrainModel& m) {
  int64_t k = 0;
  for (const TrainableTensor& t : m.params())
    if (t.name.find("lora_B") != std::string::npos)
      for (int64_t i = 0; i < t.n; ++i, ++k) t.data[i] = (float)((k * 7919 % 97) - 48) / 2400.0f;
}

struct Grads {
  double loss = 0;
  std::vector<std::vector<float>> g;
};

Grads RunSteps(TrainModel& m, const std::vector<Batch>& micro, double normalizer, bool hand_back_pages = true) {
  Grads r;
  m.ZeroGrad(hand_back_pages);
  for (const Batch& b : micro) {
    auto l = m.ForwardBackward(b.View(), normalizer);
    EXPECT_TRUE(l.ok()) << l.status().message();
    r.loss += l.ok() ? *l : NAN;
  }
  for (const TrainableTensor& t : m.params()) r.g.emplace_back(t.grad, t.grad + t.n);
  return r;
}

double WorstErr(const Grads& a, const Grads& b) {
  double w = 0;
  EXPECT_EQ(a.g.size(), b.g.size());
  for (size_t i = 0; i < a.g.size() && i < b.g.size(); ++i)
    w = std::max(w, NormErr(a.g[i].data(), b.g[i].data(), (int64_t)b.g[i].size()));
  return w;
}

// Four rows: the fixture batch, the packed row without segments and row 0 reversed.
Batch FourRows(const Fixture& f) {
  Batch b = FixtureBatch(f);
  Batch p = FixtureBatch(f, "packed_ids", "packed_labels");
  Batch out;
  out.B = 4;
  out.T = b.T;
  out.ids = b.ids;
  out.labels = b.labels;
  out.ids.insert(out.ids.end(), p.ids.begin(), p.ids.end());
  out.labels.insert(out.labels.end(), p.labels.begin(), p.labels.end());
  out.ids.insert(out.ids.end(), b.ids.rbegin() + b.T, b.ids.rend());
  out.labels.insert(out.labels.end(), b.labels.rbegin() + b.T, b.labels.rend());
  return out;
}

Batch Row(const Batch& b, int64_t r) {
  Batch o;
  o.B = 1;
  o.T = b.T;
  o.ids.assign(b.ids.begin() + r * b.T, b.ids.begin() + (r + 1) * b.T);
  o.labels.assign(b.labels.begin() + r * b.T, b.labels.begin() + (r + 1) * b.T);
  return o;
}

int64_t Targets(const Batch& b) {
  int64_t n = 0;
  for (int64_t r = 0; r < b.B; ++r)
    for (int64_t t = 1; t < b.T; ++t) n += b.labels[r * b.T + t] != -100;
  return n;
}

TEST(TrainModelAccumulation, FourMicroBatchesOfOneEqualOneBatchOfFour) {
  auto w = LoadBase("llama_gqa_tied");
  ASSERT_TRUE(w.ok());
  Fixture f("train_llama_gqa_tied");
  Batch four = FourRows(f);
  const double n = (double)Targets(four);
  ThreadPool pool(2);
  for (TrainModelOptions o : {Lora(), Full()}) {
    auto m = Make(*w, pool, o);
    NonZeroB(*m);
    Grads one = RunSteps(*m, {four}, n);
    Grads acc = RunSteps(*m, {Row(four, 0), Row(four, 1), Row(four, 2), Row(four, 3)}, n);
    EXPECT_NEAR(acc.loss, one.loss, 1e-5 * one.loss);
    double e = WorstErr(acc, one);
    EXPECT_LT(e, 1e-5);
    std::printf("accumulation (%s): loss %.7g vs %.7g, worst grad normalized error %.3g\n",
                o.method == FinetuneMethod::kLora ? "lora" : "full", acc.loss, one.loss, e);
  }
}

// TrainModelOptions::hand_back_pages / ZeroGrad(false): gradients zeroed in place and saved tensors
// kept resident give the same bits as handing their pages back, step after step (the second step
// starts from gradients the first wrote, so a missed zero would double them).
TEST(TrainModelPages, ZeroingInPlaceGivesTheSameBits) {
  auto w = LoadBase("llama_gqa_tied");
  ASSERT_TRUE(w.ok());
  Fixture f("train_llama_gqa_tied");
  Batch four = FourRows(f);
  const double n = (double)Targets(four);
  ThreadPool pool(2);
  for (TrainModelOptions o : {Full(), Freeze(), Lora()}) {
    for (int64_t group_tokens : {0L, four.T}) {  // one group; a group per row
      o.row_group_tokens = group_tokens;
      std::vector<Grads> got[2];
      for (bool hand_back : {true, false}) {
        o.hand_back_pages = hand_back;
        auto m = Make(*w, pool, o);
        NonZeroB(*m);
        for (int step = 0; step < 3; ++step) got[hand_back].push_back(RunSteps(*m, {four}, n, hand_back));
        m->ZeroGrad(hand_back);
        for (const TrainableTensor& t : m->params())
          for (int64_t i = 0; i < t.n; ++i) ASSERT_EQ(t.grad[i], 0.0f) << t.name << "[" << i << "]";
      }
      for (int step = 0; step < 3; ++step) {
        EXPECT_EQ(got[0][step].loss, got[1][step].loss);
        ASSERT_EQ(got[0][step].g.size(), got[1][step].g.size());
        for (size_t i = 0; i < got[0][step].g.size(); ++i)
          EXPECT_EQ(got[0][step].g[i], got[1][step].g[i]) << "tensor " << i << ", step " << step;
      }
    }
  }
}

TEST(TrainModelRowGroups, RowGroupRows) {
  EXPECT_EQ(RowGroupRows(4, 512, 512), 1);
  EXPECT_EQ(RowGroupRows(4, 1024, 512), 1);
  EXPECT_EQ(RowGroupRows(16, 128, 512), 4);
  EXPECT_EQ(RowGroupRows(3, 128, 512), 2);  // at most half the rows: two groups
  EXPECT_EQ(RowGroupRows(4, 128, 512), 2);
  EXPECT_EQ(RowGroupRows(1, 128, 512), 1);
  EXPECT_EQ(RowGroupRows(4, 200, 512), 2);
  EXPECT_EQ(RowGroupRows(4, 512, 0), 4);
  EXPECT_EQ(RowGroupRows(4, 24, 1), 1);
}

// Six rows of 24 tokens: the fixture's two, the packed row (with its segment ids when `segments`),
// row 0 reversed, row 1 cut after 10 tokens (pad id 0, labels -100) and a padding row (no labels,
// last: the groups after the last one with targets are skipped).
Batch SixRows(const Fixture& f, bool segments) {
  Batch out = FourRows(f);
  const int64_t T = out.T;
  for (int64_t t = 0; t < T; ++t) {
    out.ids.push_back(t < 10 ? out.ids[T + t] : 0);
    out.labels.push_back(t < 10 ? out.labels[T + t] : -100);
  }
  out.ids.insert(out.ids.end(), out.ids.begin() + 3 * T, out.ids.begin() + 4 * T);
  out.labels.insert(out.labels.end(), T, -100);
  out.B = 6;
  if (segments) {
    std::vector<int32_t> packed = FixtureBatch(f, "packed_ids", "packed_labels", "packed_seg").seg;
    out.seg.assign(out.B * T, 0);
    std::copy(packed.begin(), packed.end(), out.seg.begin() + 2 * T);
  }
  return out;
}

// Rows run in groups (one at a time, two, four) give the whole batch's loss and gradients: only the
// summation order of weight gradients over tokens changes. LoRA dropout masks are keyed by the
// token's position in the micro-batch, so they match too (keyed per group they would not, error
// ~1e-1); padding rows and packed segments stay per row; bf16, checkpointing and freeze alike.
TEST(TrainModelRowGroups, GroupsOfRowsEqualTheWholeBatch) {
  auto w = LoadBase("llama_gqa_tied");
  ASSERT_TRUE(w.ok());
  Fixture f("train_llama_gqa_tied");
  ThreadPool pool(2);
  TrainModelOptions bf16 = Lora(0.1), ckpt = Full();
  bf16.bf16 = true;
  ckpt.gradient_checkpointing = true;
  ckpt.lora_dropout = 0;
  const char* names[] = {"lora dropout 0.1", "lora bf16 dropout 0.1", "full", "full ckpt", "freeze"};
  const TrainModelOptions opts[] = {Lora(0.1), bf16, Full(), ckpt, Freeze()};
  for (bool segments : {false, true}) {
    const Batch b = SixRows(f, segments);
    const double n = (double)Targets(b);
    for (int i = 0; i < 5; ++i) {
      TrainModelOptions o = opts[i];
      o.row_group_tokens = 0;
      auto whole = Make(*w, pool, o);
      NonZeroB(*whole);
      const Grads ref = RunSteps(*whole, {b}, n);
      int64_t n_eval = 0;
      const double eval_ref = whole->Loss(b.View(), &n_eval).value();
      for (int64_t rows : {1, 2, 4})
        for (int64_t workers : {1, 2}) {
          SCOPED_TRACE(StrFormat("%s, segments %d, %lld rows per group, %lld workers", names[i], segments,
                                 (long long)rows, (long long)workers));
          o.row_group_tokens = rows * b.T;
          o.row_group_workers = workers;  // full / freeze: at most one per thread (2 here)
          auto g = Make(*w, pool, o);
          NonZeroB(*g);
          const Grads got = RunSteps(*g, {b}, n);
          const double e = WorstErr(got, ref);
          std::printf("row groups (%s, segments %d, %lld rows, %lld workers): loss %.9g vs %.9g, worst grad "
                      "normalized error %.3g\n",
                      names[i], segments, (long long)rows, (long long)workers, got.loss, ref.loss, e);
          EXPECT_NEAR(got.loss, ref.loss, 1e-6 * ref.loss);
          EXPECT_LT(e, 5e-6);
          int64_t n_got = 0;
          EXPECT_NEAR(g->Loss(b.View(), &n_got).value(), eval_ref, 1e-6 * eval_ref);
          EXPECT_EQ(n_got, n_eval);
          // Activations are held for one group per worker: 6 rows in groups of 4 on 2 workers hold
          // all 6 rows (4 + 2). LoRA's workers > 0 have private gradients; full / freeze workers
          // share the model's.
          if (workers == 1) {
            EXPECT_LT(g->AllocatedBytes().activations, whole->AllocatedBytes().activations);
          } else {
            EXPECT_LE(g->AllocatedBytes().activations, whole->AllocatedBytes().activations);
            if (o.method == FinetuneMethod::kLora) {
              EXPECT_GT(g->AllocatedBytes().gradients, whole->AllocatedBytes().gradients);
            } else {
              EXPECT_EQ(g->AllocatedBytes().gradients, whole->AllocatedBytes().gradients);
            }
          }
        }
    }
  }
}

// LoRA row groups on two workers: which group adds into which gradient buffer is fixed by the
// worker count alone, so a 1-thread pool (the workers one after another) and a 2-thread pool (side
// by side) give the same bits, step after step (dropout and bf16 included). Full and freeze run one
// worker per thread (at most row_group_workers) and add into the shared gradients in group order,
// so one worker on one thread and two on two threads give the same bits too (no reduction follows
// the thread count: the RMSNorm weight gradients' partial sums once did, so a full run resumed on
// another thread count drifted in the last bits).
TEST(TrainModelRowGroups, WorkersGiveTheSameBitsOnAnyThreadCount) {
  auto w = LoadBase("llama_gqa_tied");
  ASSERT_TRUE(w.ok());
  Fixture f("train_llama_gqa_tied");
  const Batch b = SixRows(f, /*segments=*/true);
  const double n = (double)Targets(b);
  TrainModelOptions lora_bf16 = Lora(0.1), full_bf16_ckpt = Full();
  lora_bf16.bf16 = true;
  full_bf16_ckpt.bf16 = true;
  full_bf16_ckpt.gradient_checkpointing = true;
  const char* names[] = {"lora f32", "lora bf16", "full f32", "full bf16 checkpointing", "freeze"};
  const TrainModelOptions opts[] = {Lora(0.1), lora_bf16, Full(), full_bf16_ckpt, Freeze()};
  for (int c = 0; c < 5; ++c) {
    SCOPED_TRACE(names[c]);
    TrainModelOptions o = opts[c];
    o.row_group_tokens = b.T;  // one row per group: 6 groups, 3 per worker (LoRA)
    o.row_group_workers = 2;
    std::vector<std::vector<float>> params[2];
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      auto m = Make(*w, pool, o);
      NonZeroB(*m);
      for (int step = 0; step < 3; ++step) {
        const Grads g = RunSteps(*m, {b}, n);
        for (const TrainableTensor& t : m->params())  // a plain SGD step so the next one differs
          for (int64_t i = 0; i < t.n; ++i) t.data[i] -= 0.5f * t.grad[i];
      }
      for (const TrainableTensor& t : m->params()) params[threads - 1].emplace_back(t.data, t.data + t.n);
      EXPECT_EQ(m->MaxRowGroupWorkers(b.B), o.method == FinetuneMethod::kLora ? 2 : threads);
    }
    ASSERT_EQ(params[0].size(), params[1].size());
    for (size_t i = 0; i < params[0].size(); ++i)
      EXPECT_EQ(std::memcmp(params[0][i].data(), params[1][i].data(), params[0][i].size() * 4), 0) << i;
  }
}

// Full / freeze workers on the other shared gradients: an untied head and embedding (each in group
// order, the embedding at each group's end), qwen2's q/k/v biases and qwen3's q/k norms. Two workers on two threads,
// three groups (the third runs on worker 0 after worker 1's), give one worker's bits; full bf16 too,
// where the workers add the head's gradient after their losses (HeadGradParts).
TEST(TrainModelRowGroups, FullWorkersOnUntiedAndBiasModelsGiveOneWorkersBits) {
  for (const char* name : {"llama_gqa4_untied", "qwen2_bias", "qwen3"}) {
    auto w = LoadBase(name);
    ASSERT_TRUE(w.ok()) << name;
    Batch b;
    b.B = 3;
    b.T = 20;
    std::mt19937 rng(11);
    for (int64_t i = 0; i < b.B * b.T; ++i) b.ids.push_back((int32_t)(rng() % w->config.vocab_size));
    b.labels = b.ids;
    for (int64_t t = 0; t < 5; ++t) b.labels[t] = -100;  // a prompt
    const double n = (double)Targets(b);
    TrainModelOptions full_bf16 = Full();  // two workers hold the head gradient back (HeadGradParts)
    full_bf16.bf16 = true;
    for (TrainModelOptions o : {Full(), Freeze(), full_bf16}) {
      SCOPED_TRACE(StrFormat("%s, %s%s", name, o.method == FinetuneMethod::kFull ? "full" : "freeze",
                             o.bf16 ? " bf16" : ""));
      o.row_group_tokens = b.T;
      o.row_group_workers = 2;
      std::vector<std::vector<float>> params[2];
      for (int threads : {1, 2}) {
        ThreadPool pool(threads);
        auto m = Make(*w, pool, o);
        EXPECT_EQ(m->MaxRowGroupWorkers(b.B), threads);
        for (int step = 0; step < 3; ++step) {
          RunSteps(*m, {b}, n, /*hand_back_pages=*/false);
          for (const TrainableTensor& t : m->params())
            for (int64_t i = 0; i < t.n; ++i) t.data[i] -= 0.5f * t.grad[i];
        }
        for (const TrainableTensor& t : m->params()) params[threads - 1].emplace_back(t.data, t.data + t.n);
      }
      ASSERT_EQ(params[0].size(), params[1].size());
      for (size_t i = 0; i < params[0].size(); ++i)
        EXPECT_EQ(std::memcmp(params[0][i].data(), params[1][i].data(), params[0][i].size() * 4), 0) << i;
    }
  }
}

// f32 mode's fused LoRA products (TrainModelOptions::lora_plus_products: the update inside the base product,
// forward and input gradient) give the separate products' loss and gradients up to summation order, with and
// without dropout (the forward only), one and two workers. No fixture model is wide enough for the GEMM's panel
// path (>= 192 output columns), so a random 2-layer one is: dim 192, 3 heads of 64, one KV head (k / v: 64
// columns, separate forward, fused input gradient), ffn 256, rank 8.
TEST(TrainModelLoraPlus, FusedProductsEqualTheSeparateOnes) {
  if (!kernels::LinearPlusFused(192, 192, 8)) GTEST_SKIP() << "no fused products on this CPU's kernels";
  const ModelConfig c = testing::SmallLlamaConfig(2, 192, 3, 1, 64, 256);
  const ModelWeights w = testing::RandomModelWeights(c, 11);
  Batch b;
  b.B = 2;
  b.T = 40;
  for (int64_t i = 0; i < b.B * b.T; ++i) {
    b.ids.push_back((int32_t)((i * 37 + 5) % c.vocab_size));
    b.labels.push_back(i % b.T < 6 ? -100 : (int32_t)((i * 53 + 1) % c.vocab_size));
  }
  ThreadPool pool(2);
  for (double dropout : {0.0, 0.1})
    for (int64_t workers : {1, 2}) {
      SCOPED_TRACE(StrFormat("dropout %.1f, %lld workers", dropout, (long long)workers));
      TrainModelOptions o = Lora(dropout);
      o.lora_rank = 8;
      o.row_group_tokens = b.T;
      o.row_group_workers = workers;
      o.lora_plus_products = false;
      auto sep = Make(w, pool, o);
      o.lora_plus_products = true;
      auto fused = Make(w, pool, o);
      ASSERT_TRUE(sep && fused);
      NonZeroB(*sep);
      NonZeroB(*fused);
      const Grads ref = RunSteps(*sep, {b}, 64.0), got = RunSteps(*fused, {b}, 64.0);
      const double e = WorstErr(got, ref);
      std::printf("lora plus products (dropout %.1f, %lld workers): loss %.9g vs %.9g, worst grad normalized error %.3g\n",
                  dropout, (long long)workers, got.loss, ref.loss, e);
      EXPECT_NEAR(got.loss, ref.loss, 1e-6 * ref.loss);
      EXPECT_LT(e, 5e-6);
      EXPECT_NE(got.g, ref.g) << "the same bits: the fused products did not run";
    }
}

// (qwen3: its q / k norms and their saved inputs recomputed with the block.)
TEST(TrainModelCheckpointing, EqualsNoCheckpointing) {
 for (const char* name : {"llama_gqa_tied", "qwen3"}) {
  SCOPED_TRACE(name);
  auto w = LoadBase(name);
  ASSERT_TRUE(w.ok());
  Fixture f(std::string("train_") + name);
  Batch b = FixtureBatch(f);
  std::vector<Batch> batches = {b};
  if (f.Has("packed_ids")) batches.push_back(FixtureBatch(f, "packed_ids", "packed_labels", "packed_seg"));
  ThreadPool pool(2);
  TrainModelOptions full_bf16 = Full();
  full_bf16.bf16 = true;
  for (TrainModelOptions o : {Lora(0.1), Full(), full_bf16}) {
    auto plain = Make(*w, pool, o);
    o.gradient_checkpointing = true;
    auto ckpt = Make(*w, pool, o);
    NonZeroB(*plain);
    NonZeroB(*ckpt);
    // Full bf16 on the bf16 dot product recomputes each block's mid residual from its input and attention output
    // (RecomputesMidResidual) where checkpointing recomputes the whole block: the same products on the same bits.
    const bool xmid_again = RecomputesMidResidual(o.bf16 && UsesBf16Dot(), o.method == FinetuneMethod::kLora, false);
    for (const Batch& batch : batches) {
      Grads a = RunSteps(*plain, {batch}, 10), c = RunSteps(*ckpt, {batch}, 10);
      EXPECT_EQ(a.loss, c.loss);
      EXPECT_LE(WorstErr(c, a), 1e-6);
      if (xmid_again) {
        EXPECT_EQ(a.g, c.g);
      }
    }
  }
 }
}

TEST(TrainModelDropout, SeededMasksChangeGradientsDeterministically) {
  auto w = LoadBase("llama_gqa_tied");
  ASSERT_TRUE(w.ok());
  Fixture f("train_llama_gqa_tied");
  Batch b = FixtureBatch(f);
  ThreadPool pool(2);
  auto d1 = Make(*w, pool, Lora(0.2)), d2 = Make(*w, pool, Lora(0.2)), d0 = Make(*w, pool, Lora(0));
  for (auto* m : {d1.get(), d2.get(), d0.get()}) NonZeroB(*m);
  Grads g1 = RunSteps(*d1, {b}, 10), g2 = RunSteps(*d2, {b}, 10), g0 = RunSteps(*d0, {b}, 10);
  EXPECT_EQ(WorstErr(g1, g2), 0.0);  // same seed, same step -> same masks
  EXPECT_GT(WorstErr(g1, g0), 1e-2);  // dropout matters
  EXPECT_EQ(g1.loss, g2.loss);
  EXPECT_NE(g1.loss, g0.loss);  // B != 0, so dropping LoRA inputs changes the loss
}

// bf16 rounds every matmul input (8 significant bits, relative rounding error 2^-9 = 2e-3 per
// element); measured on this model: loss 1e-4 .. 4e-4 relative, gradients 1.7e-2 (full) .. 2.2e-2 (LoRA)
// normalized where the CPU has avx512_bf16 (activations kept as bf16, model::ActivationsAsBf16: 1.5e-2 .. 1.9e-2
// without; a stale restore of them gives ~1.9).
// Limits: 5e-3 and 5e-2.
TEST(TrainModelBf16, CloseToF32) {
 for (const char* name : {"llama_gqa_tied", "qwen3"}) {
  SCOPED_TRACE(name);
  auto w = LoadBase(name);
  ASSERT_TRUE(w.ok());
  Fixture f(std::string("train_") + name);
  Batch b = FixtureBatch(f);
  ThreadPool pool(2);
  for (TrainModelOptions o : {Lora(), Full()}) {
    auto f32 = Make(*w, pool, o);
    o.bf16 = true;
    auto b16 = Make(*w, pool, o);
    NonZeroB(*f32);
    NonZeroB(*b16);
    Grads a = RunSteps(*f32, {b}, 32), c = RunSteps(*b16, {b}, 32);
    double e = WorstErr(c, a);
    std::printf("bf16 (%s, %s): loss %.6g vs f32 %.6g, worst grad normalized error %.3g\n", name,
                o.method == FinetuneMethod::kLora ? "lora" : "full", c.loss, a.loss, e);
    EXPECT_NEAR(c.loss, a.loss, 5e-3 * a.loss);
    EXPECT_LT(e, 5e-2);
    EXPECT_GT(e, 1e-5);  // the rounding is really applied
  }
 }
}

// Full bf16 reads the trained head from its f32 masters at every loss chunk (on avx512_bf16 CPUs: rounded as it is
// paired, no bf16 shadow or packed copy; elsewhere from a bf16 shadow refreshed every step): after the weights move,
// a model that ran a step before gives the bits of a fresh model given the same weights. A copy left from the
// first step would put the old head into every gradient below the loss.
TEST(TrainModelBf16, TrainedHeadPackFollowsTheWeights) {
  auto w = LoadBase("llama_gqa_tied");
  ASSERT_TRUE(w.ok());
  Fixture f("train_llama_gqa_tied");
  Batch b = FixtureBatch(f);
  ThreadPool pool(2);
  TrainModelOptions o = Full();
  o.bf16 = true;
  const auto move = [](TrainModel& m) {  // the same new values in both models, whatever their gradients
    for (const TrainableTensor& t : m.params())
      for (int64_t i = 0; i < t.n; ++i) t.data[i] = t.data[i] * 1.25f + 0.01f * (float)((i % 7) - 3);
  };
  auto stepped = Make(*w, pool, o), fresh = Make(*w, pool, o);
  const Grads first = RunSteps(*stepped, {b}, 32);
  move(*stepped);
  move(*fresh);
  const Grads a = RunSteps(*stepped, {b}, 32), c = RunSteps(*fresh, {b}, 32);
  EXPECT_NE(a.loss, first.loss);
  EXPECT_EQ(a.loss, c.loss);
  ASSERT_EQ(a.g.size(), c.g.size());
  for (size_t i = 0; i < a.g.size(); ++i)
    EXPECT_EQ(std::memcmp(a.g[i].data(), c.g[i].data(), a.g[i].size() * 4), 0) << stepped->params()[i].name;
  const ModelConfig& cf = w->config;
  EXPECT_EQ(PackedHeadBytes(cf.vocab_size, cf.dim, true, false, /*bf16_pairs=*/true), 0);
  EXPECT_EQ(TrainedHeadShadow(true, false, cf.dim), !UsesBf16Dot());
  if (UsesBf16Dot()) {  // the f32 masters alone: no shadow of the head or the linears, no packed head
    EXPECT_EQ(stepped->AllocatedBytes().weights, 4 * stepped->trainable_count());
  }
}

// A copy of w with every linear weight and the embedding in `t` (and one with those values
// dequantized back to f32, the same model in f32).
ModelWeights Quantize(const ModelWeights& w, DType t, bool dequantized) {
  ModelWeights q;
  q.config = w.config;
  q.output_norm = w.output_norm;
  q.owners = w.owners;
  auto conv = [&](const Tensor& src) {
    const int64_t rows = src.shape[0], cols = src.shape[1];
    std::vector<float> f32(rows * cols);
    kernels::DequantizeRows(src, 0, rows, f32.data());
    auto buf = std::make_shared<std::vector<uint8_t>>(DTypeBytes(t, rows * cols));
    for (int64_t r = 0; r < rows; ++r) kernels::QuantizeRow(t, &f32[r * cols], cols, buf->data() + r * DTypeBytes(t, cols));
    Tensor out;
    out.data = buf->data();
    out.dtype = t;
    out.shape = src.shape;
    q.owners.push_back(buf);
    if (!dequantized) return out;
    kernels::DequantizeRows(out, 0, rows, f32.data());
    return q.OwnF32(std::move(f32), src.shape);
  };
  q.tok_embd = conv(w.tok_embd);
  q.output = w.config.tied_embeddings ? q.tok_embd : conv(w.output);
  for (const LayerWeights& L : w.layers) {
    LayerWeights o = L;
    for (Tensor* m : {&o.wq, &o.wk, &o.wv, &o.wo, &o.w_gate, &o.w_up, &o.w_down}) *m = conv(*m);
    q.layers.push_back(o);
  }
  return q;
}

TEST(TrainModelQuantizedBase, GradientsThroughFrozenQ8_0AndQ4_1EqualTheDequantizedModel) {
  auto w = LoadBase("llama_gqa_tied");
  ASSERT_TRUE(w.ok());
  Fixture f("train_llama_gqa_tied");
  Batch b = FixtureBatch(f);
  ThreadPool pool(2);
  for (DType t : {DType::kQ8_0, DType::kQ4_1}) {
    ModelWeights q = Quantize(*w, t, false), d = Quantize(*w, t, true);
    ASSERT_EQ(q.layers[0].wq.dtype, t);
    for (TrainModelOptions o : {Lora(), Full()}) {
      auto mq = Make(q, pool, o), md = Make(d, pool, o);
      NonZeroB(*mq);
      NonZeroB(*md);
      Grads gq = RunSteps(*mq, {b}, 32), gd = RunSteps(*md, {b}, 32);
      double e = WorstErr(gq, gd);
      std::printf("%s base (%s): loss %.7g vs dequantized f32 %.7g, worst grad normalized error %.3g\n", DTypeName(t),
                  o.method == FinetuneMethod::kLora ? "lora" : "full", gq.loss, gd.loss, e);
      EXPECT_NEAR(gq.loss, gd.loss, 1e-5 * gd.loss);
      EXPECT_LT(e, 1e-5);
    }
  }
}

// The llama.cpp block types no quantizer of ours writes (Q5_0, Q5_1, Q2_K .. Q6_K): the model
// llama-quantize made for the ggml_quant fixture, one type per tensor, trained frozen as stored vs
// the same weights dequantized to f32 (the backward-input path decodes them inside its GEMM).
TEST(TrainModelQuantizedBase, GradientsThroughFrozenLlamaQuantizeTypesEqualTheDequantizedModel) {
  auto lm = LoadModel(Fixtures() + "ggml_quant/model.gguf");
  ASSERT_TRUE(lm.ok()) << lm.status().message();
  const ModelWeights& q = (*lm)->weights;
  ASSERT_EQ(q.layers[0].wq.dtype, DType::kQ2_K);
  ASSERT_EQ(q.layers[0].w_down.dtype, DType::kQ5_1);
  ModelWeights d = q;
  auto f32 = [&](const Tensor& src) {
    std::vector<float> v(src.numel());
    kernels::DequantizeRows(src, 0, src.shape[0], v.data());
    return d.OwnF32(std::move(v), src.shape);
  };
  d.tok_embd = f32(q.tok_embd);
  d.output = f32(q.output);
  for (LayerWeights& L : d.layers)
    for (Tensor* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) *m = f32(*m);
  Fixture f("train_llama_gqa_tied");  // its token batch (vocab 256, as this model's)
  Batch b = FixtureBatch(f);
  ThreadPool pool(2);
  for (TrainModelOptions o : {Lora(), Full()}) {
    auto mq = Make(q, pool, o), md = Make(d, pool, o);
    NonZeroB(*mq);
    NonZeroB(*md);
    Grads gq = RunSteps(*mq, {b}, 32), gd = RunSteps(*md, {b}, 32);
    const double e = WorstErr(gq, gd);
    std::printf("llama-quantize base (%s): loss %.7g vs dequantized f32 %.7g, worst grad normalized error %.3g\n",
                o.method == FinetuneMethod::kLora ? "lora" : "full", gq.loss, gd.loss, e);
    EXPECT_NEAR(gq.loss, gd.loss, 1e-5 * gd.loss);
    EXPECT_LT(e, 1e-5);
  }
}

TEST(TrainModelFreeze, LastLayerTrainsWithTheFullFineTuningGradients) {
 for (const char* name : {"llama_gqa_tied", "qwen3"}) {
  SCOPED_TRACE(name);
  auto w = LoadBase(name);
  ASSERT_TRUE(w.ok());
  Fixture f(std::string("train_full_") + name);
  ThreadPool pool(2);
  TrainModelOptions o = Freeze();
  auto m = Make(*w, pool, o);
  const ModelConfig& c = w->config;
  ASSERT_EQ(m->params().size(), c.qk_norm ? 11u : 9u);  // 7 linear weights + 2 norms (+ q/k norms) of layer 1
  EXPECT_EQ(m->trainable_count(), (c.ParamCount() - c.vocab_size * c.dim - c.dim) / 2);  // one of two layers
  Batch b = FixtureBatch(f);
  RunSteps(*m, {b}, f.F64("n_targets"));
  for (const TrainableTensor& t : m->params()) {
    EXPECT_EQ(t.name.rfind("model.layers.1.", 0), 0u) << t.name;
    std::vector<float> want = f.F32("full.grad." + t.name);
    EXPECT_LT(NormErr(t.grad, want.data(), t.n), 1e-4) << t.name;
  }
  // Frozen weights stay as loaded (Q4_1 here): freeze works on a quantized base too.
  ModelWeights q = Quantize(*w, DType::kQ4_1, false);
  auto mq = Make(q, pool, o);
  auto l = mq->ForwardBackward(b.View(), 32);
  ASSERT_TRUE(l.ok()) << l.status().message();
 }
}

// Full fine-tuning on 2 threads must be bit-reproducible run to run: the pool hands chunks to
// whichever thread claims them first, so any reduction keyed by the thread index (rather than by
// the chunk) changes its summation order between runs. 3 steps of forward/backward, grad norm and
// AdamW, 4 independent runs, every loss / grad norm / final weight compared bit for bit.
TEST(TrainModelDeterminism, FullFineTuningOnTwoThreadsIsBitReproducible) {
  auto w = LoadBase("llama_gqa_tied");
  ASSERT_TRUE(w.ok());
  // 8 x 128 random tokens: 64 chunks of 16 rows per row-parallel op, so both threads take part.
  Batch big;
  big.B = 8;
  big.T = 128;
  std::mt19937 rng(7);
  for (int64_t i = 0; i < big.B * big.T; ++i) big.ids.push_back((int32_t)(rng() % w->config.vocab_size));
  big.labels = big.ids;
  ThreadPool pool(2);
  struct Run {
    std::vector<double> losses, norms;
    std::vector<float> weights;
  };
  auto run = [&]() {
    Run r;
    auto m = Make(*w, pool, Full());
    std::vector<train::ParamRef> refs;
    for (const TrainableTensor& t : m->params()) refs.push_back({t.name, t.data, t.grad, t.n, t.decay});
    train::AdamW adam(0.9, 0.999, 1e-8, 0.01);
    for (int step = 0; step < 3; ++step) {
      m->ZeroGrad();
      auto l = m->ForwardBackward(big.View(), (double)Targets(big));
      EXPECT_TRUE(l.ok());
      r.losses.push_back(l.ok() ? *l : NAN);
      r.norms.push_back(train::ClipGradNorm(refs, 1.0));
      adam.Step(refs, 1e-3);
    }
    for (const TrainableTensor& t : m->params()) r.weights.insert(r.weights.end(), t.data, t.data + t.n);
    return r;
  };
  const Run first = run();
  for (int rep = 1; rep < 4; ++rep) {
    SCOPED_TRACE(rep);
    Run again = run();
    for (int s = 0; s < 3; ++s) {
      EXPECT_EQ(again.losses[s], first.losses[s]) << "step " << s;
      EXPECT_EQ(again.norms[s], first.norms[s]) << "step " << s;
    }
    ASSERT_EQ(again.weights.size(), first.weights.size());
    EXPECT_EQ(std::memcmp(again.weights.data(), first.weights.data(), first.weights.size() * sizeof(float)), 0);
  }
}

// A deep copy of an all-f32 model into anonymous (writable) buffers.
ModelWeights AnonymousCopy(const ModelWeights& w) {
  ModelWeights o;
  o.config = w.config;
  auto copy = [&](const Tensor& t) {
    if (!t.data) return t;
    return o.OwnF32(std::vector<float>(t.as<float>(), t.as<float>() + t.numel()), t.shape);
  };
  o.tok_embd = copy(w.tok_embd);
  o.output_norm = copy(w.output_norm);
  o.output = w.config.tied_embeddings ? o.tok_embd : copy(w.output);
  for (const LayerWeights& L : w.layers) {
    LayerWeights n;
    for (auto [dst, src] : {std::pair{&n.attn_norm, &L.attn_norm}, {&n.ffn_norm, &L.ffn_norm}, {&n.wq, &L.wq},
                            {&n.wk, &L.wk}, {&n.wv, &L.wv}, {&n.wo, &L.wo}, {&n.w_gate, &L.w_gate},
                            {&n.w_up, &L.w_up}, {&n.w_down, &L.w_down}, {&n.bq, &L.bq}, {&n.bk, &L.bk},
                            {&n.bv, &L.bv}})
      *dst = copy(*src);
    o.layers.push_back(n);
  }
  return o;
}

// Full fine-tuning keeps one f32 copy of each trainable tensor: from a file-mapped base the model
// copies it and drops the file pages (which still read back the same bytes), and CreateInPlace
// trains writable f32 base tensors themselves, with bit-identical steps.
TEST(TrainModelMasters, TrainableTensorsHaveOneF32Copy) {
  auto w = LoadBase("llama_gqa_tied");  // f32 safetensors, mmapped
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(InReadOnlyFileMapping(w->tok_embd.data, w->tok_embd.nbytes()));
  Fixture f("train_llama_gqa_tied");
  Batch b = FixtureBatch(f);
  ThreadPool pool(2);
  auto copied = Make(*w, pool, Full());
  TrainMemory cm = copied->AllocatedBytes();
  // Every linear weight and the embedding were file pages (norms are converted copies, kept).
  const ModelConfig& c = w->config;
  const int64_t norms = (2 * c.n_layers + 1) * c.dim;
  EXPECT_EQ(cm.base_released, (copied->trainable_count() - norms) * 4);
  EXPECT_EQ(cm.weights, copied->trainable_count() * 4);
  // The dropped pages read back as the file's bytes: the masters equal the base they came from.
  const TrainableTensor& embed = copied->params()[0];
  ASSERT_EQ(embed.name, "model.embed_tokens.weight");
  EXPECT_EQ(std::memcmp(embed.data, w->tok_embd.data, w->tok_embd.nbytes()), 0);

  ModelWeights anon = AnonymousCopy(*w);
  ASSERT_FALSE(InReadOnlyFileMapping(anon.tok_embd.data, anon.tok_embd.nbytes()));
  auto in_place = TrainModel::CreateInPlace(anon, pool, Full());
  ASSERT_TRUE(in_place.ok()) << in_place.status().message();
  TrainModel& m = **in_place;
  TrainMemory im = m.AllocatedBytes();
  // No f32 copy: the masters are the base tensors (counted as the model's weights, not the base's).
  EXPECT_EQ(im.weights, m.trainable_count() * 4);
  EXPECT_EQ(im.base_released, m.trainable_count() * 4);
  EXPECT_EQ(m.params()[0].data, anon.tok_embd.as<float>());
  EXPECT_EQ(m.params()[1].data, anon.layers[0].wq.as<float>()) << m.params()[1].name;
  auto run = [&](TrainModel& tm) {
    std::vector<train::ParamRef> refs;
    for (const TrainableTensor& t : tm.params()) refs.push_back({t.name, t.data, t.grad, t.n, t.decay});
    train::AdamW adam(0.9, 0.999, 1e-8, 0.01);
    std::vector<double> losses;
    for (int step = 0; step < 2; ++step) {
      tm.ZeroGrad();
      losses.push_back(tm.ForwardBackward(b.View(), 32).value());
      adam.Step(refs, 1e-3);
    }
    return losses;
  };
  EXPECT_EQ(run(m), run(*copied));
  for (size_t i = 0; i < m.params().size(); ++i)
    EXPECT_EQ(std::memcmp(m.params()[i].data, copied->params()[i].data, m.params()[i].n * 4), 0)
        << m.params()[i].name;
  // The trained values are in anon now (trained in place).
  EXPECT_NE(std::memcmp(anon.tok_embd.data, w->tok_embd.data, w->tok_embd.nbytes()), 0);
}

// LoRA / freeze in bf16 mode on the bf16 dot product keep each frozen f32 linear of a file-mapped base as a
// bf16 copy and drop its file pages (FrozenLinearsAsBf16): the kernels round it as they would have rounded it
// while packing, so loss and gradients are those of the same weights in anonymous memory (kept f32, rounded at
// every pack). Freeze saves its frozen layers from the base: the dropped pages read back the file's bytes.
TEST(TrainModelBf16, FrozenF32LinearsAsBf16CopiesGiveTheSameBits) {
  auto w = LoadBase("llama_gqa_tied");  // f32 safetensors, mmapped
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(InReadOnlyFileMapping(w->layers[0].wq.data, w->layers[0].wq.nbytes()));
  Fixture f("train_llama_gqa_tied");
  Batch b = FixtureBatch(f);
  ThreadPool pool(2);
  const ModelConfig& c = w->config;
  const int64_t lin = c.n_layers * (2 * c.dim * c.q_dim() + 2 * c.dim * c.kv_dim() + 3 * c.dim * c.ffn_dim);
  ModelWeights anon = AnonymousCopy(*w);
  TrainModelOptions freeze = Full();
  freeze.method = FinetuneMethod::kFreeze;
  freeze.freeze_trainable_layers = 1;
  for (TrainModelOptions o : {Lora(), freeze}) {
    o.bf16 = true;
    auto mapped = Make(*w, pool, o), owned = Make(anon, pool, o);
    NonZeroB(*mapped);
    NonZeroB(*owned);
    const int64_t frozen = o.method == FinetuneMethod::kLora ? lin : lin - lin / c.n_layers;
    EXPECT_EQ(mapped->AllocatedBytes().frozen_copies, UsesBf16Dot() ? 2 * frozen : 0);
    EXPECT_EQ(owned->AllocatedBytes().frozen_copies, 0);
    const Grads a = RunSteps(*mapped, {b}, 32), g = RunSteps(*owned, {b}, 32);
    EXPECT_EQ(a.loss, g.loss);
    ASSERT_EQ(a.g.size(), g.g.size());
    for (size_t i = 0; i < a.g.size(); ++i)
      EXPECT_EQ(std::memcmp(a.g[i].data(), g.g[i].data(), a.g[i].size() * 4), 0) << mapped->params()[i].name;
  }
  // The file pages dropped under the copies still read the weights.
  EXPECT_EQ(std::memcmp(w->layers[0].w_up.data, anon.layers[0].w_up.data, anon.layers[0].w_up.nbytes()), 0);
}

// LoRA in bf16 mode on the bf16 dot product takes a frozen head stored in any dtype but bf16 as its bf16 copy
// (FrozenHeadAsBf16; a block type dequantized first), as autocast casts a model loaded in bf16: a Q8_0 head
// (tied, as in the SmolLM2 GGUF) trains bit for bit like the same model whose head is those bf16 values (the
// embedding still Q8_0). A file-mapped head gives its pages back; the embedding still reads them.
TEST(TrainModelBf16, FrozenHeadOfAnyDtypeIsTakenAsItsBf16Copy) {
  if (!UsesBf16Dot()) GTEST_SKIP() << "no avx512_bf16 (or LATHE_BF16_DOT=0)";
  auto w = LoadBase("llama_gqa_tied");  // f32 safetensors, mmapped
  ASSERT_TRUE(w.ok());
  Fixture f("train_llama_gqa_tied");
  Batch b = FixtureBatch(f);
  ThreadPool pool(2);
  const ModelConfig& c = w->config;
  TrainModelOptions o = Lora();
  o.bf16 = true;
  ModelWeights q = Quantize(*w, DType::kQ8_0, false);
  ASSERT_EQ(q.output.data, q.tok_embd.data);
  ModelWeights r = q;
  {
    std::vector<float> f32(c.vocab_size * c.dim);
    kernels::DequantizeRows(q.output, 0, c.vocab_size, f32.data());
    auto h16 = std::make_shared<std::vector<uint16_t>>(f32.size());
    for (size_t i = 0; i < f32.size(); ++i) (*h16)[i] = F32ToBF16(f32[i]);
    r.owners.push_back(h16);
    r.output.data = h16->data();
    r.output.dtype = DType::kBF16;
  }
  auto mq = Make(q, pool, o), mr = Make(r, pool, o);
  NonZeroB(*mq);
  NonZeroB(*mr);
  const Grads gq = RunSteps(*mq, {b}, 32), gr = RunSteps(*mr, {b}, 32);
  EXPECT_EQ(gq.loss, gr.loss);
  ASSERT_EQ(gq.g.size(), gr.g.size());
  for (size_t i = 0; i < gq.g.size(); ++i)
    EXPECT_EQ(std::memcmp(gq.g[i].data(), gr.g[i].data(), gq.g[i].size() * 4), 0) << mq->params()[i].name;
  // The mapped f32 base: the head's file pages go back with the frozen linears' (their f32 bytes at most).
  auto mapped = Make(*w, pool, o);
  const int64_t lin = c.n_layers * (2 * c.dim * c.q_dim() + 2 * c.dim * c.kv_dim() + 3 * c.dim * c.ffn_dim);
  EXPECT_GT(mapped->AllocatedBytes().base_released, 4 * lin);
  EXPECT_LE(mapped->AllocatedBytes().base_released, 4 * lin + 4 * c.vocab_size * c.dim);
}

TEST(TrainModelErrors, BadBatchesAndOptionsAreErrorsNotCrashes) {
  auto w = LoadBase("llama_gqa_tied");
  ASSERT_TRUE(w.ok());
  ThreadPool pool(1);
  auto m = Make(*w, pool, Lora());
  Batch b;
  b.B = 1;
  b.T = 4;
  b.ids = {1, 2, 3, 4};
  b.labels = {1, 2, 3, 4};
  auto msg = [&](const Batch& x, double n = 1) {
    auto r = m->ForwardBackward(x.View(), n);
    return r.ok() ? std::string("ok") : r.status().message();
  };
  EXPECT_EQ(msg(b), "ok");
  Batch bad = b;
  bad.ids[2] = 256;
  EXPECT_NE(msg(bad).find("input_ids[2] = 256 out of range"), std::string::npos) << msg(bad);
  bad = b;
  bad.labels[1] = -5;
  EXPECT_NE(msg(bad).find("labels[1] = -5"), std::string::npos) << msg(bad);
  bad = b;
  bad.T = 3;
  EXPECT_NE(msg(bad).find("B*T"), std::string::npos) << msg(bad);
  EXPECT_NE(msg(b, 0).find("normalizer"), std::string::npos);
  bad.T = w->config.max_seq_len + 1;
  bad.ids.assign(bad.T, 1);
  bad.labels.assign(bad.T, 1);
  EXPECT_NE(msg(bad).find("exceeds the model's max_seq_len"), std::string::npos) << msg(bad);
  TrainModelOptions o = Lora();
  o.lora_rank = 0;
  EXPECT_NE(TrainModel::Create(*w, pool, o).status().message().find("lora_rank"), std::string::npos);
  o = Lora();
  o.lora_targets = {(LoraModule)9};
  EXPECT_NE(TrainModel::Create(*w, pool, o).status().message().find("lora_target"), std::string::npos);
  o.method = FinetuneMethod::kFreeze;
  o.freeze_trainable_layers = 5;
  EXPECT_NE(TrainModel::Create(*w, pool, o).status().message().find("freeze_trainable_layers"), std::string::npos);
  // A full model refuses to export an adapter.
  auto full = Make(*w, pool, Full());
  EXPECT_FALSE(full->ExportAdapter().ok());
}


// LATHE_PERF=1: one LoRA training step (r16, all 7 linear modules) at SmolLM2-135M shapes (its Q4_1
// GGUF, batch 4 x 512 tokens) in tokens/s, with the inference prefill of the same tokens in the
// same run as the baseline. Information only (no limit).
TEST(TrainModelPerf, SmolLM2LoraStepTokensPerSecond) {
  if (!std::getenv("LATHE_PERF")) GTEST_SKIP() << "set LATHE_PERF=1";
  std::string path = lathe::testing::SmolLM2Path();
  LATHE_REQUIRE_FILE(path);
  auto lm = LoadModel(path);
  ASSERT_TRUE(lm.ok()) << lm.status().message();
  const ModelWeights& w = (*lm)->weights;
  const int threads = std::getenv("LATHE_THREADS") ? std::atoi(std::getenv("LATHE_THREADS")) : 2;
  ThreadPool pool(threads);
  const int64_t B = 4, T = 512;
  Batch b;
  b.B = B;
  b.T = T;
  std::mt19937 rng(1);
  for (int64_t i = 0; i < B * T; ++i) b.ids.push_back((int32_t)(rng() % w.config.vocab_size));
  b.labels = b.ids;
  auto now = [] { return std::chrono::steady_clock::now(); };
  auto secs = [](auto a, auto z) { return std::chrono::duration<double>(z - a).count(); };
  // Baseline: inference prefill of the same B x T tokens.
  double t_inf;
  {
    Transformer tf(w, pool, TransformerOptions{});
    std::vector<float> lg;
    auto t0 = now();
    for (int64_t r = 0; r < B; ++r) {
      KvCache cache(w.config, 1, T);
      std::vector<int32_t> ids(b.ids.begin() + r * T, b.ids.begin() + (r + 1) * T);
      SeqInput in{0, ids, false};
      ASSERT_TRUE(tf.Forward(cache, {&in, 1}, &lg).ok());
    }
    t_inf = secs(t0, now());
  }
  for (bool ckpt : {false, true}) {
    TrainModelOptions o;
    o.lora_rank = 16;
    o.lora_alpha = 32;
    o.gradient_checkpointing = ckpt;
    auto m = Make(w, pool, o);
    ASSERT_TRUE(m);
    m->ZeroGrad();
    ASSERT_TRUE(m->ForwardBackward(b.View(), B * T).ok());  // sizes the buffers
    auto t0 = now();
    m->ZeroGrad();
    auto l = m->ForwardBackward(b.View(), B * T);
    double t = secs(t0, now());
    ASSERT_TRUE(l.ok());
    std::printf("SmolLM2-135M Q4_1, LoRA r16 all-linear, %lld x %lld tokens, %d threads%s: step %.2f s = %.0f tokens/s; "
                "inference prefill of the same tokens %.2f s (step / prefill = %.2fx); loss %.4f\n",
                (long long)B, (long long)T, threads, ckpt ? ", checkpointing" : "", t, B * T / t, t_inf, t / t_inf,
                *l / (B * T));
  }
}

}  // namespace
}  // namespace lathe::model
