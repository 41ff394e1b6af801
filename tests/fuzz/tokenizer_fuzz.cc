// libFuzzer target for the tokenizer files a model directory brings (downloaded, untrusted):
// tokenizer.json (HF: BPE vocab, merges, added tokens, normalizers, pre-tokenizer regexes),
// tokenizer.model (SentencePiece protobuf, decoded by hand), llama2.c tokenizer.bin and a GGUF's tokenizer.ggml.*
// metadata (gpt2 BPE with merges, llama SentencePiece with scores and token types; and the HF files written from
// it, read back). The first
// byte picks the reader, the rest is the file. Any bytes must load or give an error, never crash
// or hit UB; a tokenizer that loads must encode and decode text, its own bytes included.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "formats/gguf.h"
#include "fuzz_file.h"
#include "tokenizer/hf_export.h"
#include "tokenizer/tokenizer.h"

using lathe::tokenizer::Tokenizer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t kind = data[0] % 4;
  const int vocab_size = 1 + data[1] % 64;  // llama2.c's header does not say; the model's does
  lathe::Result<std::unique_ptr<Tokenizer>> tok = lathe::Status::Error("unset");
  if (kind == 3) {
    auto g = lathe::formats::GgufFile::Parse(data + 2, size - 2, "fuzz.gguf");
    if (!g.ok()) return 0;
    tok = Tokenizer::FromGguf(**g);
    // The HF files written from the same metadata (a fine-tune's output folder): written or refused, and what is
    // written loads back through the tokenizer.json reader or gives an error.
    auto files = lathe::tokenizer::HfTokenizerFilesFromGguf(**g);
    if (files.ok() && !files->empty()) {
      const std::string& json = files->front().second;
      lathe::fuzz::MemFile exported("tokenizer", reinterpret_cast<const uint8_t*>(json.data()), json.size());
      (void)Tokenizer::FromTokenizerJson(exported.path());
    }
  } else {
    lathe::fuzz::MemFile file("tokenizer", data + 2, size - 2);
    tok = kind == 0   ? Tokenizer::FromTokenizerJson(file.path())
          : kind == 1 ? Tokenizer::FromSentencePieceModel(file.path())
                      : Tokenizer::FromLlama2cBin(file.path(), vocab_size);
  }
  if (!tok.ok()) return 0;
  const Tokenizer& t = **tok;
  const int32_t n = t.vocab_size();
  for (int32_t id = 0; id < n && id < 512; ++id) {
    (void)t.TokenBytes(id);
    (void)t.Piece(id);
  }
  // Texts: fixed ones (specials, bytes that are not UTF-8, digits, spaces) and the input's tail.
  const std::string_view tail(reinterpret_cast<const char*>(data) + 2, std::min<size_t>(size - 2, 256));
  const std::string texts[] = {"Hello world! 123 4567 <s></s><|im_start|>user\n\xff\xfe caf\xc3\xa9  \t\n",
                               std::string(tail), ""};
  for (const std::string& text : texts)
    for (bool bos : {false, true})
      for (bool special : {false, true}) {
        std::vector<int32_t> ids = t.Encode(text, bos, special);
        for (int32_t id : ids)
          if (id < 0 || id >= n) __builtin_trap();  // an id outside the vocab would index past it
        (void)t.Decode(ids);
      }
  std::vector<int32_t> odd = {0, n - 1, n / 2};
  (void)t.Decode(odd);
  return 0;
}
