// Helpers shared by sub-commands: loading a model from flags, printing errors, JSON output.
#pragma once

#include <memory>
#include <string>

#include "cli/args.h"
#include "core/dtype.h"
#include "core/status.h"
#include "model/loader.h"

namespace lathe::cli {

// Prints "lathe CMD: message" to stderr and returns 1 (for `return Fail(...)`).
int Fail(const std::string& command, const Status& status);

// Declares the model-loading flags (-m/--model, --tokenizer, -t/--threads).
void AddModelFlags(Args& args);
Result<std::unique_ptr<model::LoadedModel>> LoadModelFromArgs(const Args& args);
int ThreadsFromArgs(const Args& args);

// --kv-cache-dtype (auto | f32 | f16 | bf16): the KV cache's element type, for the commands that hold one.
// auto (the default) = model::DefaultKvCacheDType of the loaded model. CheckKvCacheDTypeFlag validates the
// value before a model is loaded; KvCacheDTypeFromArgs gives the type for a model.
void AddKvCacheDTypeFlag(Args& args);
Status CheckKvCacheDTypeFlag(const Args& args);
Result<DType> KvCacheDTypeFromArgs(const Args& args, const model::ModelWeights& w);

// JSON-escapes into a quoted string (invalid UTF-8 is replaced by U+FFFD).
std::string JsonString(const std::string& s);

}  // namespace lathe::cli
