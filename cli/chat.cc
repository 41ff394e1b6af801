// `lathe chat`: an interactive conversation that streams the reply and keeps the history (the
// KV cache is reused for the part of the conversation that did not change).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/sampling_flags.h"
#include "model/transformer.h"
#include "serve/generate.h"
#include "tokenizer/chat_template.h"

namespace lathe::cli {

int RunChat(int argc, char** argv) {
  Args args("chat", "lathe chat -m MODEL [--system TEXT] [--template NAME]");
  AddModelFlags(args);
  args.Flag("--system", "system message");
  args.Flag("--template", "chat template overriding the model's: a name (chatml, llama3, llama2, mistral, mistral-v3, alpaca, deepseek-r1) or a "
            "jinja file (its format detected from its markers)");
  args.Flag("-n,--n-predict", "maximum tokens per reply", "512");
  args.Flag("-c,--ctx-size", "context length", "4096");
  AddKvCacheDTypeFlag(args);
  args.Bool("--verbose", "after each reply, print prompt size, cache reuse and speed to stderr");
  AddSamplingFlags(args);
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return Fail("chat", st);
  if (args.help_requested()) {
    std::printf("%s\nType a message and press Enter; /reset clears the history, /exit (or EOF) quits.\n",
                args.Help().c_str());
    return 0;
  }
  auto sampling = SamplingFromArgs(args);
  if (!sampling.ok()) return Fail("chat", sampling.status());
  auto n_predict = args.Int("n-predict");
  auto ctx = args.Int("ctx-size");
  if (!n_predict.ok() || !ctx.ok() || *n_predict <= 0 || *ctx <= 0) {
    return Fail("chat", Status::Error("--n-predict and --ctx-size must be positive integers"));
  }
  if (Status kst = CheckKvCacheDTypeFlag(args); !kst.ok()) return Fail("chat", kst);
  auto lm = LoadModelFromArgs(args);
  if (!lm.ok()) return Fail("chat", lm.status());
  auto kvt = KvCacheDTypeFromArgs(args, (*lm)->weights);
  if (!kvt.ok()) return Fail("chat", kvt.status());
  const tokenizer::Tokenizer& tok = *(*lm)->tokenizer;
  if (Status gst = GrammarFromArgs(args, tok, &*sampling); !gst.ok()) return Fail("chat", gst);
  tokenizer::ChatTemplate tmpl = tokenizer::ChatTemplate::Detect(tok.chat_template());
  if (args.Has("template")) {
    auto t = tokenizer::ChatTemplate::FromFlag("--template", args.Get("template"));
    if (!t.ok()) return Fail("chat", t.status());
    tmpl = *t;
  }
  ThreadPool pool(ThreadsFromArgs(args));
  model::TransformerOptions topts;
  topts.adapter = (*lm)->adapter.get();
  model::Transformer tf((*lm)->weights, pool, topts);
  model::KvCache cache(tf.config(), 1, *ctx, 16, *kvt);
  std::vector<int32_t> cached;  // tokens whose K/V are in the cache
  std::vector<tokenizer::ChatMessage> history;
  if (args.Has("system")) history.push_back({"system", args.Get("system")});
  const bool tty = isatty(0);
  if (tty) std::fprintf(stderr, "lathe chat: %s (template %s). /reset clears, /exit quits.\n",
                        (*lm)->path.c_str(), tmpl.name().c_str());
  std::string line;
  for (;;) {
    if (tty) std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      history.resize(args.Has("system") ? 1 : 0);
      continue;
    }
    if (line.empty()) continue;
    history.push_back({"user", line});
    std::string prompt = tmpl.Apply(history, true);
    std::vector<int32_t> ids = tok.Encode(prompt, tok.add_bos() && !tmpl.text_has_bos(), true);
    // Reuse the cached prefix.
    size_t common = 0;
    while (common < cached.size() && common < ids.size() && cached[common] == ids[common]) ++common;
    cache.Truncate(0, (int64_t)common);
    int64_t room = *ctx - (int64_t)ids.size();
    if (room <= 0) {
      std::fprintf(stderr, "lathe chat: the conversation (%zu tokens) fills the context (%lld); /reset to start over\n",
                   ids.size(), (long long)*ctx);
      history.pop_back();
      continue;
    }
    serve::GenerateOptions opts;
    opts.max_tokens = (int)std::min<int64_t>(*n_predict, room);
    opts.sampling = *sampling;
    opts.stop = tmpl.StopStrings();
    auto res = serve::Generate(tf, cache, 0, tok, ids, opts, [](const std::string& piece) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::printf("\n");
    std::fflush(stdout);
    if (!res.ok()) return Fail("chat", res.status());
    if (args.On("verbose")) {
      std::fprintf(stderr, "[turn %zu: prompt %zu tokens, %zu reused from the KV cache; %zu generated at %.1f tok/s]\n",
                   (history.size() + 1) / 2, ids.size(), common, res->ids.size(),
                   res->ids.size() > 1 ? (res->ids.size() - 1) / res->decode_seconds : 0.0);
    }
    cached = ids;
    if (!res->ids.empty()) cached.insert(cached.end(), res->ids.begin(), res->ids.end() - 1);
    history.push_back({"assistant", res->text});
  }
  return 0;
}

}  // namespace lathe::cli
