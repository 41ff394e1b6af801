// `lathe serve`: the OpenAI-compatible server — loads a model (+ LoRA adapters), sizes the paged
// KV cache, runs the continuous-batching engine and the HTTP server until SIGINT/SIGTERM.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/profiler.h"
#include "model/lora.h"
#include "serve/engine.h"
#include "server/http_server.h"
#include "server/openai_api.h"

namespace lathe::cli {

namespace {

// MemAvailable from /proc/meminfo in bytes (0 if unknown).
int64_t AvailableMemory() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  int64_t kb;
  while (f >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

}  // namespace

static Result<int64_t> ParseKvCacheMemory(const std::string& text) {
  if (text.empty()) return Status::Error("--kv-cache-memory is empty");
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  std::string suffix = end ? std::string(end) : "";
  if (end == text.c_str() || !(v > 0) || !std::isfinite(v)) {
    return Status::Error("--kv-cache-memory '" + text +
                         "': expected bytes (1073741824, 512M, 4G) or a fraction of free RAM (0.25)");
  }
  double mult = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    mult = 1024.0;
  else if (suffix == "M" || suffix == "MiB")
    mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (!suffix.empty()) {
    return Status::Error("--kv-cache-memory '" + text + "': unknown unit '" + suffix + "' (K, M or G)");
  }
  if (suffix.empty() && v <= 1.0) {
    int64_t avail = AvailableMemory();
    if (avail <= 0)
      return Status::Error("--kv-cache-memory as a fraction needs /proc/meminfo; give bytes instead");
    return (int64_t)(v * (double)avail);
  }
  return (int64_t)(v * mult);
}

namespace {

volatile sig_atomic_t g_stop_signal = 0;
void OnSignal(int sig) { g_stop_signal = sig; }

}  // namespace

int RunServe(int argc, char** argv) {
  Args args("serve", "lathe serve -m MODEL [--host 127.0.0.1] [--port 8000] [--lora name=DIR ...]");
  AddModelFlags(args);
  args.Flag("--host", "address to bind (loopback by default; 0.0.0.0 exposes the server)", "127.0.0.1");
  args.Flag("--port", "TCP port (0 = any free port)", "8000");
  args.Flag("--api-key", "require \"Authorization: Bearer KEY\" on the API routes");
  args.Flag("--served-model-name", "the base model's name in the API (default: the model file's name)");
  args.Flag("--kv-cache-memory",
            "KV cache size: bytes (e.g. 2G, 512M) or a fraction of free RAM (0.2); default: enough for "
            "max-num-seqs full contexts, at most max(1 GiB, 4 full contexts) and a quarter of free RAM");
  args.Flag("--block-size", "tokens per KV-cache block", "16");
  AddKvCacheDTypeFlag(args);
  AddInt8PromptFlag(args);
  args.Flag("--max-num-batched-tokens", "tokens per engine step (the batch's token budget)", "512");
  args.Flag("--max-prefill-tokens-with-decode",
            "prompt tokens in a step that also decodes (bounds the inter-token latency of running streams "
            "while new prompts arrive); 0 = up to max-num-batched-tokens",
            "64");
  args.Flag("--prefill-tokens-per-decode-row",
            "raise that cap to this many prompt tokens per decode row of the step (many streams' arrivals "
            "keep pace); 0 = the fixed cap; auto = 8 where the prompt rows run on AMX tiles (bf16 or "
            "block-quantized weights on a Xeon with amx_bf16), else 2",
            "auto");
  args.Flag("--max-num-seqs", "sequences running at once", "64");
  args.Flag("--max-model-len", "context length per request (prompt + completion); default min(model's, 4096)",
            "0");
  args.Bool("--no-prefix-caching", "compute every prompt in full (no reuse of cached prefix blocks)");
  args.Flag("--lora", "LoRA adapter to serve as NAME=DIR (PEFT directory); repeatable");
  args.Flag("--profile",
            "write a Chrome trace of every forward op to this file at shutdown and print the top ops "
            "(events accumulate while serving: for a bounded session)");
  args.Flag("--chat-template",
            "chat template overriding the model's: a name (chatml, llama3, llama2, mistral, mistral-v3, alpaca, deepseek-r1) or a "
            "jinja file (its format detected from its markers)");
  args.Flag("--reasoning-parser",
            "split a chat reply's reasoning into message.reasoning_content, as vLLM's parser of that name: qwen3 "
            "(<think>...</think>)");
  args.Bool("--structured-outputs-in-reasoning",
            "with --reasoning-parser: structured outputs and forced tool calls constrain the reasoning too (vLLM's "
            "structured_outputs_config.enable_in_reasoning); by default they start after it");
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return Fail("serve", st);
  if (args.help_requested()) {
    std::printf("%s", args.Help().c_str());
    return 0;
  }
  if (args.Has("reasoning-parser")) {
    const std::string err = server::CheckReasoningParser(args.Get("reasoning-parser"));
    if (!err.empty()) return Fail("serve", Status::Error("--reasoning-parser: " + err));
  } else if (args.On("structured-outputs-in-reasoning")) {
    return Fail("serve", Status::Error("--structured-outputs-in-reasoning: it applies with --reasoning-parser (which "
                                       "reasoning to constrain), which is not given"));
  }
  serve::EngineConfig ec;
  auto port = args.Int("port");
  auto bs = args.Int("block-size");
  auto mbt = args.Int("max-num-batched-tokens");
  auto mns = args.Int("max-num-seqs");
  auto mpd = args.Int("max-prefill-tokens-with-decode");
  auto mml = args.Int("max-model-len");
  if (!port.ok() || *port < 0 || *port > 65535)
    return Fail("serve", Status::Error("--port must be in 0..65535"));
  if (!bs.ok() || *bs < 1 || *bs > 1024)
    return Fail("serve", Status::Error("--block-size must be in 1..1024"));
  if (!mbt.ok() || *mbt < 1)
    return Fail("serve", Status::Error("--max-num-batched-tokens must be a positive integer"));
  if (!mns.ok() || *mns < 1) return Fail("serve", Status::Error("--max-num-seqs must be a positive integer"));
  if (!mpd.ok() || *mpd < 0)
    return Fail("serve", Status::Error("--max-prefill-tokens-with-decode must be a non-negative integer"));
  if (Status pst = CheckPrefillTokensPerDecodeRowFlag(args); !pst.ok()) return Fail("serve", pst);
  if (!mml.ok() || *mml < 0)
    return Fail("serve", Status::Error("--max-model-len must be a non-negative integer"));
  if (args.Has("adapter")) {
    return Fail("serve",
                Status::Error("--adapter is for generate/chat; serve adapters with --lora NAME=DIR"));
  }
  auto lm = LoadModelFromArgs(args);
  if (!lm.ok()) return Fail("serve", lm.status());
  const model::ModelConfig& mc = (*lm)->weights.config;
  ec.block_size = *bs;
  ec.max_num_batched_tokens = *mbt;
  ec.max_num_seqs = *mns;
  ec.max_prefill_tokens_with_decode = *mpd;
  auto ppr = PrefillTokensPerDecodeRowFromArgs(args, (*lm)->weights);
  if (!ppr.ok()) return Fail("serve", ppr.status());
  ec.prefill_tokens_per_decode_row = *ppr;
  ec.prefix_caching = !args.On("no-prefix-caching");
  ec.max_model_len = *mml > 0 ? *mml : std::min<int64_t>(mc.max_seq_len, 4096);
  if (ec.max_model_len < 2) return Fail("serve", Status::Error("--max-model-len must be at least 2"));
  auto kvt = KvCacheDTypeFromArgs(args, (*lm)->weights);
  if (!kvt.ok()) return Fail("serve", kvt.status());
  ec.kv_cache_dtype = *kvt;
  const size_t block_bytes = model::KvBlockStore::BlockBytes(mc, ec.block_size, ec.kv_cache_dtype);
  int64_t kv_bytes;
  if (args.Has("kv-cache-memory")) {
    auto b = ParseKvCacheMemory(args.Get("kv-cache-memory"));
    if (!b.ok()) return Fail("serve", b.status());
    kv_bytes = *b;
  } else {
    int64_t full =
        ec.max_num_seqs * ((ec.max_model_len + ec.block_size - 1) / ec.block_size + 1) * (int64_t)block_bytes;
    int64_t avail = AvailableMemory();
    // At most 1 GiB (or 4 full contexts) by default: the store is committed at start (in 2 MiB pages).
    const int64_t four_requests =
        4 * ((ec.max_model_len + ec.block_size - 1) / ec.block_size) * (int64_t)block_bytes;
    kv_bytes = std::min<int64_t>(full, std::max<int64_t>(int64_t{1} << 30, four_requests));
    if (avail > 0) kv_bytes = std::min(kv_bytes, avail / 4);
  }
  ec.n_blocks = kv_bytes / (int64_t)block_bytes;
  const int64_t per_request = (ec.max_model_len + ec.block_size - 1) / ec.block_size;
  if (ec.n_blocks < per_request) {
    return Fail(
        "serve",
        Status::Error(StrFormat(
            "--kv-cache-memory: %lld bytes hold %lld blocks of %zu bytes, but one full-context "
            "request (--max-model-len %lld) needs %lld; give more memory or a smaller --max-model-len",
            (long long)kv_bytes, (long long)ec.n_blocks, block_bytes, (long long)ec.max_model_len,
            (long long)per_request)));
  }
  // Adapters.
  std::vector<std::unique_ptr<model::LoraAdapter>> adapters;
  server::ServerOptions so;
  for (const std::string& spec : args.All("lora")) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
      return Fail("serve", Status::Error("--lora '" + spec + "': expected NAME=DIR"));
    }
    std::string name = spec.substr(0, eq);
    for (const auto& a : so.adapters) {
      if (a.first == name)
        return Fail("serve", Status::Error("--lora: the name '" + name + "' is given twice"));
    }
    auto a = model::LoadPeftAdapter(spec.substr(eq + 1), mc);
    if (!a.ok()) return Fail("serve", Status::Error("--lora " + name + ": " + a.status().message()));
    adapters.push_back(std::move(*a));
    so.adapters.push_back({name, adapters.back().get()});
  }
  const tokenizer::Tokenizer& tok = *(*lm)->tokenizer;
  tokenizer::ChatTemplate tmpl = tokenizer::ChatTemplate::Detect(tok.chat_template());
  if (args.Has("chat-template")) {
    auto t = tokenizer::ChatTemplate::FromFlag("--chat-template", args.Get("chat-template"));
    if (!t.ok()) return Fail("serve", t.status());
    tmpl = *t;
  }
  so.host = args.Get("host");
  so.port = (int)*port;
  so.api_key = args.Get("api-key");
  so.reasoning_parser = args.Get("reasoning-parser");
  so.structured_outputs_in_reasoning = args.On("structured-outputs-in-reasoning");
  if (args.Has("served-model-name")) {
    so.model_name = args.Get("served-model-name");
  } else {
    std::string p = (*lm)->path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    so.model_name = p.substr(p.find_last_of('/') + 1);
  }
  for (const auto& a : so.adapters) {
    if (a.first == so.model_name)
      return Fail("serve", Status::Error("--lora: '" + a.first + "' is the base model's name"));
  }

  // A client that vanishes mid-write must not kill the server.
  signal(SIGPIPE, SIG_IGN);
  ThreadPool pool(ThreadsFromArgs(args));
  Profiler profiler;
  model::TransformerOptions topts;
  topts.int8_prompt_rows = args.On("int8-prompt");
  const bool profile = args.Has("profile");
  if (profile) {
    if (args.Get("profile").empty()) return Fail("serve", Status::Error("--profile: expected an output FILE"));
    topts.profiler = &profiler;
    pool.SetProfiler(&profiler);
  }
  serve::Engine engine((*lm)->weights, pool, ec, topts);
  engine.Start();
  server::HttpServer http(engine, tok, tmpl, so);
  // Signals: a watcher thread stops the HTTP server (Run returns), then the engine stops.
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done.load()) {
      if (g_stop_signal) {
        std::fprintf(stderr, "lathe serve: signal %d, shutting down\n", (int)g_stop_signal);
        http.Stop();
        return;
      }
      usleep(50 * 1000);
    }
  });
  // Prints the address once the server listens, however long that takes on a loaded machine (a
  // fixed number of tries left a slow start silent: scripts wait for this line).
  std::thread announcer([&] {
    while (!done.load()) {
      if (http.listening()) {
        std::printf(
            "lathe serve: %s (%lld KV blocks x %lld tokens = %.1f MiB, context %lld, %zu adapter(s)) on "
            "http://%s:%d/v1\n",
            so.model_name.c_str(), (long long)ec.n_blocks, (long long)ec.block_size,
            (double)ec.n_blocks * block_bytes / (1 << 20), (long long)ec.max_model_len, so.adapters.size(),
            so.host.c_str(), http.port());
        std::fflush(stdout);
        return;
      }
      usleep(20 * 1000);
    }
  });
  Status run = http.Run();
  done = true;
  announcer.join();
  watcher.join();
  engine.Stop();
  if (profile) {
    pool.SetProfiler(nullptr);
    Status ps = profiler.WriteChromeTrace(args.Get("profile"));
    if (!ps.ok()) return Fail("serve", ps);
    std::fprintf(stderr, "profile: %s (open in Perfetto or chrome://tracing)\n%s", args.Get("profile").c_str(),
                 profiler.Summary().c_str());
  }
  if (!run.ok()) return Fail("serve", run);
  return 0;
}

}  // namespace lathe::cli
