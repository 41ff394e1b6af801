// HttpServer: request handling, streaming, metrics.
#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>

#include "monitor/metrics.h"
#include "serve/generate.h"
#include "serve/grammar.h"
#include "server/openai_api.h"

namespace lathe::server {

using nlohmann::json;

namespace {

constexpr int kListenBacklog = 1024;  // pending connections the kernel queues before accept

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One generation (n choices) in flight: engine events arrive on the engine thread and are
// consumed by the HTTP thread.
struct Job {
  struct Ev {
    int choice;
    serve::TokenEvent e;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Ev> events;
  std::vector<int64_t> ids;  // engine request id per choice
  void Push(int choice, const serve::TokenEvent& e) {
    {
      std::lock_guard<std::mutex> l(mu);
      events.push_back({choice, e});
    }
    cv.notify_all();
  }
  bool Pop(Ev* out, double timeout_s) {
    std::unique_lock<std::mutex> l(mu);
    if (!cv.wait_for(l, std::chrono::duration<double>(timeout_s), [&] { return !events.empty(); }))
      return false;
    *out = std::move(events.front());
    events.pop_front();
    return true;
  }
};

// Per-choice text assembly: detokenize, apply stop strings, collect logprobs.
struct ChoiceState {
  std::unique_ptr<tokenizer::StreamDecoder> dec;
  std::unique_ptr<serve::StopStringMatcher> stops;
  bool done = false;
  int64_t tokens = 0;
  std::string echo;  // completions with echo: the prompt text, sent before the first token's text
  Choice choice;
  std::string raw;   // tool calling: the generated text (choice.text is the content)
  std::unique_ptr<ToolCallReader> reader;  // tool_choice "auto" or "required"
  JsonMinifier minifier;                   // a named function's arguments
  std::unique_ptr<ReasoningReader> reasoning;  // chat with --reasoning-parser
};

}  // namespace

struct HttpServer::Impl {
  serve::Engine& engine;
  const tokenizer::Tokenizer& tok;
  tokenizer::ChatTemplate tmpl;
  ServerOptions opt;
  std::atomic<int> bound_port{0};
  std::atomic<int> listen_fd{-1};  // the listening socket, recorded by the socket-options hook
  httplib::Server http;
  std::atomic<int64_t> next_id{1};
  monitor::Registry metrics;
  monitor::Counter* requests_ok;
  monitor::Counter* requests_err;
  monitor::Counter* prompt_tokens;
  monitor::Counter* gen_tokens;
  monitor::Histogram* ttft;
  monitor::Histogram* itl;
  monitor::Gauge* in_flight;
  monitor::Counter* preemptions;
  monitor::Counter* cancelled;
  monitor::Counter* prefix_queries;
  monitor::Counter* prefix_hits;
  monitor::Counter* structured;
  monitor::Counter* mask_walks;
  monitor::Counter* mask_hits;
  std::mutex render_mu;  // /metrics turns engine totals into counter increments
  // Structured outputs: the vocabulary as grammars see it (built at the first such request), and the
  // grammars compiled so far by their GBNF text, so requests with one schema share its mask cache.
  std::mutex grammar_mu;
  std::shared_ptr<const serve::GrammarVocab> grammar_vocab;
  std::map<std::string, std::shared_ptr<const serve::CompiledGrammar>> grammars;
  std::deque<std::string> grammar_order;  // oldest first; at most kMaxGrammars kept
  static constexpr size_t kMaxGrammars = 64;
  size_t evicted_walks = 0, evicted_hits = 0;  // mask counts of the caches of grammars dropped from `grammars`

  Result<std::shared_ptr<const serve::CompiledGrammar>> CompileGrammar(const std::string& gbnf) {
    std::lock_guard<std::mutex> lock(grammar_mu);
    if (auto it = grammars.find(gbnf); it != grammars.end()) return it->second;
    auto g = serve::Grammar::Parse(gbnf);
    if (!g.ok()) return g.status();
    if (!grammar_vocab) grammar_vocab = serve::GrammarVocab::FromTokenizer(tok);
    auto c = std::make_shared<const serve::CompiledGrammar>(serve::CompiledGrammar{g.value(), grammar_vocab});
    if (grammars.size() >= kMaxGrammars) {
      const auto& old = grammars.at(grammar_order.front())->cache;
      evicted_walks += old->misses();
      evicted_hits += old->hits();
      grammars.erase(grammar_order.front());
      grammar_order.pop_front();
    }
    grammars.emplace(gbnf, c);
    grammar_order.push_back(gbnf);
    return c;
  }

  Impl(serve::Engine& e, const tokenizer::Tokenizer& t, tokenizer::ChatTemplate tm, ServerOptions o)
      : engine(e), tok(t), tmpl(std::move(tm)), opt(std::move(o)) {
    const std::vector<double> lat = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    requests_ok =
        metrics.GetCounter("lathe_requests_total", "Completed requests.", monitor::LabelPair("status", "ok"));
    requests_err = metrics.GetCounter("lathe_requests_total", "Completed requests.",
                                      monitor::LabelPair("status", "error"));
    prompt_tokens = metrics.GetCounter("lathe_prompt_tokens_total", "Prompt tokens received.");
    gen_tokens = metrics.GetCounter("lathe_generation_tokens_total",
                                    "Tokens generated by the engine (incl. cancelled requests').");
    cancelled = metrics.GetCounter("lathe_requests_cancelled_total",
                                   "Streams whose client went away before the end.");
    ttft = metrics.GetHistogram("lathe_time_to_first_token_seconds", "Time to first token.", lat);
    itl = metrics.GetHistogram("lathe_inter_token_latency_seconds", "Time between output tokens.", lat);
    in_flight =
        metrics.GetGauge("lathe_http_requests_in_flight", "Completion requests in flight in the HTTP layer.");
    preemptions = metrics.GetCounter("lathe_preemptions_total",
                                     "Sequences preempted (blocks freed, recomputed later).");
    prefix_queries = metrics.GetCounter("lathe_prefix_cache_queries_total",
                                        "Full prompt blocks looked up in the prefix cache.");
    prefix_hits =
        metrics.GetCounter("lathe_prefix_cache_hits_total", "Prompt blocks found in the prefix cache.");
    structured = metrics.GetCounter("lathe_structured_requests_total",
                                    "Requests whose output a grammar constrains (JSON schema, JSON mode, choices, "
                                    "GBNF, forced tool calls).");
    mask_walks = metrics.GetCounter("lathe_grammar_mask_walks_total",
                                    "Token masks computed by walking the vocabulary (structured outputs).");
    mask_hits = metrics.GetCounter("lathe_grammar_mask_cache_hits_total",
                                   "Token masks found in a grammar's mask cache (structured outputs).");
  }

  // The adapter a request's "model" names: {nullptr, 0} for the base model; false if unknown.
  bool ResolveModel(const std::string& name, const model::LoraAdapter** adapter, uint64_t* key) const {
    *adapter = nullptr;
    *key = 0;
    if (name.empty() || name == opt.model_name) return true;
    for (size_t i = 0; i < opt.adapters.size(); ++i) {
      if (opt.adapters[i].first == name) {
        *adapter = opt.adapters[i].second;
        *key = i + 1;
        return true;
      }
    }
    return false;
  }

  std::string ModelNames() const {
    std::string names = "'" + opt.model_name + "'";
    for (const auto& a : opt.adapters) names += ", '" + a.first + "'";
    return names;
  }

  void Error(httplib::Response& res, const ApiError& e) {
    res.status = e.http_status;
    res.set_content(e.ToJson().dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    requests_err->Inc();
  }

  bool Authorized(const httplib::Request& req, httplib::Response& res) {
    if (opt.api_key.empty()) return true;
    if (req.get_header_value("Authorization") == "Bearer " + opt.api_key) return true;
    ApiError e;
    e.http_status = 401;
    e.type = "authentication_error";
    e.message = "missing or invalid API key (send Authorization: Bearer <key>)";
    Error(res, e);
    return false;
  }

  std::string RenderMetrics() {
    std::lock_guard<std::mutex> lock(render_mu);
    serve::EngineStats s = engine.stats();
    preemptions->Inc((double)s.preemptions - preemptions->value());
    gen_tokens->Inc((double)s.generated_tokens - gen_tokens->value());
    prefix_queries->Inc((double)s.prefix_queries - prefix_queries->value());
    prefix_hits->Inc((double)s.prefix_hits - prefix_hits->value());
    {
      std::lock_guard<std::mutex> glock(grammar_mu);
      size_t walks = evicted_walks, hits = evicted_hits;
      for (const auto& [text, g] : grammars) {
        walks += g->cache->misses();
        hits += g->cache->hits();
      }
      mask_walks->Inc((double)walks - mask_walks->value());
      mask_hits->Inc((double)hits - mask_hits->value());
    }
    metrics.GetGauge("lathe_kv_tokens_stored", "Tokens whose K/V are held by running sequences.")
        ->Set((double)s.tokens_stored);
    metrics.GetGauge("lathe_kv_tokens_capacity", "Tokens the KV cache can hold.")
        ->Set((double)s.blocks_total * engine.config().block_size);
    metrics.GetGauge("lathe_num_requests_running", "Sequences running in the engine.")
        ->Set((double)s.running);
    metrics.GetGauge("lathe_num_requests_waiting", "Requests waiting in the engine.")->Set((double)s.waiting);
    metrics.GetGauge("lathe_kv_blocks_used", "KV-cache blocks in use.")->Set((double)s.blocks_used);
    metrics.GetGauge("lathe_kv_blocks_total", "KV-cache blocks.")->Set((double)s.blocks_total);
    metrics.GetGauge("lathe_prefix_cache_hit_rate", "Prefix-cache block hits / lookups.")
        ->Set(s.prefix_queries ? (double)s.prefix_hits / s.prefix_queries : 0.0);
    return metrics.Render();
  }

  // Runs one completion request; writes a JSON response or streams SSE.
  void Complete(const httplib::Request& req, httplib::Response& res, bool chat) {
    const double t0 = Now();
    if (!Authorized(req, res)) return;
    json body;
    try {
      body = json::parse(req.body);
    } catch (const json::exception& e) {
      ApiError err;
      err.message = std::string("the body is not valid JSON: ") + e.what();
      return Error(res, err);
    }
    CompletionRequest r;
    std::optional<ApiError> perr;
    try {
      // A JSON schema's properties (a tool's parameters too) are generated in the order the request lists them.
      std::optional<nlohmann::ordered_json> ordered;
      if (NeedsKeyOrder(body)) ordered = nlohmann::ordered_json::parse(req.body);
      perr = ParseCompletionRequest(body, chat, &r, ordered ? &*ordered : nullptr, ToolFormatFor(tmpl));
      if (!perr && !r.grammar.empty()) {
        auto g = CompileGrammar(r.grammar);
        if (!g.ok()) {
          perr = ApiError();
          perr->param = r.grammar_param;
          perr->message = g.status().message();
        } else {
          r.sampling.grammar = g.value();
          structured->Inc();
        }
      }
      if (!perr) perr = ResolveTriggerToken(tok, &r);
    } catch (const std::exception& ex) {  // a parser gap must still be a 400, never a crash
      perr = ApiError();
      perr->message = std::string("malformed request: ") + ex.what();
    }
    if (perr) return Error(res, *perr);
    const model::LoraAdapter* adapter = nullptr;
    uint64_t adapter_key = 0;
    if (!ResolveModel(r.model, &adapter, &adapter_key)) {
      ApiError e;
      e.http_status = 404;
      e.param = "model";
      e.code = "model_not_found";
      e.message = "model '" + r.model + "' does not exist; this server has " + ModelNames();
      return Error(res, e);
    }
    // Each prompt's token ids (chat: one, from the template; completions: one or a batch).
    std::vector<std::vector<int32_t>> prompt_ids;
    bool reasoning_open = false;  // the prompt ends inside a think block its template opened
    if (chat) {
      const std::string text = PromptText(r, tmpl);
      reasoning_open = ReasoningOpenAtEnd(text);
      SetReasoningGate(opt.reasoning_parser, opt.structured_outputs_in_reasoning, chat, reasoning_open, &r);
      prompt_ids.push_back(tok.Encode(text, tok.add_bos() && !tmpl.text_has_bos(), true));
    } else {
      for (const auto& p : r.prompts) prompt_ids.push_back(p.is_ids ? p.ids : tok.Encode(p.text, tok.add_bos(), true));
    }
    const int64_t ctx = engine.config().max_model_len;
    std::vector<int64_t> max_tokens(prompt_ids.size());
    int64_t n_prompt = 0;  // usage.prompt_tokens: the batch's prompts together
    for (size_t pi = 0; pi < prompt_ids.size(); ++pi) {
      std::vector<int32_t>& ids = prompt_ids[pi];
      const std::string param =
          chat ? "messages" : prompt_ids.size() > 1 ? "prompt[" + std::to_string(pi) + "]" : std::string("prompt");
      if (ids.empty() && tok.bos_id() >= 0) ids.push_back(tok.bos_id());
      if (ids.empty() || (int64_t)ids.size() >= ctx) {
        ApiError e;
        e.param = param;
        e.code = "context_length_exceeded";
        e.message = ids.empty()
                        ? std::string("the prompt is empty")
                        : StrFormat(
                              "the prompt has %zu tokens; this model's context is %lld tokens (prompt + "
                              "completion), so at most %lld prompt tokens fit",
                              ids.size(), (long long)ctx, (long long)ctx - 1);
        return Error(res, e);
      }
      max_tokens[pi] = r.max_tokens >= 0 ? r.max_tokens : ctx - (int64_t)ids.size();
      if ((int64_t)ids.size() + std::max<int64_t>(1, max_tokens[pi]) > ctx) {
        ApiError e;
        e.param = chat && body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
        e.code = "context_length_exceeded";
        e.message = StrFormat(
            "'%s' is %lld but %s has %zu tokens and the context is %lld tokens: at most %lld "
            "tokens can be generated",
            e.param.c_str(), (long long)max_tokens[pi], param.c_str(), ids.size(), (long long)ctx,
            (long long)(ctx - (int64_t)ids.size()));
        return Error(res, e);
      }
      for (int32_t t : ids) {
        if (t >= tok.vocab_size()) {
          ApiError e;
          e.param = param;
          e.message = StrFormat("token id %d is out of range (vocabulary of %d)", t, (int)tok.vocab_size());
          return Error(res, e);
        }
      }
      n_prompt += (int64_t)ids.size();
    }
    for (const auto& [t, bias] : r.sampling.logit_bias) {
      if (t >= tok.vocab_size()) {
        ApiError e;
        e.param = "logit_bias";
        e.message = StrFormat("logit_bias: token id %d is out of range (vocabulary of %d)", t, (int)tok.vocab_size());
        return Error(res, e);
      }
    }
    const int n_choices = (int)prompt_ids.size() * r.n;  // choice c: prompt c / n, sample c % n
    auto job = std::make_shared<Job>();
    std::vector<std::string> stop_strings = r.stop;
    if (chat)
      for (const auto& s : tmpl.StopStrings()) stop_strings.push_back(s);
    serve::RequestOptions ro;
    ro.sampling = r.sampling;
    if (r.echo && !chat && r.logprobs >= 0) ro.prompt_logprobs = r.logprobs;
    ro.priority = r.priority;
    ro.top_logprobs = r.logprobs;
    ro.adapter = adapter;
    ro.adapter_key = adapter_key;
    if (!r.ignore_eos) ro.stop_ids = tok.stop_ids();
    for (int c = 0; c < n_choices; ++c) {
      const size_t pi = (size_t)(c / r.n);
      serve::RequestOptions rc = ro;
      // max_tokens 0 with echo: the prompt (and its logprobs) only, as OpenAI's legacy completions.
      rc.max_tokens = r.echo && !chat && r.max_tokens == 0 ? 0 : std::max<int64_t>(max_tokens[pi], 1);
      if (rc.sampling.has_seed) rc.sampling.seed += (uint64_t)(c % r.n);  // distinct, reproducible samples
      auto id = engine.AddRequest(prompt_ids[pi], rc, [job, c](const serve::TokenEvent& e) { job->Push(c, e); });
      if (!id.ok()) {
        for (int64_t prev : job->ids) engine.Abort(prev);
        ApiError e;
        e.message = id.status().message();
        return Error(res, e);
      }
      job->ids.push_back(*id);
    }
    prompt_tokens->Inc((double)n_prompt);
    in_flight->Add(1);
    auto states = std::make_shared<std::vector<ChoiceState>>(n_choices);
    for (int c = 0; c < n_choices; ++c) {
      (*states)[c].dec = std::make_unique<tokenizer::StreamDecoder>(tok);
      (*states)[c].stops = std::make_unique<serve::StopStringMatcher>(stop_strings);
      (*states)[c].choice.index = c;
      (*states)[c].choice.has_logprobs = r.logprobs >= 0;
      if (r.echo && !chat) {
        const auto& p = r.prompts[(size_t)(c / r.n)];
        (*states)[c].echo = p.is_ids ? tok.Decode(p.ids) : p.text;
      }
    }
    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
    auto call_id = [id](int c) { return "call_" + id.substr(id.find('-') + 1) + "_" + std::to_string(c) + "_"; };
    if (chat && !opt.reasoning_parser.empty()) {
      for (int c = 0; c < n_choices; ++c) {
        (*states)[c].reasoning = std::make_unique<ReasoningReader>(opt.reasoning_parser, reasoning_open);
      }
    }
    if (r.tool_mode == "auto" || r.tool_mode == "required") {
      for (int c = 0; c < n_choices; ++c) {
        (*states)[c].reader =
            std::make_unique<ToolCallReader>(call_id(c), r.tool_format, /*list=*/r.tool_mode == "required",
                                             r.tool_parameters);
      }
    }
    const int64_t created = (int64_t)std::time(nullptr);
    auto last_token_time = std::make_shared<double>(0);
    // Applies one engine event to its choice; returns the text delta (and logprobs) it produced.
    auto first_prompt_token = std::make_shared<std::vector<int32_t>>();
    for (const auto& ids : prompt_ids) first_prompt_token->push_back(ids[0]);
    auto apply = [this, job, states, r, t0, last_token_time, first_prompt_token, id, call_id](const Job::Ev& ev, Choice* delta) {
      ChoiceState& cs = (*states)[ev.choice];
      delta->index = ev.choice;
      delta->has_logprobs = cs.choice.has_logprobs;
      if (cs.done) return;
      double now = Now();
      if (ev.e.token >= 0) {
        if (*last_token_time == 0)
          ttft->Observe(now - t0);
        else
          itl->Observe(now - *last_token_time);
        *last_token_time = now;
        cs.tokens++;
      }
      bool is_stop_token = ev.e.finished && ev.e.finish_reason == "stop";
      std::string text;
      bool stopped = false;
      if (ev.e.token >= 0 && !is_stop_token) text = cs.stops->Push(cs.dec->Push(ev.e.token), &stopped);
      if (ev.e.finished || stopped) {
        if (!stopped) text += cs.stops->Push(cs.dec->Flush(), &stopped);
        if (!stopped) text += cs.stops->Flush();
        cs.done = true;
        delta->finish_reason = stopped || is_stop_token        ? "stop"
                               : ev.e.finish_reason == "abort" ? "abort"
                                                               : "length";
        if (stopped && !ev.e.finished) engine.Abort(job->ids[ev.choice]);
      }
      if (cs.choice.has_logprobs && !ev.e.prompt_logprobs.empty()) {
        // echo: the prompt's tokens first; the first has no logprob (nothing predicts it).
        TokenLogprobInfo first;
        first.token = tok.TokenBytes((*first_prompt_token)[(size_t)(ev.choice / r.n)]);
        first.first_prompt_token = true;
        delta->logprobs.push_back(first);
        for (size_t p = 0; p < ev.e.prompt_logprobs.size(); ++p) {
          const auto& lps = ev.e.prompt_logprobs[p];
          TokenLogprobInfo info;
          info.token = tok.TokenBytes(lps[0].id);
          info.logprob = lps[0].logprob;
          for (size_t k = 1; k < lps.size(); ++k) info.top.push_back({tok.TokenBytes(lps[k].id), lps[k].logprob});
          delta->logprobs.push_back(info);
        }
      }
      if (cs.choice.has_logprobs && ev.e.token >= 0 && !ev.e.logprobs.empty()) {
        TokenLogprobInfo info;
        info.token = tok.TokenBytes(ev.e.token);
        info.logprob = ev.e.logprobs[0].logprob;
        for (size_t k = 1; k < ev.e.logprobs.size(); ++k) {
          info.top.push_back({tok.TokenBytes(ev.e.logprobs[k].id), ev.e.logprobs[k].logprob});
        }
        delta->logprobs.push_back(info);
      }
      if (!cs.echo.empty()) {
        text = cs.echo + text;
        cs.echo.clear();
      }
      if (cs.reasoning) {  // the reasoning goes to its own field; what follows sees the content alone
        std::string content;
        cs.reasoning->Update(text, !delta->finish_reason.empty(), &delta->reasoning, &content);
        cs.choice.reasoning += delta->reasoning;
        text = std::move(content);
      }
      if (!delta->finish_reason.empty()) cs.choice.finish_reason = delta->finish_reason;
      cs.choice.logprobs.insert(cs.choice.logprobs.end(), delta->logprobs.begin(), delta->logprobs.end());
      if (r.tool_mode.empty()) {
        delta->text = text;
        cs.choice.text += text;
        return;
      }
      cs.raw += text;
      if (cs.reader) {
        // tool_choice "auto" (content as it comes, then calls) or "required" (a list of calls): each call's arguments
        // as they come.
        cs.reader->Update(cs.raw, !delta->finish_reason.empty(), &delta->text, &delta->tool_calls);
        cs.choice.text += delta->text;
        AppendToolCalls(delta->tool_calls, &cs.choice.tool_calls);
        if (delta->finish_reason == "stop" && cs.reader->calls() > 0) {
          delta->finish_reason = cs.choice.finish_reason = "tool_calls";
        }
      } else if (r.tool_mode == "named") {
        // A named function: the text is its arguments, streamed as they come (blanks outside strings dropped, as
        // the reader's) after a first delta with its id and name.
        const std::string piece = cs.minifier.Push(text);
        if (cs.choice.tool_calls.empty()) {
          delta->tool_calls.push_back(ToolCall{call_id(ev.choice) + "0", r.tool_name, piece, 0});
        } else if (!piece.empty()) {
          delta->tool_calls.push_back(ToolCall{"", "", piece, 0});
        }
        AppendToolCalls(delta->tool_calls, &cs.choice.tool_calls);
        if (delta->finish_reason == "stop") delta->finish_reason = cs.choice.finish_reason = "tool_calls";
      }
    };
    auto all_done = [states] {
      for (const auto& s : *states)
        if (!s.done) return false;
      return true;
    };
    const std::string model = r.model.empty() ? opt.model_name : r.model;
    // Response sent, or client gone (a failed write): cancel whatever still runs so its blocks are freed.
    auto release = [this, job, states](bool success) {
      bool cut = false;
      for (size_t c = 0; c < states->size(); ++c) {
        if (!(*states)[c].done) {
          engine.Abort(job->ids[c]);
          cut = true;
        }
      }
      (success ? requests_ok : requests_err)->Inc();
      if (cut) cancelled->Inc();
      in_flight->Add(-1);
    };
    if (!r.stream) {
      // cpp-httplib 0.11.4 (Debian 12) has no Request::is_connection_closed (added in later
      // versions), so a plain handler cannot see a client leave. The JSON body is sent through a
      // chunked provider instead: while the engine works, a space every kProbeInterval (leading
      // whitespace is valid JSON) probes the connection; a failed write cancels the request (the
      // releaser). A write to a just-closed socket may still succeed once; the next one fails.
      constexpr double kProbeInterval = 0.2;
      auto deadline = std::make_shared<double>(Now() + 600);
      auto next_probe = std::make_shared<double>(Now() + kProbeInterval);
      res.set_chunked_content_provider(
          "application/json",
          [this, job, states, apply, all_done, id, created, model, chat, n_prompt, deadline, next_probe](
              size_t, httplib::DataSink& sink) -> bool {
            while (!all_done() && Now() < *deadline) {
              if (Now() >= *next_probe) {  // also while tokens keep coming
                *next_probe = Now() + kProbeInterval;
                static const char kProbe = ' ';
                return sink.write(&kProbe, 1);
              }
              Job::Ev ev;
              if (!job->Pop(&ev, kProbeInterval)) continue;
              Choice d;
              apply(ev, &d);
              *deadline = Now() + 600;
            }
            for (size_t c = 0; c < states->size(); ++c) {
              if (!(*states)[c].done) engine.Abort(job->ids[c]);  // timed out: stop spending on it
            }
            std::vector<Choice> choices;
            Usage u{n_prompt, 0};
            for (auto& st : *states) {
              choices.push_back(st.choice);
              u.completion_tokens += st.tokens;
            }
            const std::string body = CompletionResponse(id, created, model, choices, u, chat)
                                         .dump(-1, ' ', false, json::error_handler_t::replace);
            if (!sink.write(body.data(), body.size())) return false;
            sink.done();
            return true;
          },
          release);
      return;
    }
    auto first = std::make_shared<std::vector<bool>>(n_choices, true);
    const bool include_usage = r.include_usage;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [job, states, first, apply, all_done, id, created, model, chat, include_usage, n_prompt](
            size_t, httplib::DataSink& sink) -> bool {
          if (all_done()) {
            if (include_usage) {
              Usage u{n_prompt, 0};
              for (auto& s : *states) u.completion_tokens += s.tokens;
              std::string ev = SseEvent(UsageChunk(id, created, model, u, chat));
              if (!sink.write(ev.data(), ev.size())) return false;
            }
            std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
            sink.done();
            return true;
          }
          Job::Ev ev;
          if (!job->Pop(&ev, 0.5)) {
            // Nothing to send yet (queued, or a long prefill): an SSE comment line, which clients
            // ignore, finds out whether the client is still there; a failed write cancels it.
            static const std::string kKeepAlive = ": keep-alive\n\n";
            return sink.write(kKeepAlive.data(), kKeepAlive.size());
          }
          Choice d;
          apply(ev, &d);
          if (d.text.empty() && d.reasoning.empty() && d.finish_reason.empty() && !(*first)[d.index] &&
              d.logprobs.empty() && d.tool_calls.empty())
            return true;
          std::string out = SseEvent(CompletionChunk(id, created, model, d, chat, (*first)[d.index]));
          (*first)[d.index] = false;
          return sink.write(out.data(), out.size());
        },
        release);
  }

  void Routes() {
    http.new_task_queue = [n = opt.http_threads] { return new httplib::ThreadPool(n); };
    http.Post("/v1/completions",
              [this](const httplib::Request& q, httplib::Response& s) { Complete(q, s, false); });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& q, httplib::Response& s) { Complete(q, s, true); });
    http.Get("/v1/models", [this](const httplib::Request& q, httplib::Response& s) {
      if (!Authorized(q, s)) return;
      json data = json::array();
      data.push_back({{"id", opt.model_name},
                      {"object", "model"},
                      {"created", 0},
                      {"owned_by", "lathe"},
                      {"max_model_len", engine.config().max_model_len}});
      for (const auto& a : opt.adapters) {
        data.push_back({{"id", a.first},
                        {"object", "model"},
                        {"created", 0},
                        {"owned_by", "lathe"},
                        {"root", a.second->path},
                        {"parent", opt.model_name}});
      }
      json m = {{"object", "list"}, {"data", data}};
      s.set_content(m.dump(), "application/json");
    });
    http.Get("/health",
             [](const httplib::Request&, httplib::Response& s) { s.set_content("{}", "application/json"); });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& s) {
      s.set_content(RenderMetrics(), "text/plain; version=0.0.4");
    });
    http.Post("/tokenize", [this](const httplib::Request& q, httplib::Response& s) {
      if (!Authorized(q, s)) return;
      json b = json::parse(q.body, nullptr, false);
      if (!b.is_object() || !b.contains("prompt") || !b["prompt"].is_string()) {
        ApiError e;
        e.param = "prompt";
        e.message = "expected {\"prompt\": string}";
        return Error(s, e);
      }
      bool add_special = true;
      if (b.contains("add_special_tokens")) {
        if (!b["add_special_tokens"].is_boolean()) {
          ApiError e;
          e.param = "add_special_tokens";
          e.message = "'add_special_tokens' must be a boolean";
          return Error(s, e);
        }
        add_special = b["add_special_tokens"].get<bool>();
      }
      auto ids = tok.Encode(b["prompt"].get<std::string>(), add_special && tok.add_bos(), true);
      s.set_content(
          json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", engine.config().max_model_len}}
              .dump(),
          "application/json");
    });
    http.Post("/detokenize", [this](const httplib::Request& q, httplib::Response& s) {
      if (!Authorized(q, s)) return;
      json b = json::parse(q.body, nullptr, false);
      if (!b.is_object() || !b.contains("tokens") || !b["tokens"].is_array()) {
        ApiError e;
        e.param = "tokens";
        e.message = "expected {\"tokens\": [int, ...]}";
        return Error(s, e);
      }
      std::vector<int32_t> ids;
      for (const auto& t : b["tokens"]) {
        if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() > INT32_MAX) ||
            t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.vocab_size()) {
          ApiError e;
          e.param = "tokens";
          e.message = "token ids must be integers in [0, vocab size)";
          return Error(s, e);
        }
        ids.push_back((int32_t)t.get<int64_t>());
      }
      s.set_content(json{{"prompt", tok.Decode(ids)}}.dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
    });
    http.set_payload_max_length(16 << 20);
    http.set_error_handler(
        httplib::Server::HandlerWithResponse([](const httplib::Request& q, httplib::Response& s) {
          if (!s.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // our own JSON error
          ApiError e;
          e.http_status = s.status;
          e.type = s.status == 404 ? "not_found_error" : "invalid_request_error";
          e.message = StrFormat("%s %s: %s", q.method.c_str(), q.path.c_str(),
                                s.status == 404 ? "no such route" : "the request cannot be served");
          s.set_content(e.ToJson().dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
          return httplib::Server::HandlerResponse::Handled;
        }));
    http.set_exception_handler([this](const httplib::Request&, httplib::Response& s, std::exception_ptr) {
      ApiError e;
      e.http_status = 500;
      e.type = "server_error";
      e.message = "internal error";
      Error(s, e);
    });
  }
};

HttpServer::HttpServer(serve::Engine& engine, const tokenizer::Tokenizer& tok, tokenizer::ChatTemplate tmpl,
                       ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, tok, std::move(tmpl), std::move(options))) {
  impl_->Routes();
  Impl* im = impl_.get();
  impl_->http.set_socket_options([im](socket_t sock) {
    httplib::default_socket_options(sock);
    im->listen_fd = (int)sock;
  });
}

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Run() {
  int port = impl_->opt.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(impl_->opt.host.c_str());
    if (port <= 0) return Status::Error("cannot bind " + impl_->opt.host);
  } else if (!impl_->http.bind_to_port(impl_->opt.host.c_str(), port)) {
    return Status::Error(StrFormat("cannot bind %s:%d (in use, or not an address of this machine)",
                                   impl_->opt.host.c_str(), port));
  }
  impl_->bound_port = port;
  // Debian's cpp-httplib is a shared library whose listen() uses its default backlog of 5, whatever
  // CPPHTTPLIB_LISTEN_BACKLOG says here: a burst of clients arriving while both cores decode then
  // overflowed the accept queue (TcpExtListenOverflows; clients saw "HTTP error Read"). listen()
  // again on the bound socket sets the new backlog in place (capped by net.core.somaxconn).
  const int fd = impl_->listen_fd.load();
  if (fd >= 0 && ::listen(fd, kListenBacklog) != 0)
    return Status::Error(StrFormat("listen(backlog %d) on %s:%d failed", kListenBacklog, impl_->opt.host.c_str(), port));
  if (!impl_->http.listen_after_bind()) return Status::Error("the HTTP server stopped with an error");
  return Status::Ok();
}

void HttpServer::Stop() {
  if (impl_) impl_->http.stop();
}

int HttpServer::port() const { return impl_->bound_port.load(); }

bool HttpServer::listening() const { return impl_->http.is_running(); }

}  // namespace lathe::server
