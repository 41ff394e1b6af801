// Kernel micro-benchmarks: MatMul GEMV (decode, M=1) in GB/s of weight read and prefill (M=512)
// in GFLOP/s, per weight dtype and thread count, each next to a plain f32 baseline from the same
// run (bench/baseline_gemv.cc over a dequantized copy); plus the elementwise ops.
// GEMV cycles through copies of W totalling >= 128 MiB, so W comes from DRAM as in real decode.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "baseline_gemv.h"
#include "core/cpu.h"
#include "core/thread_pool.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/reference.h"
#include "kernels/kernels.h"
#include "kernels/train_ops.h"
#include "model/config.h"
#include "model/train_model.h"
#include "model/transformer.h"

namespace lathe::bench {
namespace {

constexpr size_t kColdBytes = (size_t)128 << 20;
constexpr int64_t kPrefillM = 512;

struct Shape {
  int64_t N, K;
};
// SmolLM2-135M: q/o (576,576), k/v (192,576), gate/up (1536,576), down (576,1536), head.
const Shape kShapes[] = {{576, 576}, {192, 576}, {1536, 576}, {576, 1536}};
const Shape kHead = {49152, 576};
const DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1};
// K-quant decode (the types of llama-quantize's Q*_K_M files) on 256-multiple rows (a 1B-class
// Llama's attention and FFN), next to Q4_0 / Q8_0 on the same shapes.
const Shape kKShapes[] = {{1024, 1024}, {2816, 1024}, {1024, 2816}};
const DType kKTypes[] = {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ5_0,
                         DType::kQ4_0, DType::kQ8_0};

std::vector<float> RandomFloats(int64_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = ((int32_t)(s >> 8) - (1 << 23)) * (0.05f / (1 << 23));
  }
  return v;
}

// `copies` identical weights in dtype t, so that successive calls read cold memory.
struct Weights {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<Tensor> t;
};

Weights MakeWeights(DType dt, Shape s, int copies) {
  Weights w;
  const std::vector<float> f = RandomFloats(s.N * s.K, 1);
  const size_t rb = DTypeBytes(dt, s.K);
  std::vector<uint8_t> one(rb * s.N);
  for (int64_t n = 0; n < s.N; ++n)
    kernels::ref::QuantizeRow(dt, f.data() + n * s.K, s.K, one.data() + n * rb);
  for (int c = 0; c < copies; ++c) {
    w.bytes.push_back(one);
    Tensor t;
    t.data = w.bytes.back().data();
    t.dtype = dt;
    t.shape = {s.N, s.K};
    w.t.push_back(t);
  }
  return w;
}

// LATHE_BENCH_HOT=1 reuses one copy (W stays in L2/L3 when it fits): the kernels' compute rate.
int CopiesFor(size_t bytes) {
  static const bool hot = std::getenv("LATHE_BENCH_HOT") != nullptr;
  return hot ? 1 : (int)std::max<size_t>(1, (kColdBytes + bytes - 1) / bytes);
}

// Seconds per call of the baseline, keyed by "gemv NxK" / "prefill NxK", for the speedup column.
std::map<std::string, double>& BaselineSeconds() {
  static std::map<std::string, double> m;
  return m;
}

std::string Key(const char* kind, Shape s) {
  return std::string(kind) + " " + std::to_string(s.N) + "x" + std::to_string(s.K);
}

using Clock = std::chrono::steady_clock;

double SecondsPerCall(Clock::time_point t0, const benchmark::State& state) {
  return std::chrono::duration<double>(Clock::now() - t0).count() / std::max<int64_t>(1, state.iterations());
}

// Baselines run before the lathe benchmarks of the same shape (registration order), so the
// ratio is always against a baseline measured in this run.
void SetSpeedup(benchmark::State& state, const std::string& key, double our_seconds_per_call) {
  auto it = BaselineSeconds().find(key);
  if (it != BaselineSeconds().end()) state.counters["x_baseline"] = it->second / our_seconds_per_call;
}

// ---- baselines (single thread, dequantized f32 W) ----

void BM_BaselineGemv(benchmark::State& state, Shape s) {
  const size_t bytes = (size_t)s.N * s.K * 4;
  const int copies = CopiesFor(bytes);
  std::vector<std::vector<float>> w(copies, RandomFloats(s.N * s.K, 1));
  const std::vector<float> x = RandomFloats(s.K, 2);
  std::vector<float> y(s.N);
  int c = 0;
  const auto t0 = Clock::now();
  for (auto _ : state) {
    BaselineMatMulF32(x.data(), 1, w[c].data(), s.N, s.K, y.data());
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % copies;
  }
  BaselineSeconds()[Key("gemv", s)] = SecondsPerCall(t0, state);
  state.counters["GB/s"] =
      benchmark::Counter((double)bytes * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * s.N * s.K * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
}

void BM_BaselinePrefill(benchmark::State& state, Shape s) {
  const std::vector<float> w = RandomFloats(s.N * s.K, 1), x = RandomFloats(kPrefillM * s.K, 2);
  std::vector<float> y(kPrefillM * s.N);
  const auto t0 = Clock::now();
  for (auto _ : state) {
    BaselineMatMulF32(x.data(), kPrefillM, w.data(), s.N, s.K, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  BaselineSeconds()[Key("prefill", s)] = SecondsPerCall(t0, state);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kPrefillM * s.N * s.K * state.iterations() * 1e-9,
                                                 benchmark::Counter::kIsRate);
}

// ---- lathe ----

void BM_Gemv(benchmark::State& state, DType dt, Shape s, int threads) {
  ThreadPool pool(threads);
  const size_t bytes = DTypeBytes(dt, s.N * s.K);
  const int copies = CopiesFor(bytes);
  Weights w = MakeWeights(dt, s, copies);
  const std::vector<float> x = RandomFloats(s.K, 2);
  std::vector<float> y(s.N);
  int c = 0;
  const auto t0 = Clock::now();
  for (auto _ : state) {
    kernels::MatMul(pool, x.data(), 1, w.t[c], y.data());
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % copies;
  }
  SetSpeedup(state, Key("gemv", s), SecondsPerCall(t0, state));
  state.counters["GB/s"] =
      benchmark::Counter((double)bytes * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * s.N * s.K * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
  state.counters["us/call"] = benchmark::Counter((double)state.iterations() * 1e-6,
                                                 benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_Prefill(benchmark::State& state, DType dt, Shape s, int threads) {
  ThreadPool pool(threads);
  Weights w = MakeWeights(dt, s, 1);
  const std::vector<float> x = RandomFloats(kPrefillM * s.K, 2);
  std::vector<float> y(kPrefillM * s.N);
  const auto t0 = Clock::now();
  for (auto _ : state) {
    kernels::MatMul(pool, x.data(), kPrefillM, w.t[0], y.data());
    benchmark::DoNotOptimize(y.data());
  }
  SetSpeedup(state, Key("prefill", s), SecondsPerCall(t0, state));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kPrefillM * s.N * s.K * state.iterations() * 1e-9,
                                                 benchmark::Counter::kIsRate);
}

// The same product from the 16-row strips the Transformer packs float weights into (kernels::StripWeight:
// prefill's path for F32 / F16 / BF16 models, no packing of W per call).
void BM_PrefillStrips(benchmark::State& state, DType dt, Shape s, int threads) {
  ThreadPool pool(threads);
  Weights w = MakeWeights(dt, s, 1);
  std::vector<uint8_t> strips(kernels::StripWeightBytes(dt, s.N, s.K));
  const kernels::StripWeight sw = kernels::PackStripWeight(pool, w.t[0], strips.data());
  const std::vector<float> x = RandomFloats(kPrefillM * s.K, 2);
  std::vector<float> y(kPrefillM * s.N);
  for (auto _ : state) {
    kernels::MatMulStrips(pool, x.data(), kPrefillM, sw, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * kPrefillM * s.N * s.K * state.iterations() * 1e-9,
                                                 benchmark::Counter::kIsRate);
}

// Small batches (several decoding sequences at once): where GEMV hands over to the panel path.
void BM_Batch(benchmark::State& state, DType dt, Shape s, int64_t M) {
  ThreadPool pool(1);
  Weights w = MakeWeights(dt, s, 1);
  const std::vector<float> x = RandomFloats(M * s.K, 2);
  std::vector<float> y(M * s.N);
  for (auto _ : state) {
    kernels::MatMul(pool, x.data(), M, w.t[0], y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * M * s.N * s.K * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
}

// Block-quantized weights at batch sizes of batched decode and prefill: the int8 GEMM (MatMul's path
// for M > kGemvQuantMaxM on tiers that have one) against the previous path with qgemm switched off
// (int8 GEMV up to kGemvQuantMaxM, dequantized panels + f32 FMA above), same weights and x.
void BM_QGemm(benchmark::State& state, DType dt, Shape s, int64_t M, bool old_path, int threads) {
  ThreadPool pool(threads);
  Weights w = MakeWeights(dt, s, 1);
  const std::vector<float> x = RandomFloats(M * s.K, 2);
  std::vector<float> y(M * s.N);
  kernels::cpu::MatMulKernels mm = kernels::cpu::Best().mm;
  if (old_path) mm.qgemm = nullptr;
  for (auto _ : state) {
    kernels::cpu::MatMulWith(mm, pool, x.data(), M, w.t[0], y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * M * s.N * s.K * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
}

// Prompt rows of a block-quantized W, the three forms of the same product in one run (same weights and x):
// f32 x on dequantized panels (MatMul exact), bf16 x times the dequantized weights rounded to bf16 (where the
// table has bf16_dequant), int16 x on the int16 GEMM (where the table has qgemm_runs: AVX-512 VNNI, AVX2 vpmaddwd;
// the transformer's choice there).
void BM_PromptRows(benchmark::State& state, DType dt, Shape s, int64_t M, int form, int threads) {
  ThreadPool pool(threads);
  Weights w = MakeWeights(dt, s, 1);
  const std::vector<float> x = RandomFloats(M * s.K, 2);
  std::vector<float> y(M * s.N);
  const kernels::cpu::MatMulKernels& mm = kernels::cpu::Best().mm;
  for (auto _ : state) {
    if (form == 0) kernels::cpu::MatMulWith(mm, pool, x.data(), M, w.t[0], y.data(), /*exact_activations=*/true);
    if (form == 1) kernels::cpu::MatMulBf16With(mm, pool, x.data(), M, w.t[0], y.data());
    if (form == 2) kernels::cpu::MatMulInt16With(mm, pool, x.data(), M, w.t[0], y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * M * s.N * s.K * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
}

// The matmuls of one SmolLM2-135M forward step over M rows (30 layers of q, k, v, o, gate, up, down,
// then the head), each layer with its own weights (~143 MB in Q8_0), so they stream from DRAM as in
// the serving engine (a bench on one matrix keeps it in cache). exact = the prompt rows' path (f32
// activations; at M = 1 the dequantized-panel path, not a GEMV), else the sampled rows' (int8). Compare
// CPU times on a busy box.
void BM_Step(benchmark::State& state, DType dt, int64_t M, bool exact, int threads) {
  ThreadPool pool(threads);
  const Shape layer[] = {{576, 576},  {192, 576},  {192, 576}, {576, 576},
                         {1536, 576}, {1536, 576}, {576, 1536}};
  std::vector<Weights> ws;
  double flops = 0;
  for (int l = 0; l < 30; ++l)
    for (Shape s : layer) {
      ws.push_back(MakeWeights(dt, s, 1));
      flops += 2.0 * M * s.N * s.K;
    }
  ws.push_back(MakeWeights(dt, kHead, 1));
  flops += 2.0 * M * kHead.N * kHead.K;
  const std::vector<float> x = RandomFloats(M * 1536, 2);
  std::vector<float> y(M * kHead.N);
  for (auto _ : state) {
    for (const Weights& w : ws) {
      kernels::MatMul(pool, x.data(), M, w.t[0], y.data(), exact);
      benchmark::DoNotOptimize(y.data());
    }
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
}

// One decode token's paged attention (3 query heads per KV head, head_dim 64, as SmolLM2-135M;
// blocks of 16 in a shuffled table): the AVX2 group kernel against the per-position Dot / Softmax /
// Axpy form (group_attend switched off), same data.
void BM_PagedAttention(benchmark::State& state, int64_t n_pos, bool old_path) {
  const int group = 3, hd = 64, kv_heads = 3, bs = 16;
  const int64_t kv_dim = kv_heads * hd, n_blocks = (n_pos + bs - 1) / bs, pool_blocks = 2 * n_blocks + 1;
  const std::vector<float> k = RandomFloats(pool_blocks * bs * kv_dim, 5),
                           v = RandomFloats(pool_blocks * bs * kv_dim, 6);
  const std::vector<float> q = RandomFloats(group * kv_heads * hd, 7);
  std::vector<int64_t> off(n_pos);
  for (int64_t p = 0; p < n_pos; ++p) off[p] = ((2 * (p / bs) + 1) * bs + p % bs) * kv_dim;
  std::vector<float> out(group * kv_heads * hd), sc(n_pos);
  kernels::cpu::KernelTable kt = kernels::cpu::Best();
  if (old_path) kt.group_attend = nullptr;
  for (auto _ : state) {
    for (int g = 0; g < kv_heads; ++g)
      kernels::cpu::GroupAttentionWith(kt, q.data() + g * group * hd, group, k.data() + g * hd,
                                       v.data() + g * hd, off.data(), n_pos, hd, 0.125f,
                                       out.data() + g * group * hd, sc.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["positions/s"] =
      benchmark::Counter((double)n_pos * group * kv_heads * state.iterations(), benchmark::Counter::kIsRate);
}

// One c=32 serving step's decode attention over `layers` layers (30: all of SmolLM2's; 1: one layer's K/V,
// which a large L3 holds): 32 sequences with 64-191 cached positions each
// (`lathe bench serve`'s default workload mid-generation), SmolLM2-135M's shape (3 KV heads of 3 query heads,
// head_dim 64), f32 or f16 (`lathe serve`'s default cache for 16-bit and quantized models) K/V in the engine's
// KvBlockStore (its layout), blocks of 16 scattered over a pool of that size (30 layers: ~1.1 GB in f32, so
// K/V come from DRAM as in the engine), one kernels::GroupAttentionRows call per (sequence, KV head) with
// one token, as Transformer::Attention makes them. Counters: GFLOP/s (q.k and p.v) and K/V GB/s (bytes as
// stored).
void BM_DecodeAttention(benchmark::State& state, int layers, int threads, DType kv) {
  constexpr int kSeqs = 32, group = 3, hd = 64, kv_heads = 3, bs = 16;
  const int64_t kv_dim = kv_heads * hd;
  std::mt19937 rng(11);
  std::vector<int64_t> n_pos(kSeqs);
  int64_t total_blocks = 0;
  for (int64_t& n : n_pos) {
    n = std::uniform_int_distribution<int64_t>(64, 191)(rng);
    total_blocks += (n + bs - 1) / bs;
  }
  std::vector<int32_t> perm(total_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  model::ModelConfig c;
  c.n_layers = layers;
  c.n_heads = group * kv_heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = hd;
  model::KvBlockStore store(c, total_blocks, bs, kv, /*populate=*/true);
  std::vector<std::vector<int64_t>> offs(kSeqs);
  int64_t next = 0, positions = 0;
  for (int s = 0; s < kSeqs; ++s) {
    const int64_t nb = (n_pos[s] + bs - 1) / bs;
    for (int64_t p = 0; p < n_pos[s]; ++p) offs[s].push_back(store.PosOffset(perm[next + p / bs], p % bs));
    next += nb;
    positions += n_pos[s];
  }
  std::vector<float> row(kv_dim);
  for (int l = 0; l < layers; ++l)
    for (int64_t b = 0; b < total_blocks; ++b)
      for (int64_t o = 0; o < bs; ++o) {
        for (int64_t j = 0; j < kv_dim; ++j)
          row[j] = (float)((((l * total_blocks + b) * bs + o) * kv_dim + j) * 2654435761u % 1000) * 1e-3f - 0.5f;
        store.Write(l, b, o, row.data(), row.data());
      }
  const size_t elt = model::KvElemBytes(kv);
  const std::vector<float> q = RandomFloats((int64_t)kSeqs * group * kv_heads * hd, 7);
  std::vector<float> out(q.size());
  ThreadPool pool(threads);
  std::vector<std::vector<float>> sc(threads, std::vector<float>(group * 256));
  for (auto _ : state) {
    for (int l = 0; l < layers; ++l) {
      const uint8_t* kl = (const uint8_t*)store.KLayer(l);
      const uint8_t* vl = (const uint8_t*)store.VLayer(l);
      pool.ParallelFor(kSeqs * kv_heads, 1, [&](int64_t b, int64_t e, int t) {
        for (int64_t it = b; it < e; ++it) {
          const int s = (int)(it / kv_heads), g = (int)(it % kv_heads);
          const int64_t qo = ((int64_t)s * group * kv_heads + g * group) * hd;
          kernels::GroupAttentionRows(q.data() + qo, group * kv_heads * hd, 1, group, kl + store.HeadOffset(g) * elt,
                                      vl + store.HeadOffset(g) * elt, kv, offs[s].data(), n_pos[s] - 1, hd, 0.125f,
                                      out.data() + qo, group * kv_heads * hd, sc[t].data());
        }
      });
    }
    benchmark::DoNotOptimize(out.data());
  }
  const double per_iter = (double)layers * positions;
  state.counters["GFLOP/s"] =
      benchmark::Counter(per_iter * 4.0 * hd * group * kv_heads * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
  state.counters["KV_GB/s"] =
      benchmark::Counter(per_iter * 2.0 * kv_dim * elt * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
}

// Training attention over one T-token row (512: the bench's rows; 2048: LLaMA-Factory's default cutoff_len) of SmolLM2-135M's shape (9 query heads, 3 KV heads,
// head_dim 64, causal), forward or backward, 1 or 2 threads; GFLOP/s of the causal half (forward 2 products,
// backward 5, as the trainer's profiler counts them). bf16: bf16 mixed precision's products on vdpbf16ps
// (FlashAttention*Bf16), next to the f32 ones on the same data.
void BM_TrainAttention(benchmark::State& state, bool backward, bool bf16, int64_t T, int threads) {
  const int H = 9, KV = 3, hd = 64;
  const std::vector<float> q = RandomFloats(T * H * hd, 11), k = RandomFloats(T * KV * hd, 12),
                           v = RandomFloats(T * KV * hd, 13), dout = RandomFloats(T * H * hd, 14);
  std::vector<float> out(T * H * hd), lse(T * H), dq(T * H * hd), dk(T * KV * hd), dv(T * KV * hd);
  ThreadPool pool(threads);
  const float scale = 0.125f;
  auto forward = bf16 ? kernels::FlashAttentionForwardBf16 : kernels::FlashAttentionForward;
  auto backward_fn = bf16 ? kernels::FlashAttentionBackwardBf16 : kernels::FlashAttentionBackward;
  forward(pool, out.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, T, H, KV, hd, scale, 0);
  for (auto _ : state) {
    if (backward)
      backward_fn(pool, dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                  lse.data(), nullptr, T, H, KV, hd, scale, 0);
    else
      forward(pool, out.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, T, H, KV, hd, scale, 0);
    benchmark::DoNotOptimize(out.data());
    benchmark::DoNotOptimize(dq.data());
  }
  const double flops = (backward ? 5.0 : 2.0) * T * T * H * hd;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
}

void BM_Elementwise(benchmark::State& state, int op, bool reference) {
  const int64_t n = 1536 * 64;
  std::vector<float> a = RandomFloats(n, 3), b = RandomFloats(n, 4), o(n);
  for (auto _ : state) {
    switch (op) {
      case 0:
        if (reference)
          kernels::ref::RmsNorm(a.data(), b.data(), o.data(), 64, 1536, 1e-5f);
        else
          kernels::RmsNorm(a.data(), b.data(), o.data(), 64, 1536, 1e-5f);
        break;
      case 1:
        o = a;
        if (reference)
          kernels::ref::SiluMul(o.data(), b.data(), n);
        else
          kernels::SiluMul(o.data(), b.data(), n);
        break;
      case 2:
        o = a;
        if (reference)
          kernels::ref::Softmax(o.data(), n);
        else
          kernels::Softmax(o.data(), n);
        break;
      default:  // argmax over one vocabulary row (SmolLM2's 49152): greedy sampling per sequence
        if (reference)
          o[0] = (float)kernels::ref::Argmax(a.data(), 49152);
        else
          o[0] = (float)kernels::Argmax(a.data(), 49152);
        break;
    }
    benchmark::DoNotOptimize(o.data());
  }
  state.counters["Melem/s"] =
      benchmark::Counter((double)(op == 3 ? 49152 : n) * state.iterations() * 1e-6, benchmark::Counter::kIsRate);
}

// Training GEMMs at SmolLM2-135M shapes over M = 2048 tokens (bench train's 4 x 512), one thread,
// CPU time (the box is shared): forward y = x W^T (the trainer's MatMul), input gradient
// dx = dy W, weight gradient dW += dy^T x, and the LoRA r16 matrices (out x 16, 16 x in).
// Also at M = 512 (one row group of the trainer) on 1 and 2 pool threads, wall time: how the
// products the trainer runs scale to 2 threads.
constexpr int64_t kTrainM = 2048;
void BM_TrainGemm(benchmark::State& state, int kind, Shape s, int64_t kTrainM, int threads) {
  ThreadPool pool(threads);
  const std::vector<float> wf = RandomFloats(s.N * s.K, 1);
  Tensor w;
  w.data = (void*)wf.data();
  w.dtype = DType::kF32;
  w.shape = {s.N, s.K};
  const std::vector<float> a = RandomFloats(kTrainM * std::max(s.N, s.K), 2);
  std::vector<float> o(std::max(kTrainM * std::max(s.N, s.K), s.N * s.K));
  for (auto _ : state) {
    if (kind == 0)
      kernels::MatMul(pool, a.data(), kTrainM, w, o.data(), /*exact_activations=*/true);
    else if (kind == 3)
      kernels::LinearForward(pool, o.data(), a.data(), kTrainM, w);
    else if (kind == 1)
      kernels::MatMulBackwardInput(pool, o.data(), a.data(), kTrainM, w);
    else
      kernels::MatMulBackwardWeight(pool, o.data(), a.data(), a.data(), kTrainM, s.N, s.K);
    benchmark::DoNotOptimize(o.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * kTrainM * s.N * s.K * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
}

// LoRA's f32 products around every decoder linear of one 512-token row group (SmolLM2-135M's 30 layers x q, k, v,
// o, gate, up, down, each with its own f32 W, rank-16 A and B: W from DRAM as in training), as the trainer runs
// them in f32 mode: kind 0 = the forward (mid = x A^T, then y = x W^T and y += (s mid) B^T), kind 1 = the input
// gradient (dmid = dy B, then dx = dy W and dx += dmid A); plus = the update inside the base product where
// kernels::LinearPlusFused holds (TrainModelOptions::lora_plus_products), else the separate products. kind 2 = the
// LoRA gradients (dB = dy^T (s mid), dmid = dy B, dA = dmid^T x); plus = dB and dmid in one pass over dy
// (kernels::LoraGradPair) and dA with x read in place (kernels::LoraGradA). GFLOP/s of the base products only (kind 2: of the three rank-r products), so the rows
// compare as times.
void BM_TrainLoraLinears(benchmark::State& state, int kind, bool plus, int threads) {
  ThreadPool pool(threads);
  constexpr int kLayers = 30;
  constexpr int64_t M = 512, r = 16;
  const Shape per_layer[] = {{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}};
  std::vector<std::vector<float>> ws, as, bs;
  std::vector<Tensor> tw, ta, tb;
  double flops = 0;
  auto tensor = [](std::vector<float>& v, int64_t n, int64_t k) {
    Tensor t;
    t.data = (void*)v.data();
    t.dtype = DType::kF32;
    t.shape = {n, k};
    return t;
  };
  ws.reserve(kLayers * 7), as.reserve(kLayers * 7), bs.reserve(kLayers * 7);
  for (int l = 0; l < kLayers; ++l)
    for (Shape s : per_layer) {
      const uint32_t seed = (uint32_t)ws.size() * 3 + 7;
      ws.push_back(RandomFloats(s.N * s.K, seed));
      as.push_back(RandomFloats(r * s.K, seed + 1));
      bs.push_back(RandomFloats(s.N * r, seed + 2));
      tw.push_back(tensor(ws.back(), s.N, s.K));
      ta.push_back(tensor(as.back(), r, s.K));
      tb.push_back(tensor(bs.back(), s.N, r));
      flops += kind == 2 ? 2.0 * M * r * (2 * s.N + s.K) : 2.0 * M * s.N * s.K;
    }
  const std::vector<float> in = RandomFloats(M * 1536, 3);
  std::vector<float> out(M * 1536), mid(M * r), ga(r * 1536), gb(1536 * r);
  const std::vector<float> smid = RandomFloats(M * r, 4);
  for (auto _ : state) {
    for (size_t i = 0; i < tw.size(); ++i) {
      const int64_t N = tw[i].shape[0], K = tw[i].shape[1];
      if (kind == 2) {  // LoRA's gradients: dB, dmid (one pass over dy with plus, where it runs), dA
        if (!plus || !kernels::LoraGradPair(pool, mid.data(), gb.data(), in.data(), smid.data(), tb[i], M)) {
          kernels::MatMulBackwardWeight(pool, gb.data(), in.data(), smid.data(), M, N, r);
          kernels::MatMulBackwardInput(pool, mid.data(), in.data(), M, tb[i]);
        }
        if (!plus || !kernels::LoraGradA(pool, ga.data(), mid.data(), in.data(), M, K, r))
          kernels::MatMulBackwardWeight(pool, ga.data(), mid.data(), in.data(), M, r, K);
        continue;
      }
      if (kind == 0) {
        kernels::LinearForward(pool, mid.data(), in.data(), M, ta[i]);
        if (plus && kernels::LinearPlusFused(N, K, r)) {
          kernels::LinearForwardPlus(pool, out.data(), in.data(), M, tw[i], mid.data(), tb[i]);
        } else {
          kernels::LinearForward(pool, out.data(), in.data(), M, tw[i]);
          kernels::LinearForward(pool, out.data(), mid.data(), M, tb[i], /*accumulate=*/true);
        }
      } else {
        kernels::MatMulBackwardInput(pool, mid.data(), in.data(), M, tb[i]);
        if (plus && kernels::LinearPlusFused(K, N, r)) {
          kernels::MatMulBackwardInputPlus(pool, out.data(), in.data(), M, tw[i], mid.data(), ta[i]);
        } else {
          kernels::MatMulBackwardInput(pool, out.data(), in.data(), M, tw[i]);
          kernels::MatMulBackwardInput(pool, out.data(), mid.data(), M, ta[i], /*accumulate=*/true);
        }
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(flops * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
}

// One training step's decoder-linear products in bf16 mode, as the trainer runs them for one 512-token row
// group: every linear of SmolLM2-135M's 30 layers (q, k, v, o, gate, up, down) with its own f32 master W
// and f32 gradient (850 MB together, so W and dW come from DRAM as in training), kind 0 = y = x W^T,
// 1 = dx = dy W, 2 = dW += dy^T x. Operand packing is included, as in the trainer's per-op times.
// bf16 = false: the same products in f32 (full-f32's linears; the f32 training GEMM on W as stored).
void BM_TrainStepLinears(benchmark::State& state, int kind, int threads, bool bf16) {
  ThreadPool pool(threads);
  constexpr int kLayers = 30;
  const Shape per_layer[] = {{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}};
  std::vector<std::vector<float>> ws, gs;
  std::vector<Tensor> ts;
  double flops = 0;
  for (int l = 0; l < kLayers; ++l)
    for (Shape s : per_layer) {
      ws.push_back(RandomFloats(s.N * s.K, (uint32_t)ws.size() + 7));
      gs.emplace_back(s.N * s.K, 0.0f);
      Tensor t;
      t.data = (void*)ws.back().data();
      t.dtype = DType::kF32;
      t.shape = {s.N, s.K};
      ts.push_back(t);
      flops += 2.0 * kPrefillM * s.N * s.K;
    }
  std::vector<float> a = RandomFloats(kPrefillM * 1536, 3), b = RandomFloats(kPrefillM * 1536, 4);
  if (bf16) {
    kernels::RoundToBf16(a.data(), a.data(), (int64_t)a.size());
    kernels::RoundToBf16(b.data(), b.data(), (int64_t)b.size());
  }
  std::vector<float> o(kPrefillM * 1536);
  for (auto _ : state) {
    for (size_t i = 0; i < ts.size(); ++i) {
      const Tensor& w = ts[i];
      if (kind == 0 && bf16)
        kernels::LinearForwardBf16(pool, o.data(), a.data(), kPrefillM, w);
      else if (kind == 0)
        kernels::LinearForward(pool, o.data(), a.data(), kPrefillM, w);
      else if (kind == 1 && bf16)
        kernels::MatMulBackwardInputBf16(pool, o.data(), a.data(), kPrefillM, w);
      else if (kind == 1)
        kernels::MatMulBackwardInput(pool, o.data(), a.data(), kPrefillM, w);
      else if (bf16)
        kernels::MatMulBackwardWeightBf16(pool, gs[i].data(), a.data(), b.data(), kPrefillM, w.shape[0], w.shape[1]);
      else
        kernels::MatMulBackwardWeight(pool, gs[i].data(), a.data(), b.data(), kPrefillM, w.shape[0], w.shape[1]);
    }
    benchmark::DoNotOptimize(o.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(flops * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
}

// The loss of one 512-token row group in bf16 mode over SmolLM2's bf16 head (49152 x 576): logits, softmax
// and dx from the packed head's pairs (LoRA: frozen head), plus the head's weight gradient (full: f32
// gradient, 113 MB, from DRAM).
// The loss (cross-entropy over SmolLM2's 49152 x 576 head, 512 tokens in chunks of 128): bf16 mixed precision's
// products on vdpbf16ps (bf16) or f32; full = the trained head's weight gradient too (the third product).
// f32_head (bf16): the head as f32 rows (a trained head's masters, rounded by the loss as it reads them) instead of
// a bf16 copy.
void BM_TrainLoss(benchmark::State& state, bool full, int threads, bool bf16, bool f32_head = false) {
  ThreadPool pool(threads);
  const int64_t V = kHead.N, C = kHead.K, T = 512;
  std::vector<float> wf = RandomFloats(V * C, 11);
  const bool w16_head = bf16 && !f32_head;
  std::vector<uint16_t> w16(w16_head ? V * C : 0);
  for (size_t i = 0; i < w16.size(); ++i) w16[i] = F32ToBF16(wf[i]);
  Tensor w;
  w.data = w16_head ? (void*)w16.data() : (void*)wf.data();
  w.dtype = w16_head ? DType::kBF16 : DType::kF32;
  w.shape = {V, C};
  // The head packed for dx only where the trainer keeps a packed copy (model::PackedHeadBytes: not for a trained f32
  // head, whose input gradient packs W's panels per round of each chunk).
  const bool use_packed = model::PackedHeadBytes(V, C, full, false, w16_head) > 0;
  kernels::PackedBackwardB packed;
  if (use_packed && w16_head) {
    kernels::PackForBackwardInputBf16(pool, w, &packed);
  } else if (use_packed) {
    kernels::PackForBackwardInput(pool, w, &packed);
  }
  std::vector<float> x = RandomFloats(T * C, 12), dx(T * C), dw(full ? V * C : 0);
  if (bf16) kernels::RoundToBf16(x.data(), x.data(), T * C);
  std::vector<int32_t> labels(T);
  for (int64_t t = 0; t < T; ++t) labels[t] = (int32_t)((t * 7919) % V);
  for (auto _ : state) {
    benchmark::DoNotOptimize(kernels::CrossEntropyBackward(pool, dx.data(), full ? dw.data() : nullptr, x.data(), T,
                                                           w, labels.data(), (float)T, 1.0f, 128,
                                                           use_packed ? &packed : nullptr, bf16));
  }
  state.counters["GFLOP/s"] = benchmark::Counter((full ? 3 : 2) * 2.0 * T * V * C * state.iterations() * 1e-9,
                                                 benchmark::Counter::kIsRate);
}

std::string Name(const char* kind, const std::string& what, Shape s, int threads) {
  std::string n = std::string(kind) + "/" + what + "/" + std::to_string(s.N) + "x" + std::to_string(s.K);
  if (threads > 0) n += "/threads:" + std::to_string(threads);
  return n;
}

void RegisterAll() {
  const bool avx2 = GetCpuFeatures().HasAvx2Tier();  // the baseline is compiled for AVX2
  std::vector<Shape> gemv_shapes(std::begin(kShapes), std::end(kShapes));
  gemv_shapes.push_back(kHead);
  for (Shape s : gemv_shapes) {
    const bool head = s.N == kHead.N;
    if (avx2)
      benchmark::RegisterBenchmark(Name("gemv", "baseline_f32", s, 0).c_str(), BM_BaselineGemv, s)
          ->UseRealTime();
    for (DType dt : kTypes) {
      if (head && dt != DType::kQ8_0 && dt != DType::kQ4_0) continue;
      for (int threads : {1, 2})
        benchmark::RegisterBenchmark(Name("gemv", DTypeName(dt), s, threads).c_str(), BM_Gemv, dt, s, threads)
            ->UseRealTime();
    }
  }
  for (Shape s : kKShapes) {
    for (DType dt : kKTypes)
      for (int threads : {1, 2})
        benchmark::RegisterBenchmark(Name("kgemv", DTypeName(dt), s, threads).c_str(), BM_Gemv, dt, s, threads)
            ->UseRealTime();
  }
  for (Shape s : kShapes) {
    if (s.N == 192) continue;
    if (avx2)
      benchmark::RegisterBenchmark(Name("prefill", "baseline_f32", s, 0).c_str(), BM_BaselinePrefill, s)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    for (DType dt : kTypes)
      for (int threads : {1, 2})
        benchmark::RegisterBenchmark(Name("prefill", DTypeName(dt), s, threads).c_str(), BM_Prefill, dt, s,
                                     threads)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
  }
  for (Shape s : kShapes)
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
      for (int threads : {1, 2})
        benchmark::RegisterBenchmark(Name("prefill_strips", DTypeName(dt), s, threads).c_str(), BM_PrefillStrips, dt,
                                     s, threads)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
  for (DType dt : kTypes)
    for (int64_t M : {2, 3, 4, 5, 6, 7, 8, 12, 15, 16, 24, 32})
      benchmark::RegisterBenchmark(
          ("batch/" + std::string(DTypeName(dt)) + "/M:" + std::to_string(M) + "/1536x576").c_str(), BM_Batch,
          dt, Shape{1536, 576}, M)
          ->UseRealTime();
  const char* train_kinds[] = {"fwd_matmul", "bwd_input", "bwd_weight", "fwd_linear"};
  const Shape train_shapes[] = {{576, 576}, {1536, 576}, {576, 1536}, {16, 576}, {576, 16}, {16, 1536}, {1536, 16}};
  for (int kind : {0, 3, 1, 2})
    for (Shape s : train_shapes)
      benchmark::RegisterBenchmark(Name("train", train_kinds[kind], s, 1).c_str(), BM_TrainGemm, kind, s, kTrainM, 1)
          ->Unit(benchmark::kMillisecond);
  for (int kind : {3, 1, 2})
    for (Shape s : train_shapes)
      for (int threads : {1, 2})
        benchmark::RegisterBenchmark((Name("train512", train_kinds[kind], s, 0) + "/pool:" + std::to_string(threads)).c_str(),
                                     BM_TrainGemm, kind, s, (int64_t)512, threads)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
  for (int kind : {0, 1, 2})
    for (int threads : {1, 2})
      for (bool plus : {false, true})
        benchmark::RegisterBenchmark((std::string("train_lora_f32/") +
                                      (kind == 0 ? "forward" : kind == 1 ? "input_grad" : "lora_grads") +
                                     (plus ? "/plus" : "/separate") + "/threads:" + std::to_string(threads))
                                        .c_str(),
                                    BM_TrainLoraLinears, kind, plus, threads)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
  // The loss's head products per 128-token chunk (train_xent.cc): the head's weight gradient
  // (full fine-tuning) and input gradient.
  for (int kind : {1, 2})
    for (int threads : {1, 2})
      benchmark::RegisterBenchmark((Name("train128", train_kinds[kind], kHead, 0) + "/pool:" + std::to_string(threads)).c_str(),
                                   BM_TrainGemm, kind, kHead, (int64_t)128, threads)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  if (kernels::cpu::Best().mm.qgemm)
    for (DType dt : {DType::kQ8_0, DType::kQ4_0})
      for (Shape s : {Shape{1536, 576}, Shape{576, 1536}, kHead})
        for (int64_t M : {16, 32, 64, 128, 512}) {
          if (s.N == kHead.N && M > 128) continue;
          for (bool old_path : {true, false})
            benchmark::RegisterBenchmark(
                ("qgemm/" + std::string(DTypeName(dt)) + "/" + (old_path ? "old" : "int8gemm") +
                 "/M:" + std::to_string(M) + "/" + std::to_string(s.N) + "x" + std::to_string(s.K))
                    .c_str(),
                BM_QGemm, dt, s, M, old_path, 1)
                ->Unit(benchmark::kMicrosecond)
                ->UseRealTime();
        }
  for (DType dt : {DType::kQ8_0, DType::kQ4_1})
    for (Shape s : {Shape{1536, 576}, Shape{576, 1536}})
      for (int64_t M : {64, 512})
        for (int form : {0, 1, 2})
          for (int threads : {1, 2}) {
            if (form == 1 && !kernels::cpu::Best().mm.bf16_dequant) continue;
            if (form == 2 && !kernels::cpu::Best().mm.qgemm_runs) continue;
            benchmark::RegisterBenchmark(("prompt/" + std::string(DTypeName(dt)) + "/" +
                                          (form == 0 ? "f32x" : form == 1 ? "bf16x" : "int16x") + "/M:" +
                                          std::to_string(M) + "/" + std::to_string(s.N) + "x" + std::to_string(s.K) +
                                          "/threads:" + std::to_string(threads))
                                             .c_str(),
                                         BM_PromptRows, dt, s, M, form, threads)
                ->Unit(benchmark::kMicrosecond)
                ->UseRealTime();
          }
  for (DType dt : {DType::kQ8_0, DType::kQ4_1})
    for (int64_t M : {1, 4, 6, 8, 32, 64})
      for (bool exact : {false, true})
        for (int threads : {1, 2}) {
          if (exact && M != 1 && M < 32) continue;
          benchmark::RegisterBenchmark(("step/" + std::string(DTypeName(dt)) + (exact ? "/f32x" : "/int8x") +
                                        "/M:" + std::to_string(M) + "/threads:" + std::to_string(threads))
                                           .c_str(),
                                       BM_Step, dt, M, exact, threads)
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime();
        }
  for (int64_t n_pos : {32, 160, 1024})
    for (bool old_path : {true, false})
      benchmark::RegisterBenchmark(("paged_attention/" + std::string(old_path ? "dot_axpy" : "group_kernel") +
                                    "/positions:" + std::to_string(n_pos))
                                       .c_str(),
                                   BM_PagedAttention, n_pos, old_path)
          ->UseRealTime();
  for (DType kv : {DType::kF32, DType::kF16})
    for (int layers : {30, 1})
      for (int threads : {1, 2})
        benchmark::RegisterBenchmark(("decode_attention/c32/" + std::string(DTypeName(kv)) + "/layers:" +
                                      std::to_string(layers) + "/threads:" + std::to_string(threads))
                                         .c_str(),
                                     BM_DecodeAttention, layers, threads, kv)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
  for (bool bf16 : {true, false})
    for (bool full : {false, true})
      for (int threads : {1, 2}) {
        if (bf16 && !UsesBf16Dot()) continue;
        benchmark::RegisterBenchmark((std::string(bf16 ? "train_bf16_loss/" : "train_f32_loss/") +
                                      (full ? "full" : "lora") + "/T:512/threads:" + std::to_string(threads))
                                         .c_str(),
                                     BM_TrainLoss, full, threads, bf16, false)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
        if (bf16 && full)  // the trained head as the trainer keeps it: f32 masters, no bf16 shadow
          benchmark::RegisterBenchmark(("train_bf16_loss/full_f32head/T:512/threads:" + std::to_string(threads)).c_str(),
                                       BM_TrainLoss, full, threads, bf16, true)
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime();
      }
  for (bool bf16 : {true, false})
    for (int kind : {0, 1, 2})
      for (int threads : {1, 2}) {
        if (bf16 && !UsesBf16Dot()) continue;
        benchmark::RegisterBenchmark((std::string(bf16 ? "train_bf16_step/" : "train_f32_step/") +
                                      (kind == 0 ? "fwd" : kind == 1 ? "bwd_input" : "bwd_weight") +
                                      "/M:512/threads:" + std::to_string(threads))
                                         .c_str(),
                                     BM_TrainStepLinears, kind, threads, bf16)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
  for (int64_t T : {512, 2048})
    for (bool backward : {false, true})
      for (bool bf16 : {false, true})
        for (int threads : {1, 2}) {
          if (bf16 && !UsesBf16Dot()) continue;
          benchmark::RegisterBenchmark((std::string("train_attention/") + (backward ? "backward" : "forward") +
                                        (bf16 ? "/bf16" : "/f32") + "/T:" + std::to_string(T) +
                                        "/threads:" + std::to_string(threads))
                                           .c_str(),
                                       BM_TrainAttention, backward, bf16, T, threads)
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime();
        }
  const char* ops[] = {"rmsnorm", "silu_mul", "softmax", "argmax49152"};
  for (int op = 0; op < 4; ++op)
    for (bool reference : {true, false})
      benchmark::RegisterBenchmark(
          (std::string("elementwise/") + ops[op] + (reference ? "/reference" : "/lathe")).c_str(),
          BM_Elementwise, op, reference);
}

}  // namespace
}  // namespace lathe::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const lathe::CpuFeatures& f = lathe::GetCpuFeatures();
  std::printf("lathe kernels bench: ISA tier %s (cpu: %s)\n", lathe::IsaTierName(lathe::BestIsaTier()),
              f.ToString().c_str());
  if (f.HasAvx2Tier() && !std::getenv("LATHE_BENCH_NO_PEAK"))
    std::printf("measured 1-core peaks: f32 FMA (%s) %.1f GFLOP/s, DRAM read %.1f GB/s\n",
                lathe::BestIsaTier() == lathe::IsaTier::kAvx512 ? "zmm" : "ymm", lathe::MeasureFmaPeakGflops(),
                lathe::bench::MeasureReadBandwidthGBs());
  lathe::bench::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
