// `lathe info MODEL`: what a model file holds.
#include <cstdio>
#include <map>
#include <string>

#include "cli/commands.h"
#include "formats/gguf.h"

namespace lathe::cli {

int RunInfo(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: lathe info MODEL\n");
    return argc < 2 ? 1 : 0;
  }
  auto g = formats::GgufFile::Open(argv[1]);
  if (!g.ok()) {
    std::fprintf(stderr, "lathe info: %s\n", g.status().message().c_str());
    return 1;
  }
  std::map<std::string, int64_t> params_by_type;
  int64_t total = 0;
  uint64_t bytes = 0;
  for (const auto& t : (*g)->tensors()) {
    int64_t n = 1;
    for (int64_t d : t.ne) n *= d;
    params_by_type[formats::GgmlTypeName(t.ggml_type)] += n;
    total += n;
    bytes += t.nbytes;
  }
  std::printf("file: %s (GGUF v%u, %zu tensors)\n", argv[1], (*g)->version(), (*g)->tensors().size());
  std::printf("parameters: %lld (%.1f MB of weights)\n", (long long)total, bytes / 1e6);
  for (auto& [k, v] : params_by_type) std::printf("  %-6s %lld\n", k.c_str(), (long long)v);
  return 0;
}

}  // namespace lathe::cli
