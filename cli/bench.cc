// `lathe bench`: inference speed of one or more models — prefill tok/s (512-token prompt) and
// decode tok/s (batch 1) at 1 and 2 threads — with decode's achieved memory bandwidth as a
// fraction of the read bandwidth measured in the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/cpu.h"
#include "core/profiler.h"
#include "kernels/kernels.h"
#include "model/transformer.h"

namespace lathe::cli {

namespace {

using Clock = std::chrono::steady_clock;


// Sum of the 64-bit words of [p, p + n) read as S equal parts side by side (word i of every part
// per step): S concurrent sequential streams, 4 accumulators per stream. Not instrumented in the sanitizer
// build: the probe measures DRAM, and checked it read 9 GiB at a fraction of that (10 s per `bench` there).
template <int S>
__attribute__((no_sanitize("address", "undefined"))) uint64_t SumStreams(const uint64_t* p, size_t n) {
  const size_t part = n / S / 4 * 4;
  uint64_t acc[S][4] = {};
  for (size_t i = 0; i < part; i += 4)
    for (int s = 0; s < S; ++s)
      for (int u = 0; u < 4; ++u) acc[s][u] += p[s * part + i + u];
  uint64_t t = 0;
  for (int s = 0; s < S; ++s)
    for (int u = 0; u < 4; ++u) t += acc[s][u];
  return t;
}

// Read bandwidth (GB/s) over a buffer much larger than the caches, on `pool`'s threads: the best of
// one sequential stream per thread and of 4 and 8 concurrent streams per thread (on some CPUs one
// stream per core reaches only part of what the memory system delivers: Zen 1 ~12 of ~17 GB/s, and
// the decode GEMVs read several rows at once).
double MeasureReadBandwidth(ThreadPool& pool, size_t bytes) {
  const size_t n = bytes / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  pool.ParallelFor((int64_t)n, 1 << 15, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) buf[i] = (uint64_t)i * 0x9e3779b97f4a7c15ull;
  });
  double best = 0;
  std::vector<uint64_t> sink(pool.size() * 8);
  const int64_t chunk = 1 << 16;  // 512 KiB per task
  for (int streams : {1, 4, 8}) {
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = Clock::now();
      pool.ParallelFor((int64_t)n, chunk, [&](int64_t b, int64_t e, int t) {
        const uint64_t* p = &buf[b];
        const size_t len = (size_t)(e - b);
        sink[t * 8] += streams == 1   ? SumStreams<1>(p, len)
                       : streams == 4 ? SumStreams<4>(p, len)
                                      : SumStreams<8>(p, len);
      });
      double s = Seconds(t0, Clock::now());
      best = std::max(best, bytes / s / 1e9);
    }
  }
  return best;
}

// Bytes of weights a decode step reads: every layer matrix, one embedding row, the output head.
double DecodeWeightBytes(const model::ModelWeights& w) {
  double b = (double)w.output.nbytes() + (double)w.tok_embd.row_bytes() + (double)w.output_norm.nbytes();
  for (const auto& l : w.layers) {
    for (const Tensor* t : l.All()) {
      if (t->data) b += (double)t->nbytes();
    }
  }
  return b;
}

struct Row {
  std::string model;
  int threads;
  double prefill_tps, decode_tps, decode_gbs, bw_gbs;
  DType kv = DType::kF32;
};

}  // namespace

int RunBench(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "serve") return RunBenchServe(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "train") return RunBenchTrain(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "structured") return RunBenchStructured(argc - 1, argv + 1);
  Args args("bench", "lathe bench -m MODEL [-m MODEL2 ...] [--prompt-tokens 512] [--gen-tokens 128] [--threads-list 1,2]\n"
                     "       lathe bench serve -m MODEL ...   (serving throughput; see `lathe bench serve --help`)\n"
                     "       lathe bench train ...            (training tokens/s vs PyTorch; see `lathe bench train --help`)\n"
                     "       lathe bench structured -m MODEL  (structured outputs: constrained vs free decoding)");
  args.Flag("-m,--model", "model to benchmark (repeatable)");
  args.Flag("--prompt-tokens", "prefill length", "512");
  args.Flag("--gen-tokens", "decode length (batch 1)", "128");
  args.Flag("--threads-list", "thread counts to run", "1,2");
  args.Flag("-r,--repetitions", "repetitions per measurement (best is reported)", "3");
  args.Flag("--depth", "decode after this many tokens of context (llama-bench's -d): the KV cache each step reads", "0");
  args.Flag("--profile",
            "after the timed runs, profile one more prefill per model and thread count (warm caches, a Transformer of "
            "its own): print the top ops and write a Chrome trace of the last one to this file");
  AddKvCacheDTypeFlag(args);
  AddInt8PromptFlag(args);
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return Fail("bench", st);
  if (args.help_requested() || args.All("model").empty()) {
    std::printf("%s", args.Help().c_str());
    return args.help_requested() ? 0 : 1;
  }
  auto pp = args.Int("prompt-tokens");
  auto tg = args.Int("gen-tokens");
  auto reps = args.Int("repetitions");
  auto depth = args.Int("depth");
  if (!pp.ok() || !tg.ok() || !reps.ok() || *pp < 1 || *tg < 1 || *reps < 1) {
    return Fail("bench", Status::Error("--prompt-tokens, --gen-tokens and --repetitions must be positive integers"));
  }
  if (!depth.ok() || *depth < 0) return Fail("bench", Status::Error("--depth must be a non-negative integer"));
  if (Status kst = CheckKvCacheDTypeFlag(args); !kst.ok()) return Fail("bench", kst);
  std::vector<int> thread_list;
  {
    std::string s = args.Get("threads-list");
    size_t p = 0;
    while (p < s.size()) {
      size_t q = s.find(',', p);
      if (q == std::string::npos) q = s.size();
      int n = std::atoi(s.substr(p, q - p).c_str());
      if (n < 1) return Fail("bench", Status::Error("--threads-list: expected positive integers like 1,2"));
      thread_list.push_back(n);
      p = q + 1;
    }
  }
  std::printf("lathe bench: CPU features: %s; kernels: %s%s%s\n", GetCpuFeatures().ToString().c_str(),
              IsaTierName(BestIsaTier()),
              BestIsaTier() == IsaTier::kAvx2 ? (Splits256BitOps() ? " (128-bit int8 form)" : " (256-bit int8 form)")
                                              : "",
              !UsesBf16Dot() ? "" : Bf16PairsOnFma() ? ", bf16 pairs on FMAs" : ", bf16 pairs on vdpbf16ps");
  std::vector<double> bw(thread_list.size());
  for (size_t i = 0; i < thread_list.size(); ++i) {
    ThreadPool pool(thread_list[i]);
    bw[i] = MeasureReadBandwidth(pool, (size_t)1 << 30);
    std::printf("measured read bandwidth, %d thread(s): %.1f GB/s\n", thread_list[i], bw[i]);
  }
  std::vector<Row> rows;
  for (const std::string& path : args.All("model")) {
    model::LoadOptions opts;
    auto lm = model::LoadModel(path, opts);
    if (!lm.ok()) return Fail("bench", lm.status());
    const model::ModelWeights& w = (*lm)->weights;
    auto kvt = KvCacheDTypeFromArgs(args, w);
    if (!kvt.ok()) return Fail("bench", kvt.status());
    double wbytes = DecodeWeightBytes(w);
    std::mt19937 rng(1234);
    std::vector<int32_t> prompt(*pp), context(*depth);
    for (auto& t : prompt) t = (int32_t)(rng() % w.config.vocab_size);
    for (auto& t : context) t = (int32_t)(rng() % w.config.vocab_size);
    for (size_t ti = 0; ti < thread_list.size(); ++ti) {
      ThreadPool pool(thread_list[ti]);
      model::TransformerOptions topts;
      topts.int8_prompt_rows = args.On("int8-prompt");
      model::Transformer tf(w, pool, topts);
      model::KvCache cache(w.config, 1, std::max(*pp, *depth) + *tg + 1, 16, *kvt);
      std::vector<float> logits;
      Row row{path, thread_list[ti], 0, 0, 0, bw[ti], *kvt};
      for (int r = 0; r < *reps; ++r) {
        cache.Clear(0);
        model::SeqInput in{0, std::span<const int32_t>(prompt), false};
        auto t0 = Clock::now();
        Status fs = tf.Forward(cache, std::span<const model::SeqInput>(&in, 1), &logits);
        if (!fs.ok()) return Fail("bench", fs);
        row.prefill_tps = std::max(row.prefill_tps, *pp / Seconds(t0, Clock::now()));
        // Decode from a one-token context, as llama-bench's tg, or after --depth tokens (untimed).
        cache.Clear(0);
        if (*depth > 0) {
          model::SeqInput ctx{0, std::span<const int32_t>(context), false};
          fs = tf.Forward(cache, std::span<const model::SeqInput>(&ctx, 1), &logits);
          if (!fs.ok()) return Fail("bench", fs);
        }
        int32_t tok = prompt[0];
        t0 = Clock::now();
        for (int64_t i = 0; i < *tg; ++i) {
          model::SeqInput step{0, std::span<const int32_t>(&tok, 1), false, 1};
          fs = tf.Forward(cache, std::span<const model::SeqInput>(&step, 1), &logits);
          if (!fs.ok()) return Fail("bench", fs);
          tok = (int32_t)(std::max_element(logits.begin(), logits.end()) - logits.begin());
        }
        row.decode_tps = std::max(row.decode_tps, *tg / Seconds(t0, Clock::now()));
      }
      if (args.Has("profile")) {
        // Its own Transformer (the timed one stays without a profiler); the first prefill warms its buffers.
        Profiler profiler;
        model::TransformerOptions popts = topts;
        popts.profiler = &profiler;
        model::Transformer ptf(w, pool, popts);
        model::SeqInput in{0, std::span<const int32_t>(prompt), false};
        for (int r = 0; r < 2; ++r) {
          cache.Clear(0);
          if (r == 1) {
            profiler.Clear();
            pool.SetProfiler(&profiler);
          }
          Status fs = ptf.Forward(cache, std::span<const model::SeqInput>(&in, 1), &logits);
          if (!fs.ok()) return Fail("bench", fs);
        }
        pool.SetProfiler(nullptr);
        std::printf("profile of one pp%lld prefill, %s, %d thread(s):\n%s", (long long)*pp, path.c_str(),
                    thread_list[ti], profiler.Summary(20).c_str());
        Status ps = profiler.WriteChromeTrace(args.Get("profile"));
        if (!ps.ok()) return Fail("bench", ps.WithContext("--profile"));
      }
      // KV bytes read per decode step, averaged over the run.
      double kv = (double)w.config.n_layers * 2 * w.config.kv_dim() * model::KvElemBytes(*kvt) * (*depth + *tg / 2.0);
      row.decode_gbs = row.decode_tps * (wbytes + kv) / 1e9;
      rows.push_back(row);
      std::printf("%-50s threads %d: prefill %8.1f tok/s | decode %7.1f tok/s, %5.1f GB/s = %3.0f%% of %.1f GB/s (%s KV)\n",
                  path.c_str(), row.threads, row.prefill_tps, row.decode_tps, row.decode_gbs,
                  100 * row.decode_gbs / row.bw_gbs, row.bw_gbs, DTypeName(row.kv));
      std::fflush(stdout);
    }
  }
  const std::string tg_name = StrFormat("tg%lld", (long long)*tg) +
                              (*depth > 0 ? StrFormat(" @ d%lld", (long long)*depth) : std::string());
  std::printf("\n| model | threads | pp%lld tok/s | %s tok/s | decode GB/s | %% of measured bandwidth |\n|---|---:|---:|---:|---:|---:|\n",
              (long long)*pp, tg_name.c_str());
  for (const Row& r : rows) {
    std::string name = r.model.substr(r.model.find_last_of('/') + 1);
    std::printf("| %s (%s KV) | %d | %.1f | %.1f | %.1f | %.0f%% |\n", name.c_str(), DTypeName(r.kv), r.threads,
                r.prefill_tps, r.decode_tps, r.decode_gbs, 100 * r.decode_gbs / r.bw_gbs);
  }
  return 0;
}

}  // namespace lathe::cli
