// `lathe tokenize`: text -> token ids with a model's (or a tokenizer file's) tokenizer.
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"

namespace lathe::cli {

int RunTokenize(int argc, char** argv) {
  Args args("tokenize", "lathe tokenize (-m MODEL | --tokenizer FILE) [--no-bos] [--json] TEXT");
  args.Flag("-m,--model", "model whose tokenizer to use (.gguf, HF directory, llama2.c .bin)");
  args.Flag("--tokenizer", "tokenizer file (tokenizer.json, tokenizer.model, llama2.c tokenizer .bin)");
  args.Bool("--no-bos", "do not prepend BOS");
  args.Bool("--no-special", "treat special-token text as plain text");
  args.Bool("--json", "print {\"ids\": [...]}");
  args.Bool("--pieces", "print each id with its piece");
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return Fail("tokenize", st);
  if (args.help_requested()) {
    std::printf("%s", args.Help().c_str());
    return 0;
  }
  if (args.positional().size() != 1) return Fail("tokenize", Status::Error("expected exactly one TEXT argument"));
  std::string path = args.Has("tokenizer") ? args.Get("tokenizer") : args.Get("model");
  if (path.empty()) return Fail("tokenize", Status::Error("pass -m MODEL or --tokenizer FILE"));
  auto tok = model::LoadTokenizer(path);
  if (!tok.ok()) return Fail("tokenize", tok.status());
  bool bos = !args.On("no-bos") && (*tok)->add_bos();
  std::vector<int32_t> ids = (*tok)->Encode(args.positional()[0], bos, !args.On("no-special"));
  if (args.On("pieces")) {
    for (int32_t id : ids) std::printf("%6d %s\n", id, JsonString((*tok)->Piece(id)).c_str());
    return 0;
  }
  std::string out = args.On("json") ? "{\"ids\": [" : "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  out += args.On("json") ? "]}\n" : "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace lathe::cli
