// Pre-tokenizer splits with PCRE2 and NFC normalization with ICU.
#include "tokenizer/bpe_pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

namespace lathe::tokenizer {

const char kGpt2Regex[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

const char kLlama3Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char kQwen2Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Per-thread PCRE2 match state: match data and a JIT stack big enough for long whitespace runs.
struct MatchState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* ctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchState() {
    md = pcre2_match_data_create(16, nullptr);
    ctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    if (ctx && stack) pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
    pcre2_match_data_free(md);
  }
};

MatchState& ThreadMatchState() {
  thread_local MatchState state;
  return state;
}

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

Status PreTokenizer::AddRegex(const std::string& pattern, SplitBehavior behavior, bool invert) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  auto re = std::make_shared<Regex>();
  re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                           PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
  if (!re->code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return Status::Error(StrFormat("pre-tokenizer regex /%s/ does not compile at offset %zu: %s", pattern.c_str(),
                                   static_cast<size_t>(err_off), reinterpret_cast<char*>(buf)));
  }
  pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is absent
  steps_.push_back({std::move(re), behavior, invert, pattern});
  return Status::Ok();
}

std::vector<PreTokenizer::SplitStep> PreTokenizer::Steps() const {
  std::vector<SplitStep> out;
  for (const Step& s : steps_) out.push_back({s.pattern, s.behavior, s.invert});
  return out;
}

Status PreTokenizer::AddLiteral(const std::string& literal, SplitBehavior behavior, bool invert) {
  std::string pattern;
  for (char c : literal) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && static_cast<unsigned char>(c) < 0x80) pattern.push_back('\\');
    pattern.push_back(c);
  }
  return AddRegex(pattern, behavior, invert);
}

Status PreTokenizer::AddByteLevelRegex() { return AddRegex(kGpt2Regex, SplitBehavior::kIsolated, false); }

Result<PreTokenizer> PreTokenizer::ForGgufPre(const std::string& pre) {
  // The regex lists of llama.cpp's llm_tokenizer_bpe for each pre-tokenizer name.
  std::vector<const char*> regexes;
  if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3" || pre == "pixtral" ||
      pre == "dbrx" || pre == "smaug-bpe") {
    regexes = {kLlama3Regex};
  } else if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "megrez") {
    regexes = {kQwen2Regex};
  } else if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" ||
             pre == "codeshell" || pre == "exaone" || pre == "minerva-7b") {
    regexes = {R"(\p{N})", kGpt2Regex};
  } else if (pre == "gpt-2" || pre == "mpt" || pre == "olmo" || pre == "jais" || pre == "trillion") {
    regexes = {kGpt2Regex};
  } else {
    // llama.cpp's default for unrecognized names ("default" included).
    regexes = {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Regex, R"(\p{N}+)", "[0-9][0-9][0-9]"};
  }
  PreTokenizer p;
  for (const char* r : regexes) LATHE_RETURN_IF_ERROR(p.AddRegex(r, SplitBehavior::kIsolated, false));
  return p;
}

void PreTokenizer::Split(std::string_view text, std::vector<std::string_view>* out) const {
  out->clear();
  if (text.empty()) return;
  out->push_back(text);
  std::vector<std::string_view> next;
  for (const Step& step : steps_) {
    next.clear();
    for (std::string_view piece : *out) SplitOne(step, piece, &next);
    out->swap(next);
  }
}

void PreTokenizer::SplitOne(const Step& step, std::string_view piece, std::vector<std::string_view>* out) const {
  struct Seg {
    size_t b, e;
    bool match;
  };
  std::vector<Seg> segs;
  MatchState& ms = ThreadMatchState();
  auto subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t offset = 0, last = 0;
  while (offset <= piece.size()) {
    int rc = pcre2_match(step.regex->code, subject, piece.size(), offset, 0, ms.md, ms.ctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(step.regex->code, subject, piece.size(), offset, PCRE2_NO_JIT, ms.md, ms.ctx);
    }
    if (rc < 0) break;  // no match (or a match error: keep the rest as one piece)
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ms.md);
    size_t mb = ov[0], me = ov[1];
    if (me == mb) {  // empty match: step over one code point
      offset = mb + 1;
      while (offset < piece.size() && (static_cast<uint8_t>(piece[offset]) & 0xC0) == 0x80) ++offset;
      continue;
    }
    if (mb > last) segs.push_back({last, mb, false});
    segs.push_back({mb, me, true});
    last = offset = me;
  }
  if (last < piece.size()) segs.push_back({last, piece.size(), false});
  if (step.invert) {
    for (Seg& s : segs) s.match = !s.match;
  }
  auto emit = [&](size_t b, size_t e) {
    if (e > b) out->push_back(piece.substr(b, e - b));
  };
  switch (step.behavior) {
    case SplitBehavior::kIsolated:
      for (const Seg& s : segs) emit(s.b, s.e);
      break;
    case SplitBehavior::kRemoved:
      for (const Seg& s : segs) {
        if (!s.match) emit(s.b, s.e);
      }
      break;
    case SplitBehavior::kMergedWithPrevious: {
      size_t start = 0;
      bool open = false;
      for (const Seg& s : segs) {
        if (s.match) {
          emit(open ? start : s.b, s.e);
          open = false;
        } else {
          if (open) emit(start, s.b);
          start = s.b;
          open = true;
        }
      }
      if (open) emit(start, piece.size());
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      size_t start = 0;
      bool pending = false;
      for (const Seg& s : segs) {
        if (s.match) {
          if (pending) emit(start, s.b);
          start = s.b;
          pending = true;
        } else {
          emit(pending ? start : s.b, s.e);
          pending = false;
        }
      }
      if (pending) emit(start, piece.size());
      break;
    }
    case SplitBehavior::kContiguous: {
      size_t i = 0;
      while (i < segs.size()) {
        size_t j = i;
        while (j + 1 < segs.size() && segs[j + 1].match == segs[i].match && segs[i].match) ++j;
        emit(segs[i].b, segs[j].e);
        i = j + 1;
      }
      break;
    }
  }
}

bool NormalizeNfc(std::string_view text, std::string* out) {
  bool ascii = true;
  for (char c : text) {
    if (static_cast<uint8_t>(c) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return false;
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
  if (U_FAILURE(err)) return false;
  icu::StringPiece sp(text.data(), static_cast<int32_t>(text.size()));
  if (nfc->isNormalizedUTF8(sp, err) && U_SUCCESS(err)) return false;
  err = U_ZERO_ERROR;
  std::string result;
  icu::StringByteSink<std::string> sink(&result);
  nfc->normalizeUTF8(0, sp, sink, nullptr, err);
  if (U_FAILURE(err)) return false;
  *out = std::move(result);
  return true;
}

}  // namespace lathe::tokenizer
