// Output files of a training run: trainer state, results, JSONL log, atomic checkpoints, rotation.
#include "train/train_outputs.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <system_error>

#include "core/strings.h"
#include "formats/atomic_file.h"
#include "monitor/progress.h"
#include "train/checkpoint.h"

namespace lathe::train {

namespace fs = std::filesystem;
using nlohmann::json;

json TrainerState::ToJson() const {
  json j;
  j["best_global_step"] = nullptr;
  j["best_metric"] = nullptr;
  j["best_model_checkpoint"] = nullptr;
  j["epoch"] = epoch;
  j["eval_steps"] = eval_steps;
  j["global_step"] = global_step;
  j["is_hyper_param_search"] = false;
  j["is_local_process_zero"] = true;
  j["is_world_process_zero"] = true;
  j["log_history"] = json::array();
  for (const json& e : log_history) j["log_history"].push_back(e);
  j["logging_steps"] = logging_steps;
  j["max_steps"] = max_steps;
  j["num_input_tokens_seen"] = num_input_tokens_seen;
  j["num_train_epochs"] = num_train_epochs;
  j["save_steps"] = save_steps;
  j["stateful_callbacks"] = {{"TrainerControl",
                              {{"args",
                                {{"should_epoch_stop", false},
                                 {"should_evaluate", false},
                                 {"should_log", false},
                                 {"should_save", true},
                                 {"should_training_stop", should_training_stop}}},
                               {"attributes", json::object()}}}};
  j["total_flos"] = total_flos;
  j["train_batch_size"] = train_batch_size;
  j["trial_name"] = nullptr;
  j["trial_params"] = nullptr;
  return j;
}

Status WriteJsonFile(const std::string& path, const json& j) {
  return formats::WriteFileAtomically(path, j.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
}

Status PrepareOutputDir(const std::string& dir, bool overwrite) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) {
      return Status::Error("key 'output_dir': '" + dir + "' exists and is not a directory");
    }
    if (!fs::is_empty(dir, ec) && !overwrite) {
      return Status::Error("key 'output_dir': '" + dir +
                           "' already exists and is not empty; set overwrite_output_dir: true (or pass "
                           "--overwrite_output_dir true) to write into it");
    }
    return Status::Ok();
  }
  fs::create_directories(dir, ec);
  if (ec) return Status::Error("key 'output_dir': cannot create '" + dir + "': " + ec.message());
  return Status::Ok();
}

Result<std::string> WriteCheckpoint(const std::string& output_dir, int64_t step,
                                    const std::function<Status(const std::string& dir)>& write) {
  std::string final_dir = (fs::path(output_dir) / ("checkpoint-" + std::to_string(step))).string();
  std::string tmp_dir = (fs::path(output_dir) / (".checkpoint-" + std::to_string(step) + ".tmp." +
                                                 std::to_string((long long)getpid())))
                            .string();
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) return Status::Error("cannot create checkpoint directory '" + tmp_dir + "': " + ec.message());
  Status st = write(tmp_dir);
  // Every file fsynced and listed with its crc32c in the manifest before the rename, so a
  // checkpoint-N dir that exists is complete (or detectably damaged).
  if (st.ok()) st = SealCheckpointDir(tmp_dir, step);
  if (!st.ok()) {
    fs::remove_all(tmp_dir, ec);
    return st.WithContext("writing " + final_dir);
  }
  if (fs::exists(final_dir, ec)) fs::remove_all(final_dir, ec);
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) {
    fs::remove_all(tmp_dir, ec);
    return Status::Error("cannot rename the checkpoint into '" + final_dir + "': " + ec.message());
  }
  LATHE_RETURN_IF_ERROR(FsyncPath(output_dir));
  return final_dir;
}

std::vector<std::string> ListCheckpoints(const std::string& output_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(output_dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.rfind("checkpoint-", 0) != 0 || !it->is_directory()) continue;
    std::string num = name.substr(11);
    if (num.empty() || num.size() > 18 || !std::all_of(num.begin(), num.end(), ::isdigit)) continue;
    found.push_back({std::stoll(num), it->path().string()});
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

Result<std::vector<std::string>> RotateCheckpoints(const std::string& output_dir, int64_t limit) {
  std::vector<std::string> deleted;
  if (limit <= 0) return deleted;
  std::vector<std::string> cps = ListCheckpoints(output_dir);
  // limit >= 1, so the newest (last) is never among the first size - limit; nor is the newest
  // sealed (complete) one, whatever lies above it.
  std::string newest_sealed;
  for (const std::string& cp : cps) {
    if (IsSealedCheckpoint(cp)) newest_sealed = cp;
  }
  for (size_t i = 0; i + (size_t)limit < cps.size(); ++i) {
    if (cps[i] == newest_sealed) continue;
    std::error_code ec;
    // The manifest goes first (and durably), so a deletion cut short leaves an unsealed dir that
    // resume_from_checkpoint 'last' skips, never a sealed one missing files.
    fs::remove(fs::path(cps[i]) / kCheckpointManifest, ec);
    if (!ec) (void)FsyncPath(cps[i]);
    fs::remove_all(cps[i], ec);
    if (ec)
      return Status::Error("save_total_limit: cannot delete old checkpoint '" + cps[i] +
                           "': " + ec.message());
    deleted.push_back(cps[i]);
  }
  return deleted;
}

std::vector<std::pair<std::string, std::string>> TokenizerFiles(const std::string& tokenizer) {
  static const char* const kNames[] = {
      "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
      "merges.txt",     "added_tokens.json",     "chat_template.jinja"};
  std::vector<std::pair<std::string, std::string>> out;
  std::error_code ec;
  fs::path p(tokenizer);
  auto add_beside = [&](const fs::path& dir, std::initializer_list<const char*> names) {
    for (const char* n : names) {
      if (fs::is_regular_file(dir / n, ec)) out.push_back({(dir / n).string(), n});
    }
  };
  if (fs::is_directory(p, ec)) {
    for (const char* n : kNames) add_beside(p, {n});
  } else if (p.extension() == ".json" && fs::is_regular_file(p, ec)) {
    out.push_back({p.string(), "tokenizer.json"});
    add_beside(p.parent_path().empty() ? fs::path(".") : p.parent_path(),
               {"tokenizer_config.json", "special_tokens_map.json"});
  } else if (p.extension() == ".model" && fs::is_regular_file(p, ec)) {
    out.push_back({p.string(), "tokenizer.model"});
  }
  return out;
}

Status CopyFiles(const std::vector<std::pair<std::string, std::string>>& files, const std::string& dest_dir) {
  for (const auto& [src, name] : files) {
    std::error_code ec;
    fs::copy_file(src, fs::path(dest_dir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return Status::Error("cannot copy '" + src + "' to '" + dest_dir + "': " + ec.message());
  }
  return Status::Ok();
}

JsonlLog::~JsonlLog() {
  if (f_) std::fclose(f_);
}

Status JsonlLog::Open(const std::string& path) {
  if (f_) std::fclose(f_);
  path_ = path;
  f_ = std::fopen(path.c_str(), "w");
  lines_ = 0;
  if (!f_) return Status::Error("cannot open '" + path + "' for writing");
  return Status::Ok();
}

Status JsonlLog::OpenResumed(const std::string& path, int64_t keep_lines) {
  std::string kept;
  int64_t n = 0;
  if (FILE* in = std::fopen(path.c_str(), "r")) {
    for (int ch; n < keep_lines && (ch = std::fgetc(in)) != EOF;) {
      kept.push_back((char)ch);
      if (ch == '\n') ++n;
    }
    std::fclose(in);
  }
  if (n < keep_lines) {
    return Status::Error(StrFormat("'%s' has %lld lines, the checkpoint was saved after %lld", path.c_str(),
                                   (long long)n, (long long)keep_lines));
  }
  LATHE_RETURN_IF_ERROR(Open(path));
  if (std::fwrite(kept.data(), 1, kept.size(), f_) != kept.size() || std::fflush(f_) != 0)
    return Status::Error("cannot write to '" + path_ + "'");
  lines_ = n;
  return Status::Ok();
}

Status JsonlLog::Append(const json& line) {
  if (!f_) return Status::Ok();
  std::string text = line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  if (std::fwrite(text.data(), 1, text.size(), f_) != text.size() || std::fflush(f_) != 0) {
    return Status::Error("cannot write to '" + path_ + "'");
  }
  lines_++;
  return Status::Ok();
}

json TrainLogJson(const TrainLogLine& l) {
  json j;
  j["current_steps"] = l.step;
  j["total_steps"] = l.total_steps;
  j["loss"] = l.loss;
  j["lr"] = l.lr;
  j["epoch"] = std::round(l.epoch * 100) / 100;
  j["percentage"] =
      l.total_steps > 0 ? std::round(10000.0 * (double)l.step / (double)l.total_steps) / 100 : 0.0;
  j["elapsed_time"] = monitor::FormatDuration(l.elapsed_s);
  double remaining = l.step > 0 ? l.elapsed_s / (double)l.step * (double)(l.total_steps - l.step) : -1;
  j["remaining_time"] = monitor::FormatDuration(remaining);
  j["throughput"] = l.tokens_per_s;
  j["total_tokens"] = l.total_tokens;
  j["step"] = l.step;
  j["grad_norm"] = l.grad_norm;
  j["tokens_per_s"] = l.tokens_per_s;
  j["rss_bytes"] = l.rss_bytes;
  return j;
}

}  // namespace lathe::train
