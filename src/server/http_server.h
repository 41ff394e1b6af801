// The OpenAI-compatible HTTP server: /v1/completions and /v1/chat/completions (JSON or SSE
// streaming), /v1/models, /health, /tokenize, /detokenize and Prometheus /metrics, on top of the
// serving Engine. HTTP via cpp-httplib; this is the only layer that speaks JSON over the wire.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "serve/engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace lathe::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string model_name = "lathe";
  std::string api_key;     // when set, requests need "Authorization: Bearer <key>"
  int http_threads = 128;  // each streaming response holds one
  // vLLM's --reasoning-parser ("qwen3", or "" for none): chat replies' <think> blocks go to reasoning_content.
  std::string reasoning_parser;
  // With a reasoning parser, grammars (structured outputs, tool calls) start after the think block, as vLLM's; true:
  // they constrain the whole reply (vLLM's structured_outputs_config.enable_in_reasoning).
  bool structured_outputs_in_reasoning = false;
  // LoRA adapters served beside the base model, chosen per request by "model" (not owned; they
  // must outlive the server). Requests of different adapters batch together in the engine.
  std::vector<std::pair<std::string, const model::LoraAdapter*>> adapters;
};

class HttpServer {
 public:
  // REQUIRES: engine, tokenizer and template outlive the server; the engine is started.
  HttpServer(serve::Engine& engine, const tokenizer::Tokenizer& tok, tokenizer::ChatTemplate tmpl,
             ServerOptions options);
  ~HttpServer();
  // Binds and serves until Stop() (blocking). Error if the address cannot be bound.
  Status Run();
  void Stop();
  // The bound port (useful with port 0) once listening.
  int port() const;
  // True once Run() has bound and accepts connections (thread-safe).
  bool listening() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lathe::server
