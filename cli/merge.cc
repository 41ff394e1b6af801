// `lathe merge`: a PEFT LoRA adapter folded into its base model (GGUF in, GGUF out; HF folder in, HF folder out).
#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/thread_pool.h"
#include "tools/merge.h"

namespace lathe::cli {

int RunMerge(int argc, char** argv) {
  Args args("merge", "lathe merge -m BASE --adapter DIR -o OUT [--dtype TYPE]");
  args.Flag("-m,--model", "base model: a GGUF file (writes OUT.gguf) or an HF model folder (writes the folder OUT)");
  args.Flag("--adapter", "PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) for that base; "
                         "repeat it to merge several, in order");
  args.Flag("-o,--output", "the merged model: a .gguf path for a GGUF base, a folder for an HF base");
  args.Flag("--dtype",
            std::string("GGUF: the output type, as `lathe convert` (") + tools::ConvertTargetNames() +
                "; default: the base's f32 / f16 / bf16, or f16 over a quantized base, as llama-export-lora). "
                "HF: f32, f16 or bf16 for every float tensor (default: as stored)");
  args.Flag("-t,--threads", "threads", std::to_string(DefaultThreadCount()));
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return Fail("merge", st);
  if (args.help_requested()) {
    std::printf("%s", args.Help().c_str());
    return 0;
  }
  if (!args.positional().empty()) return Fail("merge", Status::Error("unexpected argument '" + args.positional()[0] + "'"));
  if (!args.Has("model") || args.All("adapter").empty() || !args.Has("output")) {
    return Fail("merge", Status::Error("pass -m BASE, --adapter DIR and -o OUT"));
  }
  ThreadPool pool(ThreadsFromArgs(args));
  tools::MergeOptions o;
  o.dtype = args.Get("dtype");
  const auto t0 = std::chrono::steady_clock::now();
  auto r = tools::MergeLora(args.Get("model"), args.All("adapter"), args.Get("output"), o, pool);
  if (!r.ok()) return Fail("merge", r.status());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s (%s, %s): %lld linear weights merged, %lld tensors, %.1f MB of tensor data, %lld files, %.1f s\n",
              args.Get("output").c_str(), r->format.c_str(), r->dtype.c_str(), (long long)r->merged,
              (long long)r->tensors, r->bytes_out / 1e6, (long long)r->files, s);
  if (r->convert.requantized) {
    std::printf("note: %lld matrices were already quantized and are quantized again: an adapter's change is small "
                "beside a quantization step, so part of it rounds away (merge to f16 and `lathe quantize` from it)\n",
                (long long)r->convert.requantized);
  }
  return 0;
}

}  // namespace lathe::cli
