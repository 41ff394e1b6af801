// Mistral's v3 instruct format against mistral_common (Mistral's own request encoder): each OpenAI chat request of
// tests/golden/fixtures/mistral_v3/cases.json (tools/ref/make_mistral_fixture.py), parsed as `lathe serve` parses it
// for a mistral-v3 model (ToolFormat::kMistral: tools, calls and results included), rendered by the mistral-v3 chat
// template and tokenized with Mistral-7B-Instruct-v0.3's tokenizer.model, gives the token ids mistral_common gives.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cctype>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "random_model.h"
#include "serve/engine.h"
#include "server/http_server.h"
#include "server/openai_api.h"
#include "sharegpt_util.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "train/dataset.h"

namespace lathe {
namespace {

nlohmann::ordered_json MistralFixture() {
  std::ifstream f(lathe::testing::SourceDir() + "/tests/golden/fixtures/mistral_v3/cases.json");
  EXPECT_TRUE(f.good());
  return nlohmann::ordered_json::parse(f);
}

TEST(MistralV3Golden, RequestsTokenizeAsMistralCommonEncodesThem) {
  const std::string path = lathe::testing::MistralV3TokenizerPath();
  LATHE_REQUIRE_FILE(path);
  auto tok = tokenizer::Tokenizer::FromSentencePieceModel(path);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  auto tmpl = tokenizer::ChatTemplate::ByName("mistral-v3");
  ASSERT_TRUE(tmpl.ok());
  const auto fixture = MistralFixture();
  ASSERT_GE(fixture["cases"].size(), 10u);
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["name"].get<std::string>();
    const nlohmann::ordered_json& body = c["request"];
    server::CompletionRequest r;
    auto err = server::ParseCompletionRequest(nlohmann::json::parse(body.dump()), /*chat=*/true, &r, &body,
                                              server::ToolFormatFor(*tmpl));
    ASSERT_FALSE(err) << name << ": " << err->message;
    const std::string text = tmpl->Apply(server::PromptMessages(r, *tmpl), /*add_generation_prompt=*/true);
    ASSERT_TRUE(tmpl->text_has_bos());
    const std::vector<int32_t> ids = (*tok)->Encode(text, /*add_bos=*/false, /*parse_special=*/true);
    const std::vector<int32_t> want = c["tokens"].get<std::vector<int32_t>>();
    EXPECT_EQ(ids, want) << name << "\nours:   " << text << "\ntheirs: " << c["text"].get<std::string>();
  }
}

// Training on tool data: LLaMA-Factory sharegpt records (function_call / observation turns, tools), loaded as
// `lathe train` loads them for a mistral-v3 model, tokenize to the ids mistral_common's fine-tuning mode gives the
// same conversation (system prompt and tools before the last user turn, ids on every call and result), and the
// labels are the assistant turns: replies and calls with their </s>, nothing of the results.
TEST(MistralV3Golden, SharegptToolDataTokenizesAsMistralCommonFinetuning) {
  const std::string path = lathe::testing::MistralV3TokenizerPath();
  LATHE_REQUIRE_FILE(path);
  auto tok = tokenizer::Tokenizer::FromSentencePieceModel(path);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  auto tmpl = tokenizer::ChatTemplate::ByName("mistral-v3");
  ASSERT_TRUE(tmpl.ok());
  const auto fixture = MistralFixture();
  const auto& cases = fixture["training"];
  ASSERT_GE(cases.size(), 3u);
  lathe::testing::ScopedTempDir dir;
  nlohmann::ordered_json records = nlohmann::ordered_json::array();
  for (const auto& c : cases) records.push_back(c["record"]);
  auto examples = lathe::testing::LoadSharegptRecords(dir.path, records);
  ASSERT_TRUE(examples.ok()) << examples.status().message();
  ASSERT_EQ(examples->size(), cases.size());
  const int32_t results = (*tok)->Encode("[TOOL_RESULTS]", false, true).at(0);
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string name = cases[i]["name"].get<std::string>();
    bool truncated = false;
    auto s = train::EncodeConversation((*examples)[i], **tok, *tmpl, 4096, false, false, &truncated);
    ASSERT_TRUE(s.ok()) << name << ": " << s.status().message();
    EXPECT_EQ(s->input_ids, cases[i]["tokens"].get<std::vector<int32_t>>()) << name << "\ntheirs: " << cases[i]["text"];
    // Targets: every token from an assistant turn's start to its </s>; never a result's.
    ASSERT_EQ(s->labels.size(), s->input_ids.size());
    EXPECT_EQ(s->labels.back(), (*tok)->eos_id()) << name;
    for (size_t t = 0; t < s->input_ids.size(); ++t) {
      if (s->input_ids[t] == results) {
        EXPECT_EQ(s->labels[t], train::kIgnoreIndex) << name << " token " << t;
      }
    }
    EXPECT_GT(s->target_tokens(), 10) << name;
  }
}

// The grammar of tool_choice "auto" starts at the [TOOL_CALLS] control token: its id in the v3 vocabulary is 5.
// A tokenizer without it (SmolLM2's) refuses the request, naming "tools".
TEST(MistralV3Golden, ToolCallsTriggerIsTheControlToken) {
  const std::string path = lathe::testing::MistralV3TokenizerPath();
  LATHE_REQUIRE_FILE(path);
  auto tok = tokenizer::Tokenizer::FromSentencePieceModel(path);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const auto body = nlohmann::json::parse(R"({"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type":
      "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}]})");
  server::CompletionRequest r;
  ASSERT_FALSE(server::ParseCompletionRequest(body, true, &r, nullptr, server::ToolFormat::kMistral));
  ASSERT_FALSE(server::ResolveTriggerToken(**tok, &r));
  EXPECT_EQ(r.sampling.grammar_trigger_token, 5);
  // The llama2 tokenizer has no [TOOL_CALLS].
  auto llama = tokenizer::Tokenizer::FromSentencePieceModel(lathe::testing::SharedPath("models/llama2-tokenizer/tokenizer.model"));
  ASSERT_TRUE(llama.ok()) << llama.status().message();
  server::CompletionRequest r2;
  ASSERT_FALSE(server::ParseCompletionRequest(body, true, &r2, nullptr, server::ToolFormat::kMistral));
  auto e = server::ResolveTriggerToken(**llama, &r2);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "tools");
}

// A v3 model's jinja (it lists [AVAILABLE_TOOLS]) is detected as mistral-v3, which gives kMistral tool calls; the
// v0.1 template stays "mistral".
TEST(MistralV3Golden, DetectedFromTheJinja) {
  EXPECT_EQ(tokenizer::ChatTemplate::Detect("{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]"
                                            "{% endfor %}")
                .name(),
            "mistral");
  const auto v3 = tokenizer::ChatTemplate::Detect(
      "{%- if tools %}[AVAILABLE_TOOLS] {{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST] {{ m.content }}[/INST]");
  EXPECT_EQ(v3.name(), "mistral-v3");
  EXPECT_EQ(server::ToolFormatFor(v3), server::ToolFormat::kMistral);
}

// The whole path in `lathe serve`, in-process: a random model on the v3 vocabulary with the mistral-v3 template.
// logit_bias makes the model write [TOOL_CALLS]; the grammar that starts there must then give a call of a listed
// tool with its parameters (one: parallel_tool_calls false; a random model left free calls until max_tokens), read
// back as an OpenAI tool call with a Mistral id, the same streamed or not.
TEST(MistralV3Golden, ServerAnswersWithToolCalls) {
  const std::string path = lathe::testing::MistralV3TokenizerPath();
  LATHE_REQUIRE_FILE(path);
  auto tok = tokenizer::Tokenizer::FromSentencePieceModel(path);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  model::ModelConfig c = lathe::testing::SmallLlamaConfig(2, 64, 4, 2, 16, 128, (*tok)->vocab_size());
  c.max_seq_len = 1024;
  const model::ModelWeights w = lathe::testing::RandomModelWeights(c, 5);
  ThreadPool pool(2);
  serve::EngineConfig ec;
  ec.n_blocks = 128;
  ec.max_model_len = 1024;
  serve::Engine engine(w, pool, ec);
  engine.Start();
  server::ServerOptions so;
  so.port = 0;
  so.model_name = "m";
  auto tmpl = tokenizer::ChatTemplate::ByName("mistral-v3");
  ASSERT_TRUE(tmpl.ok());
  server::HttpServer http(engine, **tok, *tmpl, so);
  std::thread th([&] { EXPECT_TRUE(http.Run().ok()); });
  for (int i = 0; i < 500 && !http.listening(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(http.listening());
  httplib::Client client("127.0.0.1", http.port());
  client.set_read_timeout(120, 0);
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "get_weather", "parameters":
      {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "unit": {"enum": ["c", "f"]}},
      "required": ["city", "unit"]}}}, {"type": "function", "function": {"name": "ping"}}])";
  const std::string req = R"({"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}],
      "temperature": 0, "max_tokens": 200, "logit_bias": {"5": 100}, "parallel_tool_calls": false, )" + tools;
  auto check_calls = [](const nlohmann::json& calls) {
    ASSERT_TRUE(calls.is_array());
    ASSERT_EQ(calls.size(), 1u);
    for (const auto& call : calls) {
      const std::string id = call["id"];
      EXPECT_EQ(id.size(), 9u) << id;
      for (char ch : id) EXPECT_TRUE(std::isalnum((unsigned char)ch)) << id;
      const std::string name = call["function"]["name"];
      const auto args = nlohmann::json::parse(call["function"]["arguments"].get<std::string>());
      ASSERT_TRUE(args.is_object());
      if (name == "get_weather") {
        EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Oslo") << args.dump();
        EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << args.dump();
      } else {
        EXPECT_EQ(name, "ping");
      }
    }
  };
  auto r = client.Post("/v1/chat/completions", req + "}", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const auto j = nlohmann::json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << r->body;
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_null()) << r->body;
  check_calls(j["choices"][0]["message"]["tool_calls"]);
  // Streamed: the same calls, each a first delta with its id and name, then pieces of its arguments.
  auto s = client.Post("/v1/chat/completions", req + R"(, "stream": true})", "application/json");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200);
  nlohmann::json streamed = nlohmann::json::array();
  std::string finish;
  for (size_t at = 0; (at = s->body.find("data: {", at)) != std::string::npos;) {
    const size_t end = s->body.find("\n\n", at);
    const auto chunk = nlohmann::json::parse(s->body.substr(at + 6, end - at - 6));
    const auto& ch = chunk["choices"][0];
    if (ch["delta"].contains("tool_calls"))
      for (const auto& t : ch["delta"]["tool_calls"]) streamed.push_back(t);
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    at = end;
  }
  EXPECT_EQ(finish, "tool_calls");
  nlohmann::json joined = nlohmann::json::array();
  for (const auto& t : streamed) {
    if (t.contains("id")) {
      EXPECT_EQ(t["index"], (int)joined.size());
      joined.push_back(t);
    } else {
      ASSERT_FALSE(joined.empty());
      EXPECT_EQ(t["index"], (int)joined.size() - 1);
      EXPECT_FALSE(t["function"].contains("name"));
      joined.back()["function"]["arguments"] =
          joined.back()["function"]["arguments"].get<std::string>() + t["function"]["arguments"].get<std::string>();
    }
  }
  EXPECT_GT(streamed.size(), joined.size());
  ASSERT_EQ(joined.size(), j["choices"][0]["message"]["tool_calls"].size());
  for (size_t i = 0; i < joined.size(); ++i) {
    EXPECT_EQ(joined[i]["function"], j["choices"][0]["message"]["tool_calls"][i]["function"]);
  }
  // Kept from [TOOL_CALLS], the model writes content.
  r = client.Post("/v1/chat/completions",
                  R"({"model": "m", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 6,
                      "logit_bias": {"5": -100, "2": -100}, )" + tools + "}",
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const auto k = nlohmann::json::parse(r->body);
  EXPECT_EQ(k["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(k["choices"][0]["message"].contains("tool_calls"));
  http.Stop();
  th.join();
  engine.Stop();
}

}  // namespace
}  // namespace lathe
