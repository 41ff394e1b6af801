// UTF-8 helpers and the GPT-2 byte<->unicode map.
#include "tokenizer/unicode.h"

#include <vector>

namespace lathe::tokenizer {

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t DecodeUtf8(std::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = *pos;
  int len = Utf8SeqLen(p[i]);
  if (len == 1 || i + len > s.size()) {
    *pos = i + 1;
    return p[i];
  }
  uint32_t cp = p[i] & (0xFF >> (len + 1));
  for (int k = 1; k < len; ++k) {
    if ((p[i + k] & 0xC0) != 0x80) {
      *pos = i + 1;
      return p[i];
    }
    cp = (cp << 6) | (p[i + k] & 0x3F);
  }
  *pos = i + len;
  return cp;
}

namespace {

struct ByteMaps {
  std::array<std::string, 256> to_unicode;
  std::vector<int> to_byte;  // indexed by code point (< 512)
  ByteMaps() : to_byte(512, -1) {
    // Printable Latin-1 bytes map to themselves; the rest are shifted to 256.. in byte order.
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? b : 256 + n++;
      AppendUtf8(cp, &to_unicode[b]);
      to_byte[cp] = b;
    }
  }
};

const ByteMaps& Maps() {
  static const ByteMaps maps;
  return maps;
}

}  // namespace

const std::array<std::string, 256>& ByteToUnicode() { return Maps().to_unicode; }

int UnicodeToByte(uint32_t cp) { return cp < 512 ? Maps().to_byte[cp] : -1; }

std::string ByteLevelDecode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t start = pos;
    uint32_t cp = DecodeUtf8(text, &pos);
    int b = UnicodeToByte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(text.substr(start, pos - start));
    }
  }
  return out;
}

std::string ByteLevelEncode(std::string_view bytes) {
  const auto& map = ByteToUnicode();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += map[static_cast<uint8_t>(c)];
  return out;
}

size_t AppendCompleteUtf8(std::string_view s, std::string* out) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    uint8_t lead = p[i];
    if (lead < 0x80) {
      out->push_back(static_cast<char>(lead));
      ++i;
      continue;
    }
    int len = Utf8SeqLen(lead);
    if (len == 1 || lead == 0xC0 || lead == 0xC1 || lead > 0xF4) {  // stray continuation / invalid lead
      out->append(kReplacement);
      ++i;
      continue;
    }
    size_t avail = s.size() - i;
    bool bad = false;
    size_t k = 1;
    for (; k < static_cast<size_t>(len) && k < avail; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) {
        bad = true;
        break;
      }
    }
    if (bad) {
      out->append(kReplacement);
      ++i;
      continue;
    }
    if (avail < static_cast<size_t>(len)) return avail;  // may still complete
    out->append(s.substr(i, len));
    i += len;
  }
  return 0;
}

}  // namespace lathe::tokenizer
