// Structured outputs: JSON schemas (OpenAI's response_format json_schema, vLLM's guided_json), JSON mode
// (json_object) and choices (guided_choice) as GBNF grammars for serve::Grammar.
//
// The generated text is compact-friendly JSON: object members in the order `properties` lists them, at most
// one space or one newline plus indentation between tokens, nothing after the value (so generation ends when
// the value closes). What a schema may say:
// - type (one or a list), enum, const, anyOf, oneOf (as anyOf: an instance matching two branches is not
//   refused), allOf with one member, $ref into #/$defs, #/definitions or # (recursion works), an empty schema
//   or `true` (any JSON value);
// - objects: properties, required, additionalProperties (absent or false with properties, even empty ones: only
//   those keys; true, or a schema, or absent without properties: any keys with values of that schema);
// - arrays: items, minItems, maxItems; strings: minLength, maxLength, or pattern (a search, server/regex.h),
//   or a format the grammar writes (date, date-time, time, uuid, ipv4, email); integers and numbers: minimum,
//   maximum, exclusiveMinimum, exclusiveMaximum (integer parts up to 16 digits, as every integer here; a bounded
//   number is a plain decimal, no exponent, zero written "0");
// - annotations are ignored: title, description, default, examples, other formats, $schema, $id, $comment,
//   deprecated, readOnly, writeOnly.
// Keywords that assert what the grammar cannot express (multipleOf, uniqueItems, not,
// if/then/else, patternProperties, ...) are refused with an error naming the keyword and where it is, rather than
// silently not enforced.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"

namespace lathe::server {

// GBNF (start rule "root") for the instances of `schema`, whose key order is kept (members are generated in the
// order `properties` lists them). Errors name the schema path ("$.properties.age") and the keyword.
Result<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema);
// For grammars that embed several schemas (XML tool calls): the GBNF expression for the instances of `schema`. The
// rules it refers to are appended to `rules` (their names start with `prefix`, a GBNF name like "p0-"), and the
// shared primitive rules it uses (ws, string, number, value, ...) are added to `primitives`, to be written once by
// JsonPrimitiveRules.
Result<std::string> JsonSchemaExpression(const nlohmann::ordered_json& schema, const std::string& prefix,
                                         std::string* rules, std::set<std::string>* primitives);
std::string JsonPrimitiveRules(const std::set<std::string>& used);
// GBNF for any JSON object: OpenAI's JSON mode.
std::string JsonObjectGbnf();
// GBNF for exactly one of `choices` (vLLM's guided_choice).
std::string ChoiceGbnf(const std::vector<std::string>& choices);
// A GBNF string literal matching `text` exactly.
std::string GbnfLiteral(const std::string& text);
// "( a | b | c )" for several alternatives, the one itself for one. REQUIRES: alts is not empty.
std::string GbnfAlternatives(const std::vector<std::string>& alts);
// Compact JSON text; invalid UTF-8 in strings (a request may carry it) becomes U+FFFD instead of throwing.
template <class J>
std::string SafeDump(const J& j) {
  return j.dump(-1, ' ', false, J::error_handler_t::replace);
}

}  // namespace lathe::server
