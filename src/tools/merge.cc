// LoRA merge: W + scale * (B A) into each adapted linear of a GGUF file (through ConvertGguf's row edits) or of an HF
// folder's safetensors (every other tensor's bytes passed through unchanged); either way each changed tensor is made
// as its file is written, so a merge holds one converted tensor at a time.
#include "tools/merge.h"

#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/strings.h"
#include "formats/atomic_file.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "kernels/kernels.h"
#include "model/load_gguf.h"
#include "model/load_hf.h"
#include "model/lora.h"

namespace lathe::tools {

namespace fs = std::filesystem;
using model::LoraModule;

namespace {

constexpr int kMods = (int)LoraModule::kCount;

// Adds row o of scale * (B A) to w (in features): d = sum over k of B[o][k] A[k][:] in k order, then w += d * scale,
// the order of PEFT's (B @ A) * scaling added to W.
void AddDeltaRow(const model::LoraPair& p, int64_t o, float* w) {
  const int64_t r = p.a.shape[0], in = p.a.shape[1];
  const float* a = p.a.as<float>();
  const float* b = p.b.as<float>() + o * r;
  static thread_local std::vector<float> d;
  d.assign(in, 0.0f);
  for (int64_t k = 0; k < r; ++k) {
    const float bk = b[k];
    const float* ak = a + k * in;
    for (int64_t i = 0; i < in; ++i) d[i] += bk * ak[i];
  }
  for (int64_t i = 0; i < in; ++i) w[i] += d[i] * p.scale;
}

// "<prefix><layer>.<module name><suffix>" -> (layer, module), for the seven LoRA module names of `names`.
std::optional<std::pair<int64_t, int>> ParseLinear(const std::string& name, const std::string& prefix,
                                                   const char* const (&names)[kMods],
                                                   const std::string& suffix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  size_t i = prefix.size(), j = i;
  while (j < name.size() && std::isdigit((unsigned char)name[j])) ++j;
  if (j == i || j - i > 6 || j >= name.size() || name[j] != '.') return std::nullopt;
  const int64_t layer = std::stoll(name.substr(i, j - i));
  const std::string rest = name.substr(j + 1);
  for (int m = 0; m < kMods; ++m)
    if (rest == std::string(names[m]) + suffix) return std::make_pair(layer, m);
  return std::nullopt;
}

// GGUF's names of the seven linears inside "blk.N.".
constexpr const char* kGgufNames[kMods] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                           "ffn_down"};
// HF's, inside "model.layers.N." (self_attn.* / mlp.*).
constexpr const char* kHfNames[kMods] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                         "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                         "mlp.down_proj"};

// The adapter's pair for (layer, module), or nullptr when it does not adapt it.
const model::LoraPair* PairOf(const model::LoraAdapter& a, int64_t layer, int m) {
  if (layer < 0 || layer >= (int64_t)a.layers.size()) return nullptr;
  const model::LoraPair& p = a.at(layer, (LoraModule)m);
  return p.a.data ? &p : nullptr;
}

// The adapters to merge, in order: each (layer, module)'s pairs, first adapter first.
struct Adapters {
  std::vector<std::unique_ptr<model::LoraAdapter>> list;
  std::vector<std::string> dirs;
  std::vector<const model::LoraPair*> Pairs(int64_t layer, int m) const {
    std::vector<const model::LoraPair*> ps;
    for (const auto& a : list)
      if (const model::LoraPair* p = PairOf(*a, layer, m)) ps.push_back(p);
    return ps;
  }
  // The row edit adding every pair's change to (layer, module)'s weight in adapter order (f32 throughout, rounded
  // once when stored), empty when no adapter changes it.
  RowEdit Edit(int64_t layer, int m) const {
    std::vector<const model::LoraPair*> ps = Pairs(layer, m);
    if (ps.empty()) return {};
    return [ps](int64_t row, float* w) {
      for (const model::LoraPair* p : ps) AddDeltaRow(*p, row, w);
    };
  }
  // Linear weights any adapter changes.
  int64_t Changed(int64_t n_layers) const {
    int64_t n = 0;
    for (int64_t l = 0; l < n_layers; ++l)
      for (int m = 0; m < kMods; ++m) n += !Pairs(l, m).empty();
    return n;
  }
};

Result<Adapters> LoadAdapters(const std::vector<std::string>& dirs, const model::ModelConfig& config) {
  Adapters a;
  a.dirs = dirs;
  for (const std::string& d : dirs) {
    LATHE_ASSIGN_OR_RETURN(auto ad, model::LoadPeftAdapter(d, config));
    a.list.push_back(std::move(ad));
  }
  return a;
}

// The base's name of the tensor the adapter's (layer, module) pair changes.
std::string TensorName(int64_t layer, int m, bool gguf) {
  return gguf ? "blk." + std::to_string(layer) + "." + kGgufNames[m] + ".weight"
              : "model.layers." + std::to_string(layer) + "." + kHfNames[m] + ".weight";
}

// Before anything is written: every pair of the adapter must find its tensor in the base.
template <class Has>
Status CheckEveryPairHasATensor(const Adapters& ads, const Has& has, const std::string& base, bool gguf) {
  for (size_t i = 0; i < ads.list.size(); ++i)
    for (size_t l = 0; l < ads.list[i]->layers.size(); ++l)
      for (int m = 0; m < kMods; ++m) {
        if (!PairOf(*ads.list[i], (int64_t)l, m) || has(TensorName((int64_t)l, m, gguf))) continue;
        return Status::Error(ads.dirs[i] + ": the adapter's " + model::LoraModuleName((LoraModule)m) + " of layer " +
                             std::to_string(l) + " has no tensor '" + TensorName((int64_t)l, m, gguf) +
                             "' to merge into in " + base);
      }
  return Status::Ok();
}

Result<MergeStats> MergeGguf(const std::string& base, const std::vector<std::string>& adapter_dirs,
                             const std::string& out, const MergeOptions& o, ThreadPool& pool) {
  std::error_code ec;
  if (fs::is_directory(out, ec)) {
    return Status::Error("-o " + out + ": a GGUF base (" + base + ") merges into a .gguf file, not a folder");
  }
  LATHE_ASSIGN_OR_RETURN(auto gguf, formats::GgufFile::Open(base));
  LATHE_ASSIGN_OR_RETURN(model::ModelConfig config, model::ConfigFromGguf(*gguf));
  LATHE_ASSIGN_OR_RETURN(Adapters ads, LoadAdapters(adapter_dirs, config));
  std::string dtype = o.dtype;
  if (dtype.empty()) {
    // The matrices' own float type where they all share one (general.file_type is optional and says "mostly"),
    // else f16 (llama-export-lora's output type).
    std::optional<DType> common;
    bool one = true;
    for (const formats::GgufTensorInfo& ti : gguf->tensors()) {
      if (ti.shape.size() != 2) continue;
      one = one && (!common || *common == ti.dtype);
      common = ti.dtype;
    }
    dtype = one && common && (*common == DType::kF32 || *common == DType::kBF16) ? DTypeName(*common) : "f16";
  }
  LATHE_ASSIGN_OR_RETURN(ConvertTarget target, ParseConvertTarget(dtype));
  LATHE_RETURN_IF_ERROR(CheckEveryPairHasATensor(
      ads, [&](const std::string& n) { return gguf->FindTensor(n) != nullptr; }, base, true));
  gguf.reset();

  int64_t merged = 0;
  TensorEdits edits = [&](const std::string& name) -> RowEdit {
    auto lm = ParseLinear(name, "blk.", kGgufNames, ".weight");
    if (!lm) return {};
    RowEdit edit = ads.Edit(lm->first, lm->second);
    merged += (bool)edit;
    return edit;
  };
  LATHE_ASSIGN_OR_RETURN(ConvertStats cs, ConvertGguf(base, out, target, pool, /*allow_requantize=*/true, edits));
  LATHE_CHECK(merged == ads.Changed(config.n_layers));
  MergeStats ms;
  ms.format = "gguf";
  ms.dtype = target.name;
  ms.merged = merged;
  ms.tensors = cs.tensors;
  ms.files = 1;
  ms.bytes_out = cs.bytes_out;
  ms.convert = cs;
  return ms;
}

// Files of an HF folder that travel with the weights: configs, tokenizer files, chat templates, license and model
// card (never other weight formats, which would still hold the unmerged weights).
bool CopiedBeside(const fs::path& p) {
  const std::string name = p.filename().string(), ext = p.extension().string();
  if (name == "model.safetensors.index.json") return false;  // rewritten
  if (name.rfind("LICENSE", 0) == 0 || name == "README.md") return true;
  return ext == ".json" || ext == ".txt" || ext == ".model" || ext == ".jinja";
}

Result<DType> HfDType(const std::string& s) {
  if (s == "f32" || s == "float32") return DType::kF32;
  if (s == "f16" || s == "float16") return DType::kF16;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  return Status::Error("--dtype '" + s + "': an HF model folder holds f32, f16 or bf16 tensors");
}

const char* TorchDTypeName(DType t) { return t == DType::kF32 ? "float32" : t == DType::kF16 ? "float16" : "bfloat16"; }

bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// Output shards of an HF merge: each a file name and the base tensors it holds, in the base's order.
struct Item {
  const formats::SafetensorsFile* file;
  const formats::SafetensorsTensorInfo* ti;
};
struct Shard {
  std::string name;
  std::vector<Item> items;
};

Result<MergeStats> MergeHf(const std::string& base, const std::vector<std::string>& adapter_dirs,
                           const std::string& out, const MergeOptions& o, ThreadPool& pool) {
  std::error_code ec;
  if (fs::exists(out, ec) && fs::equivalent(base, out, ec)) {
    return Status::Error("-o " + out + " is the base model's own folder; choose another");
  }
  if (fs::exists(out, ec) && !fs::is_directory(out, ec)) {
    return Status::Error("-o " + out + ": an HF base (" + base + ") merges into a folder, and this is a file");
  }
  std::optional<DType> to_all;
  if (!o.dtype.empty()) {
    LATHE_ASSIGN_OR_RETURN(DType t, HfDType(o.dtype));
    to_all = t;
  }
  const std::string cfg_path = base + "/config.json";
  LATHE_ASSIGN_OR_RETURN(std::string cfg_text, ReadFileToString(cfg_path));
  LATHE_ASSIGN_OR_RETURN(model::ModelConfig config, model::ParseHfConfig(cfg_text, cfg_path));
  LATHE_ASSIGN_OR_RETURN(Adapters ads, LoadAdapters(adapter_dirs, config));
  LATHE_ASSIGN_OR_RETURN(auto set, formats::SafetensorsSet::Open(base));
  LATHE_RETURN_IF_ERROR(CheckEveryPairHasATensor(
      ads, [&](const std::string& n) { return set->Has(n); }, base, false));
  auto out_dtype = [&](const formats::SafetensorsTensorInfo& ti) {
    return to_all && ti.supported && IsFloat(ti.dtype) ? *to_all : ti.dtype;
  };

  // The base's files as they are, or (max_shard_bytes) new shards of at most that many bytes each, filled in the
  // base's tensor order as transformers' save_pretrained(max_shard_size=) fills them.
  std::vector<Shard> shards;
  if (o.max_shard_bytes == 0) {
    for (const auto& f : set->files()) {
      shards.push_back({fs::path(f->path()).filename().string(), {}});
      for (const auto& ti : f->tensors()) shards.back().items.push_back({f.get(), &ti});
    }
  } else {
    uint64_t in_shard = 0;
    for (const auto& f : set->files())
      for (const auto& ti : f->tensors()) {
        int64_t numel = 1;
        for (int64_t d : ti.shape) numel *= d;
        const uint64_t bytes = ti.supported ? DTypeBytes(out_dtype(ti), numel) : ti.nbytes;
        if (shards.empty() || (in_shard > 0 && in_shard + bytes > o.max_shard_bytes)) {
          shards.push_back({"", {}});
          in_shard = 0;
        }
        shards.back().items.push_back({f.get(), &ti});
        in_shard += bytes;
      }
    for (size_t i = 0; i < shards.size(); ++i) {
      shards[i].name = shards.size() == 1 ? "model.safetensors"
                                          : StrFormat("model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    }
  }
  LATHE_RETURN_IF_ERROR(formats::MakeDirs(out));

  MergeStats ms;
  ms.format = "hf";
  ms.dtype = to_all ? TorchDTypeName(*to_all) : "as stored";
  uint64_t total_size = 0;
  nlohmann::json weight_map = nlohmann::json::object();
  for (const Shard& shard : shards) {
    std::vector<formats::SafetensorsWriteEntry> entries;
    for (const auto [file, tip] : shard.items) {
      const formats::SafetensorsTensorInfo& ti = *tip;
      if (!ti.supported) {
        return Status::Error(file->path() + ": tensor '" + ti.name + "' is " + ti.dtype_name +
                             ", which lathe cannot rewrite");
      }
      weight_map[ti.name] = shard.name;
      LATHE_ASSIGN_OR_RETURN(Tensor t, file->GetTensor(ti.name));
      const DType to = out_dtype(ti);
      auto lm = ParseLinear(ti.name, "model.layers.", kHfNames, ".weight");
      const std::vector<const model::LoraPair*> ps =
          lm ? ads.Pairs(lm->first, lm->second) : std::vector<const model::LoraPair*>();
      const RowEdit edit = lm ? ads.Edit(lm->first, lm->second) : RowEdit();
      if (!edit && to == t.dtype) {  // unchanged: the bytes straight from the mapping
        entries.push_back({ti.name, t.dtype, ti.shape, t.data, (size_t)ti.nbytes});
        total_size += ti.nbytes;
        continue;
      }
      bool fits = IsFloat(t.dtype);
      for (const model::LoraPair* p : ps)
        fits = fits && t.ndim() == 2 && t.shape[0] == p->b.shape[0] && t.shape[1] == p->a.shape[1];
      if (!fits) {
        return Status::Error(file->path() + ": tensor '" + ti.name + "' (" + DTypeName(t.dtype) +
                             ") cannot take the adapter's change or the dtype asked for");
      }
      ms.merged += (bool)edit;
      // Made as the writer reaches it (one converted tensor in memory at a time).
      const size_t nbytes = DTypeBytes(to, t.numel());
      entries.push_back({ti.name, to, ti.shape, nullptr, nbytes, [t, to, edit, &pool](uint8_t* dst) {
                           ConvertRows(pool, t, to, edit, dst);
                           return Status::Ok();
                         }});
      total_size += nbytes;
    }
    const formats::SafetensorsFile* first = shard.items.empty() ? nullptr : shard.items[0].file;
    LATHE_RETURN_IF_ERROR(formats::WriteSafetensors((fs::path(out) / shard.name).string(), entries,
                                                    first ? first->metadata() : std::map<std::string, std::string>{}));
    ms.tensors += (int64_t)entries.size();
    ms.files++;
  }
  ms.bytes_out = total_size;
  LATHE_CHECK(ms.merged == ads.Changed(config.n_layers));

  if (o.max_shard_bytes != 0) {
    if (shards.size() > 1) {  // transformers' index for its shards
      nlohmann::json j;
      j["metadata"] = {{"total_size", total_size}};
      j["weight_map"] = weight_map;
      LATHE_RETURN_IF_ERROR(
          formats::WriteFileAtomically((fs::path(out) / "model.safetensors.index.json").string(), j.dump(2) + "\n"));
      ms.files++;
    }
  } else {
    // The shard index: the same map; its total_size follows the dtype.
    const fs::path index = fs::path(base) / "model.safetensors.index.json";
    if (fs::is_regular_file(index, ec)) {
      LATHE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index.string()));
      nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) return Status::Error(index.string() + ": invalid JSON");
      if (j.contains("metadata") && j["metadata"].is_object()) j["metadata"]["total_size"] = total_size;
      LATHE_RETURN_IF_ERROR(formats::WriteFileAtomically((fs::path(out) / index.filename()).string(), j.dump(2) + "\n"));
      ms.files++;
    }
  }
  for (const auto& entry : fs::directory_iterator(base, ec)) {
    if (!entry.is_regular_file() || !CopiedBeside(entry.path())) continue;
    const fs::path dest = fs::path(out) / entry.path().filename();
    if (entry.path().filename() == "config.json" && to_all) {
      // The dtype it now holds: transformers 4.x reads torch_dtype, 5.x writes dtype.
      nlohmann::json j = nlohmann::json::parse(cfg_text, nullptr, false);
      if (j.is_discarded() || !j.is_object()) return Status::Error(cfg_path + ": invalid JSON");
      if (j.contains("dtype")) j["dtype"] = TorchDTypeName(*to_all);
      if (j.contains("torch_dtype") || !j.contains("dtype")) j["torch_dtype"] = TorchDTypeName(*to_all);
      LATHE_RETURN_IF_ERROR(formats::WriteFileAtomically(dest.string(), j.dump(2) + "\n"));
    } else {
      LATHE_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(entry.path().string()));
      LATHE_RETURN_IF_ERROR(formats::WriteFileAtomically(dest.string(), bytes));
    }
    ms.files++;
  }
  if (ec) return Status::Error(base + ": cannot list the folder: " + ec.message());
  // What an earlier save left in the folder that this one did not write (shards of another count, an index beside a
  // single file) would be read with the new files: removed once everything new is in place, as save_pretrained does.
  std::set<std::string> wrote;
  for (const Shard& shard : shards) wrote.insert(shard.name);
  if (fs::exists(fs::path(out) / "model.safetensors.index.json", ec) &&
      (o.max_shard_bytes == 0 ? fs::is_regular_file(fs::path(base) / "model.safetensors.index.json", ec)
                              : shards.size() > 1))
    wrote.insert("model.safetensors.index.json");
  for (const auto& entry : fs::directory_iterator(out, ec)) {
    const std::string name = entry.path().filename().string();
    const bool weights = name == "model.safetensors.index.json" ||
                         (name.rfind("model", 0) == 0 && entry.path().extension() == ".safetensors");
    if (entry.is_regular_file() && weights && !wrote.count(name)) fs::remove(entry.path(), ec);
  }
  return ms;
}

}  // namespace

Result<MergeStats> MergeLora(const std::string& base, const std::vector<std::string>& adapter_dirs,
                             const std::string& out, const MergeOptions& options, ThreadPool& pool) {
  std::error_code ec;
  if (fs::is_directory(base, ec)) return MergeHf(base, adapter_dirs, out, options, pool);
  if (!fs::is_regular_file(base, ec)) return Status::Error(base + ": no such model file or folder");
  char magic[4] = {};
  if (FILE* f = std::fopen(base.c_str(), "rb")) {
    const size_t n = std::fread(magic, 1, 4, f);
    std::fclose(f);
    if (n == 4 && std::memcmp(magic, "GGUF", 4) == 0) return MergeGguf(base, adapter_dirs, out, options, pool);
  }
  return Status::Error(base + ": merge takes a GGUF file or an HF model folder (config.json + safetensors)");
}

}  // namespace lathe::tools
