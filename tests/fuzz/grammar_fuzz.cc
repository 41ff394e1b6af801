// libFuzzer target for structured outputs, whose inputs come from the network: a GBNF grammar (guided_grammar),
// a JSON schema (response_format, guided_json) or a regular expression (guided_regex). Input: the grammar, schema or
// '/' and the regex, a NUL byte, then bytes to feed the matcher. A schema (input starting with '{') or a regex is
// converted to GBNF first. Any bytes must give a grammar
// or an error, and a matcher whose masks agree with trying each token alone: no crash, hang or UB.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "serve/grammar.h"
#include "server/json_schema.h"
#include "server/regex.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in((const char*)data, size);
  const size_t nul = in.find('\0');
  std::string spec = in.substr(0, nul), feed = nul == std::string::npos ? "" : in.substr(nul + 1);
  std::string gbnf = spec;
  if (!spec.empty() && spec[0] == '{') {
    auto schema = nlohmann::ordered_json::parse(spec, nullptr, /*allow_exceptions=*/false);
    if (schema.is_discarded()) return 0;
    auto g = lathe::server::JsonSchemaToGbnf(schema);
    if (!g.ok()) return 0;
    gbnf = g.value();
  } else if (!spec.empty() && spec[0] == '/') {
    auto g = lathe::server::RegexToGbnf(spec.substr(1));
    if (!g.ok()) return 0;
    gbnf = "root ::= " + g.value() + "\n";
  }
  auto grammar = lathe::serve::Grammar::Parse(gbnf);
  if (!grammar.ok()) return 0;
  // A small vocabulary: ASCII structure, a split two-byte and three-byte character, an end token.
  static const auto vocab = [] {
    std::vector<std::string> pieces = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "a", "ab", "0", "1", "-", ".",
                                       "e", "true", "null", "\\", "\xC3", "\xA9", "\xE2\x82", "\xAC", "\"a\":", "</s>"};
    std::vector<uint8_t> text(pieces.size(), 1);
    text.back() = 0;
    return std::make_shared<lathe::serve::GrammarVocab>(pieces, text, std::vector<int32_t>{(int32_t)pieces.size() - 1});
  }();
  lathe::serve::GrammarMatcher m(grammar.value(), vocab);
  std::vector<uint8_t> mask;
  for (size_t i = 0; i < feed.size() && i < 64; ++i) {
    m.AllowedTokens(&mask);
    for (int32_t t = 0; t < vocab->size(); ++t) {
      if ((mask[t] != 0) != m.Allows(t)) __builtin_trap();  // the walk and the brute force disagree
    }
    // Each feed byte picks a token; a token the grammar refuses leaves the state unchanged.
    (void)m.AcceptToken((int32_t)((unsigned char)feed[i] % vocab->size()));
    (void)m.Complete();
    (void)m.Finished();
  }
  return 0;
}
