// Shared sub-command helpers.
#include "cli/common.h"

#include <cstdlib>
#include <cstring>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/cpu.h"
#include "core/thread_pool.h"
#include "kernels/kernels.h"
#include "model/transformer.h"

namespace lathe::cli {

int Fail(const std::string& command, const Status& status) {
  std::fprintf(stderr, "lathe %s: %s\n", command.c_str(), status.message().c_str());
  return 1;
}

void AddModelFlags(Args& args) {
  args.Flag("-m,--model", "model: a .gguf file, an HF model directory, or a llama2.c .bin");
  args.Flag("--tokenizer", "tokenizer file overriding the model's (tokenizer.json, .model, llama2.c .bin)");
  args.Flag("-t,--threads", "threads", std::to_string(DefaultThreadCount()));
  args.Flag("--adapter", "PEFT LoRA adapter directory to apply (adapter_config.json + adapter_model.safetensors)");
}

Result<std::unique_ptr<model::LoadedModel>> LoadModelFromArgs(const Args& args) {
  std::string path = args.Get("model");
  if (path.empty()) return Status::Error("no model given: pass -m MODEL (a .gguf, an HF directory or a .bin)");
  model::LoadOptions opts;
  opts.tokenizer_path = args.Get("tokenizer");
  opts.adapter_path = args.Get("adapter");
  return model::LoadModel(path, opts);
}

void AddKvCacheDTypeFlag(Args& args) {
  args.Flag("--kv-cache-dtype",
            "KV cache element type: auto (the model's own for f32 and bf16 models, else f16: llama.cpp's default cache), f32 (exact), "
            "f16 or bf16 (half the memory and the attention's reads)",
            "auto");
}

void AddInt8PromptFlag(Args& args) {
  args.Bool("--int8-prompt",
            "prompt tokens of block-quantized weights on int8 activations, as generated tokens (llama.cpp's "
            "arithmetic: one pass over the weights per serving step, ~1.3x serving throughput at 32 streams); "
            "default: bf16 / int16 prompt activations");
}

Status CheckKvCacheDTypeFlag(const Args& args) {
  DType t;
  const std::string v = args.Get("kv-cache-dtype");
  if (v == "auto" || (ParseDType(v, &t) && model::IsKvCacheDType(t))) return Status::Ok();
  return Status::Error("--kv-cache-dtype '" + v + "': expected auto, f32, f16 or bf16");
}

Result<DType> KvCacheDTypeFromArgs(const Args& args, const model::ModelWeights& w) {
  if (Status st = CheckKvCacheDTypeFlag(args); !st.ok()) return st;
  const std::string v = args.Get("kv-cache-dtype");
  if (v == "auto") return model::DefaultKvCacheDType(w);
  DType t;
  ParseDType(v, &t);
  return t;
}

Status CheckPrefillTokensPerDecodeRowFlag(const Args& args) {
  if (args.Get("prefill-tokens-per-decode-row") == "auto") return Status::Ok();
  auto n = args.Int("prefill-tokens-per-decode-row");
  if (!n.ok() || *n < 0) return Status::Error("--prefill-tokens-per-decode-row must be a non-negative integer or auto");
  return Status::Ok();
}

Result<int64_t> PrefillTokensPerDecodeRowFromArgs(const Args& args, const model::ModelWeights& w) {
  if (Status st = CheckPrefillTokensPerDecodeRowFlag(args); !st.ok()) return st;
  if (args.Get("prefill-tokens-per-decode-row") == "auto") {
    if (w.layers.empty() || !UsesAmxBf16()) return kPromptTokensPerDecodeRow;
    const Tensor& t = w.layers[0].w_gate;
    const bool amx_rows = t.dtype == DType::kBF16 ||
                          (kernels::MatMulBf16Rounds(t) && !kernels::MatMulInt16Takes(t));
    return amx_rows ? kAmxPromptTokensPerDecodeRow : kPromptTokensPerDecodeRow;
  }
  auto n = args.Int("prefill-tokens-per-decode-row");
  return *n;
}

int ThreadsFromArgs(const Args& args) {
  auto n = args.Int("threads");
  return n.ok() && *n > 0 ? (int)*n : DefaultThreadCount();
}

std::string JsonString(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Result<ConfigArgs> SplitConfigArgs(int argc, char** argv) {
  ConfigArgs out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      out.help = true;
      continue;
    }
    if (a.rfind("-", 0) != 0) {
      if (!out.config_path.empty())
        return Status::Error("unexpected argument '" + a + "' (one CONFIG.yaml, then --key value pairs)");
      out.config_path = a;
      continue;
    }
    std::string key = a, value;
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      key = a.substr(0, eq);
      value = a.substr(eq + 1);
    } else if (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) {
      value = argv[++i];
    } else {
      value = "true";  // a bare flag
    }
    out.pairs.push_back({key, value});
  }
  return out;
}

Result<int> ParseThreads(const std::string& value) {
  char* end = nullptr;
  const long n = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end || n < 1 || n > 4096)
    return Status::Error("--threads: '" + value + "' is not a positive integer");
  return (int)n;
}

}  // namespace lathe::cli
