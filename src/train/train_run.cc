// `lathe train` from a config: checks, loading, datasets, TrainModel, Trainer.
#include "train/train_run.h"

#include <cstdlib>
#include <filesystem>

#include "core/profiler.h"
#include "core/strings.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "model/loader.h"
#include "model/train_model.h"
#include "monitor/memory.h"
#include "train/memory_plan.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/hf_export.h"
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
  const double rss_start = (double)monitor::ProcessRssBytes();  // binary + libraries

  model::LoadOptions lo;
  lo.tokenizer_path = o.tokenizer_path;
  auto loaded = model::LoadModel(c.model_name_or_path, lo);
  if (!loaded.ok()) return loaded.status().WithContext("key 'model_name_or_path'");
  model::LoadedModel& lm = **loaded;
  double base_bytes = lm.weights.StoredBytes();
  const double rss_loaded = (double)monitor::ProcessRssBytes();
  const tokenizer::Tokenizer& tok = *lm.tokenizer;
  if (c.template_name.empty()) tmpl = tokenizer::ChatTemplate::Detect(tok.chat_template());
  tmpl.set_enable_thinking(c.enable_thinking);
  // A Llama 3.2 jinja writes today's date into every prompt; training pins its own fallback date so the samples
  // (and a resumed run's losses) do not depend on the day.
  tmpl.set_date("26 Jul 2024");
  if (o.log) {
    std::fprintf(o.log, "model: %s (%s) %s\n", c.model_name_or_path.c_str(), lm.format.c_str(),
                 lm.weights.config.Summary().c_str());
    if (c.stage == "sft") {
      const bool alias = !c.template_name.empty() && c.template_name != tmpl.name();  // LLaMA-Factory's qwen3, ...
      std::fprintf(o.log, "template: %s%s%s%s\n", alias ? c.template_name.c_str() : "", alias ? " (" : "",
                   tmpl.name().c_str(), alias ? ")" : "");
    }
    for (const std::string& k : c.ignored_keys)
      std::fprintf(o.log, "note: key '%s' has no effect in lathe\n", k.c_str());
  }

  // adapter_name_or_path: the run continues that PEFT adapter, with its rank, alpha, rsLoRA and modules (as
  // PeftModel.from_pretrained(..., is_trainable=True) does in LLaMA-Factory), whatever lora_rank / lora_target say.
  std::unique_ptr<model::LoraAdapter> resumed;
  if (!c.adapter_name_or_path.empty()) {
    c.adapter_name_or_path = ExpandHome(c.adapter_name_or_path);
    auto a = model::LoadPeftAdapter(c.adapter_name_or_path, lm.weights.config);
    if (!a.ok()) return a.status().WithContext("key 'adapter_name_or_path'");
    resumed = std::move(*a);
    c.lora_rank = resumed->rank;
    c.lora_alpha = resumed->alpha;
    c.use_rslora = resumed->rslora;
    c.lora_target.clear();
    for (int m = 0; m < (int)model::LoraModule::kCount; ++m)
      if (resumed->layers.size() > 0 && resumed->at(0, (model::LoraModule)m).a.data)
        c.lora_target.push_back(model::LoraModuleName((model::LoraModule)m));
    if (o.log) {
      std::string mods;
      for (const std::string& t : c.lora_target) mods += (mods.empty() ? "" : ",") + t;
      std::fprintf(o.log, "adapter: continuing %s (r %lld, alpha %g%s, %s)\n", c.adapter_name_or_path.c_str(),
                   (long long)c.lora_rank, c.lora_alpha, c.use_rslora ? ", rsLoRA" : "", mods.c_str());
    }
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

  // The datasets' bytes: what the process grew by since loading, before a quantized base is packed (its packed
  // bytes are base weights, counted as such).
  const double rss_data = (double)monitor::ProcessRssBytes();
  DType qtype;
  if (QuantizedBaseDType(c, &qtype)) {
    // Frozen layers: every layer for LoRA, all but the last freeze_trainable_layers for freeze.
    const int64_t n_layers = (int64_t)lm.weights.layers.size();
    const int64_t frozen =
        c.finetuning_type == "lora" ? n_layers : std::max<int64_t>(n_layers - c.freeze_trainable_layers, 0);
    LATHE_ASSIGN_OR_RETURN(QuantizeBaseReport qr, QuantizeBaseWeights(&lm.weights, qtype, frozen));
    // The packed bytes replace the sources' (their pages were handed back, quantize_base.h; the
    // few partial pages at tensor edges stay).
    base_bytes -= (double)qr.released_bytes;
    for (const model::LayerWeights& l : lm.weights.layers) {
      for (const Tensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
        if (t->dtype == qtype) base_bytes += (double)PackedQuantBytes(qtype, t->shape[0], t->shape[1]);
    }
    if (o.log) {
      std::fprintf(o.log,
                   "quantized base: %lld linear weights -> %s (%.2f bits/param over linear weights); "
                   "base resident %.2f MB, %.3f bytes/param; sources released %.2f MB\n",
                   (long long)qr.quantized, DTypeName(qtype),
                   8.0 * (double)qr.linear_bytes / (double)std::max<int64_t>(qr.linear_params, 1),
                   (double)qr.base_bytes / 1e6,
                   (double)qr.base_bytes / (double)std::max<int64_t>(qr.base_params, 1),
                   (double)qr.released_bytes / 1e6);
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
  mo.row_group_workers = c.row_group_workers;
  mo.bf16 = c.bf16;
  mo.fp16 = c.fp16;
  mo.gradient_checkpointing = c.gradient_checkpointing;
  mo.seed = (uint64_t)c.seed;
  std::unique_ptr<Profiler> profiler;
  if (!o.profile_path.empty()) {
    profiler = std::make_unique<Profiler>();
    mo.profiler = profiler.get();
  }

  // The memory plan of this run: the largest micro-batch (train or eval) sizes the activations;
  // the baseline is measured: RSS before the model, plus what loading grew beyond the base
  // weights (tokenizer, loader buffers), plus the tokenized datasets.
  int64_t longest_train = 0, longest_eval = 0;
  for (const TokenizedSample& s : data.train)
    longest_train = std::max<int64_t>(longest_train, (int64_t)s.input_ids.size());
  for (const TokenizedSample& s : data.eval)
    longest_eval = std::max<int64_t>(longest_eval, (int64_t)s.input_ids.size());
  TrainSetup ts;
  ts.lathe = true;
  ts.method = c.finetuning_type;
  ts.precision = c.bf16 || c.fp16 ? "bf16" : "fp32";  // TrainModel keeps the same buffers for fp16 as for bf16
  const bool paged = c.optim.rfind("paged_", 0) == 0, eight_bit = c.optim.find("8bit") != std::string::npos;
  ts.optimizer = c.optim == "sgd" ? "sgd"
                 : paged          ? (eight_bit ? "paged_adamw_8bit" : "paged_adamw_32bit")
                 : eight_bit      ? "adamw_8bit"
                                  : "adamw";
  ts.batch_size = c.per_device_train_batch_size;
  ts.seq_len = std::max<int64_t>(longest_train, 1);
  const int64_t eval_tokens = c.per_device_eval_batch_size * longest_eval;
  if (eval_tokens > ts.batch_size * ts.seq_len) {
    ts.batch_size = c.per_device_eval_batch_size;
    ts.seq_len = longest_eval;
  }
  ts.grad_checkpointing = c.gradient_checkpointing;
  ts.lora_rank = c.lora_rank;
  ts.lora_dropout = c.finetuning_type == "lora" ? c.lora_dropout : 0;
  ts.lora_targets.clear();
  for (model::LoraModule m : mo.lora_targets) {
    std::string n = model::LoraModuleName(m);
    ts.lora_targets.push_back(n.substr(0, n.find("_proj")));
  }
  ts.freeze_trainable_layers = c.freeze_trainable_layers;
  ts.loss_chunk_tokens = mo.loss_chunk_tokens;
  ts.row_group_tokens = mo.row_group_tokens;
  ts.row_group_workers = mo.row_group_workers;
  ts.grad_accum = c.gradient_accumulation_steps;
  ts.base_weight_bytes = base_bytes;
  if (!lm.weights.layers.empty()) ts.base_dtype = lm.weights.layers[0].wq.dtype;
  if (lm.weights.output.data) ts.head_dtype = lm.weights.output.dtype;
  if (QuantizedBaseDType(c, &qtype))
    ts.base_quant = BaseQuantName(qtype);
  ts.threads = o.threads;
  ts.baseline_bytes =
      rss_start + std::max(0.0, rss_loaded - rss_start - base_bytes) + std::max(0.0, rss_data - rss_loaded);

  mo.hand_back_pages = LatheHandsBackPages(ts);  // the plan's overlap line decides the same way
  ThreadPool pool(o.threads);
  pool.SetSpinIters(ThreadPool::kTrainSpinIters);  // products follow each other with short serial gaps
  if (profiler) pool.SetProfiler(profiler.get());
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<model::TrainModel> tm,
                         model::TrainModel::Create(lm.weights, pool, mo));
  if (resumed) {
    LATHE_RETURN_IF_ERROR(tm->ImportAdapter(*resumed).WithContext("key 'adapter_name_or_path'"));
  }
  // Full / freeze: the model dropped the file pages of the base tensors it copied to f32 masters; LoRA / freeze
  // in bf16 mode, those of the frozen f32 linears it keeps as bf16 copies (model::FrozenLinearsAsBf16).
  ts.base_released_bytes = (double)tm->AllocatedBytes().base_released;
  ts.frozen_copy_bytes = (double)tm->AllocatedBytes().frozen_copies;
  Result<MemoryPlan> memory_plan = PlanTraining(lm.weights.config, ts);
  if (!memory_plan.ok() && o.log) {
    std::fprintf(o.log, "note: no memory plan for this run: %s\n", memory_plan.status().message().c_str());
  }

  TrainerEnv env;
  env.base_model_name = c.model_name_or_path;
  // The tokenizer the run used travels with the weights when it is made of HF / SentencePiece
  // files (a GGUF's or llama2.c tokenizer has no such file to copy).
  env.tokenizer_files = TokenizerFiles(!o.tokenizer_path.empty() ? o.tokenizer_path
                                       : lm.format == "hf"       ? c.model_name_or_path
                                                                 : std::string());
  // A GGUF base's vocabulary (byte-level BPE or SentencePiece) is written out as HF tokenizer files (full / freeze
  // save an HF folder); it is read from the file again, once per run (the loaded model keeps no GgufFile).
  std::string no_tokenizer_why;
  if (env.tokenizer_files.empty() && o.tokenizer_path.empty() && lm.format == "gguf" && c.finetuning_type != "lora") {
    auto g = formats::GgufFile::Open(c.model_name_or_path);
    auto texts = g.ok() ? tokenizer::HfTokenizerFilesFromGguf(**g)
                        : Result<std::vector<std::pair<std::string, std::string>>>(g.status());
    if (texts.ok()) {
      env.tokenizer_texts = std::move(texts).value();
    } else {
      no_tokenizer_why = texts.status().message();
    }
  }
  // Pad with EOS (as LLaMA-Factory does when a tokenizer has no pad token); labels mask it anyway.
  env.pad_id = tok.eos_id() >= 0 ? tok.eos_id() : 0;
  const model::ModelConfig& mc = lm.weights.config;
  env.flops_params = std::max<int64_t>(mc.ParamCount() - mc.vocab_size * mc.dim, 0);
  env.log = o.log;
  env.interactive = o.interactive;
  env.memory_plan = memory_plan.ok() ? &*memory_plan : nullptr;
  env.base_weight_bytes = base_bytes;
  env.monitor = o.monitor;
  env.pool = &pool;
  env.hand_back_pages = mo.hand_back_pages;
  LATHE_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(c, *tm, std::move(data), env));
  LATHE_ASSIGN_OR_RETURN(TrainSummary s, trainer->Run());
  pool.SetProfiler(nullptr);
  if (profiler) {
    LATHE_RETURN_IF_ERROR(profiler->WriteChromeTrace(o.profile_path).WithContext("--profile"));
    if (o.log)
      std::fprintf(o.log, "profile: wrote %s\n%s", o.profile_path.c_str(), profiler->Summary().c_str());
  }
  if (o.log && env.tokenizer_files.empty() && env.tokenizer_texts.empty() && c.finetuning_type != "lora") {
    if (!no_tokenizer_why.empty()) std::fprintf(o.log, "note: no tokenizer.json written: %s\n", no_tokenizer_why.c_str());
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
