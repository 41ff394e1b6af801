// TrainModel saving: a PEFT LoRA adapter directory (as peft's save_pretrained writes it) and a
// Hugging Face model directory (config.json, generation_config.json, model.safetensors).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/atomic_file.h"
#include "formats/safetensors.h"
#include "kernels/kernels.h"
#include "model/train_model_impl.h"

namespace lathe::model::internal {

namespace {

// PEFT writes the config with json.dumps(indent=2, sort_keys=True); nlohmann's object is sorted too.
std::string Dump(const nlohmann::json& j) { return j.dump(2) + "\n"; }

}  // namespace

std::vector<float> TrainModelImpl::ToHfRows(const float* src, int64_t heads, int64_t cols) const {
  const int64_t hd = c_.head_dim;
  std::vector<float> out((size_t)heads * hd * cols);
  if (c_.rope_style != RopeStyle::kInterleaved) {
    std::memcpy(out.data(), src, out.size() * sizeof(float));
    return out;
  }
  // HF row j < hd/2 is Meta row 2j; HF row hd/2 + j is Meta row 2j + 1.
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < hd / 2; ++j) {
      std::memcpy(&out[(h * hd + j) * cols], &src[(h * hd + 2 * j) * cols], cols * sizeof(float));
      std::memcpy(&out[(h * hd + hd / 2 + j) * cols], &src[(h * hd + 2 * j + 1) * cols], cols * sizeof(float));
    }
  return out;
}

Status TrainModelImpl::SavePeftAdapter(const std::string& dir, const std::string& base_model_name) const {
  if (opt_.method != FinetuneMethod::kLora) return Status::Error("SavePeftAdapter: the model is not trained with LoRA");
  LATHE_RETURN_IF_ERROR(formats::MakeDirs(dir));
  nlohmann::json j;
  // The keys peft 0.21 writes for a plain LoRA config (see the committed lora fixture adapters).
  j["alora_invocation_tokens"] = nullptr;
  j["alpha_pattern"] = nlohmann::json::object();
  j["arrow_config"] = nullptr;
  j["auto_mapping"] = nullptr;
  j["base_model_name_or_path"] = base_model_name;
  j["bias"] = "none";
  j["corda_config"] = nullptr;
  j["ensure_weight_tying"] = false;
  j["eva_config"] = nullptr;
  j["exclude_modules"] = nullptr;
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["kasa_config"] = nullptr;
  j["layer_replication"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["loftq_config"] = nlohmann::json::object();
  if (opt_.lora_alpha == std::floor(opt_.lora_alpha)) {
    j["lora_alpha"] = (int64_t)opt_.lora_alpha;
  } else {
    j["lora_alpha"] = opt_.lora_alpha;
  }
  j["lora_bias"] = false;
  j["lora_dropout"] = opt_.lora_dropout;
  j["lora_ga_config"] = nullptr;
  j["megatron_config"] = nullptr;
  j["megatron_core"] = "megatron.core";
  j["modules_to_save"] = nullptr;
  j["monteclora_config"] = nullptr;
  j["peft_type"] = "LORA";
  j["peft_version"] = "0.21.2";
  j["qalora_group_size"] = 16;
  j["r"] = opt_.lora_rank;
  j["rank_pattern"] = nlohmann::json::object();
  j["revision"] = nullptr;
  nlohmann::json targets = nlohmann::json::array();
  for (int m = 0; m < kMods; ++m) {
    if (std::find(opt_.lora_targets.begin(), opt_.lora_targets.end(), (LoraModule)m) != opt_.lora_targets.end()) {
      targets.push_back(LoraModuleName((LoraModule)m));
    }
  }
  j["target_modules"] = targets;
  j["target_parameters"] = nullptr;
  j["task_type"] = "CAUSAL_LM";
  j["trainable_token_indices"] = nullptr;
  j["use_bdlora"] = nullptr;
  j["use_dora"] = false;
  j["use_qalora"] = false;
  j["use_rslora"] = opt_.use_rslora;
  j["velora_config"] = nullptr;
  LATHE_RETURN_IF_ERROR(formats::WriteFileAtomically(dir + "/adapter_config.json", Dump(j)));

  std::vector<std::vector<float>> keep;
  keep.reserve(params_.size());
  std::vector<formats::SafetensorsWriteEntry> entries;
  for (int64_t l = 0; l < c_.n_layers; ++l)
    for (int m = 0; m < kMods; ++m) {
      const LoraParam& p = layers_[l].lin[m].lora;
      if (!p.on) continue;
      std::string key = StrFormat("base_model.model.model.layers.%lld.%s.%s", (long long)l,
                                  m <= (int)LoraModule::kO ? "self_attn" : "mlp", LoraModuleName((LoraModule)m));
      keep.emplace_back(p.a, p.a + p.r * p.in);
      entries.push_back({key + ".lora_A.weight", DType::kF32, {p.r, p.in}, keep.back().data(), keep.back().size() * 4, {}});
      if (m == (int)LoraModule::kQ || m == (int)LoraModule::kK) {
        keep.push_back(ToHfRows(p.b, m == (int)LoraModule::kQ ? c_.n_heads : c_.n_kv_heads, p.r));
      } else {
        keep.emplace_back(p.b, p.b + p.out * p.r);
      }
      entries.push_back({key + ".lora_B.weight", DType::kF32, {p.out, p.r}, keep.back().data(), keep.back().size() * 4, {}});
    }
  return formats::WriteSafetensors(dir + "/adapter_model.safetensors", entries, {{"format", "pt"}});
}

Status TrainModelImpl::SaveHfModel(const std::string& dir, bool bf16) const {
  const ModelConfig& c = c_;
  LATHE_RETURN_IF_ERROR(formats::MakeDirs(dir));
  const bool qwen3 = c.arch == "qwen3", qwen = c.arch == "qwen2" || qwen3, mistral = c.arch == "mistral";
  nlohmann::json j;
  j["architectures"] = {qwen3  ? "Qwen3ForCausalLM"
                        : qwen ? "Qwen2ForCausalLM"
                        : mistral ? "MistralForCausalLM"
                                  : "LlamaForCausalLM"};
  j["model_type"] = qwen3 ? "qwen3" : qwen ? "qwen2" : mistral ? "mistral" : "llama";
  j["attention_dropout"] = 0.0;
  if (!qwen || qwen3) j["attention_bias"] = c.qkv_bias || c.o_bias;  // llama / qwen3: biases on q, k, v and o
  if (!qwen && !mistral) j["mlp_bias"] = false;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.ffn_dim;
  j["max_position_embeddings"] = c.max_seq_len;
  j["num_attention_heads"] = c.n_heads;
  j["num_hidden_layers"] = c.n_layers;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  const RopeScaling& s = c.rope_scaling;
  if (s.type == RopeScaling::Type::kLinear) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", s.factor}};
  } else if (s.type == RopeScaling::Type::kLlama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.factor},
                         {"low_freq_factor", s.low_freq_factor},
                         {"high_freq_factor", s.high_freq_factor},
                         {"original_max_position_embeddings", s.original_max_position}};
  } else if (s.type == RopeScaling::Type::kYarn) {
    j["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", s.factor},
                         {"original_max_position_embeddings", s.original_max_position},
                         {"beta_fast", s.beta_fast},
                         {"beta_slow", s.beta_slow},
                         {"truncate", s.truncate},
                         {"attention_factor", s.attention_factor}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (qwen) {
    // transformers 5 reads layer_types; 4.x slides in the layers from max_window_layers on.
    j["use_sliding_window"] = c.sliding_window > 0;
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
    int64_t first = c.n_layers;
    while (first > 0 && c.WindowOf(first - 1) > 0) --first;
    j["max_window_layers"] = first;
    if (c.sliding_window > 0) {
      nlohmann::json types = nlohmann::json::array();
      for (int64_t l = 0; l < c.n_layers; ++l)
        types.push_back(c.WindowOf(l) > 0 ? "sliding_attention" : "full_attention");
      j["layer_types"] = types;
    }
  }
  if (mistral) j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["torch_dtype"] = bf16 ? "bfloat16" : "float32";
  j["use_cache"] = true;
  j["vocab_size"] = c.vocab_size;
  LATHE_RETURN_IF_ERROR(formats::WriteFileAtomically(dir + "/config.json", Dump(j)));
  LATHE_RETURN_IF_ERROR(formats::WriteFileAtomically(dir + "/generation_config.json", Dump(nlohmann::json{{"_from_model_config", true}})));

  // Every tensor as f32 (current masters for trained ones, dequantized base for frozen ones).
  std::deque<std::vector<float>> f32;
  std::deque<std::vector<uint16_t>> b16;
  std::vector<formats::SafetensorsWriteEntry> entries;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
    if (bf16) {
      b16.emplace_back(v.size());
      for (size_t i = 0; i < v.size(); ++i) b16.back()[i] = F32ToBF16(v[i]);
      entries.push_back({name, DType::kBF16, std::move(shape), b16.back().data(), v.size() * 2, {}});
    } else {
      f32.push_back(std::move(v));
      entries.push_back({name, DType::kF32, std::move(shape), f32.back().data(), f32.back().size() * 4, {}});
    }
  };
  auto whole = [&](const float* master, const Tensor& t) {
    std::vector<float> v(t.numel());
    if (master) {
      std::memcpy(v.data(), master, v.size() * 4);
    } else if (t.ndim() == 2) {
      kernels::DequantizeRows(t, 0, t.shape[0], v.data());
    } else {
      std::memcpy(v.data(), t.data, v.size() * 4);
    }
    return v;
  };
  add("model.embed_tokens.weight", {c.vocab_size, c.dim}, whole(embed_master_, base_.tok_embd));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const Layer& Ly = layers_[l];
    std::string pre = StrFormat("model.layers.%lld.", (long long)l);
    for (int m = 0; m < kMods; ++m) {
      const Lin& L = Ly.lin[m];
      std::string key = pre + (m <= (int)LoraModule::kO ? "self_attn." : "mlp.") + LoraModuleName((LoraModule)m);
      std::vector<float> w = whole(L.master, L.base);
      if (m == (int)LoraModule::kQ || m == (int)LoraModule::kK) {
        w = ToHfRows(w.data(), m == (int)LoraModule::kQ ? c.n_heads : c.n_kv_heads, L.in);
      }
      add(key + ".weight", {L.out, L.in}, std::move(w));
      if (L.bias) {
        std::vector<float> b(L.bias, L.bias + L.out);
        if (m < 2) b = ToHfRows(b.data(), m == 0 ? c.n_heads : c.n_kv_heads, 1);
        add(key + ".bias", {L.out}, std::move(b));
      }
    }
    if (c.qk_norm) {
      add(pre + "self_attn.q_norm.weight", {c.head_dim}, std::vector<float>(Ly.qn.w, Ly.qn.w + c.head_dim));
      add(pre + "self_attn.k_norm.weight", {c.head_dim}, std::vector<float>(Ly.kn.w, Ly.kn.w + c.head_dim));
    }
    add(pre + "input_layernorm.weight", {c.dim}, std::vector<float>(Ly.n1.w, Ly.n1.w + c.dim));
    add(pre + "post_attention_layernorm.weight", {c.dim}, std::vector<float>(Ly.n2.w, Ly.n2.w + c.dim));
  }
  add("model.norm.weight", {c.dim}, std::vector<float>(final_norm_.w, final_norm_.w + c.dim));
  if (!c.tied_embeddings) add("lm_head.weight", {c.vocab_size, c.dim}, whole(head_master_, base_.output));
  return formats::WriteSafetensors(dir + "/model.safetensors", entries, {{"format", "pt"}});
}

}  // namespace lathe::model::internal
