// The sampling flags shared by `generate` and `chat` (llama.cpp's names and defaults).
#pragma once

#include "cli/args.h"
#include "serve/sampler.h"
#include "tokenizer/tokenizer.h"

namespace lathe::cli {

void AddSamplingFlags(Args& args);
Result<serve::SamplingParams> SamplingFromArgs(const Args& args);
// Structured output flags (--grammar-file, --json-schema, --json-schema-file, as llama.cpp names them): sets
// p->grammar for this tokenizer's vocabulary. Errors name the flag and file.
Status GrammarFromArgs(const Args& args, const tokenizer::Tokenizer& tok, serve::SamplingParams* p);

}  // namespace lathe::cli
