// Tokenizer: text <-> token ids for SentencePiece-style BPE (llama, byte fallback) and byte-level
// BPE (gpt2/llama3/qwen2/smollm), loaded from GGUF metadata, tokenizer.json, tokenizer.model or
// llama2.c tokenizer.bin. Reproduces llama.cpp's tokenizer test vectors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe::formats {
class GgufFile;
}

namespace lathe::tokenizer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // From a GGUF's tokenizer.ggml.* metadata (model "llama" or "gpt2").
  static Result<std::unique_ptr<Tokenizer>> FromGguf(const formats::GgufFile& gguf);
  // From an HF tokenizer.json (reads tokenizer_config.json beside it when present, for
  // bos/eos/add_bos_token and the chat template).
  static Result<std::unique_ptr<Tokenizer>> FromTokenizerJson(const std::string& path);
  // From a SentencePiece tokenizer.model (protobuf).
  static Result<std::unique_ptr<Tokenizer>> FromSentencePieceModel(const std::string& path);
  // From a llama2.c tokenizer.bin (vocab_size entries).
  static Result<std::unique_ptr<Tokenizer>> FromLlama2cBin(const std::string& path, int vocab_size);

  // Encodes text. add_bos adds the special tokens the tokenizer's config asks for: BOS when
  // add_bos() (llama.cpp's add_special; SmolLM2 and Qwen add none), EOS when add_eos().
  // parse_special turns control-token text (e.g. "<|im_start|>") into its single id instead of
  // tokenizing its characters; user-defined/added non-special tokens are always matched whole.
  // Thread-safe (the per-word cache is internally locked).
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_bos, bool parse_special = true) const = 0;
  // The raw bytes a token stands for when detokenized (byte-fallback tokens give their byte,
  // SentencePiece's U+2581 becomes a space, byte-level BPE maps back to bytes). Special tokens
  // give their text. May be a partial UTF-8 sequence.
  virtual std::string TokenBytes(int32_t id) const = 0;
  // Detokenizes a whole sequence: drops a leading BOS when add_bos() (the BOS Encode adds; a
  // chatml "BOS" such as SmolLM2's <|im_start|> is kept), strips the SentencePiece leading space
  // of the first piece (as sentencepiece's decode does). Bytes are returned as they are (may be
  // invalid UTF-8).
  virtual std::string Decode(const std::vector<int32_t>& ids) const = 0;
  // The vocabulary string of a token as stored (for display/debugging).
  virtual const std::string& Piece(int32_t id) const = 0;

  virtual int32_t vocab_size() const = 0;
  // Control, unknown and unused tokens (BOS, <|im_start|>, ...): not text a model writes. Grammar-
  // constrained decoding never allows them.
  virtual bool IsControl(int32_t id) const = 0;
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  // All ids that end generation (eos, eot, <|im_end|>, <|eot_id|>, ...).
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  // SentencePiece dummy prefix: a space is added before text that starts the input or follows a
  // special token, and stripped again when detokenizing the first piece.
  bool add_space_prefix() const { return add_space_prefix_; }
  // The chat template text from the file (jinja), empty if none.
  const std::string& chat_template() const { return chat_template_; }
  // "spm" or "bpe".
  virtual const char* kind() const = 0;

 protected:
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  std::vector<int32_t> stop_ids_;
  bool add_bos_ = true;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;
  std::string chat_template_;
};

// Streams detokenized text: feed ids one by one, get back only complete UTF-8 (a multi-byte
// character split across tokens is held until it completes; invalid bytes become U+FFFD). Strips
// the SentencePiece leading space of the piece right after a BOS (so generated text that follows
// a prompt keeps its leading space); BOS itself gives no text when add_bos(). Not thread-safe:
// one per stream.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  std::string Push(int32_t id);
  std::string Flush();  // whatever is pending (invalid bytes become U+FFFD)

 private:
  const Tokenizer& tok_;
  std::string pending_;
  bool after_bos_ = false;
};

}  // namespace lathe::tokenizer
