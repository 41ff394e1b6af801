// Rank-based BPE tokenizer (internal to tokenizer/): byte-level (GPT-2 style: gpt2, llama3,
// qwen2, smollm) or over code points with byte fallback (HF tokenizer.json of SentencePiece
// models). Built from GGUF metadata or tokenizer.json.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/bpe_pretokenize.h"
#include "tokenizer/vocab.h"

namespace lathe::tokenizer {

struct AddedToken {
  std::string text;
  int32_t id = -1;
  bool special = true;
  bool lstrip = false, rstrip = false;
};

// One text rewrite applied before pre-tokenization (HF normalizers, Metaspace).
struct NormalizeOp {
  // kMetaspace*: HF Metaspace's prefix, added only when the text does not already start with it;
  // kMetaspaceFirst only to the fragment at the start of the input.
  enum Kind { kNfc, kPrepend, kMetaspaceAlways, kMetaspaceFirst, kReplace } kind = kNfc;
  std::string a, b;  // prepend: a; replace: a -> b
};

struct BpeVocab {
  std::vector<std::string> pieces;  // as stored (byte-level text when byte_level)
  std::vector<TokenType> types;     // empty: all normal, except added tokens
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  bool byte_level = true;
  bool ignore_merges = false;
  bool byte_fallback = false;
  std::vector<NormalizeOp> normalize;
  PreTokenizer pre;
  // When set, these (and not token types) define the special/added tokens.
  bool has_added_tokens = false;
  std::vector<AddedToken> added;
  int32_t bos_id = -1, eos_id = -1, unk_id = -1;
  std::vector<int32_t> extra_stop_ids;
  bool add_bos = false, add_eos = false;
  bool add_space_prefix = false;  // strip the leading space when decoding (Metaspace models)
  std::string chat_template;
};

Result<std::unique_ptr<Tokenizer>> MakeBpeTokenizer(BpeVocab vocab, const std::string& source);
// A GGUF's byte-level BPE vocabulary (tokenizer.ggml.model "gpt2"), as Tokenizer::FromGguf reads it.
Result<BpeVocab> ReadGgufBpeVocab(const formats::GgufFile& g);

}  // namespace lathe::tokenizer
