// Text normalization and pre-tokenization for BPE (internal to tokenizer/): the regex splits of
// llama.cpp's named pre-tokenizers and of HF tokenizer.json (Split / ByteLevel / Digits /
// Metaspace), run with PCRE2 in UTF + UCP mode (JIT-compiled).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace lathe::tokenizer {

// How a split treats what the pattern matched (HF's SplitDelimiterBehavior).
enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  // Adds a split step; the steps run in order, each on every piece the previous one produced.
  Status AddRegex(const std::string& pattern, SplitBehavior behavior, bool invert);
  // A literal pattern (HF Split with {"String": ...}).
  Status AddLiteral(const std::string& literal, SplitBehavior behavior, bool invert);
  // The GPT-2 regex that HF's ByteLevel(use_regex=true) applies.
  Status AddByteLevelRegex();
  // llama.cpp's regex list for a tokenizer.ggml.pre name (unknown names get llama.cpp's default).
  static Result<PreTokenizer> ForGgufPre(const std::string& pre);

  // Splits text into pieces (views into `text`).
  void Split(std::string_view text, std::vector<std::string_view>* out) const;
  bool empty() const { return steps_.empty(); }

  // The steps as added (a literal as its escaped regex), for writing them out (HF Split pre-tokenizers).
  struct SplitStep {
    std::string pattern;
    SplitBehavior behavior;
    bool invert;
  };
  std::vector<SplitStep> Steps() const;

 private:
  struct Regex;
  struct Step {
    std::shared_ptr<Regex> regex;
    SplitBehavior behavior;
    bool invert;
    std::string pattern;
  };
  void SplitOne(const Step& step, std::string_view piece, std::vector<std::string_view>* out) const;
  std::vector<Step> steps_;
};

// NFC normalization (ICU). Returns false and leaves *out alone when text is already NFC.
bool NormalizeNfc(std::string_view text, std::string* out);

// The GPT-2 pre-tokenizer regex.
extern const char kGpt2Regex[];

}  // namespace lathe::tokenizer
