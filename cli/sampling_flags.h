// The sampling flags shared by `generate` and `chat` (llama.cpp's names and defaults).
#pragma once

#include "cli/args.h"
#include "serve/sampler.h"

namespace lathe::cli {

void AddSamplingFlags(Args& args);
Result<serve::SamplingParams> SamplingFromArgs(const Args& args);

}  // namespace lathe::cli
