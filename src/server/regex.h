// Regular expressions as GBNF (structured outputs): vLLM's guided_regex / structured_outputs.regex, and a JSON
// schema string's `pattern` and `format`.
//
// The syntax is Python's `re` (what vLLM's users write): literals, `.` (any character but a newline), classes
// `[a-z\d]` and `[^...]`, the escapes \d \D \w \W \s \S \n \r \t \f \v \a \0 \xHH \uHHHH \UHHHHHHHH and escaped
// punctuation, groups `(...)`, `(?:...)`, `(?P<name>...)`, `(?<name>...)`, alternation `|`, the quantifiers `* + ?
// {m} {m,} {,n} {m,n}` (lazy forms `*?` etc. match the same strings), `^` / `\A` at the start and `$` / `\Z` / `\z`
// at the end. Refused with an error naming the offset: what a context-free grammar over the text cannot express
// (backreferences, lookarounds, word boundaries, possessive quantifiers, inline flags), and anchors elsewhere.
// \w, \d and \s are ASCII (Python's re.ASCII), so the grammar stays small.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace lathe::server {

struct RegexOptions {
  // How the matched text is written: as it is, or as the inside of a JSON string literal (", \ and control
  // characters escaped: the grammar then generates the JSON encoding of each matching string).
  bool json_string = false;
  // Empty: the whole output is one match (vLLM's guided_regex; anchors are allowed and change nothing). Otherwise
  // a search, as JSON Schema's `pattern`: a branch that does not start with ^ may be preceded by any text, one
  // that does not end with $ followed by any, where `any_char` is the GBNF rule for one character of that text.
  std::string any_char;
};

// A GBNF expression (classes, literals, groups: no rule names) for the strings `pattern` matches. Errors name the
// offset in the pattern and what is not supported there.
Result<std::string> RegexToGbnf(std::string_view pattern, const RegexOptions& options = {});

}  // namespace lathe::server
