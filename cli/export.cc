// `lathe export CONFIG.yaml [--key value ...]`: LLaMA-Factory's export config (llamafactory-cli export), a LoRA merge.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "tools/export.h"

namespace lathe::cli {

namespace {

void PrintExportHelp() {
  std::printf(
      "usage: lathe export CONFIG.yaml [--key value ...] [-t THREADS]\n\n"
      "LLaMA-Factory's export config (what `llamafactory-cli export` reads): the adapter(s) of\n"
      "adapter_name_or_path merged into model_name_or_path and written to export_dir.\n\n"
      "keys:\n"
      "  model_name_or_path     base model: an HF folder (export_dir is an HF folder) or a GGUF (export_dir/model.gguf)\n"
      "  adapter_name_or_path   PEFT adapter folder(s), merged in order (finetuning_type lora)\n"
      "  finetuning_type        lora (default) | full | freeze (no adapter: the model rewritten as it is)\n"
      "  export_dir             output folder\n"
      "  export_size            GB per safetensors shard (default 5, as LLaMA-Factory)\n"
      "  infer_dtype            auto (as stored) | float32 | float16 | bfloat16\n"
      "  template, export_device, trust_remote_code: accepted (no effect here)\n"
      "  export_legacy_format: false only; export_quantization_bit: not available (use `lathe quantize` on a GGUF)\n\n"
      "options:\n"
      "  -t, --threads N        threads (default %d)\n"
      "  -h, --help             this help\n",
      DefaultThreadCount());
}

}  // namespace

int RunExport(int argc, char** argv) {
  auto split = SplitConfigArgs(argc, argv);
  if (!split.ok()) return Fail("export", split.status());
  if (split->help) {
    PrintExportHelp();
    return 0;
  }
  const std::string config_path = split->config_path;
  int threads = DefaultThreadCount();
  std::vector<std::pair<std::string, std::string>> overrides;
  for (const auto& [key, value] : split->pairs) {
    if (key == "-t" || key == "--threads") {
      auto n = ParseThreads(value);
      if (!n.ok()) return Fail("export", n.status());
      threads = *n;
    } else {
      overrides.push_back({key, value});
    }
  }
  if (config_path.empty()) return Fail("export", Status::Error("no config given: lathe export CONFIG.yaml (see --help)"));
  auto text = ReadFileToString(config_path);
  if (!text.ok()) return Fail("export", text.status());
  auto config = tools::ParseExportConfig(*text, config_path, overrides);
  if (!config.ok()) return Fail("export", config.status());
  ThreadPool pool(threads);
  std::string out;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = tools::RunExport(*config, pool, &out);
  if (!r.ok()) return Fail("export", r.status());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s (%s, %s): %lld linear weights merged from %zu adapter(s), %lld tensors, %.1f MB, %lld files, "
              "%.1f s\n",
              out.c_str(), r->format.c_str(), r->dtype.c_str(), (long long)r->merged,
              config->adapter_name_or_path.size(), (long long)r->tensors, r->bytes_out / 1e6, (long long)r->files, s);
  return 0;
}

}  // namespace lathe::cli
