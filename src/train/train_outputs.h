// What a training run leaves in output_dir, in the shapes HF Trainer / LLaMA-Factory users expect:
// trainer_state.json (HF's TrainerState schema), all_results.json / train_results.json /
// eval_results.json, trainer_log.jsonl (one line per logging step), checkpoint-N dirs written
// under a temporary name and renamed into place, save_total_limit rotation, and the output_dir
// overwrite guard.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace lathe::train {

// HF's TrainerState, serialized as transformers does (keys sorted, indent 2).
struct TrainerState {
  int64_t global_step = 0;
  int64_t max_steps = 0;
  double epoch = 0;
  double num_train_epochs = 0;
  int64_t logging_steps = 0;
  int64_t eval_steps = 0;
  int64_t save_steps = 0;
  int64_t train_batch_size = 0;
  double total_flos = 0;
  int64_t num_input_tokens_seen = 0;
  bool should_training_stop = false;
  std::vector<nlohmann::json>
      log_history;  // {step, epoch, loss, learning_rate, grad_norm} | {eval_loss, ...}
  nlohmann::json ToJson() const;
};

// Writes `j` (indent 2, trailing newline) via a temp file + rename.
Status WriteJsonFile(const std::string& path, const nlohmann::json& j);

// Refuses an existing non-empty output_dir unless overwrite_output_dir; creates it otherwise.
Status PrepareOutputDir(const std::string& dir, bool overwrite);

// Creates output_dir/checkpoint-<step> atomically: `write` fills a temporary sibling directory,
// which is then renamed (an older checkpoint-<step> of the same number is replaced).
// Returns the final path.
Result<std::string> WriteCheckpoint(const std::string& output_dir, int64_t step,
                                    const std::function<Status(const std::string& dir)>& write);

// The checkpoint-<N> dirs of output_dir sorted by N (ascending), as full paths.
std::vector<std::string> ListCheckpoints(const std::string& output_dir);
// Deletes the oldest checkpoints until at most `limit` remain (limit <= 0 keeps all); never
// deletes the newest. Returns the deleted paths.
Result<std::vector<std::string>> RotateCheckpoints(const std::string& output_dir, int64_t limit);

// (source path, file name in the output dir) of the files a tokenizer consists of, for a
// `tokenizer` that is an HF model dir (tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, tokenizer.model, vocab.json, merges.txt, added_tokens.json,
// chat_template.jinja), a tokenizer.json (plus tokenizer_config.json / special_tokens_map.json
// beside it) or a SentencePiece .model (written as tokenizer.model). Other paths (.gguf, llama2.c
// .bin): none.
std::vector<std::pair<std::string, std::string>> TokenizerFiles(const std::string& tokenizer);
// Copies each (source, name) into dest_dir.
Status CopyFiles(const std::vector<std::pair<std::string, std::string>>& files, const std::string& dest_dir);

// trainer_log.jsonl: one JSON object per line, flushed after each line.
class JsonlLog {
 public:
  JsonlLog() = default;
  ~JsonlLog();
  JsonlLog(const JsonlLog&) = delete;
  JsonlLog& operator=(const JsonlLog&) = delete;
  Status Open(const std::string& path);  // truncates
  // Resume: keeps the first keep_lines lines (those written when the checkpoint was saved; a run
  // resumed from it rewrites the later ones) and appends after them.
  Status OpenResumed(const std::string& path, int64_t keep_lines);
  int64_t lines() const { return lines_; }  // lines in the file (kept + appended)
  Status Append(const nlohmann::json& line);

 private:
  FILE* f_ = nullptr;
  std::string path_;
  int64_t lines_ = 0;
};

// One training log line as LLaMA-Factory's trainer_log.jsonl writes it (current_steps,
// total_steps, loss, lr, epoch, percentage, elapsed_time, remaining_time, throughput,
// total_tokens) plus lathe's step, grad_norm, tokens_per_s and rss_bytes.
struct TrainLogLine {
  int64_t step = 0, total_steps = 0;
  double epoch = 0, loss = 0, lr = 0, grad_norm = 0;
  double elapsed_s = 0, tokens_per_s = 0;
  int64_t total_tokens = 0, rss_bytes = 0;
};
nlohmann::json TrainLogJson(const TrainLogLine& l);

}  // namespace lathe::train
