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
    {"info", lathe::cli::RunInfo, "show a model's architecture, parameter count, dtypes and memory"},
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
