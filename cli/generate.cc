// `lathe generate`: complete a prompt (optionally wrapped in the model's chat template).
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/sampling_flags.h"
#include "model/transformer.h"
#include "serve/generate.h"
#include "tokenizer/chat_template.h"

namespace lathe::cli {

int RunGenerate(int argc, char** argv) {
  Args args("generate", "lathe generate -m MODEL -p TEXT [-n N] [--temp T] [--seed S] [--json]");
  AddModelFlags(args);
  args.Flag("-p,--prompt", "prompt text; \"\" starts from BOS alone", "");
  args.Flag("-n,--n-predict", "maximum tokens to generate", "128");
  args.Flag("-c,--ctx-size", "context length (prompt + generated); 0 = prompt + n-predict", "0");
  args.Flag("--stop", "stop string (repeatable)");
  AddKvCacheDTypeFlag(args);
  AddInt8PromptFlag(args);
  args.Bool("--chat", "wrap the prompt as a user message in the model's chat template");
  args.Flag("--system", "system message (with --chat)");
  args.Flag("--template", "chat template overriding the model's: a name (chatml, llama3, llama2, mistral, mistral-v3, alpaca, deepseek-r1) or a "
            "jinja file (its format detected from its markers)");
  args.Bool("--no-bos", "do not prepend BOS");
  args.Bool("--ignore-eos", "keep generating after end-of-sequence tokens");
  args.Bool("--json", "print one JSON line {prompt_ids, ids, text} instead of streaming text");
  args.Bool("--verbose", "print timings to stderr");
  args.Flag("--profile", "write a Chrome trace of every op to this file and print the top ops");
  args.Bool("--exact-activations", "f32 activations for quantized weights in decode (slower, exact)");
  AddSamplingFlags(args);
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return Fail("generate", st);
  if (args.help_requested()) {
    std::printf("%s", args.Help().c_str());
    return 0;
  }
  auto sampling = SamplingFromArgs(args);
  if (!sampling.ok()) return Fail("generate", sampling.status());
  auto n_predict = args.Int("n-predict");
  if (!n_predict.ok() || *n_predict < 0) return Fail("generate", Status::Error("--n-predict must be a non-negative integer"));
  if (Status kst = CheckKvCacheDTypeFlag(args); !kst.ok()) return Fail("generate", kst);
  auto lm = LoadModelFromArgs(args);
  if (!lm.ok()) return Fail("generate", lm.status());
  auto kvt = KvCacheDTypeFromArgs(args, (*lm)->weights);
  if (!kvt.ok()) return Fail("generate", kvt.status());
  const tokenizer::Tokenizer& tok = *(*lm)->tokenizer;
  if (Status gst = GrammarFromArgs(args, tok, &*sampling); !gst.ok()) return Fail("generate", gst);

  std::string prompt = args.Get("prompt");
  bool add_bos = !args.On("no-bos") && tok.add_bos();
  if (args.On("chat")) {
    tokenizer::ChatTemplate tmpl = tokenizer::ChatTemplate::Detect(tok.chat_template());
    if (args.Has("template")) {
      auto t = tokenizer::ChatTemplate::FromFlag("--template", args.Get("template"));
      if (!t.ok()) return Fail("generate", t.status());
      tmpl = *t;
    }
    std::vector<tokenizer::ChatMessage> msgs;
    if (args.Has("system")) msgs.push_back({"system", args.Get("system")});
    msgs.push_back({"user", prompt});
    prompt = tmpl.Apply(msgs, true);
    if (tmpl.text_has_bos()) add_bos = false;  // the rendered text starts with BOS already
  }
  std::vector<int32_t> ids = tok.Encode(prompt, add_bos, /*parse_special=*/true);
  if (ids.empty()) {
    if (tok.bos_id() < 0) return Fail("generate", Status::Error("empty prompt and the tokenizer has no BOS token"));
    ids.push_back(tok.bos_id());
  }
  auto ctx = args.Int("ctx-size");
  if (!ctx.ok()) return Fail("generate", ctx.status());
  int64_t max_len = *ctx > 0 ? *ctx : (int64_t)ids.size() + *n_predict;
  ThreadPool pool(ThreadsFromArgs(args));
  Profiler profiler;
  model::TransformerOptions topts;
  topts.exact_activations = args.On("exact-activations");
  topts.int8_prompt_rows = args.On("int8-prompt");
  topts.adapter = (*lm)->adapter.get();
  if (args.Has("profile")) {
    topts.profiler = &profiler;
    pool.SetProfiler(&profiler);
  }
  model::Transformer tf((*lm)->weights, pool, topts);
  model::KvCache cache(tf.config(), 1, max_len, 16, *kvt);
  serve::GenerateOptions opts;
  opts.max_tokens = (int)*n_predict;
  opts.sampling = *sampling;
  opts.stop = args.All("stop");
  opts.stop_at_eos = !args.On("ignore-eos");
  bool json = args.On("json");
  auto res = serve::Generate(tf, cache, 0, tok, ids, opts, [&](const std::string& piece) {
    if (!json) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  });
  if (!res.ok()) return Fail("generate", res.status());
  if (json) {
    std::string out = "{\"prompt_ids\": [";
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
    out += "], \"ids\": [";
    for (size_t i = 0; i < res->ids.size(); ++i) out += (i ? ", " : "") + std::to_string(res->ids[i]);
    out += "], \"text\": " + JsonString(res->text) + ", \"finish_reason\": " + JsonString(res->finish_reason) + "}\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  } else {
    std::printf("\n");
  }
  std::fflush(stdout);
  if (args.Has("profile")) {
    pool.SetProfiler(nullptr);
    Status ps = profiler.WriteChromeTrace(args.Get("profile"));
    if (!ps.ok()) return Fail("generate", ps);
    std::fprintf(stderr, "profile: %s (open in Perfetto or chrome://tracing)\n%s", args.Get("profile").c_str(),
                 profiler.Summary().c_str());
  }
  if (args.On("verbose")) {
    size_t n = res->ids.size();
    std::fprintf(stderr, "prompt: %lld tokens in %.3f s (%.1f tok/s); generated %zu tokens in %.3f s (%.1f tok/s)\n",
                 (long long)res->prompt_tokens, res->prefill_seconds, res->prompt_tokens / res->prefill_seconds, n,
                 res->decode_seconds, n > 1 ? (n - 1) / res->decode_seconds : 0.0);
  }
  return 0;
}

}  // namespace lathe::cli
