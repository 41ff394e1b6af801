// LLaMA-Factory's export config -> MergeLora.
#include "tools/export.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "core/strings.h"
#include "formats/atomic_file.h"
#include "train/train_config.h"

namespace lathe::tools {

namespace fs = std::filesystem;

namespace {

// LLaMA-Factory's export keys with an effect here, and those accepted without one.
const char* const kKeys[] = {"model_name_or_path", "adapter_name_or_path", "finetuning_type", "template",
                             "export_dir",         "export_size",          "infer_dtype",     "export_legacy_format",
                             "export_quantization_bit"};
const char* const kIgnored[] = {"export_device", "trust_remote_code", "export_quantization_dataset",
                                "export_quantization_nsamples", "export_quantization_maxlen", "stage", "do_train",
                                "use_fast_tokenizer", "hf_hub_token", "cache_dir"};
// Refused whatever the value: they ask for what lathe does not do.
const char* const kRefused[] = {"export_hub_model_id"};

bool IsTrue(const std::string& v) { return v == "true" || v == "True" || v == "1"; }
bool IsFalse(const std::string& v) { return v == "false" || v == "False" || v == "0"; }

Status Set(ExportConfig* c, const std::string& key, const std::string& value, const std::string& where) {
  auto bad = [&](const std::string& what) {
    return Status::Error(where + ": key '" + key + "': " + what + ", got '" + value + "'");
  };
  if (key == "model_name_or_path") {
    c->model_name_or_path = value;
  } else if (key == "adapter_name_or_path") {
    c->adapter_name_or_path.clear();
    size_t b = 0;
    for (size_t e; b <= value.size(); b = e + 1) {  // a YAML list arrives joined by commas
      e = value.find(',', b);
      if (e == std::string::npos) e = value.size();
      if (e > b) c->adapter_name_or_path.push_back(value.substr(b, e - b));
    }
  } else if (key == "finetuning_type") {
    if (value != "lora" && value != "full" && value != "freeze") return bad("expected lora, full or freeze");
    c->finetuning_type = value;
  } else if (key == "template") {
    c->template_name = value;
  } else if (key == "export_dir") {
    c->export_dir = value;
  } else if (key == "export_size") {
    char* end = nullptr;
    const double gb = std::strtod(value.c_str(), &end);
    if (value.empty() || *end || !(gb > 0) || !std::isfinite(gb)) return bad("expected a positive number of GB");
    c->export_size = gb;
  } else if (key == "infer_dtype") {
    if (value != "auto" && value != "float32" && value != "float16" && value != "bfloat16")
      return bad("expected auto, float32, float16 or bfloat16");
    c->infer_dtype = value;
  } else if (key == "export_legacy_format") {
    if (IsTrue(value)) {
      return Status::Error(where + ": export_legacy_format: true asks for pytorch_model.bin files; lathe writes "
                                   "safetensors only (set it to false)");
    }
    if (!IsFalse(value)) return bad("expected true or false");
  } else if (key == "export_quantization_bit") {
    return Status::Error(where + ": export_quantization_bit: GPTQ quantization of the export is not available; "
                                 "merge to a GGUF and `lathe quantize` it (q4_k_m, q8_0, ...) instead");
  } else if (std::find(std::begin(kRefused), std::end(kRefused), key) != std::end(kRefused)) {
    return Status::Error(where + ": " + key + ": uploading to the Hugging Face Hub is not available here");
  } else if (std::find(std::begin(kIgnored), std::end(kIgnored), key) != std::end(kIgnored)) {
    c->ignored_keys.push_back(key);
  } else {
    std::vector<std::string> known(std::begin(kKeys), std::end(kKeys));
    known.insert(known.end(), std::begin(kIgnored), std::end(kIgnored));
    const std::string near = Nearest(key, known);
    return Status::Error(where + ": unknown key '" + key + "'" +
                         (near.empty() ? "" : " (did you mean '" + near + "'?)"));
  }
  return Status::Ok();
}

}  // namespace

Result<ExportConfig> ParseExportConfig(const std::string& text, const std::string& source,
                                       const std::vector<std::pair<std::string, std::string>>& overrides) {
  LATHE_ASSIGN_OR_RETURN(std::vector<train::ConfigEntry> entries, train::ReadConfigYaml(text, source));
  ExportConfig c;
  for (const train::ConfigEntry& e : entries) LATHE_RETURN_IF_ERROR(Set(&c, e.key, e.value, e.where));
  for (const train::ConfigEntry& e : train::OverrideEntries(overrides))
    LATHE_RETURN_IF_ERROR(Set(&c, e.key, e.value, e.where));
  if (c.model_name_or_path.empty()) return Status::Error(source + ": key 'model_name_or_path' is required");
  if (c.export_dir.empty()) return Status::Error(source + ": key 'export_dir' is required");
  if (c.finetuning_type == "lora" && c.adapter_name_or_path.empty()) {
    return Status::Error(source + ": finetuning_type lora: key 'adapter_name_or_path' is required (the adapter to "
                                  "merge)");
  }
  if (c.finetuning_type != "lora" && !c.adapter_name_or_path.empty()) {
    return Status::Error(source + ": adapter_name_or_path is given with finetuning_type " + c.finetuning_type +
                         ": merging an adapter is finetuning_type lora");
  }
  return c;
}

Result<MergeStats> RunExport(const ExportConfig& c, ThreadPool& pool, std::string* written) {
  MergeOptions o;
  std::error_code ec;
  const bool hf = fs::is_directory(c.model_name_or_path, ec);
  if (c.infer_dtype != "auto") {
    o.dtype = c.infer_dtype == "float32" ? "f32" : c.infer_dtype == "float16" ? "f16" : "bf16";
  }
  std::string out = c.export_dir;
  if (hf) {
    o.max_shard_bytes = (uint64_t)std::llround(c.export_size * 1e9);  // transformers' "5GB" = 5 * 10^9 bytes
  } else {
    out = (fs::path(c.export_dir) / "model.gguf").string();
    LATHE_RETURN_IF_ERROR(formats::MakeDirs(c.export_dir));
  }
  *written = out;
  return MergeLora(c.model_name_or_path, c.adapter_name_or_path, out, o, pool);
}

}  // namespace lathe::tools
