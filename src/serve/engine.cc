// Engine: scheduling, batched forward, sampling.
#include "serve/engine.h"

#include <algorithm>

#include "core/check.h"

namespace lathe::serve {

Engine::Engine(const model::ModelWeights& weights, ThreadPool& pool, EngineConfig config,
               model::TransformerOptions options)
    : config_(config),
      pool_(pool),
      tf_(weights, pool, options),
      blocks_(config.n_blocks, config.block_size),
      store_(weights.config, config.n_blocks, config.block_size, config.kv_cache_dtype, /*populate=*/true),
      kv_(blocks_, store_) {
  snapshot_.blocks_total = config.n_blocks;
}

Engine::~Engine() { Stop(); }

Result<int64_t> Engine::AddRequest(std::vector<int32_t> prompt, const RequestOptions& options, Callback callback) {
  if (prompt.empty()) return Status::Error("empty prompt");
  if (options.max_tokens < 0) {
    return Status::Error(StrFormat("max_tokens must be >= 0, got %lld", (long long)options.max_tokens));
  }
  const int64_t vocab = tf_.config().vocab_size;
  for (int32_t t : prompt) {
    if (t < 0 || t >= vocab) return Status::Error(StrFormat("token id %d out of range (vocab %lld)", t, (long long)vocab));
  }
  if ((int64_t)prompt.size() + std::max<int64_t>(options.max_tokens, 1) > config_.max_model_len) {
    return Status::Error(StrFormat("prompt (%zu tokens) + max_tokens (%lld) exceeds the context length %lld",
                                   prompt.size(), (long long)options.max_tokens, (long long)config_.max_model_len));
  }
  int64_t blocks_needed = ((int64_t)prompt.size() + options.max_tokens + config_.block_size - 1) / config_.block_size;
  if (blocks_needed > config_.n_blocks) {
    return Status::Error(StrFormat("the request needs %lld KV blocks but the cache has %lld", (long long)blocks_needed,
                                   (long long)config_.n_blocks));
  }
  if ((options.adapter != nullptr) != (options.adapter_key != 0)) {
    return Status::Error("RequestOptions: adapter and adapter_key must be set together");
  }
  LATHE_RETURN_IF_ERROR(options.sampling.Validate());
  auto r = std::make_unique<Request>();
  r->tokens = std::move(prompt);
  r->prompt_len = (int64_t)r->tokens.size();
  r->options = options;
  r->sampler = std::make_unique<Sampler>(options.sampling);
  r->sampler->AddPrompt(r->tokens);
  r->callback = std::move(callback);
  int64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = r->id = next_id_++;
    inbox_.push_back(std::move(r));
  }
  cv_.notify_one();
  return id;
}

void Engine::Abort(int64_t id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborts_.push_back(id);
  }
  cv_.notify_one();
}

void Engine::DrainInbox() {
  std::vector<std::unique_ptr<Request>> in;
  std::vector<int64_t> ab;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in.swap(inbox_);
    ab.swap(aborts_);
  }
  for (auto& r : in) {
    int64_t id = r->id;
    requests_[id] = std::move(r);
    waiting_.push_back(id);
  }
  for (int64_t id : ab) {
    auto it = requests_.find(id);
    if (it != requests_.end()) Finish(*it->second, "abort", -1, {});
  }
}

void Engine::Finish(Request& r, const std::string& reason, int32_t token, std::vector<TokenLogprob> logprobs) {
  if (r.has_blocks) kv_.Free(r.id);
  running_.erase(std::remove(running_.begin(), running_.end(), r.id), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r.id), waiting_.end());
  TokenEvent ev;
  ev.request_id = r.id;
  ev.token = token;
  ev.logprobs = std::move(logprobs);
  ev.prompt_logprobs = std::move(r.prompt_lps);
  ev.finished = true;
  ev.finish_reason = reason;
  Callback cb = std::move(r.callback);
  requests_.erase(r.id);  // r is gone after this
  if (cb) cb(ev);
}

void Engine::Preempt(int64_t id) {
  Request& r = *requests_.at(id);
  kv_.Free(id);
  r.has_blocks = false;
  r.computed = 0;
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  waiting_.push_front(id);
  ++preemptions_;
}

bool Engine::Step() {
  DrainInbox();
  bool busy = !running_.empty() || !waiting_.empty();
  if (busy) {
    Status st = RunStep();
    LATHE_CHECK_MSG(st.ok(), "engine step failed: %s", st.message().c_str());
  }
  PublishStats();
  return busy;
}

void Engine::PublishStats() {
  EngineStats s;
  s.running = (int64_t)running_.size();
  s.waiting = (int64_t)waiting_.size();
  s.blocks_used = blocks_.num_used();
  s.blocks_total = blocks_.n_blocks();
  s.prefix_queries = blocks_.queries();
  s.prefix_hits = blocks_.hits();
  s.preemptions = preemptions_;
  for (int64_t id : running_) s.tokens_stored += requests_.at(id)->computed;
  s.prompt_tokens_computed = prompt_computed_;
  s.generated_tokens = generated_;
  s.steps = steps_;
  s.last_step_decode_rows = last_decode_rows_;
  s.last_step_prefill_tokens = last_prefill_tokens_;
  std::lock_guard<std::mutex> lock(mu_);
  snapshot_ = s;
}

Status Engine::RunStep() {
  struct Work {
    int64_t id;
    int64_t n;     // new tokens this step
    bool prefill;  // prompt chunk (or recomputation), not a decode row
  };
  std::vector<Work> work;
  int64_t budget = config_.max_num_batched_tokens;
  int64_t prefill_left = budget;  // set once the decode rows are placed
  // Reserves blocks for n more tokens of running request `id`; while they run out, preempts the
  // newest running sequence (returning any work it had this step). False if `id` itself went.
  auto place = [&](int64_t id, int64_t n) {
    Request& r = *requests_.at(id);
    while (!kv_.Reserve(id, r.computed + n)) {
      const int64_t victim = running_.back();
      Preempt(victim);
      for (auto w = work.begin(); w != work.end(); ++w) {
        if (w->id != victim) continue;
        budget += w->n;
        if (w->prefill) prefill_left += w->n;
        work.erase(w);
        break;
      }
      if (victim == id) return false;
    }
    return true;
  };
  // 1. Decode rows of running sequences, oldest first: never displaced by prompt work.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    const int64_t id = running_[i];
    if (!requests_.at(id)->Decoding()) {
      ++i;
      continue;
    }
    if (!place(id, 1)) continue;  // preempted itself; running_ shrank, i stays
    work.push_back({id, 1, false});
    budget -= 1;
    ++i;
  }
  // 2. Prompt tokens: the rest of the budget, capped while this step also decodes (the cap grows
  // with the decode rows: prefill_tokens_per_decode_row).
  const int64_t decode_rows = (int64_t)work.size();
  const int64_t cap =
      std::max(config_.max_prefill_tokens_with_decode,
               config_.max_prefill_tokens_with_decode > 0 ? config_.prefill_tokens_per_decode_row * decode_rows : 0);
  prefill_left = decode_rows > 0 && cap > 0 ? std::min(budget, cap) : budget;
  // Running sequences' next chunks (partial prefills, recomputation after a preemption), oldest first.
  for (size_t i = 0; i < running_.size() && prefill_left > 0;) {
    const int64_t id = running_[i];
    Request& r = *requests_.at(id);
    if (r.Decoding()) {
      ++i;
      continue;
    }
    const int64_t n = std::min<int64_t>((int64_t)r.tokens.size() - r.computed, prefill_left);
    if (!place(id, n)) continue;
    work.push_back({id, n, true});
    budget -= n;
    prefill_left -= n;
    ++i;
  }
  // Then waiting requests by (priority, arrival), while prompt tokens and sequence slots last.
  std::stable_sort(waiting_.begin(), waiting_.end(), [&](int64_t a, int64_t b) {
    return requests_.at(a)->options.priority < requests_.at(b)->options.priority;
  });
  while (!waiting_.empty() && prefill_left > 0 && (int64_t)running_.size() < config_.max_num_seqs) {
    int64_t id = waiting_.front();
    Request& r = *requests_.at(id);
    // A private cache key (no hits from other requests) when prefix caching is off or the
    // request still needs logits of prompt rows that a cache hit would skip.
    const bool shared_key = config_.prefix_caching && !r.WantsPromptLogprobs();
    // Blocks for this step's chunk only; later chunks reserve theirs as they run (step 2 above).
    auto computed = kv_.Allocate(id, r.tokens, shared_key ? r.options.adapter_key : (1ull << 63) | (uint64_t)id,
                                 prefill_left);
    if (!computed.ok()) break;  // no room now; it waits
    // Hits of its own private blocks only cover rows whose prompt logprobs were already taken.
    LATHE_CHECK(!r.WantsPromptLogprobs() || *computed < r.prompt_lp_next);
    r.has_blocks = true;
    r.computed = *computed;
    waiting_.pop_front();
    running_.push_back(id);
    int64_t n = std::min<int64_t>((int64_t)r.tokens.size() - r.computed, prefill_left);
    work.push_back({id, n, true});
    budget -= n;
    prefill_left -= n;
  }
  last_decode_rows_ = last_prefill_tokens_ = 0;
  for (const Work& w : work) (w.prefill ? last_prefill_tokens_ : last_decode_rows_) += w.n;
  if (work.empty()) return Status::Ok();

  std::vector<model::PagedSeqInput> batch;
  std::vector<int64_t> out_row(work.size());  // each work item's first logits row
  batch.reserve(work.size());
  int64_t n_out = 0;
  for (size_t i = 0; i < work.size(); ++i) {
    const Work& w = work[i];
    Request& r = *requests_.at(w.id);
    // Prompt tokens (also when recomputed after a preemption) with f32 activations, sampled ones int8.
    const int64_t sampled = w.n - std::clamp<int64_t>(r.prompt_len - r.computed, 0, w.n);
    const bool all_logits = r.WantsPromptLogprobs();
    out_row[i] = n_out;
    n_out += all_logits ? w.n : 1;
    batch.push_back({std::span<const int32_t>(r.tokens).subspan(r.computed, w.n), r.computed, kv_.BlockTable(w.id),
                     all_logits, r.options.adapter, sampled});
  }
  LATHE_RETURN_IF_ERROR(tf_.ForwardPaged(store_, batch, &logits_));
  ++steps_;
  const int64_t V = tf_.config().vocab_size;
  // Prompt logprobs and progress first; then the requests whose prompt is done draw their next token, side by
  // side on the pool (each request's sampler and logits row are its own, so the draws do not depend on the
  // threads: a draw over the whole vocabulary costs 0.2-0.6 ms, 32 of them a noticeable share of a decode
  // step); then, in order, each drawn token is appended, finished or streamed.
  std::vector<Request*> draw(work.size(), nullptr);
  for (size_t i = 0; i < work.size(); ++i) {
    const Work& w = work[i];
    Request& r = *requests_.at(w.id);
    if (batch[i].all_logits) {
      // Row j (position computed + j) predicts the token at the next position.
      for (int64_t j = 0; j < w.n; ++j) {
        const int64_t target = r.computed + j + 1;
        if (target < r.prompt_lp_next || target >= r.prompt_len) continue;
        r.prompt_lps.emplace_back();
        ComputeLogprobs(&logits_[(out_row[i] + j) * V], V, r.tokens[target], r.options.prompt_logprobs,
                        &r.prompt_lps.back());
        r.prompt_lp_next = target + 1;
      }
    }
    r.computed += w.n;
    if (r.computed <= r.prompt_len) prompt_computed_ += w.n;
    kv_.MarkComputed(w.id, r.tokens, r.computed);
    if (r.computed < (int64_t)r.tokens.size()) continue;  // still prefilling
    if (r.options.max_tokens == 0) {
      Finish(r, "length", -1, {});  // the prompt only
      continue;
    }
    draw[i] = &r;
  }
  std::vector<int32_t> drawn(work.size(), -1);
  std::vector<std::vector<TokenLogprob>> drawn_lps(work.size());
  pool_.ParallelFor((int64_t)work.size(), 1, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      Request* r = draw[i];
      if (!r) continue;
      float* row = &logits_[(out_row[i] + (batch[i].all_logits ? work[i].n - 1 : 0)) * V];
      drawn[i] = r->sampler->Sample(row, V, std::max(0, r->options.top_logprobs),
                                    r->options.top_logprobs >= 0 ? &drawn_lps[i] : nullptr);
    }
  });
  for (size_t i = 0; i < work.size(); ++i) {
    if (!draw[i]) continue;
    Request& r = *draw[i];
    std::vector<TokenLogprob> lp = std::move(drawn_lps[i]);
    const int32_t tok = drawn[i];
    r.tokens.push_back(tok);
    ++r.generated;
    ++generated_;
    const auto& stops = r.options.stop_ids;
    // A grammar that the text now completes, with nothing allowed after it: the text is done. Its last token
    // is text, so it is reported as a token, then the request finishes with "stop" and no token.
    const bool grammar_done = r.sampler->GrammarFinished();
    if (std::find(stops.begin(), stops.end(), tok) != stops.end()) {
      Finish(r, "stop", tok, std::move(lp));
    } else if (!grammar_done &&
               (r.generated >= r.options.max_tokens || (int64_t)r.tokens.size() >= config_.max_model_len)) {
      Finish(r, "length", tok, std::move(lp));
    } else {
      if (r.callback) {
        TokenEvent ev;
        ev.request_id = r.id;
        ev.token = tok;
        ev.logprobs = std::move(lp);
        ev.prompt_logprobs = std::move(r.prompt_lps);
        r.prompt_lps.clear();
        r.callback(ev);
      }
      if (grammar_done) Finish(r, "stop", -1, {});
    }
  }
  return Status::Ok();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

void Engine::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !inbox_.empty() || !aborts_.empty() || !running_.empty() || !waiting_.empty(); });
        if (stop_) return;
      }
      Step();
    }
  });
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace lathe::serve
