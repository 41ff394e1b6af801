// PEFT adapter loading.
#include "model/lora.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/mapped_file.h"
#include "formats/safetensors.h"

namespace lathe::model {

namespace {
const char* const kNames[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

bool IsAttention(LoraModule m) { return (int)m <= (int)LoraModule::kO; }

std::pair<int64_t, int64_t> InOut(const ModelConfig& c, LoraModule m) {
  switch (m) {
    case LoraModule::kQ: return {c.dim, c.q_dim()};
    case LoraModule::kK:
    case LoraModule::kV: return {c.dim, c.kv_dim()};
    case LoraModule::kO: return {c.q_dim(), c.dim};
    case LoraModule::kGate:
    case LoraModule::kUp: return {c.dim, c.ffn_dim};
    default: return {c.ffn_dim, c.dim};
  }
}

// The tensor as f32 (converting f16/bf16).
Result<std::vector<float>> ToF32(const Tensor& t, const std::string& where) {
  std::vector<float> v(t.numel());
  const uint16_t* h = t.as<uint16_t>();
  switch (t.dtype) {
    case DType::kF32: std::memcpy(v.data(), t.data, v.size() * 4); break;
    case DType::kF16: for (size_t i = 0; i < v.size(); ++i) v[i] = F16ToF32(h[i]); break;
    case DType::kBF16: for (size_t i = 0; i < v.size(); ++i) v[i] = BF16ToF32(h[i]); break;
    default: return Status::Error(where + ": LoRA weights must be f32, f16 or bf16, not " + DTypeName(t.dtype));
  }
  return v;
}
}  // namespace

const char* LoraModuleName(LoraModule m) { return kNames[(int)m]; }

Result<std::unique_ptr<LoraAdapter>> LoadPeftAdapter(const std::string& dir, const ModelConfig& c) {
  std::string cfg_path = dir + "/adapter_config.json";
  LATHE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(cfg_path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Status::Error(cfg_path + ": invalid JSON: " + e.what());
  }
  auto err = [&](const std::string& m) { return Status::Error(cfg_path + ": " + m); };
  if (!j.is_object()) return err("expected a JSON object");
  // A flag written true / false (absent or null = false); json::value would throw on another type.
  auto flag = [&](const char* key) -> Result<bool> {
    if (!j.contains(key) || j[key].is_null()) return false;
    if (!j[key].is_boolean()) return err(std::string("'") + key + "' must be true or false");
    return j[key].get<bool>();
  };
  if (j.contains("peft_type") && j["peft_type"] != "LORA") return err("peft_type must be LORA");
  LATHE_ASSIGN_OR_RETURN(const bool dora, flag("use_dora"));
  if (dora) return err("use_dora: DoRA adapters are not supported");
  if (j.contains("bias") && j["bias"].is_string() && j["bias"] != "none") return err("bias: only \"none\" is supported");
  if (j.contains("modules_to_save") && !j["modules_to_save"].is_null() && !j["modules_to_save"].empty()) {
    return err("modules_to_save: adapters that replace whole modules are not supported");
  }
  LATHE_ASSIGN_OR_RETURN(const bool fan_in_fan_out, flag("fan_in_fan_out"));
  if (fan_in_fan_out) return err("fan_in_fan_out: not supported for Llama-family models");
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() < 1) return err("'r' must be a positive integer");
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number()) return err("'lora_alpha' must be a number");
  for (const char* k : {"rank_pattern", "alpha_pattern"}) {
    if (j.contains(k) && j[k].is_object() && !j[k].empty()) return err(std::string(k) + ": per-module patterns are not supported yet");
  }
  auto a = std::make_unique<LoraAdapter>();
  a->path = dir;
  a->rank = j["r"].get<int64_t>();
  a->alpha = j["lora_alpha"].get<double>();
  LATHE_ASSIGN_OR_RETURN(a->rslora, flag("use_rslora"));
  if (j.contains("target_modules") && j["target_modules"].is_array()) {
    for (const auto& t : j["target_modules"]) if (t.is_string()) a->target_modules.push_back(t.get<std::string>());
  }
  const float scale = (float)(a->rslora ? a->alpha / std::sqrt((double)a->rank) : a->alpha / (double)a->rank);

  std::string st_path = dir + "/adapter_model.safetensors";
  LATHE_ASSIGN_OR_RETURN(auto st, formats::SafetensorsFile::Open(st_path));
  a->layers.resize(c.n_layers);
  static const std::regex kKey(R"(base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_(A|B)(\.default)?\.weight)");
  int found = 0;
  for (const auto& info : st->tensors()) {
    const std::string& name = info.name;
    std::smatch m;
    if (!std::regex_match(name, m, kKey)) {
      return Status::Error(StrFormat("%s: tensor '%s' is not a LoRA A/B weight of a decoder layer (embedding "
                                     "adapters and other modules are not supported)", st_path.c_str(), name.c_str()));
    }
    int64_t layer = std::stoll(m[1].str());
    int mod = -1;
    for (int i = 0; i < (int)LoraModule::kCount; ++i) if (m[3].str() == kNames[i]) mod = i;
    if (mod < 0 || layer >= c.n_layers || (m[2].str() == "self_attn") != IsAttention((LoraModule)mod)) {
      return Status::Error(StrFormat("%s: tensor '%s' does not match the model (%lld layers)", st_path.c_str(),
                                     name.c_str(), (long long)c.n_layers));
    }
    auto [in, out] = InOut(c, (LoraModule)mod);
    bool is_a = m[4].str() == "A";
    std::vector<int64_t> want = is_a ? std::vector<int64_t>{a->rank, in} : std::vector<int64_t>{out, a->rank};
    LATHE_ASSIGN_OR_RETURN(Tensor t, st->GetTensor(name));
    if (t.shape != want) {
      Tensor w;
      w.shape = want;
      return Status::Error(StrFormat("%s: tensor '%s' has shape %s, expected %s", st_path.c_str(), name.c_str(),
                                     t.ShapeString().c_str(), w.ShapeString().c_str()));
    }
    LATHE_ASSIGN_OR_RETURN(std::vector<float> v, ToF32(t, st_path + ": tensor '" + name + "'"));
    // HF half-split -> Meta interleaved row order for q/k B (rows are output features).
    if (!is_a && c.rope_style == RopeStyle::kInterleaved && (mod == (int)LoraModule::kQ || mod == (int)LoraModule::kK)) {
      int64_t heads = mod == (int)LoraModule::kQ ? c.n_heads : c.n_kv_heads, hd = c.head_dim, r = a->rank;
      std::vector<float> p(v.size());
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t j2 = 0; j2 < hd / 2; ++j2) {
          std::memcpy(&p[(h * hd + 2 * j2) * r], &v[(h * hd + j2) * r], r * 4);
          std::memcpy(&p[(h * hd + 2 * j2 + 1) * r], &v[(h * hd + hd / 2 + j2) * r], r * 4);
        }
      v.swap(p);
    }
    auto holder = std::make_shared<std::vector<float>>(std::move(v));
    Tensor view;
    view.data = holder->data();
    view.dtype = DType::kF32;
    view.shape = want;
    a->storage.push_back(holder);
    LoraPair& pair = a->layers[layer][mod];
    (is_a ? pair.a : pair.b) = view;
    pair.scale = scale;
    ++found;
  }
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int i = 0; i < (int)LoraModule::kCount; ++i) {
      const LoraPair& p = a->layers[l][i];
      if ((p.a.data == nullptr) != (p.b.data == nullptr)) {
        return Status::Error(StrFormat("%s: layer %lld %s has only one of lora_A / lora_B", st_path.c_str(),
                                       (long long)l, kNames[i]));
      }
    }
  if (found == 0) return Status::Error(st_path + ": no LoRA weights");
  return a;
}

}  // namespace lathe::model
