// Engine: continuous batching over the paged KV cache. Each Step() schedules within a token
// budget — decode rows of running sequences first (one token each), then prompt chunks: running
// sequences' next chunks, then waiting requests by (priority, arrival), capped while the step
// also decodes so a big prompt cannot stall every stream (Sarathi-Serve's stall-free batching) —
// runs ONE batched forward over the mixed prefill and decode work, samples for every sequence
// that caught up, and reports tokens through each request's callback. When blocks run out, the
// newest running sequence is preempted: its blocks are freed and it is requeued first, to be
// recomputed (prefix-cache hits make that cheap).
// Threading: AddRequest/Abort may be called from any thread; Step() and the callbacks run on one
// engine thread (Start() makes one, or tests call Step() directly).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "model/transformer.h"
#include "serve/block_pool.h"
#include "serve/kv_cache_manager.h"
#include "serve/sampler.h"

namespace lathe::serve {

struct EngineConfig {
  int64_t n_blocks = 256;
  int64_t block_size = 16;
  int64_t max_num_batched_tokens = 512;  // tokens per forward (the step's budget)
  int64_t max_num_seqs = 64;             // running sequences at once
  int64_t max_model_len = 2048;          // prompt + generated, per request
  bool prefix_caching = true;            // off: every request computes its whole prompt (benchmarks)
  // Prompt tokens (prefill chunks, recomputation) in a step that also carries decode rows; a step
  // without decode rows takes up to max_num_batched_tokens of them. The step's time, and so every
  // running stream's inter-token latency, is ~ decode rows + these tokens (bench/RESULTS.md,
  // "Serving", prefill cap). <= 0: no cap beyond max_num_batched_tokens (the old behaviour).
  int64_t max_prefill_tokens_with_decode = 64;
  // ... but at least this many prompt tokens per decode row of the step, so that with many streams
  // the arrivals' prompts keep pace (a workload's requests need about prompt/output tokens of
  // prompt per generated token; 64 streams of bench serve's workload need ~93 per step). 0: the
  // fixed cap alone.
  int64_t prefill_tokens_per_decode_row = 2;
  // The KV cache's element type (f32, f16, bf16: model::KvBlockStore); n_blocks of it.
  DType kv_cache_dtype = DType::kF32;
};

struct RequestOptions {
  SamplingParams sampling;
  int64_t max_tokens = 16;
  std::vector<int32_t> stop_ids;  // end the request (the stop token is reported)
  int priority = 0;               // lower runs first; FCFS within a priority
  int top_logprobs = -1;          // >= 0: report the sampled token's logprob and this many alternatives
  // >= 0: also report the logprob of every prompt token after the first (the model's raw
  // distribution at the position before it) and this many alternatives — OpenAI completions'
  // echo + logprobs, what lm-eval's loglikelihood requests read. Such a request computes its whole
  // prompt itself (no prefix-cache hits: cached blocks have no logits).
  int prompt_logprobs = -1;
  // LoRA adapter for this request (multi-LoRA serving): its rows get the adapter's deltas in the
  // shared batched forward. Not owned; must outlive the request. adapter_key must be nonzero and
  // distinct per adapter: it keys the prefix cache, so adapters never share K/V blocks.
  const model::LoraAdapter* adapter = nullptr;
  uint64_t adapter_key = 0;
};

struct TokenEvent {
  int64_t request_id = 0;
  int32_t token = -1;                  // -1 for an abort, or max_tokens = 0: no token
  std::vector<TokenLogprob> logprobs;  // when requested: [sampled, top...]
  // With RequestOptions::prompt_logprobs, the request's first event carries prompt positions
  // 1 .. prompt_len - 1, each [that prompt token, top...]. Empty otherwise.
  std::vector<std::vector<TokenLogprob>> prompt_logprobs;
  bool finished = false;
  std::string finish_reason;           // "stop" | "length" | "abort"
};

struct EngineStats {
  int64_t running = 0, waiting = 0;
  int64_t blocks_used = 0, blocks_total = 0;
  int64_t prefix_queries = 0, prefix_hits = 0;
  int64_t preemptions = 0;
  int64_t tokens_stored = 0;  // tokens whose K/V live in blocks of running sequences
  int64_t prompt_tokens_computed = 0, generated_tokens = 0, steps = 0;
  // The last step's composition: decode rows (one sampled token each) and prompt tokens.
  int64_t last_step_decode_rows = 0, last_step_prefill_tokens = 0;
};

class Engine {
 public:
  using Callback = std::function<void(const TokenEvent&)>;
  Engine(const model::ModelWeights& weights, ThreadPool& pool, EngineConfig config,
         model::TransformerOptions options = {});
  ~Engine();

  // Queues a request; returns its id, or an error for an empty/too long prompt or bad options.
  // max_tokens = 0 computes the prompt only (for prompt_logprobs) and finishes with "length".
  Result<int64_t> AddRequest(std::vector<int32_t> prompt, const RequestOptions& options, Callback callback);
  // Cancels a request: its blocks are freed at the next step boundary and its callback gets a
  // final "abort" event. Unknown or finished ids are ignored.
  void Abort(int64_t id);
  // One scheduling step on the calling thread. Returns false when there was nothing to do.
  bool Step();
  // Runs Step() on a background thread until Stop().
  void Start();
  void Stop();
  EngineStats stats() const;
  const EngineConfig& config() const { return config_; }

 private:
  struct Request {
    int64_t id = 0;
    std::vector<int32_t> tokens;  // prompt + generated
    int64_t prompt_len = 0;
    int64_t computed = 0;         // tokens whose K/V are in the cache
    int64_t generated = 0;
    RequestOptions options;
    std::unique_ptr<Sampler> sampler;
    Callback callback;
    bool has_blocks = false;
    int64_t prompt_lp_next = 1;  // next prompt position whose logprob is due (prompt_logprobs)
    std::vector<std::vector<TokenLogprob>> prompt_lps;  // computed, not yet delivered
    bool WantsPromptLogprobs() const { return options.prompt_logprobs >= 0 && prompt_lp_next < prompt_len; }
    // Its prompt (and any recomputation) is in the cache: one new token, the last sampled one.
    bool Decoding() const { return computed >= prompt_len && (int64_t)tokens.size() - computed == 1; }
  };
  void DrainInbox();
  void Finish(Request& r, const std::string& reason, int32_t token, std::vector<TokenLogprob> logprobs);
  void Preempt(int64_t id);
  Status RunStep();
  void PublishStats();

  EngineConfig config_;
  ThreadPool& pool_;  // the forward's; the step's token draws run on it too
  model::Transformer tf_;
  BlockPool blocks_;
  model::KvBlockStore store_;
  KvCacheManager kv_;
  std::map<int64_t, std::unique_ptr<Request>> requests_;  // live requests
  std::vector<int64_t> running_;                          // admission order
  std::deque<int64_t> waiting_;
  int64_t preemptions_ = 0, prompt_computed_ = 0, generated_ = 0, steps_ = 0;
  int64_t last_decode_rows_ = 0, last_prefill_tokens_ = 0;

  mutable std::mutex mu_;  // guards the inbox, the stats snapshot and next_id_
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Request>> inbox_;
  std::vector<int64_t> aborts_;
  int64_t next_id_ = 1;
  EngineStats snapshot_;
  std::thread thread_;
  bool stop_ = false;
  std::vector<float> logits_;
};

}  // namespace lathe::serve
