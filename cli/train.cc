// `lathe train CONFIG.yaml [--key value ...]`: fine-tuning with LLaMA-Factory's config keys.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "monitor/progress.h"
#include "train/train_config.h"
#include "train/train_run.h"

namespace lathe::cli {

namespace {

void PrintTrainHelp() {
  std::printf(
      "usage: lathe train CONFIG.yaml [--key value ...] [-t THREADS] [--tokenizer PATH]\n\n"
      "Fine-tunes a model (LoRA, full or freeze) with LLaMA-Factory's config keys. Any key can be given\n"
      "or overridden on the command line as --key value (or --key=value; a bare --flag means true).\n"
      "See docs/training.md and examples/.\n\n"
      "options:\n"
      "  -t, --threads N     threads (default %d)\n"
      "  --tokenizer PATH    tokenizer file overriding the model's\n"
      "  --monitor           print per-category memory (current / peak) and RSS at every logging step\n"
      "  --profile FILE      write a Chrome trace of the training ops to FILE, top ops at exit\n"
      "  -h, --help          this help\n\n"
      "config keys:\n",
      DefaultThreadCount());
  std::vector<std::string> keys = train::TrainConfigKeys();
  std::string line = " ";
  for (const std::string& k : keys) {
    if (line.size() + k.size() + 1 > 100) {
      std::printf("%s\n", line.c_str());
      line = " ";
    }
    line += " " + k;
  }
  std::printf("%s\n", line.c_str());
}

}  // namespace

int RunTrain(int argc, char** argv) {
  std::string config_path, tokenizer, profile;
  bool monitor_memory = false;
  int threads = DefaultThreadCount();
  std::vector<std::pair<std::string, std::string>> overrides;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      PrintTrainHelp();
      return 0;
    }
    if (a.rfind("-", 0) != 0) {
      if (!config_path.empty()) {
        return Fail("train", Status::Error("unexpected argument '" + a +
                                           "' (one CONFIG.yaml, then --key value pairs)"));
      }
      config_path = a;
      continue;
    }
    std::string key = a, value;
    size_t eq = a.find('=');
    if (eq != std::string::npos) {
      key = a.substr(0, eq);
      value = a.substr(eq + 1);
    } else if (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) {
      value = argv[++i];
    } else {
      value = "true";  // a bare flag
    }
    if (key == "-t" || key == "--threads") {
      char* end = nullptr;
      long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end || n < 1)
        return Fail("train", Status::Error("--threads: '" + value + "' is not a positive integer"));
      threads = (int)n;
    } else if (key == "--tokenizer") {
      tokenizer = value;
    } else if (key == "--monitor") {
      if (value != "true" && value != "false")
        return Fail("train",
                    Status::Error("--monitor: expected no value (or true/false), got '" + value + "'"));
      monitor_memory = value == "true";
    } else if (key == "--profile") {
      if (value.empty() || value == "true")
        return Fail("train", Status::Error("--profile: expected an output FILE (Chrome trace JSON)"));
      profile = value;
    } else {
      overrides.push_back({key, value});
    }
  }
  if (config_path.empty()) {
    return Fail("train",
                Status::Error("no config given: lathe train CONFIG.yaml [--key value ...] (see --help)"));
  }
  auto text = ReadFileToString(config_path);
  if (!text.ok()) return Fail("train", text.status());
  auto config = train::ParseTrainConfig(*text, config_path);
  if (!config.ok()) return Fail("train", config.status());
  Status st = train::ApplyOverrides(&*config, overrides);
  if (!st.ok()) return Fail("train", st);
  train::RunOptions opts;
  opts.threads = threads;
  opts.tokenizer_path = tokenizer;
  opts.log = stderr;
  opts.interactive = monitor::ProgressBar::IsTerminal(stderr);
  opts.monitor = monitor_memory;
  opts.profile_path = profile;
  auto summary = train::RunTraining(*config, opts);
  if (!summary.ok()) return Fail("train", summary.status());
  return 0;
}

}  // namespace lathe::cli
