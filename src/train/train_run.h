// RunTraining: `lathe train` end to end from a TrainConfig — check the config and output_dir,
// load the model (GGUF, HF dir or llama2.c .bin) and its tokenizer, pick the chat template, build
// the datasets, create the TrainModel and run the Trainer.
#pragma once

#include <cstdio>
#include <string>

#include "core/status.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace lathe::train {

struct RunOptions {
  int threads = 1;
  std::string tokenizer_path;  // overrides the model's tokenizer (as --tokenizer elsewhere)
  FILE* log = stderr;
  bool interactive = false;  // progress line redrawn with \r
  bool monitor = false;      // per-category memory (current / peak) at every logging step
  std::string profile_path;  // non-empty: Chrome trace of the training ops + a top-ops table
};

Result<TrainSummary> RunTraining(const TrainConfig& config, const RunOptions& options);

}  // namespace lathe::train
