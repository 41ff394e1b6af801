// The HTTP server in-process on stories260K over loopback (cpp-httplib client): JSON and SSE
// completions agree, field-named 4xx errors, API key, a client that hangs up mid-stream cancels
// its request and frees its blocks. (tests/e2e/serve_test.sh does the same and more with the
// official openai client; this one runs without PyPI and under the sanitizers.)
#include "server/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "model/loader.h"
#include "test_util.h"

namespace lathe::server {
namespace {

using nlohmann::json;

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string path = lathe::testing::SharedPath("models/stories260K/stories260K.gguf");
    LATHE_REQUIRE_FILE(path);
    auto lm = model::LoadModel(path);
    ASSERT_TRUE(lm.ok()) << lm.status().message();
    lm_ = std::move(*lm);
    pool_ = std::make_unique<ThreadPool>(2);
    serve::EngineConfig ec{512, 16, 256, 16, 1024};
    engine_ = std::make_unique<serve::Engine>(lm_->weights, *pool_, ec);
    engine_->Start();
    ServerOptions so;
    so.port = 0;
    so.model_name = "stories";
    so.api_key = "k";
    auto tmpl = tokenizer::ChatTemplate::ByName("chatml");
    ASSERT_TRUE(tmpl.ok());
    http_ = std::make_unique<HttpServer>(*engine_, *lm_->tokenizer, *tmpl, so);
    thread_ = std::thread([this] { EXPECT_TRUE(http_->Run().ok()); });
    for (int i = 0; i < 500 && !http_->listening(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(http_->listening());
    client_ = std::make_unique<httplib::Client>("127.0.0.1", http_->port());
    client_->set_read_timeout(60, 0);
    client_->set_default_headers({{"Authorization", "Bearer k"}});
  }
  void TearDown() override {
    if (http_) http_->Stop();
    if (thread_.joinable()) thread_.join();
    if (engine_) engine_->Stop();
  }
  std::pair<int, json> Post(const std::string& path, const std::string& body) {
    auto r = client_->Post(path.c_str(), body, "application/json");
    if (!r) return {-1, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

  std::unique_ptr<model::LoadedModel> lm_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<serve::Engine> engine_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<httplib::Client> client_;
  std::thread thread_;
};

TEST_F(HttpServerTest, CompletionJsonAndStreamAgree) {
  const std::string req =
      R"({"model": "stories", "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0,
                              "ignore_eos": true)";
  auto [st, j] = Post("/v1/completions", req + "}");
  ASSERT_EQ(st, 200) << j.dump();
  std::string text = j["choices"][0]["text"];
  EXPECT_EQ(j["usage"]["completion_tokens"], 20);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(text.empty());

  auto r = client_->Post("/v1/completions",
                         req + R"(, "stream": true, "stream_options": {"include_usage": true}})",
                         "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const std::string& sse = r->body;
  ASSERT_GE(sse.size(), 16u);
  EXPECT_EQ(sse.substr(sse.size() - 14), "data: [DONE]\n\n");
  std::string streamed;
  bool usage = false;
  for (size_t p = 0; (p = sse.find("data: {", p)) != std::string::npos;) {
    size_t e = sse.find("\n\n", p);
    json c = json::parse(sse.substr(p + 6, e - p - 6));
    if (!c["choices"].empty()) streamed += c["choices"][0]["text"].get<std::string>();
    if (c.contains("usage")) usage = c["usage"]["completion_tokens"] == 20;
    p = e;
  }
  EXPECT_EQ(streamed, text);
  EXPECT_TRUE(usage);

  // Chat through the template; /v1/models; /tokenize.
  auto [cst, cj] =
      Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})");
  ASSERT_EQ(cst, 200) << cj.dump();
  EXPECT_EQ(cj["choices"][0]["message"]["role"], "assistant");
  auto m = client_->Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(json::parse(m->body)["data"][0]["id"], "stories");
}

TEST_F(HttpServerTest, ErrorsNameTheField) {
  struct Case {
    const char* path;
    std::string body;
    int status;
    const char* param;
  } cases[] = {
      {"/v1/completions", "{oops", 400, nullptr},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": "many"})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 5000})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": ")" + std::string(6000, 'a') + " " + std::string(6000, 'b') + R"("})",
       400, "prompt"},
      {"/v1/completions", R"({"prompt": [1, 100000]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": "x", "model": "gpt-9"})", 404, "model"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": [{"type": 3}]}]})", 400,
       "messages[0].content"},
      {"/tokenize", R"({"prompt": "x", "add_special_tokens": "yes"})", 400, "add_special_tokens"},
      {"/detokenize", R"({"tokens": [-1]})", 400, "tokens"},
  };
  for (const Case& c : cases) {
    auto [st, j] = Post(c.path, c.body);
    EXPECT_EQ(st, c.status) << c.body.substr(0, 80) << " -> " << j.dump();
    ASSERT_TRUE(j.is_object() && j.contains("error")) << c.body.substr(0, 80);
    if (c.param) {
      EXPECT_EQ(j["error"]["param"], c.param) << j.dump();
    }
  }
  auto r = client_->Get("/v2/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_TRUE(json::parse(r->body, nullptr, false).contains("error"));
  httplib::Client anon("127.0.0.1", http_->port());
  auto a = anon.Post("/v1/completions", R"({"prompt": "x"})", "application/json");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->status, 401);
  EXPECT_EQ(engine_->stats().blocks_used, 0);
}

TEST_F(HttpServerTest, DisconnectMidStreamCancels) {
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = R"({"prompt": "Once upon a time", "max_tokens": 1000, "temperature": 0, "ignore_eos": true,
                 "stream": true})";
  req.set_header("Content-Type", "application/json");
  int events = 0;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    for (size_t i = 0; i + 1 < len; ++i) events += data[i] == '\n' && data[i + 1] == '\n';
    return events < 3;  // hang up after a few tokens
  };
  (void)client_->send(req);
  EXPECT_GE(events, 3);
  serve::EngineStats s;
  for (int i = 0; i < 500; ++i) {
    s = engine_->stats();
    if (s.blocks_used == 0 && s.running == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s.blocks_used, 0);
  EXPECT_EQ(s.running, 0);
  EXPECT_LT(s.generated_tokens, 1000);  // it was cut short, not run to the end
}

TEST_F(HttpServerTest, SurvivesMutatedBodies) {
  // Seeded byte-level mutations of valid requests: every answer is 200 or a 4xx JSON error.
  const std::string seeds[] = {
      R"({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.8, "seed": 3, "n": 2, "logprobs": 2,
          "stop": ["."], "echo": true})",
      R"({"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": [{"type": "text",
          "text": "Hi"}]}], "max_tokens": 6, "logprobs": true, "top_logprobs": 3, "top_k": 5, "min_p": 0.1})",
  };
  std::mt19937 rng(7);
  const char kBytes[] = "{}[]\":,0123456789-.eE truefalsnul\\\xff\x80";
  for (int i = 0; i < 300; ++i) {
    bool chat = i % 2;
    std::string b = seeds[chat];
    int edits = 1 + rng() % 4;
    for (int k = 0; k < edits && !b.empty(); ++k) {
      size_t pos = rng() % b.size();
      switch (rng() % 3) {
        case 0:
          b[pos] = kBytes[rng() % (sizeof(kBytes) - 1)];
          break;
        case 1:
          b.erase(pos, 1 + rng() % 8);
          break;
        default:
          b.insert(pos, 1, kBytes[rng() % (sizeof(kBytes) - 1)]);
      }
    }
    auto r = client_->Post(chat ? "/v1/chat/completions" : "/v1/completions", b, "application/json");
    ASSERT_TRUE(r) << "no answer to: " << b;
    EXPECT_TRUE(r->status == 200 || (r->status >= 400 && r->status < 500))
        << r->status << " for " << b << " -> " << r->body;
    if (r->status != 200) {
      json j = json::parse(r->body, nullptr, false);
      EXPECT_TRUE(j.is_object() && j.contains("error")) << r->body;
    }
  }
  serve::EngineStats s;
  for (int i = 0; i < 200 && (s = engine_->stats()).blocks_used != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s.blocks_used, 0);
}

}  // namespace
}  // namespace lathe::server
