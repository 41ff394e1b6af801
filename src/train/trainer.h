// Trainer: the HF-Trainer-style loop over a TrainModel — seed-ordered epochs of padded
// micro-batches, exact gradient accumulation, clipping, AdamW/SGD with the LR schedule, periodic
// logging / eval / checkpoints — and the files LLaMA-Factory users expect in output_dir.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/lora.h"
#include "model/train_model.h"
#include "monitor/memory.h"
#include "monitor/progress.h"
#include "monitor/tensorboard.h"
#include "train/batching.h"
#include "train/dataset.h"
#include "train/memory_plan.h"
#include "train/optimizer.h"
#include "train/optimizer_bnb.h"  // MakeOptimizer
#include "train/train_config.h"
#include "train/train_outputs.h"

namespace lathe::train {

// Config checks the trainer adds on top of TrainConfig::Validate (before any model or data is
// loaded): optimizers, precisions and features not available here, each naming its key.
Status CheckTrainerConfig(const TrainConfig& config);

// lora_target ("all", or names such as q_proj,v_proj / q,v) -> modules. Errors name the key.
Result<std::vector<model::LoraModule>> ParseLoraTargets(const std::vector<std::string>& names);


// Everything the loop needs besides the config and the model.
struct TrainerEnv {
  std::string base_model_name;  // adapter_config.json base_model_name_or_path
  // Tokenizer files copied beside the weights: (source path, name), see TokenizerFiles().
  std::vector<std::pair<std::string, std::string>> tokenizer_files;
  // Tokenizer files written beside the weights: (name, contents), made from a GGUF base's vocabulary
  // (tokenizer::HfTokenizerFilesFromGguf) when it has no files to copy.
  std::vector<std::pair<std::string, std::string>> tokenizer_texts;
  int32_t pad_id = 0;        // input id of padded positions (their labels are ignored)
  int64_t flops_params = 0;  // parameters counted in total_flos (6 * params * tokens)
  FILE* log = stderr;        // progress bar and log lines; nullptr = silent
  bool interactive = false;  // redraw a progress line with \r (stderr is a terminal)
  // Memory: the run's plan (logged at start, compared with the peak RSS at the end), the bytes of
  // the base weights (the tracker's "weights" besides the model's masters), and --monitor.
  const MemoryPlan* memory_plan = nullptr;
  double base_weight_bytes = 0;
  bool monitor = false;
  ThreadPool* pool = nullptr;  // the optimizer's elementwise updates run on it (the model's pool)
  // The model's TrainModelOptions::hand_back_pages: ZeroGrad after each step hands the gradients'
  // pages back (else zeroes them in place, except before a save, whose copy the plan lets reuse them).
  bool hand_back_pages = true;
};

struct TrainSummary {
  int64_t global_step = 0;
  double train_loss = 0;     // mean of the per-step losses
  double train_runtime = 0;  // seconds
  double epoch = 0;
  std::vector<double> eval_losses;  // in order of evaluation
  std::vector<double> step_losses;  // per optimizer step
  int64_t train_tokens = 0;         // non-padding tokens seen
};

class Trainer {
 public:
  // REQUIRES: model outlives the trainer. Errors: eval settings without eval data, samples longer
  // than the model's context (naming cutoff_len), empty training data.
  static Result<std::unique_ptr<Trainer>> Create(const TrainConfig& config, model::TrainModel& model,
                                                 DatasetSplit data, TrainerEnv env);
  // Trains, writing logs, checkpoints and the final outputs into config.output_dir (which must
  // already have passed PrepareOutputDir).
  Result<TrainSummary> Run();

  const StepPlan& plan() const { return plan_; }
  // Token-weighted mean loss over the eval split (forward only).
  Result<double> Evaluate();

 private:
  Trainer(const TrainConfig& config, model::TrainModel& model, DatasetSplit data, TrainerEnv env)
      : config_(config), model_(model), data_(std::move(data)), env_(std::move(env)) {}
  // Writes the weights (adapter or HF model), tokenizer files and trainer_state.json into dir.
  Status SaveModelFiles(const std::string& dir) const;
  // Evaluates and records eval_loss in the log history, JSONL, TensorBoard and the log.
  Status EvalAndLog(double epoch);
  void Say(const std::string& line);
  // Feeds the tracker from the model and optimizer; returns its JSON (JSONL "memory").
  nlohmann::json UpdateMemory(int64_t optimizer_bytes);

  TrainConfig config_;
  model::TrainModel& model_;
  DatasetSplit data_;
  TrainerEnv env_;
  StepPlan plan_;
  int64_t eval_every_ = 0;  // 0 = no periodic eval
  TrainerState state_;
  JsonlLog jsonl_;
  double start_s_ = 0;
  std::unique_ptr<monitor::TensorBoardWriter> tb_;
  std::unique_ptr<monitor::ProgressBar> bar_;
  TrainSummary summary_;
  monitor::MemoryTracker memory_;
};

}  // namespace lathe::train
