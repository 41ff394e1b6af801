// SentencePiece-style BPE tokenizer (internal to tokenizer/): score-ordered merges over code
// points, byte fallback to <0xXX> tokens, U+2581 for spaces, optional dummy space prefix.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/vocab.h"

namespace lathe::tokenizer {

struct SpmVocab {
  std::vector<std::string> pieces;  // as stored: U+2581 for space, <0xXX> for bytes
  std::vector<float> scores;
  std::vector<TokenType> types;
  int32_t bos_id = -1, eos_id = -1, unk_id = -1;
  std::vector<int32_t> extra_stop_ids;
  bool add_bos = true, add_eos = false;
  bool add_space_prefix = true;
  bool remove_extra_whitespaces = false;
  std::string chat_template;
};

// Builds the tokenizer; `source` names the file in error messages.
Result<std::unique_ptr<Tokenizer>> MakeSpmTokenizer(SpmVocab vocab, const std::string& source);

// The file loaders (spm_files.cc).
Result<SpmVocab> ReadSentencePieceModel(const std::string& path);
Result<SpmVocab> ReadLlama2cBin(const std::string& path, int vocab_size);
// A GGUF's SentencePiece vocabulary (tokenizer.ggml.model "llama"), as Tokenizer::FromGguf reads it (tokenizer.cc).
Result<SpmVocab> ReadGgufSpmVocab(const formats::GgufFile& g);

}  // namespace lathe::tokenizer
