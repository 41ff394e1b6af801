// Perplexity evaluation: mean negative log-likelihood of each token given its prefix, over a
// set of documents (each BOS + text, cut to the context length), computed in one prefill per
// document.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "model/transformer.h"
#include "tokenizer/tokenizer.h"

namespace lathe::tools {

struct NllResult {
  double total_nll = 0;     // nats
  int64_t tokens = 0;       // tokens scored
  int64_t documents = 0;
  int64_t bytes = 0;        // UTF-8 bytes of the scored text
  double mean_nll() const { return tokens ? total_nll / tokens : 0; }
  double perplexity() const;
  double bits_per_byte() const;
};

// Splits `text` on `separator` (e.g. "<|endoftext|>"), trims surrounding whitespace and drops
// empty pieces. An empty separator yields the whole text as one document.
std::vector<std::string> SplitDocuments(const std::string& text, const std::string& separator);

// Scores every document: ids = [BOS] + Encode(doc), cut to max_len tokens; every token after
// the first is scored. A tokenizer that adds no BOS (Qwen's, SmolLM2's: add_bos() false, as transformers' tokenizer
// and llama.cpp's perplexity read it) scores Encode(doc) the same way: its first token is context only, as in
// transformers' loss (bytes still count the whole document). Documents are batched up to `batch_tokens` tokens per
// forward call.
Result<NllResult> EvaluateNll(model::Transformer& tf, const tokenizer::Tokenizer& tok,
                              const std::vector<std::string>& documents, int64_t max_len,
                              int64_t batch_tokens = 2048, DType kv_dtype = DType::kF32);

}  // namespace lathe::tools
