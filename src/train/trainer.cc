// The training loop: epochs of seeded micro-batches, exact accumulation, clip, optimizer step,
// logging / eval / checkpoint cadence as the HF Trainer counts steps.
#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <limits>

#include "core/strings.h"
#include "formats/atomic_file.h"
#include "train/checkpoint.h"
#include "train/loss_scaler.h"

namespace lathe::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Round4(double x) { return std::round(x * 1e4) / 1e4; }

// HF's default logging_dir: output_dir/runs/<Mon DD_HH-MM-SS>_<hostname>.
std::string TensorBoardDir(const std::string& output_dir) {
  char stamp[64];
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::strftime(stamp, sizeof(stamp), "%b%d_%H-%M-%S", &tm);
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  return (fs::path(output_dir) / "runs" / (std::string(stamp) + "_" + host)).string();
}

}  // namespace

Status CheckTrainerConfig(const TrainConfig& c) {
  if (c.fp16 && c.bf16) return Status::Error("key 'fp16': fp16 and bf16 are exclusive; set one of them");
  if (c.pure_bf16) {
    return Status::Error(
        "key 'pure_bf16': not available yet; use bf16: true (bf16 matmuls, f32 master weights)");
  }
  if (c.quantization_bit != 0 && c.finetuning_type == "full") {
    return Status::Error(
        "key 'quantization_bit': a quantized base cannot be fully fine-tuned; use finetuning_type lora "
        "(QLoRA) or freeze, or remove quantization_bit");
  }
  if (!c.adapter_name_or_path.empty() && c.finetuning_type != "lora") {
    return Status::Error("key 'adapter_name_or_path': continuing an adapter is LoRA training; set finetuning_type: "
                         "lora (or merge the adapter into the model first: lathe merge / lathe export)");
  }
  if (c.adapter_name_or_path.find(',') != std::string::npos) {
    return Status::Error("key 'adapter_name_or_path': one adapter is continued; merge the others into the base "
                         "first (lathe merge -m BASE --adapter A --adapter B ... -o MERGED)");
  }
  if (!c.do_train) return Status::Error("key 'do_train': only training runs are supported (do_train: true)");
  if (c.finetuning_type == "lora") LATHE_RETURN_IF_ERROR(ParseLoraTargets(c.lora_target).status());
  if (c.eval_strategy == "steps" && c.eval_steps == 0 && c.logging_steps <= 0) {
    return Status::Error("key 'eval_steps': eval_strategy 'steps' needs eval_steps > 0");
  }
  return Status::Ok();
}

Result<std::vector<model::LoraModule>> ParseLoraTargets(const std::vector<std::string>& names) {
  using model::LoraModule;
  std::vector<LoraModule> out;
  auto add = [&](LoraModule m) {
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  };
  std::vector<std::string> valid = {"all"};
  for (int m = 0; m < (int)LoraModule::kCount; ++m) valid.push_back(model::LoraModuleName((LoraModule)m));
  for (const std::string& n : names) {
    if (n == "all") {
      for (int m = 0; m < (int)LoraModule::kCount; ++m) add((LoraModule)m);
      continue;
    }
    bool found = false;
    for (int m = 0; m < (int)LoraModule::kCount; ++m) {
      std::string full = model::LoraModuleName((LoraModule)m);  // "q_proj"
      if (n == full || n + "_proj" == full) {
        add((LoraModule)m);
        found = true;
      }
    }
    if (!found) {
      std::string near = Nearest(n, valid);
      return Status::Error(
          "key 'lora_target': '" + n +
          "' is not a module (all, q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)" +
          (near.empty() ? std::string() : " (did you mean '" + near + "'?)"));
    }
  }
  if (out.empty()) return Status::Error("key 'lora_target': no modules given");
  return out;
}

Result<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config, model::TrainModel& model,
                                                 DatasetSplit data, TrainerEnv env) {
  LATHE_RETURN_IF_ERROR(CheckTrainerConfig(config));
  if (data.train.empty()) return Status::Error("no training samples");
  int64_t longest = 0;
  for (const auto* split : {&data.train, &data.eval}) {
    for (const TokenizedSample& s : *split) longest = std::max<int64_t>(longest, (int64_t)s.input_ids.size());
  }
  if (longest > model.config().max_seq_len) {
    return Status::Error(StrFormat(
        "key 'cutoff_len': samples of up to %lld tokens exceed the model's context of "
        "%lld tokens; set cutoff_len <= %lld",
        (long long)longest, (long long)model.config().max_seq_len, (long long)model.config().max_seq_len));
  }
  if (config.eval_strategy != "no" && data.eval.empty()) {
    return Status::Error("key 'eval_strategy': '" + config.eval_strategy +
                         "' needs eval data; set val_size (a fraction or a count) or eval_dataset");
  }
  std::unique_ptr<Trainer> t(new Trainer(config, model, std::move(data), std::move(env)));
  t->plan_ = PlanSteps((int64_t)t->data_.train.size(), config.per_device_train_batch_size,
                       config.gradient_accumulation_steps, config.num_train_epochs, config.max_steps);
  if (t->plan_.total_steps <= 0) {
    return Status::Error(
        "key 'num_train_epochs': the run has no optimizer steps (set num_train_epochs > 0 or max_steps)");
  }
  if (config.eval_strategy == "steps")
    t->eval_every_ = config.eval_steps > 0 ? config.eval_steps : config.logging_steps;
  return t;
}

void Trainer::Say(const std::string& line) {
  if (bar_ && env_.log) bar_->Print(line);
}

json Trainer::UpdateMemory(int64_t optimizer_bytes) {
  using monitor::MemCategory;
  model::TrainMemory m = model_.AllocatedBytes();
  memory_.Set(MemCategory::kWeights, (int64_t)env_.base_weight_bytes - m.base_released + m.weights);
  memory_.Set(MemCategory::kLora, m.lora);
  memory_.Set(MemCategory::kGradients, m.gradients);
  memory_.Set(MemCategory::kOptimizer, optimizer_bytes);
  memory_.Set(MemCategory::kActivations, m.activations);
  memory_.Set(MemCategory::kTemporary, m.temporary);
  return memory_.ToJson();
}

Result<double> Trainer::Evaluate() {
  double loss_sum = 0;
  int64_t targets = 0;
  const int64_t bs = config_.per_device_eval_batch_size;
  for (int64_t p = 0; p < (int64_t)data_.eval.size(); p += bs) {
    std::vector<int64_t> idx;
    for (int64_t i = p; i < std::min<int64_t>(p + bs, (int64_t)data_.eval.size()); ++i) idx.push_back(i);
    Batch b = Collate(data_.eval, idx, env_.pad_id);
    model::TrainBatch tb{b.input_ids, b.labels, b.segment_ids, b.B, b.T};
    int64_t n = 0;
    LATHE_ASSIGN_OR_RETURN(double l, model_.Loss(tb, &n));
    loss_sum += l;
    targets += n;
  }
  if (targets == 0) return Status::Error("eval data has no target tokens");
  return loss_sum / (double)targets;
}

Status Trainer::EvalAndLog(double epoch) {
  double t0 = NowSeconds();
  LATHE_ASSIGN_OR_RETURN(double loss, Evaluate());
  double runtime = NowSeconds() - t0;
  int64_t n = (int64_t)data_.eval.size();
  int64_t batches = (n + config_.per_device_eval_batch_size - 1) / config_.per_device_eval_batch_size;
  json e = {{"epoch", epoch},
            {"eval_loss", loss},
            {"eval_runtime", Round4(runtime)},
            {"eval_samples_per_second", Round4(runtime > 0 ? (double)n / runtime : 0)},
            {"eval_steps_per_second", Round4(runtime > 0 ? (double)batches / runtime : 0)},
            {"step", state_.global_step}};
  state_.log_history.push_back(e);
  summary_.eval_losses.push_back(loss);
  LATHE_RETURN_IF_ERROR(jsonl_.Append({{"current_steps", state_.global_step},
                                       {"total_steps", plan_.total_steps},
                                       {"eval_loss", loss},
                                       {"epoch", std::round(epoch * 100) / 100},
                                       {"step", state_.global_step}}));
  if (tb_) LATHE_RETURN_IF_ERROR(tb_->AddScalar("eval/loss", state_.global_step, loss));
  Say(StrFormat("step %lld/%lld | epoch %.2f | eval_loss %.4f (%lld samples, %.1f s)",
                (long long)state_.global_step, (long long)plan_.total_steps, epoch, loss, (long long)n,
                runtime));
  return Status::Ok();
}

Status Trainer::SaveModelFiles(const std::string& dir) const {
  if (config_.finetuning_type == "lora") {
    LATHE_RETURN_IF_ERROR(model_.SavePeftAdapter(dir, env_.base_model_name));
  } else {
    LATHE_RETURN_IF_ERROR(model_.SaveHfModel(dir, config_.bf16));
  }
  LATHE_RETURN_IF_ERROR(CopyFiles(env_.tokenizer_files, dir));
  for (const auto& [name, text] : env_.tokenizer_texts)
    LATHE_RETURN_IF_ERROR(formats::WriteFileAtomically((fs::path(dir) / name).string(), text));
  return WriteJsonFile((fs::path(dir) / "trainer_state.json").string(), state_.ToJson());
}

Result<TrainSummary> Trainer::Run() {
  const TrainConfig& c = config_;
  const std::string& out = c.output_dir;
  start_s_ = NowSeconds();
  summary_ = TrainSummary{};
  bar_ = std::make_unique<monitor::ProgressBar>(env_.log ? env_.log : stderr, env_.log && env_.interactive);
  std::string resume_dir;
  if (!c.resume_from_checkpoint.empty()) {
    LATHE_ASSIGN_OR_RETURN(resume_dir, ResolveResumeCheckpoint(c.resume_from_checkpoint, out));
  }
  if (c.overwrite_output_dir && resume_dir.empty()) {
    // Checkpoints of an earlier run would count against save_total_limit (and could outrank this
    // run's newest), so overwriting the output dir removes them.
    for (const std::string& cp : ListCheckpoints(out)) {
      std::error_code ec;
      fs::remove_all(cp, ec);
      if (ec)
        return Status::Error("overwrite_output_dir: cannot delete old checkpoint '" + cp +
                             "': " + ec.message());
      Say("overwrite_output_dir: removed " + cp + " of an earlier run");
    }
  }
  {  // Temporary checkpoint dirs of a run that was killed mid-save.
    std::error_code ec;
    for (fs::directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec)) {
      std::string name = it->path().filename().string();
      if (name.rfind(".checkpoint-", 0) == 0 && name.find(".tmp.") != std::string::npos) {
        std::error_code rm_ec;
        fs::remove_all(it->path(), rm_ec);
      }
    }
  }
  if (resume_dir.empty()) LATHE_RETURN_IF_ERROR(jsonl_.Open((fs::path(out) / "trainer_log.jsonl").string()));
  if (std::find(c.report_to.begin(), c.report_to.end(), "tensorboard") != c.report_to.end()) {
    LATHE_ASSIGN_OR_RETURN(tb_, monitor::TensorBoardWriter::Open(TensorBoardDir(out)));
  }
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt, MakeOptimizer(c));
  opt->SetPool(env_.pool);
  const int64_t total = plan_.total_steps;
  LATHE_ASSIGN_OR_RETURN(LrSchedule sched,
                         LrSchedule::Make(c.lr_scheduler_type, c.learning_rate,
                                          WarmupSteps(c.warmup_steps, c.warmup_ratio, total), total));
  std::vector<ParamRef> params;
  int64_t trainable = 0;
  for (const model::TrainableTensor& t : model_.params()) {
    params.push_back({t.name, t.data, t.grad, t.n, t.decay});
    trainable += t.n;
  }
  state_ = TrainerState{};
  state_.max_steps = total;
  state_.num_train_epochs = plan_.num_train_epochs;
  state_.logging_steps = c.logging_steps;
  state_.eval_steps = eval_every_ > 0 ? eval_every_ : c.logging_steps;
  state_.save_steps = c.save_steps;
  state_.train_batch_size = c.per_device_train_batch_size;

  if (env_.log) {
    Say(StrFormat(
        "training: %zu samples (%zu eval), %g epoch(s), %lld steps of %lld x %lld samples, %lld trainable "
        "params (%s)",
        data_.train.size(), data_.eval.size(), plan_.num_train_epochs, (long long)total,
        (long long)c.per_device_train_batch_size, (long long)c.gradient_accumulation_steps,
        (long long)trainable, c.finetuning_type.c_str()));
    if (env_.memory_plan) {
      std::string lines;
      for (const PlanLine& l : env_.memory_plan->lines) {
        lines += StrFormat("\n  %-11s %10s  %s", l.category.c_str(), monitor::FormatBytes(l.bytes).c_str(),
                           l.formula.c_str());
      }
      Say(StrFormat("memory plan: %s in all (host-paged optimizer state %s)%s",
                    monitor::FormatBytes(env_.memory_plan->Total("device")).c_str(),
                    monitor::FormatBytes(env_.memory_plan->Total("host")).c_str(), lines.c_str()));
    }
  }
  UpdateMemory(0);

  model_.ZeroGrad();
  const int64_t n_train = (int64_t)data_.train.size();
  const int64_t mb_per_epoch = plan_.micro_batches_per_epoch;
  double interval_loss = 0, loss_total = 0, last_log_s = start_s_, last_grad_norm = 0, last_lr = 0;
  int64_t interval_steps = 0, interval_tokens = 0, last_eval_step = -1;
  double epoch_f = 0;
  // fp16: dynamic loss scaling as torch.cuda.amp.GradScaler (init 2^16, x2 after 2000 clean steps,
  // x0.5 and the step skipped on inf/nan gradients; the LR schedule does not advance on a skipped
  // step, as the HF Trainer's optimizer_step_was_skipped).
  LossScaler scaler;
  if (!c.fp16) scaler.scale = 1.0;
  // LATHE_TEST_FP16_OVERFLOW_STEPS=3,7 (tests only): a gradient overflows at those steps.
  std::vector<int64_t> injected_overflows;
  if (const char* e = std::getenv("LATHE_TEST_FP16_OVERFLOW_STEPS")) {
    for (const char* q = e; *q;) {
      char* end = nullptr;
      long long v = std::strtoll(q, &end, 10);
      if (end == q) break;
      injected_overflows.push_back(v);
      q = *end == ',' ? end + 1 : end;
    }
  }
  // Data position: the next optimizer step starts at micro-batch start_g of epoch start_epoch.
  int64_t start_epoch = 0, start_g = 0;
  // Everything besides the weights files a resumed run needs to continue bit-identically.
  auto save_state = [&](const std::string& dir, int64_t epoch, int64_t next_g) -> Status {
    if (next_g >= mb_per_epoch) {
      epoch++;
      next_g = 0;
    }
    json j = {{"global_step", state_.global_step},
              {"epoch_index", epoch},
              {"next_micro_batch", next_g},
              {"seed", c.seed},
              {"epoch", epoch_f},
              {"dropout_rng", model_.dropout_rng_state()},
              {"interval_loss", interval_loss},
              {"interval_steps", interval_steps},
              {"interval_tokens", interval_tokens},
              {"loss_total", loss_total},
              {"last_eval_step", last_eval_step},
              {"train_tokens", summary_.train_tokens},
              {"total_flos", state_.total_flos},
              {"step_losses", summary_.step_losses},
              {"eval_losses", summary_.eval_losses},
              {"log_history", state_.log_history},
              {"jsonl_lines", jsonl_.lines()},
              {"loss_scale", scaler.scale},
              {"growth_tracker", scaler.growth_tracker},
              {"skipped_steps", scaler.skipped_steps},
              {"threads", env_.pool ? env_.pool->size() : 1},
              {"row_group_workers", model_.MaxRowGroupWorkers(c.per_device_train_batch_size)}};
    return SaveTrainingState(dir, params, *opt, j);
  };
  if (!resume_dir.empty()) {
    LATHE_ASSIGN_OR_RETURN(json j, LoadTrainingState(resume_dir, params, *opt));
    const std::string where = "resume_from_checkpoint '" + resume_dir + "': ";
    int64_t jsonl_lines = 0;
    try {
      if (j.at("seed").get<int64_t>() != c.seed) {
        return Status::Error("key 'seed': " + std::to_string(c.seed) +
                             " differs from the checkpointed run's " + j.at("seed").dump() +
                             " (the data order would change)");
      }
      state_.global_step = j.at("global_step").get<int64_t>();
      start_epoch = j.at("epoch_index").get<int64_t>();
      start_g = j.at("next_micro_batch").get<int64_t>();
      epoch_f = j.at("epoch").get<double>();
      state_.epoch = epoch_f;
      model_.set_dropout_rng_state(j.at("dropout_rng").get<uint64_t>());
      interval_loss = j.at("interval_loss").get<double>();
      interval_steps = j.at("interval_steps").get<int64_t>();
      interval_tokens = j.at("interval_tokens").get<int64_t>();
      loss_total = j.at("loss_total").get<double>();
      last_eval_step = j.at("last_eval_step").get<int64_t>();
      summary_.train_tokens = j.at("train_tokens").get<int64_t>();
      state_.total_flos = j.at("total_flos").get<double>();
      summary_.step_losses = j.at("step_losses").get<std::vector<double>>();
      summary_.eval_losses = j.at("eval_losses").get<std::vector<double>>();
      state_.log_history = j.at("log_history").get<std::vector<json>>();
      jsonl_lines = j.at("jsonl_lines").get<int64_t>();
      scaler.scale = j.at("loss_scale").get<double>();
      scaler.growth_tracker = j.at("growth_tracker").get<int64_t>();
      scaler.skipped_steps = j.at("skipped_steps").get<int64_t>();
    } catch (const json::exception& e) {
      return Status::Error(where + kTrainingStateJson + ": " + e.what());
    }
    if (start_g % c.gradient_accumulation_steps != 0 || start_g >= mb_per_epoch) {
      return Status::Error(where + "its data position (micro-batch " + std::to_string(start_g) +
                           ") does not fit this run's batching (per_device_train_batch_size, "
                           "gradient_accumulation_steps and the data must match the checkpointed run)");
    }
    // LoRA runs its row groups on up to one worker per thread (TrainModelOptions::row_group_workers),
    // summing their gradients in that grouping: another worker count continues the run, not
    // bit-identically. Full / freeze workers add in group order: the same bits on any count. (Checkpoints written before
    // "row_group_workers" was recorded name only their thread count, which was the worker count of
    // a LoRA run.)
    const int threads = env_.pool ? env_.pool->size() : 1;
    const int64_t workers = model_.MaxRowGroupWorkers(c.per_device_train_batch_size);
    int64_t saved_workers = -1;
    if (j.contains("row_group_workers") && j["row_group_workers"].is_number_integer()) {
      saved_workers = j["row_group_workers"].get<int64_t>();
    } else if (j.contains("threads") && j["threads"].is_number_integer() && c.finetuning_type == "lora") {
      saved_workers = std::clamp<int64_t>(j["threads"].get<int64_t>(), 1, c.per_device_train_batch_size);
    }
    if (c.finetuning_type == "lora" && saved_workers > 0 && saved_workers != workers) {
      const std::string saved_threads =
          j.contains("threads") && j["threads"].is_number_integer() ? j["threads"].dump() : "?";
      Say(StrFormat("warning: resuming with %lld LoRA row-group worker(s) (%d thread(s)), the checkpointed run used "
                    "%lld (%s thread(s)): LoRA sums its gradients per worker, so the losses can differ in the last "
                    "bits from an uninterrupted run (--threads %s resumes it bit-identically)",
                    (long long)workers, threads, (long long)saved_workers, saved_threads.c_str(),
                    saved_threads.c_str()));
    }
    LATHE_RETURN_IF_ERROR(jsonl_.OpenResumed((fs::path(out) / "trainer_log.jsonl").string(), jsonl_lines));
    Say(StrFormat("resumed from %s at step %lld (epoch %lld, micro-batch %lld)", resume_dir.c_str(),
                  (long long)state_.global_step, (long long)start_epoch, (long long)start_g));
  }
  std::vector<int64_t> lengths;  // group_by_length: each sample's tokens
  if (c.group_by_length) {
    for (const TokenizedSample& s : data_.train) lengths.push_back((int64_t)s.input_ids.size());
  }
  for (int64_t epoch = start_epoch; state_.global_step < total; ++epoch) {
    std::vector<std::vector<int64_t>> mbs = EpochMicroBatches(n_train, c.per_device_train_batch_size, (uint64_t)c.seed,
                                                              epoch, c.group_by_length ? &lengths : nullptr);
    for (int64_t g = epoch == start_epoch ? start_g : 0; g < mb_per_epoch && state_.global_step < total;
         g += c.gradient_accumulation_steps) {
      int64_t g_end = std::min(mb_per_epoch, g + c.gradient_accumulation_steps);
      std::vector<Batch> batches;
      int64_t targets = 0;
      for (int64_t k = g; k < g_end; ++k) {
        batches.push_back(Collate(data_.train, mbs[k], env_.pad_id));
        targets += batches.back().target_tokens;
      }
      // The normalizer covers the whole accumulated batch, so k micro-batches equal one big batch.
      double normalizer = (double)std::max<int64_t>(targets, 1);
      double loss_sum = 0;
      for (const Batch& b : batches) {
        model::TrainBatch tb{b.input_ids, b.labels, b.segment_ids, b.B, b.T};
        LATHE_ASSIGN_OR_RETURN(double l, model_.ForwardBackward(tb, normalizer / scaler.scale));
        loss_sum += l;
        interval_tokens += b.real_tokens;
        summary_.train_tokens += b.real_tokens;
        state_.total_flos += 6.0 * (double)env_.flops_params * (double)(b.B * b.T);
      }
      double step_loss = loss_sum / normalizer;
      bool skipped = false;
      if (c.fp16) {
        if (std::find(injected_overflows.begin(), injected_overflows.end(), state_.global_step + 1) !=
            injected_overflows.end())
          params[0].grad[0] = std::numeric_limits<float>::infinity();
        skipped = !scaler.Unscale(params, step_loss);
        scaler.Update(!skipped);
      }
      {
        ScopedOp op(model_.profiler(), "clip_grad_norm");
        last_grad_norm =
            skipped ? std::numeric_limits<double>::quiet_NaN() : ClipGradNorm(params, c.max_grad_norm);
      }
      if (!skipped && (!std::isfinite(last_grad_norm) || !std::isfinite(step_loss))) {
        return Status::Error(
            StrFormat("step %lld: the loss or gradient is not finite (loss %g, grad_norm %g); lower "
                      "learning_rate or set max_grad_norm",
                      (long long)state_.global_step + 1, step_loss, last_grad_norm));
      }
      if (!skipped) {
        ScopedOp op(model_.profiler(), "optimizer_step");
        opt->Step(params, sched.At(state_.global_step - scaler.skipped_steps));
      }
      json mem = UpdateMemory((int64_t)(opt->StateBytesPerParam() * (double)trainable));
      // A save follows this step: hand the gradients' pages back for its copy (the memory plan's
      // save overlap) even where they are otherwise zeroed in place.
      const int64_t next_step = state_.global_step + 1;
      model_.ZeroGrad(env_.hand_back_pages || next_step % c.save_steps == 0 || next_step >= total);
      state_.global_step++;
      // As the HF Trainer: the logged learning rate is the scheduler's value after its step.
      last_lr = sched.At(state_.global_step - scaler.skipped_steps);
      if (skipped) {
        Say(StrFormat("step %lld: inf/nan gradients at fp16 loss scale %g; step skipped, scale -> %g",
                      (long long)state_.global_step, scaler.scale * 2, scaler.scale));
      }
      epoch_f = (double)epoch + (double)g_end / (double)mb_per_epoch;
      state_.epoch = epoch_f;
      summary_.step_losses.push_back(step_loss);
      interval_loss += step_loss;
      loss_total += step_loss;
      interval_steps++;
      double now = NowSeconds();
      monitor::ProgressState ps{state_.global_step,
                                total,
                                step_loss,
                                last_lr,
                                (double)summary_.train_tokens / std::max(now - start_s_, 1e-9),
                                now - start_s_,
                                monitor::ProcessRssBytes()};
      bar_->Update(ps, state_.global_step == total);

      if (state_.global_step % c.logging_steps == 0) {
        double loss = interval_loss / (double)interval_steps;
        double tps = (double)interval_tokens / std::max(now - last_log_s, 1e-9);
        state_.log_history.push_back({{"epoch", epoch_f},
                                      {"grad_norm", last_grad_norm},
                                      {"learning_rate", last_lr},
                                      {"loss", Round4(loss)},
                                      {"step", state_.global_step}});
        TrainLogLine line{
            state_.global_step,    total,       epoch_f, loss, last_lr, last_grad_norm, now - start_s_, tps,
            summary_.train_tokens, ps.rss_bytes};
        json lj = TrainLogJson(line);
        lj["memory"] = mem;
        if (c.fp16) {
          lj["loss_scale"] = scaler.scale;
          lj["skipped_steps"] = scaler.skipped_steps;
          state_.log_history.back()["loss_scale"] = scaler.scale;
          state_.log_history.back()["skipped_steps"] = scaler.skipped_steps;
        }
        LATHE_RETURN_IF_ERROR(jsonl_.Append(lj));
        if (tb_) {
          LATHE_RETURN_IF_ERROR(tb_->AddScalar("train/loss", state_.global_step, loss));
          LATHE_RETURN_IF_ERROR(tb_->AddScalar("train/learning_rate", state_.global_step, last_lr));
          LATHE_RETURN_IF_ERROR(tb_->AddScalar("train/grad_norm", state_.global_step, last_grad_norm));
          LATHE_RETURN_IF_ERROR(tb_->AddScalar("train/epoch", state_.global_step, epoch_f));
          for (int i = 0; i < monitor::kMemCategories; ++i) {
            auto cat = (monitor::MemCategory)i;
            LATHE_RETURN_IF_ERROR(tb_->AddScalar(std::string("memory/") + monitor::MemCategoryName(cat),
                                                 state_.global_step, (double)memory_.current(cat)));
          }
          LATHE_RETURN_IF_ERROR(tb_->AddScalar("memory/rss", state_.global_step, (double)ps.rss_bytes));
          LATHE_RETURN_IF_ERROR(
              tb_->AddScalar("memory/peak_rss", state_.global_step, (double)monitor::ProcessPeakRssBytes()));
        }
        ps.loss = loss;
        ps.tokens_per_s = tps;
        Say(StrFormat("%s | epoch %.2f | grad_norm %.4f", monitor::FormatProgress(ps).c_str(), epoch_f,
                      last_grad_norm));
        if (env_.monitor) Say("memory: " + memory_.Format());
        interval_loss = 0;
        interval_steps = 0;
        interval_tokens = 0;
        last_log_s = now;
      }
      if (eval_every_ > 0 && state_.global_step % eval_every_ == 0) {
        LATHE_RETURN_IF_ERROR(EvalAndLog(epoch_f));
        last_eval_step = state_.global_step;
      }
      if (state_.global_step % c.save_steps == 0) {
        state_.should_training_stop = state_.global_step == total;
        LATHE_ASSIGN_OR_RETURN(
            std::string cp, WriteCheckpoint(out, state_.global_step, [&](const std::string& dir) -> Status {
              LATHE_RETURN_IF_ERROR(SaveModelFiles(dir));
              return save_state(dir, epoch, g_end);
            }));
        LATHE_ASSIGN_OR_RETURN(std::vector<std::string> deleted, RotateCheckpoints(out, c.save_total_limit));
        Say("saved " + cp + (deleted.empty() ? "" : " (deleted " + std::to_string(deleted.size()) + " old)"));
      }
    }
    if (c.eval_strategy == "epoch" && last_eval_step != state_.global_step) {
      LATHE_RETURN_IF_ERROR(EvalAndLog(epoch_f));
      last_eval_step = state_.global_step;
    }
  }
  bar_->Finish();
  if (!data_.eval.empty() && last_eval_step != state_.global_step) LATHE_RETURN_IF_ERROR(EvalAndLog(epoch_f));

  summary_.global_step = state_.global_step;
  summary_.train_loss = loss_total / (double)std::max<int64_t>(state_.global_step, 1);
  summary_.train_runtime = NowSeconds() - start_s_;
  summary_.epoch = epoch_f;
  double samples = c.max_steps > 0
                       ? (double)(total * c.per_device_train_batch_size * c.gradient_accumulation_steps)
                       : (double)n_train * c.num_train_epochs;
  double rt = std::max(summary_.train_runtime, 1e-9);
  json train_metrics = {{"epoch", epoch_f},
                        {"total_flos", state_.total_flos},
                        {"train_loss", summary_.train_loss},
                        {"train_runtime", Round4(summary_.train_runtime)},
                        {"train_samples_per_second", std::round(samples / rt * 1e3) / 1e3},
                        {"train_steps_per_second", std::round((double)total / rt * 1e3) / 1e3}};
  json final_entry = train_metrics;
  final_entry["step"] = state_.global_step;
  state_.log_history.push_back(final_entry);
  state_.should_training_stop = true;

  LATHE_RETURN_IF_ERROR(SaveModelFiles(out));
  LATHE_RETURN_IF_ERROR(WriteJsonFile((fs::path(out) / "train_results.json").string(), train_metrics));
  json all = train_metrics;
  if (!summary_.eval_losses.empty()) {
    json ev;
    for (auto it = state_.log_history.rbegin(); it != state_.log_history.rend(); ++it) {
      if (it->contains("eval_loss")) {
        ev = *it;
        break;
      }
    }
    ev.erase("step");
    if (c.stage == "pt") ev["perplexity"] = std::exp(ev["eval_loss"].get<double>());
    LATHE_RETURN_IF_ERROR(WriteJsonFile((fs::path(out) / "eval_results.json").string(), ev));
    for (auto& [k, v] : ev.items()) all[k] = v;
  }
  LATHE_RETURN_IF_ERROR(WriteJsonFile((fs::path(out) / "all_results.json").string(), all));
  if (env_.log && env_.memory_plan) {
    const double peak = (double)monitor::ProcessPeakRssBytes(), planned = env_.memory_plan->Total("device");
    Say(StrFormat("memory: peak RSS %s (%.0f B), plan %s (%.0f B), measured/plan %.3f",
                  monitor::FormatBytes(peak).c_str(), peak, monitor::FormatBytes(planned).c_str(), planned,
                  planned > 0 ? peak / planned : 0.0));
  }
  if (env_.log) {
    Say(StrFormat("done: %lld steps in %s, train_loss %.4f%s; wrote %s", (long long)state_.global_step,
                  monitor::FormatDuration(summary_.train_runtime).c_str(), summary_.train_loss,
                  summary_.eval_losses.empty()
                      ? ""
                      : StrFormat(", eval_loss %.4f", summary_.eval_losses.back()).c_str(),
                  out.c_str()));
  }
  return summary_;
}

}  // namespace lathe::train
