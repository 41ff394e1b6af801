// HttpServer: request handling, streaming, metrics.
#include "server/http_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "monitor/metrics.h"
#include "serve/generate.h"
#include "server/openai_api.h"

namespace lathe::server {

using nlohmann::json;

namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

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
    if (!cv.wait_for(l, std::chrono::duration<double>(timeout_s), [&] { return !events.empty(); })) return false;
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
  Choice choice;
};

}  // namespace

struct HttpServer::Impl {
  serve::Engine& engine;
  const tokenizer::Tokenizer& tok;
  tokenizer::ChatTemplate tmpl;
  ServerOptions opt;
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

  Impl(serve::Engine& e, const tokenizer::Tokenizer& t, tokenizer::ChatTemplate tm, ServerOptions o)
      : engine(e), tok(t), tmpl(std::move(tm)), opt(std::move(o)) {
    const std::vector<double> lat = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    requests_ok = metrics.GetCounter("lathe_requests_total", "Completed requests.", monitor::LabelPair("status", "ok"));
    requests_err = metrics.GetCounter("lathe_requests_total", "Completed requests.", monitor::LabelPair("status", "error"));
    prompt_tokens = metrics.GetCounter("lathe_prompt_tokens_total", "Prompt tokens received.");
    gen_tokens = metrics.GetCounter("lathe_generation_tokens_total", "Tokens generated.");
    ttft = metrics.GetHistogram("lathe_time_to_first_token_seconds", "Time to first token.", lat);
    itl = metrics.GetHistogram("lathe_inter_token_latency_seconds", "Time between output tokens.", lat);
    in_flight = metrics.GetGauge("lathe_requests_running", "Requests in flight in the HTTP layer.");
  }

  void Error(httplib::Response& res, const ApiError& e) {
    res.status = e.http_status;
    res.set_content(e.ToJson().dump(), "application/json");
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
    serve::EngineStats s = engine.stats();
    metrics.GetGauge("lathe_num_requests_running", "Sequences running in the engine.")->Set((double)s.running);
    metrics.GetGauge("lathe_num_requests_waiting", "Requests waiting in the engine.")->Set((double)s.waiting);
    metrics.GetGauge("lathe_kv_blocks_used", "KV-cache blocks in use.")->Set((double)s.blocks_used);
    metrics.GetGauge("lathe_kv_blocks_total", "KV-cache blocks.")->Set((double)s.blocks_total);
    metrics.GetGauge("lathe_prefix_cache_hit_rate", "Prefix-cache block hits / lookups.")
        ->Set(s.prefix_queries ? (double)s.prefix_hits / s.prefix_queries : 0.0);
    metrics.GetGauge("lathe_preemptions", "Sequences preempted so far.")->Set((double)s.preemptions);
    return metrics.Render();
  }

  // Runs one completion request; writes a JSON response or streams SSE.
  void Complete(const httplib::Request& req, httplib::Response& res, bool chat) {
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
    if (auto e = ParseCompletionRequest(body, chat, &r)) return Error(res, *e);
    if (!r.model.empty() && r.model != opt.model_name) {
      ApiError e;
      e.http_status = 404;
      e.param = "model";
      e.code = "model_not_found";
      e.message = "model '" + r.model + "' does not exist; this server has '" + opt.model_name + "'";
      return Error(res, e);
    }
    std::vector<int32_t> ids;
    if (chat) {
      ids = tok.Encode(tmpl.Apply(r.messages, true), tok.add_bos() && !tmpl.text_has_bos(), true);
    } else if (r.prompt_is_ids) {
      ids = r.prompt_ids;
    } else {
      ids = tok.Encode(r.prompt, tok.add_bos(), true);
    }
    const int64_t ctx = engine.config().max_model_len;
    int64_t max_tokens = r.max_tokens >= 0 ? r.max_tokens : ctx - (int64_t)ids.size();
    if (ids.empty() || (int64_t)ids.size() + std::max<int64_t>(1, max_tokens) > ctx) {
      ApiError e;
      e.param = "messages";
      e.code = "context_length_exceeded";
      e.message = StrFormat("the prompt has %zu tokens and max_tokens is %lld; the context is %lld tokens", ids.size(),
                            (long long)max_tokens, (long long)ctx);
      return Error(res, e);
    }
    auto job = std::make_shared<Job>();
    std::vector<std::string> stop_strings = r.stop;
    if (chat) for (const auto& s : tmpl.StopStrings()) stop_strings.push_back(s);
    serve::RequestOptions ro;
    ro.sampling = r.sampling;
    ro.max_tokens = std::max<int64_t>(max_tokens, 1);
    ro.priority = r.priority;
    ro.top_logprobs = r.logprobs;
    if (!r.ignore_eos) ro.stop_ids = tok.stop_ids();
    for (int c = 0; c < r.n; ++c) {
      serve::RequestOptions rc = ro;
      if (rc.sampling.has_seed) rc.sampling.seed += (uint64_t)c;  // distinct, reproducible samples
      auto id = engine.AddRequest(ids, rc, [job, c](const serve::TokenEvent& e) { job->Push(c, e); });
      if (!id.ok()) {
        for (int64_t prev : job->ids) engine.Abort(prev);
        ApiError e;
        e.message = id.status().message();
        return Error(res, e);
      }
      job->ids.push_back(*id);
    }
    prompt_tokens->Inc((double)ids.size());
    in_flight->Add(1);
    auto states = std::make_shared<std::vector<ChoiceState>>(r.n);
    for (int c = 0; c < r.n; ++c) {
      (*states)[c].dec = std::make_unique<tokenizer::StreamDecoder>(tok);
      (*states)[c].stops = std::make_unique<serve::StopStringMatcher>(stop_strings);
      (*states)[c].choice.index = c;
      (*states)[c].choice.has_logprobs = r.logprobs >= 0;
    }
    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
    const int64_t created = (int64_t)std::time(nullptr);
    const double t0 = Now();
    auto last_token_time = std::make_shared<double>(0);
    // Applies one engine event to its choice; returns the text delta (and logprobs) it produced.
    auto apply = [this, job, states, r, t0, last_token_time](const Job::Ev& ev, Choice* delta) {
      ChoiceState& cs = (*states)[ev.choice];
      delta->index = ev.choice;
      delta->has_logprobs = cs.choice.has_logprobs;
      if (cs.done) return;
      double now = Now();
      if (ev.e.token >= 0) {
        if (*last_token_time == 0) ttft->Observe(now - t0);
        else itl->Observe(now - *last_token_time);
        *last_token_time = now;
        gen_tokens->Inc();
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
        delta->finish_reason = stopped || is_stop_token ? "stop" : ev.e.finish_reason == "abort" ? "abort" : "length";
        if (stopped && !ev.e.finished) engine.Abort(job->ids[ev.choice]);
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
      delta->text = text;
      cs.choice.text += text;
      cs.choice.logprobs.insert(cs.choice.logprobs.end(), delta->logprobs.begin(), delta->logprobs.end());
      if (!delta->finish_reason.empty()) cs.choice.finish_reason = delta->finish_reason;
    };
    auto all_done = [states] {
      for (const auto& s : *states) if (!s.done) return false;
      return true;
    };
    const std::string model = opt.model_name;
    const int64_t n_prompt = (int64_t)ids.size();
    if (!r.stream) {
      while (!all_done()) {
        Job::Ev ev;
        if (!job->Pop(&ev, 600)) break;
        Choice d;
        apply(ev, &d);
      }
      std::vector<Choice> choices;
      Usage u{n_prompt, 0};
      for (auto& s : *states) {
        choices.push_back(s.choice);
        u.completion_tokens += s.tokens;
      }
      res.set_content(CompletionResponse(id, created, model, choices, u, chat).dump(-1, ' ', false, json::error_handler_t::replace),
                      "application/json");
      requests_ok->Inc();
      in_flight->Add(-1);
      return;
    }
    auto first = std::make_shared<std::vector<bool>>(r.n, true);
    const bool include_usage = r.include_usage;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, states, first, apply, all_done, id, created, model, chat, include_usage, n_prompt](
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
          if (!job->Pop(&ev, 0.5)) return sink.is_writable();  // keep waiting while the client is there
          Choice d;
          apply(ev, &d);
          if (d.text.empty() && d.finish_reason.empty() && !(*first)[d.index] && d.logprobs.empty()) return true;
          std::string out = SseEvent(CompletionChunk(id, created, model, d, chat, (*first)[d.index]));
          (*first)[d.index] = false;
          return sink.write(out.data(), out.size());
        },
        [this, job, states](bool success) {
          // Client gone or stream finished: cancel whatever still runs so its blocks are freed.
          for (size_t c = 0; c < states->size(); ++c) {
            if (!(*states)[c].done) engine.Abort(job->ids[c]);
          }
          (success ? requests_ok : requests_err)->Inc();
          in_flight->Add(-1);
        });
  }

  void Routes() {
    http.new_task_queue = [n = opt.http_threads] { return new httplib::ThreadPool(n); };
    http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& s) { Complete(q, s, false); });
    http.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& s) { Complete(q, s, true); });
    http.Get("/v1/models", [this](const httplib::Request& q, httplib::Response& s) {
      if (!Authorized(q, s)) return;
      json m = {{"object", "list"},
                {"data", json::array({{{"id", opt.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "lathe"}}})}};
      s.set_content(m.dump(), "application/json");
    });
    http.Get("/health", [](const httplib::Request&, httplib::Response& s) { s.set_content("{}", "application/json"); });
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
      bool add_special = b.value("add_special_tokens", true);
      auto ids = tok.Encode(b["prompt"].get<std::string>(), add_special && tok.add_bos(), true);
      s.set_content(json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", engine.config().max_model_len}}.dump(),
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
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.vocab_size()) {
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
}

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Run() {
  int port = impl_->opt.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(impl_->opt.host.c_str());
    if (port <= 0) return Status::Error("cannot bind " + impl_->opt.host);
    impl_->opt.port = port;
  } else if (!impl_->http.bind_to_port(impl_->opt.host.c_str(), port)) {
    return Status::Error(StrFormat("cannot bind %s:%d (in use, or not an address of this machine)",
                                   impl_->opt.host.c_str(), port));
  }
  if (!impl_->http.listen_after_bind()) return Status::Error("the HTTP server stopped with an error");
  return Status::Ok();
}

void HttpServer::Stop() {
  if (impl_) impl_->http.stop();
}

int HttpServer::port() const { return impl_->opt.port; }

}  // namespace lathe::server
