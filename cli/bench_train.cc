// `lathe bench train`: training speed of TrainModel (LoRA and full fine-tuning with AdamW, f32 and
// bf16; memory-saving rows: QLoRA NF4+DQ / int8 base, 8-bit and paged AdamW) — tokens/s, step time,
// peak RSS (one subprocess per row) with its breakdown by memory category, and model-FLOPs
// utilization against the peak measured in the same run (f32 FMA; bf16 rows: the bf16 dot product where used).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/check.h"
#include "core/cpu.h"
#include "core/profiler.h"
#include "model/loader.h"
#include "model/train_model.h"
#include "monitor/memory.h"
#include "train/memory_plan.h"
#include "train/optimizer.h"
#include "train/optimizer_bnb.h"
#include "train/quantize_base.h"
#include "train/train_config.h"

namespace lathe::cli {

namespace {

using Clock = std::chrono::steady_clock;


// Peak f32 GFLOP/s of `threads` cores running the probe at once (best of 3).
double MeasurePeak(int threads, bool bf16 = false) {
  ThreadPool pool(threads);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<double> g(threads * 8, 0);
    pool.ParallelFor(threads, 1, [&](int64_t b, int64_t e, int t) {
      for (int64_t i = b; i < e; ++i)
        g[i * 8] = !bf16 ? MeasureFmaPeakGflops() : UsesAmxBf16() ? MeasureAmxBf16PeakGflops() : MeasureBf16DotPeakGflops();
    });
    double sum = 0;
    for (int i = 0; i < threads; ++i) sum += g[i * 8];
    best = std::max(best, sum);
  }
  return best;
}

// Random weights with the shapes of `c` (uniform, std 0.02; norms 1), tied head if c says so.
// `storage`: f32 for everything; bf16 stores the matrices in bf16 (as a bf16 checkpoint loads);
// a packed type (nf4_dq, i8_row) stores the embeddings in bf16 and packs each layer's linear
// weights as soon as the layer is made (QuantizeBaseWeights, as `lathe train` does on load), so
// the process never holds more than one layer's bf16 source.
std::unique_ptr<model::ModelWeights> RandomWeights(const model::ModelConfig& c, DType storage = DType::kF32) {
  auto w = std::make_unique<model::ModelWeights>();
  w->config = c;
  uint64_t s = 0x9E3779B97F4A7C15ull;
  auto mat = [&](int64_t rows, int64_t cols) {
    std::vector<float> v(rows * cols);
    const float a = 0.02f * 1.7320508f;
    for (auto& x : v) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      x = a * (2.0f * (float)(s >> 40) / (float)(1ull << 24) - 1.0f);
    }
    if (storage == DType::kF32) return w->OwnF32(std::move(v), {rows, cols});
    auto h = std::make_shared<std::vector<uint16_t>>(v.size());
    for (size_t i = 0; i < v.size(); ++i) (*h)[i] = F32ToBF16(v[i]);
    w->owners.push_back(h);
    return Tensor{h->data(), DType::kBF16, {rows, cols}};
  };
  auto ones = [&](int64_t n) { return w->OwnF32(std::vector<float>(n, 1.0f), {n}); };
  w->tok_embd = mat(c.vocab_size, c.dim);
  w->output_norm = ones(c.dim);
  w->output = c.tied_embeddings ? w->tok_embd : mat(c.vocab_size, c.dim);
  w->layers.resize(c.n_layers);
  for (int64_t li = 0; li < c.n_layers; ++li) {
    model::LayerWeights& l = w->layers[li];
    l.attn_norm = ones(c.dim);
    l.ffn_norm = ones(c.dim);
    l.wq = mat(c.q_dim(), c.dim);
    l.wk = mat(c.kv_dim(), c.dim);
    l.wv = mat(c.kv_dim(), c.dim);
    l.wo = mat(c.dim, c.q_dim());
    l.w_gate = mat(c.ffn_dim, c.dim);
    l.w_up = mat(c.ffn_dim, c.dim);
    l.w_down = mat(c.dim, c.ffn_dim);
    if (IsPackedQuant(storage)) {
      auto r = train::QuantizeBaseWeights(w.get(), storage, li + 1);  // packs layer li, frees its source
      LATHE_CHECK(r.ok() && r->kept.empty());
    }
  }
  return w;
}

struct RowSpec {
  const char* name;
  bool lora, bf16;
  DType base = DType::kF32;           // storage of the random base (RandomWeights)
  const char* optim = "adamw_torch";  // TrainConfig::optim
};
// The memory-saving rows store the base as a bf16 checkpoint would (lora-bf16w is their baseline,
// the "bf16 LoRA" of the issue) or pack it, and compute in bf16 mode.
const RowSpec kRows[] = {{"lora-f32", true, false},
                         {"lora-bf16", true, true},
                         {"full-f32", false, false},
                         {"full-bf16", false, true},
                         {"lora-bf16w", true, true, DType::kBF16},
                         {"qlora-nf4", true, true, DType::kNF4DQ},
                         {"lora-int8", true, true, DType::kI8Row},
                         {"lora-adamw8bit", true, true, DType::kBF16, "adamw_8bit"},
                         {"lora-paged8bit", true, true, DType::kBF16, "paged_adamw_8bit"},
                         {"qlora-nf4-paged8bit", true, true, DType::kNF4DQ, "paged_adamw_8bit"}};
constexpr const char* kDefaultRows =
    "lora-f32,lora-bf16,full-f32,full-bf16,lora-bf16w,qlora-nf4,lora-int8,lora-adamw8bit,lora-paged8bit,"
    "qlora-nf4-paged8bit";

// Bytes of the frozen base as held (packed weights at their exact layout size).
double BaseBytes(const model::ModelWeights& w) {
  auto bytes = [](const Tensor& t) {
    if (t.data == nullptr) return 0.0;
    return IsPackedQuant(t.dtype) ? (double)PackedQuantBytes(t.dtype, t.shape[0], t.shape[1])
                                  : (double)t.nbytes();
  };
  double b =
      bytes(w.tok_embd) + bytes(w.output_norm) + (w.output.data != w.tok_embd.data ? bytes(w.output) : 0);
  for (const model::LayerWeights& l : w.layers) {
    for (const Tensor* t : l.All())
      b += bytes(*t);
  }
  return b;
}

// Matmul parameters touched per token: every decoder linear layer plus the output head.
double MatmulParams(const model::ModelConfig& c) {
  double per_layer = (double)c.dim * (2.0 * c.q_dim() + 2.0 * c.kv_dim()) + 3.0 * c.dim * c.ffn_dim;
  return per_layer * c.n_layers + (double)c.vocab_size * c.dim;
}

// Causal attention FLOPs per token (QK^T and PV over T/2 keys on average): forward 4 * q_dim * T/2
// per layer, backward twice that (both for LoRA and full: input gradients flow through attention).
double AttentionFlopsPerToken(const model::ModelConfig& c, int64_t T) {
  return 3.0 * 4.0 * (double)c.q_dim() * (T / 2.0) * c.n_layers;
}

double CpuSeconds() {  // user + sys of this process: robust to other load on a shared machine
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// The child: builds the model, runs warmup + steps, prints
// "RESULT tokens_per_s step_s rss_kb loss tokens_per_cpu_s" (the fastest step by each clock) and
// "MEMORY weights lora grads optimizer activations temporary" (bytes held after the last step:
// the base as stored plus the model's own buffers by category, optimizer state as allocated).
// The child owns its weights and hands them over: full fine-tuning trains the f32 tensors in place
// (as PyTorch does with its parameters); a file-mapped model's trained tensors are copied to f32
// masters and their file pages dropped, as `lathe train` does.
int RunChild(model::ModelWeights& w, const RowSpec& row, int threads, int64_t B, int64_t T, int steps,
             int64_t optim_resident_mb, int64_t row_group_tokens, int64_t row_group_workers,
             const std::string& profile_path) {
  ThreadPool pool(threads);
  pool.SetSpinIters(ThreadPool::kTrainSpinIters);  // as `lathe train`
  std::unique_ptr<Profiler> profiler;
  if (!profile_path.empty()) profiler = std::make_unique<Profiler>();
  model::TrainModelOptions o;
  o.method = row.lora ? model::FinetuneMethod::kLora : model::FinetuneMethod::kFull;
  o.lora_rank = 16;
  o.lora_alpha = 32;
  o.bf16 = row.bf16;
  o.row_group_tokens = row_group_tokens;
  o.row_group_workers = row_group_workers;
  {  // whether pages go back to the OS each step, as `lathe train` decides it for this shape
    train::TrainSetup ts;
    ts.lathe = true;
    ts.method = row.lora ? "lora" : "full";
    ts.batch_size = B;
    ts.seq_len = T;
    ts.row_group_tokens = row_group_tokens;
    o.hand_back_pages = train::LatheHandsBackPages(ts);
  }
  o.profiler = profiler.get();  // events of earlier steps are cleared before the last one
  auto m = model::TrainModel::CreateInPlace(w, pool, o);
  if (!m.ok()) return Fail("bench train", m.status());
  std::vector<train::ParamRef> refs;
  for (const auto& p : (*m)->params()) refs.push_back({p.name, p.data, p.grad, p.n, p.decay});
  train::TrainConfig tc;
  tc.optim = row.optim;
  tc.weight_decay = 0;
  tc.optim_resident_mb = optim_resident_mb;
  auto opt = train::MakeOptimizer(tc);
  if (!opt.ok()) return Fail("bench train", opt.status());
  (*opt)->SetPool(&pool);  // as lathe train does
  std::vector<int32_t> ids(B * T);
  uint64_t s = 12345;
  for (auto& t : ids) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t = (int32_t)((s >> 33) % (uint64_t)w.config.vocab_size);
  }
  model::TrainBatch batch;
  batch.input_ids = ids;
  batch.labels = ids;
  batch.B = B;
  batch.T = T;
  double best = 1e30, best_cpu = 1e30, loss = 0, last_wall_ns = 0;
  int64_t last_start_ns = 0;
  for (int i = 0; i < steps + 1; ++i) {  // the first step sizes the buffers (warmup)
    if (profiler && i == steps) {  // the last step only
      profiler->Clear();
      pool.SetProfiler(profiler.get());
      last_start_ns = profiler->NowNs();
    }
    const double c0 = CpuSeconds();
    auto t0 = Clock::now();
    {
      ScopedOp op(profiler.get(), "zero_grad");
      (*m)->ZeroGrad(o.hand_back_pages);
    }
    auto l = (*m)->ForwardBackward(batch, (double)(B * T));
    if (!l.ok()) return Fail("bench train", l.status());
    {
      ScopedOp op(profiler.get(), "optimizer_step");
      (*opt)->Step(refs, 1e-5);
    }
    double t = Seconds(t0, Clock::now());
    if (profiler && i == steps) last_wall_ns = (double)(profiler->NowNs() - last_start_ns);
    loss = *l / (B * T);
    const double ct = CpuSeconds() - c0;
    if (i > 0) best = std::min(best, t), best_cpu = std::min(best_cpu, ct);
  }
  pool.SetProfiler(nullptr);
  if (profiler) {
    Status ps = profiler->WriteChromeTrace(profile_path);
    if (!ps.ok()) return Fail("bench train", ps.WithContext("--profile"));
    // The step as a whole: how much of it the recorded ops cover (the rest ran serially on this
    // thread outside any op) and the threads busy on average (this thread + other threads' chunks).
    double in_ops = 0, other = 0;
    const std::vector<Profiler::Event> evs = profiler->Events();
    int me = 0;  // this thread's track: the one zero_grad ran on
    for (const auto& e : evs)
      if (e.name == "zero_grad") me = e.tid;
    for (const auto& e : evs) {
      if (e.tid == me && e.name != "pool_chunk") in_ops += (double)e.dur_ns;
      if (e.tid != me && e.name == "pool_chunk") other += (double)e.dur_ns;
    }
    std::fprintf(stderr,
                 "profile of the last step (%s, %d thread(s)): wrote %s\nstep %.1f ms: ops cover %.1f%%, threads "
                 "busy on average %.2f of %d\n%s",
                 row.name, threads, profile_path.c_str(), last_wall_ns / 1e6, 100.0 * in_ops / last_wall_ns,
                 (last_wall_ns + other) / last_wall_ns, threads, profiler->Summary(25).c_str());
  }
  std::printf("RESULT %.3f %.4f %lld %.4f %.3f\n", B * T / best, best,
              (long long)(monitor::ProcessPeakRssBytes() / 1024), loss, B * T / best_cpu);
  int64_t trainable = 0;
  for (const auto& r : refs) trainable += r.n;
  const auto* bnb = dynamic_cast<const train::BnbAdamW*>(opt->get());
  const double opt_bytes = bnb ? (double)bnb->StateBytes() : (*opt)->StateBytesPerParam() * (double)trainable;
  const model::TrainMemory mem = (*m)->AllocatedBytes();
  std::printf("MEMORY %.0f %lld %lld %.0f %lld %lld\n", BaseBytes(w) - (double)mem.base_released + (double)mem.weights,
              (long long)mem.lora, (long long)mem.gradients, opt_bytes, (long long)mem.activations,
              (long long)mem.temporary);
  return 0;
}

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  size_t p = 0;
  while (p < s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    out.push_back(std::atoi(s.substr(p, q - p).c_str()));
    p = q + 1;
  }
  return out;
}

}  // namespace

int RunBenchTrain(int argc, char** argv) {
  Args args("bench train",
            "lathe bench train [--arch smollm2-135m | -m MODEL] [--seq 512] [--batch 4] [--steps 2] "
            "[--threads-list 1,2] [--rows lora-f32,...] [--optim-resident-mb 0] [--row-group-tokens 512] "
            "[--row-group-workers 0]");
  args.Flag("--arch", "named architecture with random f32 weights (see `lathe estimate`)", "smollm2-135m");
  args.Flag("-m,--model", "a model file/dir instead of random weights (its dtype is kept for frozen weights)");
  args.Flag("--seq", "tokens per row", "512");
  args.Flag("--batch", "rows per step", "4");
  args.Flag("--steps", "timed steps per row after one warmup step (the fastest is reported)", "2");
  args.Flag("--threads-list", "thread counts to run", "1,2");
  args.Flag(
      "--rows",
      "rows to run: lora-f32, lora-bf16, full-f32, full-bf16 (f32 base); lora-bf16w (bf16 base), qlora-nf4 "
      "(NF4+DQ base), lora-int8 (LLM.int8 base), lora-adamw8bit, lora-paged8bit (bf16 base, 8-bit / paged "
      "8-bit AdamW), qlora-nf4-paged8bit; all but the first four in bf16 mode",
      kDefaultRows);
  args.Flag("--optim-resident-mb", "resident cap of the paged rows' optimizer state (0 = no cap)", "0");
  args.Flag("--row-group-tokens",
            "rows of a step run forward + backward in groups of max(1, this / seq) rows (0 = all at once)",
            std::to_string(model::TrainModelOptions().row_group_tokens));
  args.Flag("--row-group-workers",
            "row groups run data-parallel on this many workers, each on one thread (0 = one per thread, but one "
            "for full rows; 1 = every product split over all threads; full rows: at most one per thread)",
            "0");
  args.Flag("--profile",
            "PREFIX: each row's last step is profiled to PREFIX-ROW-tN.json (Chrome trace) with a top-ops "
            "table on stderr (its cores column shows how well each op used the threads); the recorded events "
            "add to the row's peak RSS");
  args.Flag("--child", "internal: run one row in this process and print its RESULT line");
  args.Flag("--threads", "internal: threads of the --child row", "1");
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return Fail("bench train", st);
  if (args.help_requested()) {
    std::printf("%s", args.Help().c_str());
    return 0;
  }
  auto seq = args.Int("seq"), batch = args.Int("batch"), steps = args.Int("steps");
  if (!seq.ok() || !batch.ok() || !steps.ok() || *seq < 2 || *batch < 1 || *steps < 1) {
    return Fail("bench train", Status::Error("--seq (>= 2), --batch and --steps must be positive integers"));
  }
  std::vector<std::string> row_names;
  {
    std::string s = args.Get("rows");
    size_t p = 0;
    while (p < s.size()) {
      size_t q = s.find(',', p);
      if (q == std::string::npos) q = s.size();
      row_names.push_back(s.substr(p, q - p));
      p = q + 1;
    }
  }
  auto find_row = [](const std::string& n) -> const RowSpec* {
    for (const RowSpec& r : kRows) {
      if (n == r.name) return &r;
    }
    return nullptr;
  };
  for (const auto& n : row_names) {
    if (!find_row(n)) {
      return Fail("bench train", Status::Error("--rows: unknown row '" + n + "' (expected one of " +
                                               std::string(kDefaultRows) + ")"));
    }
  }
  std::vector<int> threads = ParseList(args.Get("threads-list"));
  for (int t : threads) {
    if (t < 1) return Fail("bench train", Status::Error("--threads-list: expected positive integers like 1,2"));
  }

  auto resident_mb = args.Int("optim-resident-mb");
  if (!resident_mb.ok() || *resident_mb < 0) {
    return Fail("bench train", Status::Error("--optim-resident-mb: expected an integer >= 0"));
  }
  auto group_tokens = args.Int("row-group-tokens");
  if (!group_tokens.ok() || *group_tokens < 0) {
    return Fail("bench train", Status::Error("--row-group-tokens: expected an integer >= 0"));
  }
  auto group_workers = args.Int("row-group-workers");
  if (!group_workers.ok() || *group_workers < 0) {
    return Fail("bench train", Status::Error("--row-group-workers: expected an integer >= 0"));
  }
  // Model (config in the parent; weights only in the children).
  auto load = [&](DType storage) -> Result<std::pair<std::unique_ptr<model::LoadedModel>, std::unique_ptr<model::ModelWeights>>> {
    if (args.Has("model")) {
      auto lm = model::LoadModel(args.Get("model"));
      if (!lm.ok()) return lm.status();
      return std::make_pair(std::move(*lm), std::unique_ptr<model::ModelWeights>());
    }
    auto c = train::NamedArchitecture(args.Get("arch"));
    if (!c.ok()) return c.status();
    c->max_seq_len = std::max<int64_t>(c->max_seq_len, *seq);
    return std::make_pair(std::unique_ptr<model::LoadedModel>(), RandomWeights(*c, storage));
  };

  if (args.Has("child")) {
    const RowSpec& row = *find_row(args.Get("child"));
    auto ws = load(row.base);
    if (!ws.ok()) return Fail("bench train", ws.status());
    if (ws->first && IsPackedQuant(row.base)) {  // a model file: pack its linears as `lathe train` does
      auto r = train::QuantizeBaseWeights(&ws->first->weights, row.base, ws->first->weights.config.n_layers);
      if (!r.ok()) return Fail("bench train", r.status());
    }
    model::ModelWeights& w = ws->first ? ws->first->weights : *ws->second;
    if (*seq > w.config.max_seq_len) {
      return Fail("bench train", Status::Error("--seq " + std::to_string(*seq) + " exceeds the model's max_seq_len " +
                                               std::to_string(w.config.max_seq_len)));
    }
    auto t = args.Int("threads");
    if (!t.ok() || *t < 1) return Fail("bench train", Status::Error("--threads: expected a positive integer"));
    return RunChild(w, row, (int)*t, *batch, *seq, (int)*steps, *resident_mb, *group_tokens, *group_workers,
                    args.Has("profile") ? args.Get("profile") : std::string());
  }

  model::ModelConfig c;
  std::string source;
  if (args.Has("model")) {
    auto lm = model::LoadModel(args.Get("model"));
    if (!lm.ok()) return Fail("bench train", lm.status());
    c = (*lm)->weights.config;
    source = args.Get("model") + " (frozen weights as stored: " + std::string(DTypeName((*lm)->weights.layers[0].wq.dtype)) + ")";
  } else {
    auto nc = train::NamedArchitecture(args.Get("arch"));
    if (!nc.ok()) return Fail("bench train", nc.status());
    c = *nc;
    source = args.Get("arch") + " shapes, random f32 weights";
  }
  const double n_mm = MatmulParams(c);
  const double attn = AttentionFlopsPerToken(c, *seq);
  std::printf("lathe bench train: %s; %lld x %lld tokens per step; CPU features: %s; kernels: %s\n", source.c_str(),
              (long long)*batch, (long long)*seq, GetCpuFeatures().ToString().c_str(), IsaTierName(BestIsaTier()));
  std::printf("model FLOPs per token: N = %.1fM matmul parameters (decoder linears + head); full 6N = %.2f GFLOP, "
              "LoRA 4N = %.2f GFLOP, plus causal attention %.3f GFLOP (fwd 4*q_dim*T/2 per layer, bwd 2x fwd); "
              "MFU = model FLOPs / measured peak: f32 FMA for f32 rows, %s\n",
              n_mm / 1e6, 6 * n_mm / 1e9, 4 * n_mm / 1e9, attn / 1e9,
              !UsesBf16Dot()     ? "and for bf16-mode rows too (no bf16 dot product used on this CPU)"
              : UsesAmxBf16()    ? "AMX's bf16 tiles (tdpbf16ps) for bf16-mode rows (their linears and head run on them)"
              : Bf16PairsOnFma() ? "and for bf16-mode rows too (their bf16 pair products run on FMAs here: "
                                   "vdpbf16ps is slower on this CPU)"
                                 : "the bf16 dot product (vdpbf16ps) for bf16-mode rows");
  std::vector<double> peak(threads.size()), peak16(threads.size());
  for (size_t i = 0; i < threads.size(); ++i) {
    peak[i] = MeasurePeak(threads[i]);
    peak16[i] = UsesBf16Dot() ? MeasurePeak(threads[i], /*bf16=*/true) : peak[i];
    std::printf("measured f32 FMA peak, %d thread(s): %.1f GFLOP/s", threads[i], peak[i]);
    if (UsesAmxBf16()) std::printf("; AMX bf16 peak: %.1f GFLOP/s", peak16[i]);
    else if (UsesBf16Dot() && !Bf16PairsOnFma()) std::printf("; bf16 dot-product peak: %.1f GFLOP/s", peak16[i]);
    std::printf("\n");
  }
  std::fflush(stdout);

  std::string self = "/proc/self/exe";
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) exe[n] = 0, self = exe;
  struct Out {
    std::string row;
    int threads;
    double tps, step, rss_mb, gflops, mfu, loss, cpu_tps;
    double mem[6];  // weights, lora, grads, optimizer, activations, temporary (bytes)
  };
  std::vector<Out> outs;
  for (const std::string& rn : row_names) {
    const RowSpec& row = *find_row(rn);
    for (size_t ti = 0; ti < threads.size(); ++ti) {
      std::string cmd = "'" + self + "' bench train --child " + rn + " --threads " + std::to_string(threads[ti]) +
                        " --seq " + std::to_string(*seq) + " --batch " + std::to_string(*batch) + " --steps " +
                        std::to_string(*steps) + " --optim-resident-mb " + std::to_string(*resident_mb) +
                        " --row-group-tokens " + std::to_string(*group_tokens) + " --row-group-workers " +
                        std::to_string(*group_workers);
      cmd += args.Has("model") ? " -m '" + args.Get("model") + "'" : " --arch '" + args.Get("arch") + "'";
      if (args.Has("profile")) {
        cmd += " --profile '" + args.Get("profile") + "-" + rn + "-t" + std::to_string(threads[ti]) + ".json'";
      }
      FILE* p = popen(cmd.c_str(), "r");
      if (!p) return Fail("bench train", Status::Error("cannot start the row subprocess: " + cmd));
      char line[512];
      Out o{rn, threads[ti], 0, 0, 0, 0, 0, 0, 0, {0, 0, 0, 0, 0, 0}};
      bool got = false;
      while (std::fgets(line, sizeof(line), p)) {
        long rss = 0;
        if (std::sscanf(line, "RESULT %lf %lf %ld %lf %lf", &o.tps, &o.step, &rss, &o.loss, &o.cpu_tps) == 5) {
          o.rss_mb = rss / 1024.0;
          got = true;
        }
        std::sscanf(line, "MEMORY %lf %lf %lf %lf %lf %lf", &o.mem[0], &o.mem[1], &o.mem[2], &o.mem[3],
                    &o.mem[4], &o.mem[5]);
      }
      int rc = pclose(p);
      if (!got || rc != 0) return Fail("bench train", Status::Error("row " + rn + " failed (command: " + cmd + ")"));
      double per_tok = (row.lora ? 4 : 6) * n_mm + attn;
      o.gflops = o.tps * per_tok / 1e9;
      const double pk = row.bf16 ? peak16[ti] : peak[ti];
      o.mfu = pk > 0 ? o.gflops / pk : 0;
      outs.push_back(o);
      std::printf("%-9s threads %d: %7.1f tokens/s, step %7.4f s, peak RSS %7.0f MB, %6.1f GFLOP/s = %4.1f%% of "
                  "%.1f (loss %.4f); %7.1f tokens per CPU-second\n",
                  rn.c_str(), o.threads, o.tps, o.step, o.rss_mb, o.gflops, 100 * o.mfu, pk, o.loss, o.cpu_tps);
      std::fflush(stdout);
    }
  }
  std::printf("\n| row | threads | tokens/s | step s | peak RSS MB | GFLOP/s | MFU | tokens/CPU-s |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Out& o : outs) {
    std::printf("| %s | %d | %.1f | %.2f | %.0f | %.1f | %.1f%% | %.1f |\n", o.row.c_str(), o.threads, o.tps, o.step,
                o.rss_mb, o.gflops, 100 * o.mfu, o.cpu_tps);
  }
  // Where the peak goes: the bytes each category holds after the last step (MB); "other" is the
  // peak RSS not in any category (binary, libraries, allocator slack, the peak's transient buffers).
  std::printf(
      "\nmemory by category after the last step (MiB like the RSS; weights = frozen base as stored + "
      "trainable masters):\n"
      "| row | threads | peak RSS | weights | LoRA params | grads | optimizer | activations | temporary | "
      "other |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  constexpr double kMiB = 1048576.0;
  for (const Out& o : outs) {
    double sum = 0;
    for (double b : o.mem) sum += b;
    std::printf("| %s | %d | %.0f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f |\n", o.row.c_str(),
                o.threads, o.rss_mb, o.mem[0] / kMiB, o.mem[1] / kMiB, o.mem[2] / kMiB, o.mem[3] / kMiB,
                o.mem[4] / kMiB, o.mem[5] / kMiB, o.rss_mb - sum / kMiB);
  }
  return 0;
}

}  // namespace lathe::cli
