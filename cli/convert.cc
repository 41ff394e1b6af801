// `lathe convert`: rewrite a GGUF model's weights in another dtype.
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/thread_pool.h"
#include "tools/convert.h"

namespace lathe::cli {

int RunConvert(int argc, char** argv) {
  Args args("convert", "lathe convert MODEL.gguf --dtype {f32,f16,bf16,q8_0,q4_0,q4_1} -o OUT.gguf");
  args.Flag("--dtype", "target weight dtype: f32, f16, bf16, q8_0, q4_0, q4_1");
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
  DType target;
  if (!ParseDType(args.Get("dtype"), &target)) {
    return Fail("convert", Status::Error("--dtype '" + args.Get("dtype") + "' is unknown (f32, f16, bf16, q8_0, q4_0, q4_1)"));
  }
  ThreadPool pool(ThreadsFromArgs(args));
  auto r = tools::ConvertGguf(args.positional()[0], args.Get("output"), target, pool);
  if (!r.ok()) return Fail("convert", r.status());
  std::printf("wrote %s: %lld tensors, %lld params, %.1f MB -> %.1f MB\n", args.Get("output").c_str(),
              (long long)r->tensors, (long long)r->params, r->bytes_in / 1e6, r->bytes_out / 1e6);
  if (r->f16_fallbacks) {
    std::printf("note: %lld matrices kept in f16: their rows are not a multiple of the %s block size\n",
                (long long)r->f16_fallbacks, DTypeName(target));
  }
  return 0;
}

}  // namespace lathe::cli
