// `lathe estimate`: predicted memory of a training or inference run, per category, per device.
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/mapped_file.h"
#include "formats/gguf.h"
#include "model/load_gguf.h"
#include "model/load_hf.h"
#include "model/loader.h"
#include "model/train_model.h"
#include "model/transformer.h"
#include "train/memory_plan.h"

namespace lathe::cli {

namespace {

// "7B", "135M", "1.5e9" -> parameter count.
Result<int64_t> ParseParams(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string suffix = end ? end : "";
  double mult = suffix.empty() ? 1 : suffix == "K" || suffix == "k" ? 1e3 : suffix == "M" || suffix == "m" ? 1e6
                                 : suffix == "B" || suffix == "b" ? 1e9 : suffix == "T" ? 1e12 : -1;
  if (end == s.c_str() || mult < 0 || v <= 0) {
    return Status::Error("--params expects a count like 7B, 135M or 1.5e9, got '" + s + "'");
  }
  return (int64_t)(v * mult);
}

Result<model::ModelConfig> ConfigFrom(const std::string& path) {
  std::string p = path;
  if (p.size() > 5 && p.substr(p.size() - 5) == ".gguf") {
    LATHE_ASSIGN_OR_RETURN(auto g, formats::GgufFile::Open(p));
    return model::ConfigFromGguf(*g);
  }
  std::string cfg = p;
  if (cfg.size() < 5 || cfg.substr(cfg.size() - 5) != ".json") cfg = p + "/config.json";
  LATHE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(cfg));
  return model::ParseHfConfig(text, cfg);
}

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) {
    if (!x.empty()) out.push_back(x.size() > 5 && x.substr(x.size() - 5) == "_proj" ? x.substr(0, x.size() - 5) : x);
  }
  return out;
}

}  // namespace

int RunEstimate(int argc, char** argv) {
  Args args("estimate",
            "lathe estimate (MODEL | --arch NAME | --params 7B) [--method lora] [--precision bf16] [--batch 4] [--seq 512] ...");
  std::string archs;
  for (const std::string& n : train::NamedArchitectures()) archs += (archs.empty() ? "" : ", ") + n;
  args.Flag("--arch", "named architecture (" + archs + ")");
  args.Flag("--params", "parameter count (7B, 135M); shape from --arch (default llama-7b)");
  args.Bool("--inference", "estimate inference (weights + KV cache) instead of training");
  args.Flag("--method", "full | freeze | lora | qlora", "lora");
  args.Flag("--precision", "fp32 | fp16 | bf16 | pure_bf16", "bf16");
  args.Flag("--quant", "base weights: none | int8 | nf4 | nf4_dq", "none");
  args.Flag("--optim", "adamw | adamw_8bit | paged_adamw_8bit | paged_adamw_32bit | sgd", "adamw");
  args.Flag("--batch", "per-device micro-batch size", "1");
  args.Flag("--seq", "sequence length", "512");
  args.Flag("--grad-accum", "gradient accumulation steps", "1");
  args.Bool("--grad-checkpointing", "keep only block inputs, recompute in backward");
  args.Flag("--lora-rank", "LoRA rank", "8");
  args.Flag("--lora-target", "comma list of q,k,v,o,gate,up,down or all", "all");
  args.Flag("--freeze-layers", "freeze: number of trainable last layers", "2");
  args.Flag("--zero", "ZeRO stage 0-3", "0");
  args.Flag("--world-size", "devices (processes)", "1");
  args.Bool("--offload", "optimizer states (and ZeRO-3 params) in host memory");
  args.Flag("--dtype", "inference weight dtype (f32, f16, bf16, q8_0, q4_0, q4_1)", "bf16");
  args.Flag("--kv-dtype", "inference KV cache dtype: auto (what `lathe serve` / `generate` take for --dtype: f32 / bf16 "
                          "as the weights, else f16), f32, f16 or bf16", "auto");
  args.Flag("--kv-tokens", "inference: tokens per sequence in the KV cache", "4096");
  args.Flag("--kv-seqs", "inference: sequences in the KV cache", "1");
  args.Bool("--lathe", "plan `lathe train` itself (f32 activations and gradients, bf16 shadows, kernel scratch, "
                      "save copy, process baseline) instead of a PyTorch-style run");
  args.Flag("--baseline-mb", "--lathe: process baseline in MiB (binary, libraries, tokenizer, data; `lathe train` "
                             "measures it)", "9");
  args.Bool("--explain", "show each line's formula");
  args.Bool("--json", "machine-readable output");
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return Fail("estimate", st);
  if (args.help_requested()) {
    std::printf("%s", args.Help().c_str());
    return 0;
  }
  Result<model::ModelConfig> cfg = Status::Error("pass MODEL (config.json, model dir or .gguf), --arch NAME or --params N");
  if (!args.positional().empty()) cfg = ConfigFrom(args.positional()[0]);
  else if (args.Has("arch") || args.Has("params")) cfg = train::NamedArchitecture(args.Has("arch") ? args.Get("arch") : "llama-7b");
  if (!cfg.ok()) return Fail("estimate", cfg.status());
  int64_t params = 0;
  if (args.Has("params")) {
    auto p = ParseParams(args.Get("params"));
    if (!p.ok()) return Fail("estimate", p.status());
    params = *p;
  }
  auto num = [&](const char* name, int64_t* out) -> Status {
    LATHE_ASSIGN_OR_RETURN(*out, args.Int(name));
    return Status::Ok();
  };
  train::MemoryPlan plan;
  std::string what;
  if (args.On("inference")) {
    train::InferSetup s;
    s.param_count = params;
    if (!ParseDType(args.Get("dtype"), &s.weight_dtype)) {
      return Fail("estimate", Status::Error("--dtype: expected f32, f16, bf16, q8_0, q4_0 or q4_1"));
    }
    if (args.Get("kv-dtype") == "auto") {
      s.kv_dtype = model::DefaultKvCacheDTypeFor(s.weight_dtype);
    } else if (!ParseDType(args.Get("kv-dtype"), &s.kv_dtype) || !model::IsKvCacheDType(s.kv_dtype)) {
      return Fail("estimate",
                  Status::Error("--kv-dtype '" + args.Get("kv-dtype") + "': expected auto, f32, f16 or bf16"));
    }
    st = num("kv-tokens", &s.kv_tokens);
    if (st.ok()) st = num("kv-seqs", &s.kv_seqs);
    if (!st.ok()) return Fail("estimate", st);
    plan = train::PlanInference(*cfg, s);
    what = StrFormat("inference, %s weights, KV %lld tokens x %lld seqs (%s)", args.Get("dtype").c_str(),
                     (long long)s.kv_tokens, (long long)s.kv_seqs, DTypeName(s.kv_dtype));
  } else {
    train::TrainSetup s;
    s.param_count = params;
    s.method = args.Get("method");
    s.precision = args.Get("precision");
    s.base_quant = args.Get("quant");
    s.optimizer = args.Get("optim");
    s.grad_checkpointing = args.On("grad-checkpointing");
    s.cpu_offload = args.On("offload");
    if (args.Get("lora-target") != "all") s.lora_targets = SplitComma(args.Get("lora-target"));
    int64_t zero = 0, world = 1;
    for (auto [name, out] : std::initializer_list<std::pair<const char*, int64_t*>>{
             {"batch", &s.batch_size}, {"seq", &s.seq_len}, {"grad-accum", &s.grad_accum},
             {"lora-rank", &s.lora_rank}, {"freeze-layers", &s.freeze_trainable_layers}, {"zero", &zero},
             {"world-size", &world}}) {
      st = num(name, out);
      if (!st.ok()) return Fail("estimate", st);
    }
    s.zero_stage = (int)zero;
    s.world_size = (int)world;
    if (args.On("lathe")) {
      s.lathe = true;
      s.loss_chunk_tokens = model::TrainModelOptions().loss_chunk_tokens;
      s.row_group_tokens = model::TrainModelOptions().row_group_tokens;
      s.threads = DefaultThreadCount();
      char* end = nullptr;
      const std::string mb = args.Get("baseline-mb");
      double v = std::strtod(mb.c_str(), &end);
      if (mb.empty() || *end || !(v >= 0))
        return Fail("estimate", Status::Error("--baseline-mb: expected a number of MiB >= 0, got '" + mb + "'"));
      s.baseline_bytes = v * 1024 * 1024;
      if (params > 0) return Fail("estimate", Status::Error("--params: not available with --lathe (give --arch or MODEL)"));
    }
    if (s.lathe && !args.positional().empty()) {
      // A model file: the plan takes its weights as stored (dtypes, bytes), as `lathe train` does.
      auto lm = model::LoadModel(args.positional()[0]);
      if (!lm.ok()) return Fail("estimate", lm.status());
      const model::ModelWeights& w = (*lm)->weights;
      s.base_weight_bytes = w.StoredBytes();
      if (!w.layers.empty()) s.base_dtype = w.layers[0].wq.dtype;
      if (w.output.data) s.head_dtype = w.output.dtype;
      // A quantized base: every frozen linear packed on load in place of its source (train::QuantizeBaseWeights).
      const std::string q = train::BaseQuantOf(s);
      if (q != "none" && (s.method == "lora" || s.method == "qlora")) {
        const DType t = train::BaseQuantDType(q);
        for (const model::LayerWeights& l : w.layers)
          for (const Tensor* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
            if (PackableAs(t, m->shape[1]))
              s.base_weight_bytes += (double)PackedQuantBytes(t, m->shape[0], m->shape[1]) - (double)m->nbytes();
        s.base_dtype = t;
      }
    }
    auto p = train::PlanTraining(*cfg, s);
    if (!p.ok()) return Fail("estimate", p.status());
    plan = *p;
    what = StrFormat("%s training, %s, %s optimizer, batch %lld x seq %lld%s%s", s.method.c_str(), s.precision.c_str(),
                     s.optimizer.c_str(), (long long)s.batch_size, (long long)s.seq_len,
                     s.grad_checkpointing ? ", gradient checkpointing" : "",
                     s.world_size > 1 ? StrFormat(", ZeRO-%d x %d devices", s.zero_stage, s.world_size).c_str() : "");
  }
  if (args.On("json")) {
    nlohmann::json j;
    j["setup"] = what;
    j["model"] = cfg->Summary();
    j["total_params"] = plan.total_params;
    j["trainable_params"] = plan.trainable_params;
    for (const auto& l : plan.lines) {
      j["lines"].push_back({{"category", l.category}, {"where", l.where}, {"bytes", l.bytes}, {"formula", l.formula}});
    }
    j["total_device_bytes"] = plan.Total("device");
    j["total_host_bytes"] = plan.Total("host");
    std::printf("%s\n", j.dump(1).c_str());
    return 0;
  }
  std::printf("model: %s\n%lld params (%.1fM)%s\nsetup: %s\n\n", cfg->Summary().c_str(), (long long)plan.total_params,
              plan.total_params / 1e6,
              plan.trainable_params ? StrFormat(", %lld trainable (%.3f%%)", (long long)plan.trainable_params,
                                                100.0 * plan.trainable_params / plan.total_params).c_str() : "",
              what.c_str());
  std::printf("%-12s %-7s %14s\n", "category", "where", "bytes");
  for (const auto& l : plan.lines) {
    std::printf("%-12s %-7s %11.3f GB%s%s\n", l.category.c_str(), l.where.c_str(), l.bytes / 1e9,
                args.On("explain") ? "   " : "", args.On("explain") ? l.formula.c_str() : "");
  }
  std::printf("%-12s %-7s %11.3f GB  (per device)\n", "total", "device", plan.Total("device") / 1e9);
  if (plan.Total("host") > 0) std::printf("%-12s %-7s %11.3f GB\n", "total", "host", plan.Total("host") / 1e9);
  return 0;
}

}  // namespace lathe::cli
