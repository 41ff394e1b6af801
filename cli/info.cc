// `lathe info MODEL`: architecture, parameter count, dtypes and memory of a model.
#include <cstdio>
#include <map>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "tokenizer/chat_template.h"

namespace lathe::cli {

int RunInfo(int argc, char** argv) {
  Args args("info", "lathe info MODEL");
  args.Flag("--tokenizer", "tokenizer file overriding the model's");
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return Fail("info", st);
  if (args.help_requested() || args.positional().size() != 1) {
    std::printf("%s", args.Help().c_str());
    return args.help_requested() ? 0 : 1;
  }
  model::LoadOptions opts;
  opts.tokenizer_path = args.Get("tokenizer");
  auto lm = model::LoadModel(args.positional()[0], opts);
  if (!lm.ok()) return Fail("info", lm.status());
  const model::ModelWeights& w = (*lm)->weights;
  const model::ModelConfig& c = w.config;
  std::map<std::string, std::pair<int64_t, double>> by_dtype;  // params, bytes
  auto add = [&](const Tensor& t) {
    if (!t.data) return;
    auto& e = by_dtype[DTypeName(t.dtype)];
    e.first += t.numel();
    e.second += (double)t.nbytes();
  };
  add(w.tok_embd);
  if (!c.tied_embeddings) add(w.output);
  add(w.output_norm);
  for (const auto& l : w.layers) {
    for (const Tensor* t : l.All()) {
      add(*t);
    }
  }
  int64_t params = 0;
  double bytes = 0;
  for (auto& [k, v] : by_dtype) {
    params += v.first;
    bytes += v.second;
  }
  std::printf("model:        %s (%s)\n", (*lm)->path.c_str(), (*lm)->format.c_str());
  std::printf("architecture: %s\n", c.Summary().c_str());
  std::printf("context:      %lld tokens, rms eps %g\n", (long long)c.max_seq_len, c.norm_eps);
  std::printf("parameters:   %lld (%.1fM)\n", (long long)params, params / 1e6);
  std::printf("weights:      %.1f MB\n", bytes / 1e6);
  for (auto& [k, v] : by_dtype) {
    std::printf("  %-5s %12lld params %9.1f MB (%.3f bytes/param)\n", k.c_str(), (long long)v.first, v.second / 1e6,
                v.second / v.first);
  }
  double kv_per_token = (double)c.n_layers * 2 * c.kv_dim() * sizeof(float);
  std::printf("KV cache:     %.1f KB per token (f32); %.1f MB for the full %lld-token context\n", kv_per_token / 1e3,
              kv_per_token * c.max_seq_len / 1e6, (long long)c.max_seq_len);
  const tokenizer::Tokenizer& tok = *(*lm)->tokenizer;
  std::printf("tokenizer:    %s, %d tokens, bos %d, eos %d, chat template %s\n", tok.kind(), tok.vocab_size(),
              tok.bos_id(), tok.eos_id(),
              tok.chat_template().empty() ? "none" : tokenizer::ChatTemplate::Detect(tok.chat_template()).name().c_str());
  return 0;
}

}  // namespace lathe::cli
