// Helpers shared by sub-commands: loading a model from flags, printing errors, JSON output.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/args.h"
#include "core/dtype.h"
#include "core/status.h"
#include "model/loader.h"

namespace lathe::cli {

// Prints "lathe CMD: message" to stderr and returns 1 (for `return Fail(...)`).
int Fail(const std::string& command, const Status& status);

// The command line of a config-file command (`lathe train` / `lathe export CONFIG.yaml [--key value ...]`): the one
// positional CONFIG path and every --key value / --key=value / bare --flag (value "true") pair in order, flags of
// the command itself included (the caller takes those out). help: -h / --help was given. Errors: a second positional.
struct ConfigArgs {
  std::string config_path;
  std::vector<std::pair<std::string, std::string>> pairs;
  bool help = false;
};
Result<ConfigArgs> SplitConfigArgs(int argc, char** argv);
// A -t / --threads value: a positive integer.
Result<int> ParseThreads(const std::string& value);

// Declares the model-loading flags (-m/--model, --tokenizer, -t/--threads).
void AddModelFlags(Args& args);
Result<std::unique_ptr<model::LoadedModel>> LoadModelFromArgs(const Args& args);
int ThreadsFromArgs(const Args& args);

// --kv-cache-dtype (auto | f32 | f16 | bf16): the KV cache's element type, for the commands that hold one.
// auto (the default) = model::DefaultKvCacheDType of the loaded model. CheckKvCacheDTypeFlag validates the
// value before a model is loaded; KvCacheDTypeFromArgs gives the type for a model.
void AddKvCacheDTypeFlag(Args& args);
// --int8-prompt: model::TransformerOptions::int8_prompt_rows, for the commands that run prompts.
void AddInt8PromptFlag(Args& args);
Status CheckKvCacheDTypeFlag(const Args& args);
Result<DType> KvCacheDTypeFromArgs(const Args& args, const model::ModelWeights& w);

// The serving engine's --prefill-tokens-per-decode-row: a non-negative integer, or auto (the default):
// kAmxPromptTokensPerDecodeRow where the model's prompt rows run on AMX tiles (UsesAmxBf16, linear weights bf16 or
// block-quantized on the bf16 prompt rows: ~3x cheaper per row than on FMAs, so a step can carry more of the
// arrivals' prompt tokens for the same latency), else kPromptTokensPerDecodeRow (bench/RESULTS.md, "Serving").
constexpr int64_t kPromptTokensPerDecodeRow = 2, kAmxPromptTokensPerDecodeRow = 8;
// CheckPrefillTokensPerDecodeRowFlag validates the flag before a model is loaded.
Status CheckPrefillTokensPerDecodeRowFlag(const Args& args);
Result<int64_t> PrefillTokensPerDecodeRowFromArgs(const Args& args, const model::ModelWeights& w);

// JSON-escapes into a quoted string (invalid UTF-8 is replaced by U+FFFD).
std::string JsonString(const std::string& s);

// Seconds from a to b on the steady clock.
inline double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace lathe::cli
