// HF tokenizer files for a GGUF's vocabulary, so that a model saved from a GGUF base (full / freeze fine-tuning
// writes an HF folder) carries a tokenizer transformers and `tokenizers` load: tokenizer.json, tokenizer_config.json
// and special_tokens_map.json, written from the same tokenizer.ggml.* metadata Tokenizer::FromGguf reads.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace lathe::formats {
class GgufFile;
}

namespace lathe::tokenizer {

// (file name, contents) of each file, for a byte-level BPE vocabulary (tokenizer.ggml.model "gpt2": GPT-2, SmolLM,
// Llama 3, Qwen2). tokenizer.json: the BPE model (vocab in id order, merges in rank order, ignore_merges as llama.cpp
// applies it), the pre-tokenizer as llama.cpp's regex list for tokenizer.ggml.pre (one Split each, isolated) then
// ByteLevel without its own regex, the ByteLevel decoder, BOS / EOS added by a TemplateProcessing where the GGUF
// asks for them; control tokens as special added tokens, user-defined ones as plain added tokens (both matched whole,
// as llama.cpp matches them). tokenizer_config.json: the special tokens, add_bos_token / add_eos_token and the chat
// template. A SentencePiece vocabulary ("llama"): HF's legacy Llama tokenizer.json (normalizer: U+2581 for spaces,
// with add_space_prefix one prepended to each text piece, i.e. at the start and after special tokens as llama.cpp
// does; BPE with byte fallback; the decoder undoing both), its merges derived from the scores as transformers
// derives them for a GGUF (no merges in the file). Other kinds, and remove_extra_whitespaces, are errors naming the
// key.
Result<std::vector<std::pair<std::string, std::string>>> HfTokenizerFilesFromGguf(const formats::GgufFile& g);

}  // namespace lathe::tokenizer
