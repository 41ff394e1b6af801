// `lathe eval`: perplexity of a model on a text file (documents split by a separator).
#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/mapped_file.h"
#include "tools/eval.h"

namespace lathe::cli {

int RunEval(int argc, char** argv) {
  Args args("eval", "lathe eval -m MODEL --text FILE [--separator '<|endoftext|>'] [-c 512] [--json]");
  AddModelFlags(args);
  args.Flag("--text", "text file to score");
  args.Flag("--separator", "document separator in the file", "<|endoftext|>");
  args.Flag("-c,--ctx-size", "tokens per document (longer ones are cut)", "512");
  args.Flag("--max-docs", "score at most this many documents (0 = all)", "0");
  args.Flag("--kv-cache-dtype",
            "KV cache element type: f32 (the default: exact scores), f16, bf16, or auto (what generate / serve "
            "take: the model's own for f32 and bf16 models, else f16), to measure a 16-bit cache's cost",
            "f32");
  AddInt8PromptFlag(args);
  args.Bool("--json", "print a JSON line");
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return Fail("eval", st);
  if (args.help_requested()) {
    std::printf("%s", args.Help().c_str());
    return 0;
  }
  if (!args.Has("text")) return Fail("eval", Status::Error("pass --text FILE"));
  auto ctx = args.Int("ctx-size");
  auto max_docs = args.Int("max-docs");
  if (!ctx.ok() || *ctx < 2) return Fail("eval", Status::Error("--ctx-size must be an integer >= 2"));
  if (!max_docs.ok() || *max_docs < 0) return Fail("eval", Status::Error("--max-docs must be a non-negative integer"));
  auto text = ReadFileToString(args.Get("text"));
  if (!text.ok()) return Fail("eval", text.status());
  if (Status kst = CheckKvCacheDTypeFlag(args); !kst.ok()) return Fail("eval", kst);
  auto lm = LoadModelFromArgs(args);
  if (!lm.ok()) return Fail("eval", lm.status());
  auto kvt = KvCacheDTypeFromArgs(args, (*lm)->weights);
  if (!kvt.ok()) return Fail("eval", kvt.status());
  std::vector<std::string> docs = tools::SplitDocuments(*text, args.Get("separator"));
  if (*max_docs > 0 && (int64_t)docs.size() > *max_docs) docs.resize(*max_docs);
  ThreadPool pool(ThreadsFromArgs(args));
  model::TransformerOptions topts;
  topts.adapter = (*lm)->adapter.get();
  topts.int8_prompt_rows = args.On("int8-prompt");
  model::Transformer tf((*lm)->weights, pool, topts);
  auto t0 = std::chrono::steady_clock::now();
  auto r = tools::EvaluateNll(tf, *(*lm)->tokenizer, docs, *ctx, /*batch_tokens=*/2048, *kvt);
  if (!r.ok()) return Fail("eval", r.status());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (args.On("json")) {
    std::printf("{\"documents\": %lld, \"tokens\": %lld, \"mean_nll\": %.6f, \"perplexity\": %.6f, \"bits_per_byte\": %.6f}\n",
                (long long)r->documents, (long long)r->tokens, r->mean_nll(), r->perplexity(), r->bits_per_byte());
  } else {
    std::printf("documents %lld, tokens %lld: mean NLL %.4f nats/token, perplexity %.4f, %.4f bits/byte (%.1f tok/s)\n",
                (long long)r->documents, (long long)r->tokens, r->mean_nll(), r->perplexity(), r->bits_per_byte(),
                r->tokens / secs);
  }
  return 0;
}

}  // namespace lathe::cli
