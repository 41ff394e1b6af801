// The `lathe` binary: dispatches to one sub-command per file in cli/.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* help;
};

const Command kCommands[] = {
    {"generate", lathe::cli::RunGenerate, "complete a prompt"},
    {"chat", lathe::cli::RunChat, "interactive chat with a model (streams, keeps history)"},
    {"info", lathe::cli::RunInfo, "show a model's architecture, parameter count, dtypes and memory"},
    {"tokenize", lathe::cli::RunTokenize, "text -> token ids"},
    {"eval", lathe::cli::RunEval, "perplexity on a text file"},
    {"convert", lathe::cli::RunConvert, "rewrite a GGUF model in another type (f16, bf16, q8_0, q4_k_m, ... as llama-quantize)"},
    {"quantize", lathe::cli::RunQuantize, "IN.gguf OUT.gguf TYPE: the same, in llama-quantize's argument order"},
    {"merge", lathe::cli::RunMerge, "fold a LoRA adapter into its base model (GGUF -> GGUF, HF folder -> HF folder)"},
    {"export", lathe::cli::RunExport, "LLaMA-Factory's export config (llamafactory-cli export): merge adapters, reshard"},
    {"estimate", lathe::cli::RunEstimate, "predicted memory of a training or inference run"},
    {"serve", lathe::cli::RunServe, "OpenAI-compatible server: continuous batching, paged KV cache, multi-LoRA"},
    {"bench", lathe::cli::RunBench, "inference speed: prefill and decode tok/s, bandwidth"},
    {"train", lathe::cli::RunTrain, "fine-tune (LoRA, full, freeze) from a LLaMA-Factory-style YAML config"},
};

void PrintUsage() {
  std::printf("usage: lathe <command> [options]\n\ncommands:\n");
  for (const Command& c : kCommands) std::printf("  %-10s %s\n", c.name, c.help);
  std::printf("\n`lathe <command> --help` for a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    PrintUsage();
    return argc < 2 ? 1 : 0;
  }
  for (const Command& c : kCommands) {
    if (!std::strcmp(argv[1], c.name)) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "lathe: unknown command '%s'\n", argv[1]);
  PrintUsage();
  return 1;
}
