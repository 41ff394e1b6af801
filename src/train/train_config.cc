// TrainConfig parsing: one table maps each key to its field and type.
#include "train/train_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>

#include "core/strings.h"

namespace lathe::train {

namespace {

// Keys accepted for compatibility with LLaMA-Factory configs, with no effect in lathe.
const char* const kIgnored[] = {"trust_remote_code", "overwrite_cache", "preprocessing_num_workers",
                                "dataloader_num_workers", "plot_loss", "save_only_model", "ddp_timeout",
                                "flash_attn", "use_fast_tokenizer", "tokenized_path", "streaming",
                                "cache_dir", "hub_model_id", "push_to_hub", "logging_dir_suffix",
                                "include_num_input_tokens_seen", "disable_tqdm"};

struct Setter {
  const char* expected;
  std::function<Status(TrainConfig*, const std::string& key, const std::string& value)> set;
};

Status BadValue(const std::string& key, const std::string& value, const char* expected) {
  return Status::Error(StrFormat("key '%s': '%s' is not %s", key.c_str(), value.c_str(), expected));
}

Setter Str(std::string TrainConfig::*f, std::vector<std::string> allowed = {}) {
  return {"a string", [f, allowed](TrainConfig* c, const std::string& k, const std::string& v) -> Status {
            if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
              std::string list;
              for (auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
              std::string near = Nearest(v, allowed);
              return Status::Error(StrFormat("key '%s': '%s' is not one of %s%s", k.c_str(), v.c_str(), list.c_str(),
                                             near.empty() ? "" : (" (did you mean '" + near + "'?)").c_str()));
            }
            c->*f = v;
            return Status::Ok();
          }};
}

Setter Int(int64_t TrainConfig::*f, int64_t lo = INT64_MIN) {
  return {"an integer", [f, lo](TrainConfig* c, const std::string& k, const std::string& v) -> Status {
            char* end = nullptr;
            long long x = std::strtoll(v.c_str(), &end, 10);
            if (v.empty() || *end) {
              // Accept integral floats such as "3.0" or "1e3".
              double d = std::strtod(v.c_str(), &end);
              if (v.empty() || *end || d != (double)(long long)d) return BadValue(k, v, "an integer");
              x = (long long)d;
            }
            if (x < lo) return Status::Error(StrFormat("key '%s': %lld is below the minimum %lld", k.c_str(), x, (long long)lo));
            c->*f = x;
            return Status::Ok();
          }};
}

Setter Float(double TrainConfig::*f, double lo = -1e300) {
  return {"a number", [f, lo](TrainConfig* c, const std::string& k, const std::string& v) -> Status {
            char* end = nullptr;
            double x = std::strtod(v.c_str(), &end);
            if (v.empty() || *end) return BadValue(k, v, "a number");
            if (x < lo) return Status::Error(StrFormat("key '%s': %g is below the minimum %g", k.c_str(), x, lo));
            c->*f = x;
            return Status::Ok();
          }};
}

Setter Bool(bool TrainConfig::*f) {
  return {"true or false", [f](TrainConfig* c, const std::string& k, const std::string& v) -> Status {
            std::string l = v;
            std::transform(l.begin(), l.end(), l.begin(), ::tolower);
            if (l == "true" || l == "1" || l == "yes") c->*f = true;
            else if (l == "false" || l == "0" || l == "no") c->*f = false;
            else return BadValue(k, v, "true or false");
            return Status::Ok();
          }};
}

// Comma-separated list (YAML sequences arrive joined by commas).
Setter List(std::vector<std::string> TrainConfig::*f) {
  return {"a list", [f](TrainConfig* c, const std::string&, const std::string& v) -> Status {
            std::vector<std::string> out;
            size_t p = 0;
            while (p <= v.size()) {
              size_t q = v.find(',', p);
              if (q == std::string::npos) q = v.size();
              std::string item = v.substr(p, q - p);
              item.erase(0, item.find_first_not_of(" \t"));
              item.erase(item.find_last_not_of(" \t") + 1);
              if (!item.empty()) out.push_back(item);
              p = q + 1;
            }
            c->*f = out;
            return Status::Ok();
          }};
}

// quantization_bit: 4 (NF4/FP4, QLoRA) or 8 (LLM.int8); LLaMA-Factory's other widths need
// methods (HQQ, EETQ) lathe does not have.
Setter QuantBits() {
  return {"4 or 8", [](TrainConfig* c, const std::string& k, const std::string& v) -> Status {
            if (v == "4" || v == "8") {
              c->quantization_bit = v[0] - '0';
              return Status::Ok();
            }
            return BadValue(k, v, "4 or 8 (bitsandbytes NF4/FP4 or int8)");
          }};
}

const std::map<std::string, Setter>& Table() {
  static const std::map<std::string, Setter> t = {
      {"model_name_or_path", Str(&TrainConfig::model_name_or_path)},
      {"adapter_name_or_path", Str(&TrainConfig::adapter_name_or_path)},
      {"stage", Str(&TrainConfig::stage, {"sft", "pt"})},
      {"do_train", Bool(&TrainConfig::do_train)},
      {"finetuning_type", Str(&TrainConfig::finetuning_type, {"lora", "full", "freeze"})},
      {"lora_rank", Int(&TrainConfig::lora_rank, 1)},
      {"lora_alpha", Float(&TrainConfig::lora_alpha, 0)},
      {"lora_dropout", Float(&TrainConfig::lora_dropout, 0)},
      {"lora_target", List(&TrainConfig::lora_target)},
      {"use_rslora", Bool(&TrainConfig::use_rslora)},
      {"freeze_trainable_layers", Int(&TrainConfig::freeze_trainable_layers, 1)},
      {"dataset", List(&TrainConfig::dataset)},
      {"eval_dataset", List(&TrainConfig::eval_dataset)},
      {"dataset_dir", Str(&TrainConfig::dataset_dir)},
      {"template", Str(&TrainConfig::template_name)},
      {"cutoff_len", Int(&TrainConfig::cutoff_len, 2)},
      {"max_samples", Int(&TrainConfig::max_samples, 0)},
      {"val_size", Float(&TrainConfig::val_size, 0)},
      {"packing", Bool(&TrainConfig::packing)},
      {"group_by_length", Bool(&TrainConfig::group_by_length)},
      {"train_on_prompt", Bool(&TrainConfig::train_on_prompt)},
      {"mask_history", Bool(&TrainConfig::mask_history)},
      {"enable_thinking", Bool(&TrainConfig::enable_thinking)},
      {"per_device_train_batch_size", Int(&TrainConfig::per_device_train_batch_size, 1)},
      {"per_device_eval_batch_size", Int(&TrainConfig::per_device_eval_batch_size, 1)},
      {"gradient_accumulation_steps", Int(&TrainConfig::gradient_accumulation_steps, 1)},
      {"learning_rate", Float(&TrainConfig::learning_rate, 0)},
      {"num_train_epochs", Float(&TrainConfig::num_train_epochs, 0)},
      {"max_steps", Int(&TrainConfig::max_steps, -1)},
      {"lr_scheduler_type",
       Str(&TrainConfig::lr_scheduler_type, {"linear", "cosine", "constant", "constant_with_warmup"})},
      {"warmup_ratio", Float(&TrainConfig::warmup_ratio, 0)},
      {"warmup_steps", Int(&TrainConfig::warmup_steps, 0)},
      {"weight_decay", Float(&TrainConfig::weight_decay, 0)},
      {"max_grad_norm", Float(&TrainConfig::max_grad_norm, 0)},
      {"optim", Str(&TrainConfig::optim, {"adamw_torch", "adamw_hf", "adamw_torch_fused", "adamw_8bit", "paged_adamw_8bit",
                                          "paged_adamw_32bit", "sgd"})},
      {"optim_resident_mb", Int(&TrainConfig::optim_resident_mb, 0)},
      {"quantization_bit", QuantBits()},
      {"quantization_method", Str(&TrainConfig::quantization_method, {"bnb"})},
      {"quantization_type", Str(&TrainConfig::quantization_type, {"nf4", "fp4"})},
      {"bnb_4bit_quant_type", Str(&TrainConfig::quantization_type, {"nf4", "fp4"})},
      {"double_quantization", Bool(&TrainConfig::double_quantization)},
      {"bnb_4bit_use_double_quant", Bool(&TrainConfig::double_quantization)},
      {"bf16", Bool(&TrainConfig::bf16)},
      {"fp16", Bool(&TrainConfig::fp16)},
      {"pure_bf16", Bool(&TrainConfig::pure_bf16)},
      {"gradient_checkpointing", Bool(&TrainConfig::gradient_checkpointing)},
      {"row_group_workers", Int(&TrainConfig::row_group_workers, 0)},
      {"logging_steps", Int(&TrainConfig::logging_steps, 1)},
      {"save_steps", Int(&TrainConfig::save_steps, 1)},
      {"save_total_limit", Int(&TrainConfig::save_total_limit, 0)},
      {"eval_steps", Int(&TrainConfig::eval_steps, 0)},
      {"eval_strategy", Str(&TrainConfig::eval_strategy, {"no", "steps", "epoch"})},
      {"output_dir", Str(&TrainConfig::output_dir)},
      {"overwrite_output_dir", Bool(&TrainConfig::overwrite_output_dir)},
      {"seed", Int(&TrainConfig::seed, 0)},
      {"report_to", List(&TrainConfig::report_to)},
      {"resume_from_checkpoint", Str(&TrainConfig::resume_from_checkpoint)},
  };
  return t;
}

Status Set(TrainConfig* c, const std::string& key, const std::string& value, const std::string& where) {
  const auto& t = Table();
  auto it = t.find(key);
  if (it == t.end()) {
    if (std::find(std::begin(kIgnored), std::end(kIgnored), key) != std::end(kIgnored)) {
      c->ignored_keys.push_back(key);
      return Status::Ok();
    }
    std::string near = Nearest(key, TrainConfigKeys());
    return Status::Error(StrFormat("%s: unknown key '%s'%s", where.c_str(), key.c_str(),
                                   near.empty() ? "" : (" (did you mean '" + near + "'?)").c_str()));
  }
  return it->second.set(c, key, value).WithContext(where);
}

}  // namespace

std::vector<std::string> TrainConfigKeys() {
  std::vector<std::string> keys;
  for (const auto& [k, v] : Table()) keys.push_back(k);
  return keys;
}

Result<std::vector<ConfigEntry>> ReadConfigYaml(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Status::Error(StrFormat("%s: invalid YAML at line %d, column %d: %s", source.c_str(), e.mark.line + 1,
                                   e.mark.column + 1, e.msg.c_str()));
  }
  if (root.IsNull()) return Status::Error(source + ": empty config");
  if (!root.IsMap()) return Status::Error(source + ": the config must be a mapping of key: value");
  std::vector<ConfigEntry> out;
  for (const auto& kv : root) {
    ConfigEntry e;
    e.key = kv.first.as<std::string>();
    e.where = StrFormat("%s line %d", source.c_str(), kv.first.Mark().line + 1);
    const YAML::Node& v = kv.second;
    if (v.IsNull()) {
      continue;  // `key: null` / `key:` keeps the default (LLaMA-Factory writes resume_from_checkpoint: null)
    } else if (v.IsScalar()) {
      e.value = v.Scalar();
    } else if (v.IsSequence()) {
      for (const auto& item : v) {
        if (!item.IsScalar()) return Status::Error(e.where + ": key '" + e.key + "' must be a list of plain values");
        e.value += (e.value.empty() ? "" : ",") + item.Scalar();
      }
    } else {
      return Status::Error(e.where + ": key '" + e.key + "' must be a value or a list, not a mapping");
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<ConfigEntry> OverrideEntries(const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<ConfigEntry> out;
  for (const auto& [k, v] : overrides) {
    std::string key = k;
    while (!key.empty() && key[0] == '-') key.erase(0, 1);
    std::replace(key.begin(), key.end(), '-', '_');
    out.push_back({key, v, "command line --" + key});
  }
  return out;
}

Result<TrainConfig> ParseTrainConfig(const std::string& text, const std::string& source) {
  LATHE_ASSIGN_OR_RETURN(std::vector<ConfigEntry> entries, ReadConfigYaml(text, source));
  TrainConfig c;
  for (const ConfigEntry& e : entries) LATHE_RETURN_IF_ERROR(Set(&c, e.key, e.value, e.where));
  return c;
}

Status ApplyOverrides(TrainConfig* c, const std::vector<std::pair<std::string, std::string>>& overrides) {
  for (const ConfigEntry& e : OverrideEntries(overrides)) LATHE_RETURN_IF_ERROR(Set(c, e.key, e.value, e.where));
  return Status::Ok();
}

Status TrainConfig::Validate() const {
  if (model_name_or_path.empty()) return Status::Error("key 'model_name_or_path' is required");
  if (output_dir.empty()) return Status::Error("key 'output_dir' is required");
  if (do_train && dataset.empty()) return Status::Error("key 'dataset' is required for training");
  if ((int)bf16 + (int)fp16 + (int)pure_bf16 > 1) return Status::Error("choose one of bf16, fp16, pure_bf16");
  if (warmup_ratio > 1) return Status::Error("key 'warmup_ratio' must be in [0, 1]");
  if (lora_dropout >= 1) return Status::Error("key 'lora_dropout' must be in [0, 1)");
  for (const std::string& r : report_to) {
    if (r != "none" && r != "tensorboard") {
      return Status::Error("key 'report_to': '" + r + "' is not supported (none, tensorboard)");
    }
  }
  return Status::Ok();
}

bool QuantizedBaseDType(const TrainConfig& c, DType* out) {
  if (c.quantization_bit == 8) {
    *out = DType::kI8Row;
    return true;
  }
  if (c.quantization_bit != 4) return false;
  const bool nf4 = c.quantization_type != "fp4";
  *out = c.double_quantization ? (nf4 ? DType::kNF4DQ : DType::kFP4DQ) : (nf4 ? DType::kNF4 : DType::kFP4);
  return true;
}

}  // namespace lathe::train
