// libFuzzer target for PEFT LoRA adapter directories (downloaded, untrusted: `lathe serve --lora`,
// `--adapter`): the input is adapter_config.json, a 0 byte, then adapter_model.safetensors, loaded
// for a small Llama (dim 64, GQA 4/2, ffn 96, 2 layers; HF's Q/K layout) and for the same model
// with interleaved RoPE (the q/k rows are permuted on load). Any bytes must load or give an error,
// never crash or hit UB; a loaded adapter must have the shapes the forward reads (A (r, in),
// B (out, r) for every adapted module), whose first and last values are touched.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

#include "fuzz_file.h"
#include "model/load_hf.h"
#include "model/lora.h"

namespace {

using namespace lathe;

constexpr const char* kConfig = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
  "rope_theta": 10000.0, "tie_word_embeddings": true, "hidden_act": "silu"})";

struct Setup {
  std::string dir;
  model::ModelConfig hf, interleaved;
};

const Setup& Init() {
  static Setup s = [] {
    Setup r;
    r.dir = fuzz::TempDir("peft_fuzz");
    auto c = model::ParseHfConfig(kConfig, "fuzz/config.json");
    if (!c.ok()) std::abort();
    r.hf = *c;
    r.interleaved = *c;
    r.interleaved.rope_style = model::RopeStyle::kInterleaved;
    return r;
  }();
  return s;
}

void Check(const model::LoraAdapter& a, const model::ModelConfig& c) {
  if ((int64_t)a.layers.size() != c.n_layers) __builtin_trap();
  volatile float sink = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int m = 0; m < (int)model::LoraModule::kCount; ++m) {
      const model::LoraPair& p = a.at(l, (model::LoraModule)m);
      if (!p.a.data) continue;
      using M = model::LoraModule;
      const M mod = (M)m;
      const int64_t in = mod == M::kO ? c.q_dim() : mod == M::kDown ? c.ffn_dim : c.dim;
      const int64_t out = mod == M::kQ                     ? c.q_dim()
                          : mod == M::kK || mod == M::kV   ? c.kv_dim()
                          : mod == M::kGate || mod == M::kUp ? c.ffn_dim
                                                           : c.dim;
      if (p.a.ndim() != 2 || p.b.ndim() != 2 || p.a.shape[1] != in || p.b.shape[0] != out ||
          p.a.shape[0] != p.b.shape[1] || p.a.shape[0] < 1) {
        __builtin_trap();
      }
      const float* pa = p.a.as<float>();
      const float* pb = p.b.as<float>();
      sink = sink + pa[0] + pa[p.a.numel() - 1] + pb[0] + pb[p.b.numel() - 1];
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Setup& s = Init();
  const uint8_t* zero = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t cfg_len = zero ? (size_t)(zero - data) : size;
  fuzz::WriteFile(s.dir + "/adapter_config.json", data, cfg_len);
  const size_t st_off = zero ? cfg_len + 1 : size;
  fuzz::WriteFile(s.dir + "/adapter_model.safetensors", data + st_off, size - st_off);
  for (const model::ModelConfig* c : {&s.hf, &s.interleaved}) {
    auto a = model::LoadPeftAdapter(s.dir, *c);
    if (a.ok()) Check(**a, *c);
  }
  return 0;
}
