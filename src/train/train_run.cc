// `lathe train` from a config: checks, loading, datasets, TrainModel, Trainer.
#include "train/train_run.h"

#include <cstdlib>
#include <filesystem>

#include "core/strings.h"
#include "core/thread_pool.h"
#include "model/loader.h"
#include "model/train_model.h"
#include "tokenizer/chat_template.h"
#include "train/quantize_base.h"

namespace lathe::train {

namespace fs = std::filesystem;

namespace {

// "~/..." -> "$HOME/..." (YAML files are not expanded by a shell).
std::string ExpandHome(const std::string& path) {
  const char* home = std::getenv("HOME");
  if (path.rfind("~/", 0) == 0 && home && *home) return std::string(home) + path.substr(1);
  return path;
}

}  // namespace

Result<TrainSummary> RunTraining(const TrainConfig& config, const RunOptions& o) {
  TrainConfig c = config;
  c.model_name_or_path = ExpandHome(c.model_name_or_path);
  c.output_dir = ExpandHome(c.output_dir);
  c.dataset_dir = ExpandHome(c.dataset_dir);
  LATHE_RETURN_IF_ERROR(c.Validate());
  LATHE_RETURN_IF_ERROR(CheckTrainerConfig(c));
  std::error_code ec;
  if (!fs::exists(c.model_name_or_path, ec)) {
    return Status::Error(
        "key 'model_name_or_path': '" + c.model_name_or_path +
        "' does not exist (expected a .gguf file, an HF model directory or a llama2.c .bin; models "
        "are not downloaded)");
  }
  tokenizer::ChatTemplate tmpl = tokenizer::ChatTemplate::Detect("");
  if (!c.template_name.empty()) {
    auto t = tokenizer::ChatTemplate::ByName(c.template_name);
    if (!t.ok()) return t.status().WithContext("key 'template'");
    tmpl = *t;
  }
  // Resuming writes into the run's own output_dir.
  LATHE_RETURN_IF_ERROR(
      PrepareOutputDir(c.output_dir, c.overwrite_output_dir || !c.resume_from_checkpoint.empty()));

  model::LoadOptions lo;
  lo.tokenizer_path = o.tokenizer_path;
  auto loaded = model::LoadModel(c.model_name_or_path, lo);
  if (!loaded.ok()) return loaded.status().WithContext("key 'model_name_or_path'");
  model::LoadedModel& lm = **loaded;
  const tokenizer::Tokenizer& tok = *lm.tokenizer;
  if (c.template_name.empty()) tmpl = tokenizer::ChatTemplate::Detect(tok.chat_template());
  if (o.log) {
    std::fprintf(o.log, "model: %s (%s) %s\n", c.model_name_or_path.c_str(), lm.format.c_str(),
                 lm.weights.config.Summary().c_str());
    if (c.stage == "sft") std::fprintf(o.log, "template: %s\n", tmpl.name().c_str());
    for (const std::string& k : c.ignored_keys)
      std::fprintf(o.log, "note: key '%s' has no effect in lathe\n", k.c_str());
  }

  LATHE_ASSIGN_OR_RETURN(DatasetSplit data, BuildDatasets(c, tok, tmpl));
  for (const std::string& name : c.eval_dataset) {
    TrainConfig ec_cfg = c;
    ec_cfg.dataset = {name};
    ec_cfg.eval_dataset.clear();
    ec_cfg.val_size = 0;
    ec_cfg.packing = false;
    LATHE_ASSIGN_OR_RETURN(DatasetSplit ev, BuildDatasets(ec_cfg, tok, tmpl));
    data.eval.insert(data.eval.end(), std::make_move_iterator(ev.train.begin()),
                     std::make_move_iterator(ev.train.end()));
  }
  if (o.log) {
    std::fprintf(
        o.log,
        "data: %lld records -> %zu train / %zu eval samples (%lld truncated to cutoff_len %lld, %lld "
        "without target tokens dropped)\n",
        (long long)data.examples, data.train.size(), data.eval.size(), (long long)data.truncated,
        (long long)c.cutoff_len, (long long)data.dropped);
  }

  DType qtype;
  if (QuantizedBaseDType(c, &qtype)) {
    // Frozen layers: every layer for LoRA, all but the last freeze_trainable_layers for freeze.
    const int64_t n_layers = (int64_t)lm.weights.layers.size();
    const int64_t frozen =
        c.finetuning_type == "lora" ? n_layers : std::max<int64_t>(n_layers - c.freeze_trainable_layers, 0);
    LATHE_ASSIGN_OR_RETURN(QuantizeBaseReport qr, QuantizeBaseWeights(&lm.weights, qtype, frozen));
    if (o.log) {
      std::fprintf(o.log,
                   "quantized base: %lld linear weights -> %s (%.2f bits/param over linear weights); "
                   "base resident %.2f MB, %.3f bytes/param\n",
                   (long long)qr.quantized, DTypeName(qtype),
                   8.0 * (double)qr.linear_bytes / (double)std::max<int64_t>(qr.linear_params, 1),
                   (double)qr.base_bytes / 1e6,
                   (double)qr.base_bytes / (double)std::max<int64_t>(qr.base_params, 1));
      for (const std::string& k : qr.kept) std::fprintf(o.log, "quantized base: kept %s\n", k.c_str());
    }
  }

  model::TrainModelOptions mo;
  mo.method = c.finetuning_type == "lora"   ? model::FinetuneMethod::kLora
              : c.finetuning_type == "full" ? model::FinetuneMethod::kFull
                                            : model::FinetuneMethod::kFreeze;
  mo.lora_rank = c.lora_rank;
  mo.lora_alpha = c.lora_alpha > 0 ? c.lora_alpha : 2.0 * (double)c.lora_rank;
  mo.lora_dropout = c.lora_dropout;
  mo.use_rslora = c.use_rslora;
  if (c.finetuning_type == "lora") {
    LATHE_ASSIGN_OR_RETURN(mo.lora_targets, ParseLoraTargets(c.lora_target));
  }
  mo.freeze_trainable_layers = c.freeze_trainable_layers;
  mo.bf16 = c.bf16;
  mo.fp16 = c.fp16;
  mo.gradient_checkpointing = c.gradient_checkpointing;
  mo.seed = (uint64_t)c.seed;

  ThreadPool pool(o.threads);
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<model::TrainModel> tm,
                         model::TrainModel::Create(lm.weights, pool, mo));

  TrainerEnv env;
  env.base_model_name = c.model_name_or_path;
  // The tokenizer the run used travels with the weights when it is made of HF / SentencePiece
  // files (a GGUF's or llama2.c tokenizer has no such file to copy).
  env.tokenizer_files = TokenizerFiles(!o.tokenizer_path.empty() ? o.tokenizer_path
                                       : lm.format == "hf"       ? c.model_name_or_path
                                                                 : std::string());
  // Pad with EOS (as LLaMA-Factory does when a tokenizer has no pad token); labels mask it anyway.
  env.pad_id = tok.eos_id() >= 0 ? tok.eos_id() : 0;
  const model::ModelConfig& mc = lm.weights.config;
  env.flops_params = std::max<int64_t>(mc.ParamCount() - mc.vocab_size * mc.dim, 0);
  env.log = o.log;
  env.interactive = o.interactive;
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(c, *tm, std::move(data), env));
  LATHE_ASSIGN_OR_RETURN(TrainSummary s, trainer->Run());
  if (o.log && env.tokenizer_files.empty() && c.finetuning_type != "lora") {
    std::string hint =
        lm.format == "gguf"
            ? "--tokenizer " + c.model_name_or_path
            : std::string(
                  "--tokenizer pointing at the tokenizer beside the .bin (tok<vocab>.bin, tokenizer.bin)");
    std::fprintf(o.log,
                 "note: the model came from a %s file, so %s has no tokenizer files; load it with %s\n",
                 lm.format.c_str(), c.output_dir.c_str(),
                 o.tokenizer_path.empty() ? hint.c_str() : ("--tokenizer " + o.tokenizer_path).c_str());
  }
  return s;
}

}  // namespace lathe::train
