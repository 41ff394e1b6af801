// UTF-8 helpers and the GPT-2 byte<->unicode map shared by the tokenizers (internal to tokenizer/).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace lathe::tokenizer {

// Length of the UTF-8 sequence a lead byte announces (1 for ASCII and for invalid leads).
inline int Utf8SeqLen(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// The byte a SentencePiece byte-fallback piece "<0xAB>" stands for, or -1 for any other text.
inline int ParseByteToken(std::string_view p) {
  if (p.size() != 6 || p.compare(0, 3, "<0x") != 0 || p[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  int hi = hex(p[3]), lo = hex(p[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// Appends the UTF-8 encoding of a code point.
void AppendUtf8(uint32_t cp, std::string* out);
// Decodes one code point at s[*pos] (advancing *pos); invalid bytes decode as themselves (Latin-1)
// and advance one byte, so the result is always defined.
uint32_t DecodeUtf8(std::string_view s, size_t* pos);

// GPT-2's reversible map from each byte to a printable code point (UTF-8 encoded).
const std::array<std::string, 256>& ByteToUnicode();
// The inverse: byte for a code point of the map, or -1.
int UnicodeToByte(uint32_t cp);
// Maps a byte-level token text back to raw bytes; code points outside the map are kept as UTF-8.
std::string ByteLevelDecode(std::string_view text);
// Maps raw bytes to byte-level text.
std::string ByteLevelEncode(std::string_view bytes);

// Splits `s` into the longest prefix of complete, valid UTF-8 (copied to *out, invalid bytes
// replaced by U+FFFD) and returns how many trailing bytes form an incomplete sequence that may
// still complete (those are left unconsumed).
size_t AppendCompleteUtf8(std::string_view s, std::string* out);

}  // namespace lathe::tokenizer
