// `lathe convert` and `lathe quantize`: rewrite a GGUF model's weights in another type
// (llama-quantize's file types); `quantize` takes llama-quantize's own argument order.
#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/thread_pool.h"
#include "tools/convert.h"

namespace lathe::cli {

namespace {

int Convert(const char* cmd, const std::string& in, const std::string& out, const std::string& type, int threads,
            bool allow_requantize) {
  auto target = tools::ParseConvertTarget(type);
  if (!target.ok()) return Fail(cmd, target.status());
  ThreadPool pool(threads);
  auto r = tools::ConvertGguf(in, out, *target, pool, allow_requantize);
  if (!r.ok()) return Fail(cmd, r.status());
  std::printf("wrote %s (%s): %lld tensors, %lld params, %.1f MB -> %.1f MB\n", out.c_str(), target->name.c_str(),
              (long long)r->tensors, (long long)r->params, r->bytes_in / 1e6, r->bytes_out / 1e6);
  if (r->fallbacks) {
    std::printf("note: %lld matrices stored in a wider type than %s asks for: their rows are not whole blocks "
                "(as llama-quantize does)\n", (long long)r->fallbacks, target->name.c_str());
  }
  if (r->requantized) {
    std::printf("note: %lld matrices were already quantized and are quantized again (more error than quantizing "
                "the f32/f16/bf16 original)\n", (long long)r->requantized);
  }
  return 0;
}

}  // namespace

int RunConvert(int argc, char** argv) {
  Args args("convert", "lathe convert MODEL.gguf --dtype TYPE -o OUT.gguf");
  args.Flag("--dtype", std::string("target type, as llama-quantize names them: ") + tools::ConvertTargetNames());
  args.Flag("-o,--output", "output .gguf path");
  args.Flag("-t,--threads", "threads", std::to_string(DefaultThreadCount()));
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return Fail("convert", st);
  if (args.help_requested()) {
    std::printf("%s", args.Help().c_str());
    return 0;
  }
  if (args.positional().size() != 1) return Fail("convert", Status::Error("expected one input MODEL.gguf"));
  if (!args.Has("dtype") || !args.Has("output")) return Fail("convert", Status::Error("pass --dtype D and -o OUT.gguf"));
  return Convert("convert", args.positional()[0], args.Get("output"), args.Get("dtype"), ThreadsFromArgs(args), true);
}

int RunQuantize(int argc, char** argv) {
  Args args("quantize", "lathe quantize [--allow-requantize] IN.gguf OUT.gguf TYPE [THREADS]   (llama-quantize's order)");
  args.Bool("--allow-requantize", "allow quantizing weights that are already quantized (lossier than from f32/f16/bf16)");
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return Fail("quantize", st);
  if (args.help_requested()) {
    std::printf("%s\nTYPE: %s\n", args.Help().c_str(), tools::ConvertTargetNames());
    return 0;
  }
  const auto& pos = args.positional();
  if (pos.size() != 3 && pos.size() != 4) {
    return Fail("quantize", Status::Error("expected IN.gguf OUT.gguf TYPE [THREADS]"));
  }
  int threads = DefaultThreadCount();
  if (pos.size() == 4) {
    char* end = nullptr;
    long n = std::strtol(pos[3].c_str(), &end, 10);
    if (*end || n < 1 || n > 1024) return Fail("quantize", Status::Error("THREADS '" + pos[3] + "' is not a count of threads"));
    threads = (int)n;
  }
  return Convert("quantize", pos[0], pos[1], pos[2], threads, args.On("allow-requantize"));
}

}  // namespace lathe::cli
