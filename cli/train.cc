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
  auto split = SplitConfigArgs(argc, argv);
  if (!split.ok()) return Fail("train", split.status());
  if (split->help) {
    PrintTrainHelp();
    return 0;
  }
  config_path = split->config_path;
  for (const auto& [key, value] : split->pairs) {
    if (key == "-t" || key == "--threads") {
      auto n = ParseThreads(value);
      if (!n.ok()) return Fail("train", n.status());
      threads = *n;
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
