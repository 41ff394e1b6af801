// `lathe bench serve`: serving throughput and latency over loopback HTTP — the engine and the
// OpenAI server in-process (or an external OpenAI-compatible --url such as llama-server, fed the
// same token-id prompts) — with a seeded synthetic workload of real TinyStories text at several
// concurrency levels, streamed through cpp-httplib client threads.
// Prints output tok/s, TTFT and ITL p50/p99, the ratio to one request at a time from the same
// run, llama-server's figures (../shared/PEERS.md), KV utilization under load, and the prefill
// time a shared system prompt saves with the prefix cache on vs off.
#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/profiler.h"
#include "serve/engine.h"
#include "server/http_server.h"

namespace lathe::cli {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double Now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = (size_t)std::min<double>((double)v.size() - 1, p / 100.0 * (double)(v.size() - 1) + 0.5);
  return v[i];
}

struct Endpoint {
  std::string host;
  int port = 0;
  std::string api_key;
  std::string model;  // the request's "model" field; empty: left out (the server's default model)
  double temperature = 0;  // the requests' sampling temperature (0 = greedy)
};

// One streamed completion: send time -> first content chunk (TTFT), gaps between content chunks
// (ITL), and the completion tokens from the final usage chunk. A content chunk is one carrying
// text: servers differ in whether they send an empty first chunk or an empty finish chunk
// (llama-server's last /v1/completions chunk has "text": "" with the usage).
struct Sample {
  bool ok = false;
  std::string error;
  double ttft = 0, latency = 0;
  std::vector<double> itl;
  int64_t tokens = 0;
};

// Whether any choice carries text (completions) or delta content (chat).
bool HasText(const json& choices) {
  for (const json& c : choices) {
    if (!c.is_object()) continue;
    auto t = c.find("text");
    if (t != c.end() && t->is_string() && !t->get<std::string>().empty()) return true;
    auto d = c.find("delta");
    if (d != c.end() && d->is_object()) {
      auto content = d->find("content");
      if (content != d->end() && content->is_string() && !content->get<std::string>().empty()) return true;
    }
  }
  return false;
}

Sample StreamCompletion(const Endpoint& ep, const std::vector<int32_t>& prompt, int64_t max_tokens) {
  Sample s;
  json body = {{"prompt", prompt}, {"max_tokens", max_tokens},
               {"temperature", ep.temperature}, {"ignore_eos", true},
               {"stream", true},   {"stream_options", {{"include_usage", true}}}};
  httplib::Client cli(ep.host, ep.port);
  cli.set_read_timeout(600, 0);
  cli.set_connection_timeout(10, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  if (!ep.model.empty()) body["model"] = ep.model;
  req.body = body.dump();
  if (!ep.api_key.empty()) req.set_header("Authorization", "Bearer " + ep.api_key);
  std::string buf;
  const double t0 = Now();
  double last = 0;
  bool done = false;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buf.append(data, len);
    size_t pos;
    while ((pos = buf.find("\n\n")) != std::string::npos) {
      std::string ev = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      if (ev.rfind("data: ", 0) != 0) continue;  // keep-alive comments
      std::string payload = ev.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      json j = json::parse(payload, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("usage") && j["usage"].is_object() && j["usage"].contains("completion_tokens") &&
          j["usage"]["completion_tokens"].is_number_integer())
        s.tokens = j["usage"]["completion_tokens"].get<int>();
      if (!j.contains("choices") || !j["choices"].is_array() || !HasText(j["choices"])) continue;
      const double now = Now();
      if (last == 0)
        s.ttft = now - t0;
      else
        s.itl.push_back(now - last);
      last = now;
    }
    return true;
  };
  auto res = cli.send(req);
  s.latency = Now() - t0;
  if (last == 0) s.ttft = s.latency;  // no chunk carried text (e.g. one token that decodes to "")
  if (!res) {
    s.error = "HTTP error " + httplib::to_string(res.error());
  } else if (res->status != 200) {
    s.error = StrFormat("status %d: %s", res->status, res->body.substr(0, 200).c_str());
  } else if (!done) {
    s.error = "stream ended without [DONE]";
  } else if (s.tokens != max_tokens) {
    // The workload relies on ignore_eos: a server that stops early (or ignores max_tokens) would
    // be compared on other work.
    s.error = StrFormat("usage.completion_tokens %lld != max_tokens %lld (ignore_eos / max_tokens not honored?)",
                        (long long)s.tokens, (long long)max_tokens);
  } else {
    s.ok = true;
  }
  return s;
}

std::string HttpGet(const Endpoint& ep, const std::string& path) {
  httplib::Client cli(ep.host, ep.port);
  auto res = cli.Get(path.c_str());
  return res && res->status == 200 ? res->body : std::string();
}

double MetricValue(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::atof(line.c_str() + name.size() + 1);
  }
  return -1;
}

struct Request {
  std::vector<int32_t> prompt;
  int64_t max_tokens;
};

struct LevelResult {
  int concurrency = 0;
  int n = 0, failed = 0;
  double wall = 0, tokens = 0;
  double ttft_p50 = 0, ttft_p99 = 0, itl_p50 = 0, itl_p99 = 0, latency_p50 = 0;
  double kv_util = -1, kv_blocks_frac = -1;  // under load: tokens / capacity of used blocks, used / total
  double cache_hits = -1;                    // lathe_prefix_cache_hits_total after the level (-1: none)
  std::string first_error;
  double tps() const { return tokens / wall; }
};

LevelResult RunLevel(const Endpoint& ep, const std::vector<Request>& reqs, int concurrency) {
  LevelResult r;
  r.concurrency = concurrency;
  r.n = (int)reqs.size();
  std::vector<Sample> samples(reqs.size());
  std::atomic<size_t> next{0};
  std::atomic<bool> running{true};
  // KV utilization, sampled from /metrics while the level runs.
  std::vector<double> util, frac;
  std::thread sampler([&] {
    while (running.load()) {
      std::string m = HttpGet(ep, "/metrics");
      double stored = MetricValue(m, "lathe_kv_tokens_stored"), used = MetricValue(m, "lathe_kv_blocks_used");
      double total = MetricValue(m, "lathe_kv_blocks_total"),
             cap = MetricValue(m, "lathe_kv_tokens_capacity");
      if (stored > 0 && used > 0 && total > 0 && cap > 0) {
        util.push_back(stored / (used * cap / total));
        frac.push_back(used / total);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const double t0 = Now();
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < reqs.size();) {
        samples[i] = StreamCompletion(ep, reqs[i].prompt, reqs[i].max_tokens);
      }
    });
  }
  for (auto& t : threads) t.join();
  r.wall = Now() - t0;
  running = false;
  sampler.join();
  r.cache_hits = MetricValue(HttpGet(ep, "/metrics"), "lathe_prefix_cache_hits_total");
  std::vector<double> ttft, itl, lat;
  for (const Sample& s : samples) {
    if (!s.ok) {
      if (r.failed++ == 0) r.first_error = s.error;
      continue;
    }
    r.tokens += (double)s.tokens;
    ttft.push_back(s.ttft);
    lat.push_back(s.latency);
    itl.insert(itl.end(), s.itl.begin(), s.itl.end());
  }
  r.ttft_p50 = Percentile(ttft, 50);
  r.ttft_p99 = Percentile(ttft, 99);
  r.itl_p50 = Percentile(itl, 50);
  r.itl_p99 = Percentile(itl, 99);
  r.latency_p50 = Percentile(lat, 50);
  if (!util.empty()) {
    // The busiest half of the samples: the ramp-up and drain at the ends are not "under load".
    std::vector<size_t> order(frac.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return frac[a] > frac[b]; });
    double u = 0, f = 0;
    size_t k = std::max<size_t>(1, order.size() / 2);
    for (size_t i = 0; i < k; ++i) {
      u += util[order[i]];
      f += frac[order[i]];
    }
    r.kv_util = u / k;
    r.kv_blocks_frac = f / k;
  }
  return r;
}

// An in-process engine + HTTP server on a free loopback port.
struct LocalServer {
  std::unique_ptr<serve::Engine> engine;
  std::unique_ptr<server::HttpServer> http;
  std::thread thread;
  ~LocalServer() {
    if (http) http->Stop();
    if (thread.joinable()) thread.join();
    if (engine) engine->Stop();
  }
};

Result<std::unique_ptr<LocalServer>> StartLocal(const model::LoadedModel& lm, ThreadPool& pool,
                                                serve::EngineConfig ec, Profiler* profiler = nullptr,
                                                bool int8_prompt = false) {
  auto s = std::make_unique<LocalServer>();
  model::TransformerOptions to;
  to.profiler = profiler;
  to.int8_prompt_rows = int8_prompt;
  s->engine = std::make_unique<serve::Engine>(lm.weights, pool, ec, to);
  s->engine->Start();
  server::ServerOptions so;
  so.port = 0;
  s->http = std::make_unique<server::HttpServer>(
      *s->engine, *lm.tokenizer, tokenizer::ChatTemplate::Detect(lm.tokenizer->chat_template()), so);
  server::HttpServer* h = s->http.get();
  s->thread = std::thread([h] { (void)h->Run(); });
  for (int i = 0; i < 500 && !h->listening(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (!h->listening()) return Status::Error("the in-process server did not start");
  return s;
}

// http://HOST:PORT with an optional trailing "/": the endpoint, or an error naming --url.
Result<Endpoint> ParseUrl(const std::string& u) {
  const std::string scheme = "http://";
  std::string rest = u.rfind(scheme, 0) == 0 ? u.substr(scheme.size()) : std::string();
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  size_t colon = rest.rfind(':');
  Endpoint ep;
  if (colon != std::string::npos && colon > 0) {
    ep.host = rest.substr(0, colon);
    std::string port = rest.substr(colon + 1);
    if (!port.empty() && port.size() <= 5 && std::all_of(port.begin(), port.end(), ::isdigit))
      ep.port = std::atoi(port.c_str());
  }
  if (ep.host.empty() || ep.host.find('/') != std::string::npos || ep.port < 1 || ep.port > 65535)
    return Status::Error("--url " + u + ": expected http://HOST:PORT (plain HTTP, a port in 1..65535)");
  return ep;
}

std::vector<int> ParseIntList(const std::string& s) {
  std::vector<int> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) v.push_back(std::atoi(item.c_str()));
  return v;
}

// Mean TTFT of `n` one-token requests that share a `shared`-token prefix (+ a distinct tail).
Result<double> PrefixTtft(const Endpoint& ep, const std::vector<int32_t>& text, int shared, int tail, int n) {
  std::vector<double> t;
  for (int i = 0; i <= n; ++i) {
    std::vector<int32_t> p(text.begin(), text.begin() + shared);
    size_t off = (size_t)shared + (size_t)(i + 1) * tail;
    if (off + tail > text.size()) return Status::Error("not enough text for the prefix benchmark");
    p.insert(p.end(), text.begin() + off, text.begin() + off + tail);
    Sample s = StreamCompletion(ep, p, 1);
    if (!s.ok) return Status::Error("prefix benchmark request failed: " + s.error);
    if (i > 0) t.push_back(s.ttft);  // the first request fills the cache
  }
  double sum = 0;
  for (double v : t) sum += v;
  return sum / (double)t.size();
}

}  // namespace

int RunBenchServe(int argc, char** argv) {
  Args args("bench serve",
            "lathe bench serve -m MODEL [--concurrency 1,8,32,64] | --url http://127.0.0.1:PORT -m MODEL");
  AddModelFlags(args);
  args.Flag("--url",
            "benchmark a running OpenAI-compatible server instead (http://HOST:PORT, e.g. llama-server): the "
            "same workload as token-id prompts to /v1/completions; -m still gives the tokenizer");
  args.Flag("--api-key", "API key for --url");
  args.Flag("--served-model", "the request's \"model\" field for --url (default: left out)");
  args.Flag("--concurrency", "concurrency levels", "1,8,32,64");
  args.Flag("--requests", "requests per level: max(this, 2 x concurrency)", "16");
  args.Flag("--data", "text to draw prompts from", "../shared/data/tinystories/validation_100.txt");
  args.Flag("--prompt-tokens", "prompt length range MIN,MAX (uniform, seeded)", "32,160");
  args.Flag("--output-tokens", "output length range MIN,MAX (uniform, seeded)", "32,96");
  args.Flag("--seed", "workload seed", "1234");
  args.Flag("--temperature",
            "the requests' sampling temperature (0 = greedy; > 0 samples every token over the whole vocabulary, "
            "as OpenAI clients' default of 1 does)",
            "0");
  args.Flag("--max-num-seqs", "engine: sequences at once", "64");
  args.Flag("--max-num-batched-tokens", "engine: tokens per step", "512");
  args.Flag("--max-prefill-tokens-with-decode",
            "engine: prompt tokens in a step that also decodes (0 = up to max-num-batched-tokens); a list "
            "(0,32,64) runs every level once per value, on fresh engines, interleaved",
            "64");
  args.Flag("--prefill-tokens-per-decode-row",
            "engine: raise that cap to this many prompt tokens per decode row (0 = the fixed cap; auto = 8 where "
            "the prompt rows run on AMX tiles, else 2)",
            "auto");
  args.Flag("--kv-cache-memory", "engine: KV cache bytes", "1073741824");
  args.Flag("--block-size", "engine: tokens per KV-cache block", "16");
  AddKvCacheDTypeFlag(args);
  AddInt8PromptFlag(args);
  args.Flag("--system-prompt-tokens", "shared-prefix benchmark: prefix length (0 = skip)", "384");
  args.Flag("--rounds", "run every level (and --max-prefill-tokens-with-decode value) this many times", "1");
  args.Flag("--profile",
            "in-process engine: write a Chrome trace of the last level's forward ops to this file and print its "
            "top ops (the engine's op times: where a step goes)");
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return Fail("bench serve", st);
  if (args.help_requested()) {
    std::printf("%s", args.Help().c_str());
    return 0;
  }
  signal(SIGPIPE, SIG_IGN);
  auto levels = ParseIntList(args.Get("concurrency"));
  auto plen = ParseIntList(args.Get("prompt-tokens"));
  auto olen = ParseIntList(args.Get("output-tokens"));
  auto nreq = args.Int("requests"), seed = args.Int("seed"), mns = args.Int("max-num-seqs");
  auto mbt = args.Int("max-num-batched-tokens"), kvb = args.Int("kv-cache-memory"),
       sys_n = args.Int("system-prompt-tokens"), bs = args.Int("block-size"), rounds = args.Int("rounds");
  // Prefill caps: a comma-separated list of non-negative integers (a typo must not become 0).
  std::vector<int64_t> caps;
  {
    std::stringstream in(args.Get("max-prefill-tokens-with-decode"));
    for (std::string item; std::getline(in, item, ',');) {
      if (item.empty() || item.size() > 9 || !std::all_of(item.begin(), item.end(), ::isdigit)) {
        return Fail("bench serve",
                    Status::Error("--max-prefill-tokens-with-decode: expected non-negative integers "
                                  "separated by commas, got '" + item + "'"));
      }
      caps.push_back(std::atoll(item.c_str()));
    }
    if (caps.empty()) return Fail("bench serve", Status::Error("--max-prefill-tokens-with-decode: empty"));
  }
  if (!rounds.ok() || *rounds < 1 || *rounds > 100)
    return Fail("bench serve", Status::Error("--rounds must be in 1..100"));
  if (Status pst = CheckPrefillTokensPerDecodeRowFlag(args); !pst.ok()) return Fail("bench serve", pst);
  if (levels.empty() || std::any_of(levels.begin(), levels.end(), [](int c) { return c < 1; }) ||
      plen.size() != 2 || olen.size() != 2 || plen[0] < 1 || plen[1] < plen[0] || olen[0] < 1 ||
      olen[1] < olen[0] || !nreq.ok() || !seed.ok() || !mns.ok() || !mbt.ok() || !kvb.ok() || !sys_n.ok() ||
      !bs.ok() || *nreq < 1 || *mns < 1 || *mbt < 1 || *kvb < 1 || *sys_n < 0 || *bs < 1 || *bs > 1024) {
    return Fail(
        "bench serve",
        Status::Error("bad flags: --concurrency 1,8,..; --prompt-tokens/--output-tokens MIN,MAX; "
                      "positive --requests/--max-num-seqs/--max-num-batched-tokens/--kv-cache-memory; "
                      "--block-size 1..1024"));
  }
  Result<Endpoint> url_ep = Endpoint{};
  if (args.Has("url")) {
    url_ep = ParseUrl(args.Get("url"));
    if (!url_ep.ok()) return Fail("bench serve", url_ep.status());
  }
  auto lm = LoadModelFromArgs(args);
  if (!lm.ok()) return Fail("bench serve", lm.status());
  const tokenizer::Tokenizer& tok = *(*lm)->tokenizer;
  std::ifstream f(args.Get("data"));
  if (!f) return Fail("bench serve", Status::Error("--data: cannot read " + args.Get("data")));
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<int32_t> text = tok.Encode(ss.str(), false, false);
  if ((int64_t)text.size() < 4 * plen[1] + *sys_n * 2)
    return Fail("bench serve", Status::Error("--data: too little text"));
  // The workload: prompt = BOS + a random window of the text.
  std::mt19937_64 rng((uint64_t)*seed);
  int max_levels = *std::max_element(levels.begin(), levels.end());
  int64_t per_level = std::max<int64_t>(*nreq, 2 * max_levels);
  std::vector<Request> all;
  for (int64_t i = 0; i < per_level; ++i) {
    int p = std::uniform_int_distribution<int>(plen[0], plen[1])(rng);
    int o = std::uniform_int_distribution<int>(olen[0], olen[1])(rng);
    size_t start = std::uniform_int_distribution<size_t>(0, text.size() - p - 1)(rng);
    Request r;
    if (tok.bos_id() >= 0 && tok.add_bos()) r.prompt.push_back(tok.bos_id());
    r.prompt.insert(r.prompt.end(), text.begin() + start, text.begin() + start + p);
    r.max_tokens = o;
    all.push_back(std::move(r));
  }

  Endpoint ep;
  ThreadPool pool(ThreadsFromArgs(args));
  serve::EngineConfig ec;
  ec.block_size = *bs;
  ec.max_num_seqs = *mns;
  ec.max_num_batched_tokens = *mbt;
  ec.max_prefill_tokens_with_decode = caps[0];
  auto ppr = PrefillTokensPerDecodeRowFromArgs(args, (*lm)->weights);
  if (!ppr.ok()) return Fail("bench serve", ppr.status());
  ec.prefill_tokens_per_decode_row = *ppr;
  ec.max_model_len = std::min<int64_t>((*lm)->weights.config.max_seq_len, 4096);
  auto kvt = KvCacheDTypeFromArgs(args, (*lm)->weights);
  if (!kvt.ok()) return Fail("bench serve", kvt.status());
  ec.kv_cache_dtype = *kvt;
  ec.n_blocks =
      *kvb / (int64_t)model::KvBlockStore::BlockBytes((*lm)->weights.config, ec.block_size, ec.kv_cache_dtype);
  std::unique_ptr<LocalServer> local;
  std::unique_ptr<Profiler> profiler;
  if (args.Has("profile")) {
    if (args.Has("url")) return Fail("bench serve", Status::Error("--profile profiles the in-process engine; not with --url"));
    profiler = std::make_unique<Profiler>();
  }
  auto temperature = args.Float("temperature");
  if (!temperature.ok() || !(*temperature >= 0 && *temperature <= 2))
    return Fail("bench serve", Status::Error("--temperature must be a number in [0, 2]"));
  if (args.Has("url")) {
    ep = *url_ep;
    ep.api_key = args.Get("api-key");
    ep.model = args.Get("served-model");
  } else {
    auto s = StartLocal(**lm, pool, ec, profiler.get(), args.On("int8-prompt"));
    if (!s.ok()) return Fail("bench serve", s.status());
    local = std::move(*s);
    ep.host = "127.0.0.1";
    ep.port = local->http->port();
  }
  ep.temperature = *temperature;
  std::printf(
      "lathe bench serve: %s, %s; %lld requests per level, prompt %d-%d tokens, output "
      "%d-%d tokens (seed %lld), %s, ignore_eos, streamed over http://%s:%d\n",
      (*lm)->path.c_str(),
      local ? StrFormat("in-process server, %d engine thread(s)", pool.size()).c_str()
            : "external server (token-id prompts; -m gives the tokenizer only)",
      (long long)per_level, plen[0], plen[1], olen[0], olen[1], (long long)*seed,
      ep.temperature > 0 ? StrFormat("temperature %g", ep.temperature).c_str() : "greedy", ep.host.c_str(), ep.port);
  std::string cap_list;
  for (int64_t v : caps) cap_list += (cap_list.empty() ? "" : ",") + std::to_string(v);
  if (local) {
    std::printf(
        "engine: %lld KV blocks x %lld tokens (%s), max-num-seqs %lld, max-num-batched-tokens %lld, "
        "max-prefill-tokens-with-decode %s, prefill-tokens-per-decode-row %lld; each level on a fresh engine "
        "(empty prefix cache)%s\n",
        (long long)ec.n_blocks, (long long)ec.block_size, DTypeName(ec.kv_cache_dtype), (long long)ec.max_num_seqs,
        (long long)ec.max_num_batched_tokens, cap_list.c_str(), (long long)ec.prefill_tokens_per_decode_row,
        caps.size() > 1 || *rounds > 1
            ? StrFormat("; %lld rounds, the values alternating within each level", (long long)*rounds).c_str()
            : "");
  }
  // With --url the engine flags do not apply: one pass per level and round.
  if (!local) caps.resize(1);
  const bool sweep = caps.size() > 1 || *rounds > 1;
  // Warm-up prompt (page faults, thread start-up): 2 tokens, so it fills no KV block to cache. An
  // external server must answer it, or nothing below could be measured.
  const std::vector<int32_t> warm(all[0].prompt.begin(),
                                  all[0].prompt.begin() + std::min<size_t>(2, all[0].prompt.size()));
  if (!local) {
    Sample w = StreamCompletion(ep, warm, 2);
    if (!w.ok) {
      return Fail("bench serve", Status::Error(StrFormat("--url %s: the warm-up completion failed: %s",
                                                         args.Get("url").c_str(), w.error.c_str())));
    }
  }
  std::vector<LevelResult> results;
  std::vector<int64_t> result_cap, result_round;
  struct Run {
    int64_t round;
    int c;
    int64_t cap;
  };
  std::vector<Run> runs;  // rounds, each over the levels, each level over the caps
  for (int64_t round = 1; round <= *rounds; ++round)
    for (int c : levels)
      for (int64_t cap : caps) runs.push_back({round, c, cap});
  for (const auto& [round, c, cap] : runs) {
    // Every level on a fresh in-process engine: the levels share the workload's first requests, and
    // with the prefix cache of the previous level the next one skipped their prompts (at concurrency
    // 32 after 1, 16 of 64 prompts were cached: its ratio to one at a time was inflated).
    if (local && !results.empty()) {
      local.reset();
      ec.max_prefill_tokens_with_decode = cap;
      auto s = StartLocal(**lm, pool, ec, profiler.get(), args.On("int8-prompt"));
      if (!s.ok()) return Fail("bench serve", s.status());
      local = std::move(*s);
      ep.port = local->http->port();
    }
    (void)StreamCompletion(ep, warm, 2);
    // The profile keeps the last level's ops only (the warm-up's dropped too).
    if (profiler) {
      profiler->Clear();
      pool.SetProfiler(profiler.get());
    }
    // One request at a time runs a quarter of the requests (the slowest level); the others all.
    std::vector<Request> reqs(all.begin(),
                              all.begin() + (c == 1 ? std::max<int64_t>(4, per_level / 4) : per_level));
    LevelResult r = RunLevel(ep, reqs, c);
    if (profiler) pool.SetProfiler(nullptr);
    results.push_back(r);
    result_cap.push_back(cap);
    result_round.push_back(round);
    if (sweep) std::printf("round %lld, prefill cap %4lld, ", (long long)round, (long long)cap);
    std::printf(
        "concurrency %3d: %4d requests in %6.1f s: %7.1f output tok/s | TTFT p50 %6.3f p99 %6.3f s | ITL p50 "
        "%6.1f p99 %6.1f ms | latency p50 %5.2f s",
        c, r.n, r.wall, r.tps(), r.ttft_p50, r.ttft_p99, 1e3 * r.itl_p50, 1e3 * r.itl_p99, r.latency_p50);
    if (r.kv_util >= 0)
      std::printf(" | KV: %.1f%% of used block capacity holds tokens, %.1f%% of blocks used", 100 * r.kv_util,
                  100 * r.kv_blocks_frac);
    // A fresh engine per level: any hit is a prompt shared within the level, not one from an earlier level.
    if (local && r.cache_hits >= 0) std::printf(" | prefix cache hits %.0f", r.cache_hits);
    if (r.failed) std::printf(" | %d FAILED (%s)", r.failed, r.first_error.c_str());
    std::printf("\n");
    std::fflush(stdout);
  }
  std::printf(
      "\n| %sconcurrency | output tok/s | vs one at a time | TTFT p50 / p99 (s) | ITL p50 / p99 (ms) | KV "
      "tokens / used capacity |\n"
      "|%s---:|---:|---:|---:|---:|---:|\n",
      sweep ? "round | prefill cap | " : "", sweep ? "---:|---:|" : "");
  for (size_t i = 0; i < results.size(); ++i) {
    const LevelResult& r = results[i];
    // One at a time in the same round with the same cap.
    const LevelResult* base = nullptr;
    for (size_t j = 0; j < results.size(); ++j)
      if (results[j].concurrency == 1 && result_cap[j] == result_cap[i] && result_round[j] == result_round[i])
        base = &results[j];
    if (sweep) std::printf("| %lld | %lld ", (long long)result_round[i], (long long)result_cap[i]);
    std::printf("| %d | %.1f | %s | %.3f / %.3f | %.1f / %.1f | %s |\n", r.concurrency, r.tps(),
                base ? StrFormat("%.2fx", r.tps() / base->tps()).c_str() : "-", r.ttft_p50, r.ttft_p99,
                1e3 * r.itl_p50, 1e3 * r.itl_p99,
                r.kv_util >= 0 ? StrFormat("%.1f%%", 100 * r.kv_util).c_str() : "-");
  }
  if (profiler) {
    Status ps = profiler->WriteChromeTrace(args.Get("profile"));
    if (!ps.ok()) return Fail("bench serve", ps.WithContext("--profile"));
    std::printf("\nprofile of the last level (concurrency %d): %s (open in Perfetto or chrome://tracing)\n%s",
                runs.back().c, args.Get("profile").c_str(), profiler->Summary(25).c_str());
  }
  if (local)
    std::printf(
      "\nllama-server (../shared/PEERS.md; SmolLM2-135M Q8_0, --parallel 8 -t 2, max_tokens 64, same machine "
      "type, another run): one at a time ~110 tok/s; 32 concurrent 206 tok/s (1.85x), median latency 7.2 "
      "s.\n");

  // Shared system prompt: prefill time saved by the prefix cache.
  if (*sys_n > 0) {
    const int tail = 16, n = 8;
    std::vector<int32_t> sys_text;
    if (tok.bos_id() >= 0 && tok.add_bos()) sys_text.push_back(tok.bos_id());
    sys_text.insert(sys_text.end(), text.begin(),
                    text.begin() + std::min<size_t>(text.size(), (size_t)*sys_n * 2 + 64 * tail));
    double on = 0, off = 0;
    auto t_on = PrefixTtft(ep, sys_text, (int)*sys_n, tail, n);
    if (!t_on.ok()) return Fail("bench serve", t_on.status());
    on = *t_on;
    if (local) {
      local.reset();
      serve::EngineConfig off_cfg = ec;
      off_cfg.prefix_caching = false;
      auto s = StartLocal(**lm, pool, off_cfg, nullptr, args.On("int8-prompt"));
      if (!s.ok()) return Fail("bench serve", s.status());
      local = std::move(*s);
      ep.port = local->http->port();
      (void)StreamCompletion(ep, all[0].prompt, 4);
      auto t_off = PrefixTtft(ep, sys_text, (int)*sys_n, tail, n);
      if (!t_off.ok()) return Fail("bench serve", t_off.status());
      off = *t_off;
      std::printf(
          "\nshared %lld-token system prompt + %d distinct tokens, 1 output token, %d requests one at a "
          "time: TTFT "
          "%.1f ms with the prefix cache vs %.1f ms without: %.1f ms (%.0f%%) of prefill saved per request "
          "(%.1fx)\n",
          (long long)*sys_n, tail, n, 1e3 * on, 1e3 * off, 1e3 * (off - on), 100 * (off - on) / off,
          off / on);
    } else {
      std::printf(
          "\nshared %lld-token system prompt + %d distinct tokens: TTFT %.1f ms (prefix cache as configured "
          "on the "
          "server)\n",
          (long long)*sys_n, tail, 1e3 * on);
    }
  }
  for (const auto& r : results)
    if (r.failed) return 1;
  return 0;
}

}  // namespace lathe::cli
