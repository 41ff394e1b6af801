// JSON schema -> GBNF (see json_schema.h).
#include "server/json_schema.h"

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "core/strings.h"
#include "server/regex.h"

namespace lathe::server {

namespace {

using ordered_json = nlohmann::ordered_json;

// The shared rules: whitespace between tokens, JSON strings, numbers and any value.
constexpr const char* kPrimitives[][2] = {
    {"ws", "| \" \" | \"\\n\" [ \\t]{0,20}"},
    {"char", "[^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})"},
    {"string", "\"\\\"\" char* \"\\\"\""},
    {"integer", "\"-\"? (\"0\" | [1-9] [0-9]{0,15})"},
    {"number", "\"-\"? (\"0\" | [1-9] [0-9]{0,15}) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?"},
    {"boolean", "\"true\" | \"false\""},
    {"null", "\"null\""},
    {"value", "object | array | string | number | boolean | null"},
    {"object", "\"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\""},
    {"array", "\"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\""},
};

// Keywords other than these and the ones Visit reads are ignored, as JSON Schema ignores unknown keywords:
// annotations (title, description, default, examples, format, $schema, ...) and vocabulary this grammar has no
// use for. These assert what a grammar over the text cannot enforce: refused, not silently dropped.
const std::set<std::string>& Unsupported() {
  static const std::set<std::string> k = {
      "multipleOf",       "minProperties",   "maxProperties",    "uniqueItems",        "contains",
      "minContains",      "maxContains",     "not",              "if",                 "then",
      "else",             "dependentRequired", "dependentSchemas", "dependencies",     "patternProperties",
      "propertyNames",    "unevaluatedProperties", "unevaluatedItems", "prefixItems",  "additionalItems",
      "$dynamicRef",      "$recursiveRef",   "$anchor"};
  return k;
}

std::string Sanitize(const std::string& s) {
  std::string out;
  for (char c : s) out += (std::isalnum((unsigned char)c) || c == '-') ? c : '-';
  if (out.empty()) out = "x";
  return out;
}

// Decimal digits of the integers in [a, b], both written with the same number of digits (leading zeros allowed
// here: they are the inner digits of a longer number).
std::string SameLength(const std::string& a, const std::string& b) {
  const size_t n = a.size();
  if (n == 0) return "";
  if (a == b) return GbnfLiteral(a);
  if (a[0] == b[0]) {
    std::string rest = SameLength(a.substr(1), b.substr(1));
    return GbnfLiteral(a.substr(0, 1)) + (rest.empty() ? "" : " " + rest);
  }
  const std::string zeros(n - 1, '0'), nines(n - 1, '9');
  const std::string any = n > 1 ? StrFormat(" [0-9]{%zu}", n - 1) : "";
  std::vector<std::string> alts;
  char from = a[0], to = b[0];
  if (a.substr(1) != zeros) {
    alts.push_back(GbnfLiteral(a.substr(0, 1)) + " " + SameLength(a.substr(1), nines));
    ++from;
  }
  std::string high;
  if (b.substr(1) != nines) {
    high = GbnfLiteral(b.substr(0, 1)) + " " + SameLength(zeros, b.substr(1));
    --to;
  }
  if (from <= to) alts.push_back((from == to ? GbnfLiteral(std::string(1, from)) : StrFormat("[%c-%c]", from, to)) + any);
  if (!high.empty()) alts.push_back(high);
  return GbnfAlternatives(alts);
}

// The integers' rule writes at most 16 digits; so do bounded ones.
constexpr int kMaxDigits = 16;

// Alternatives for the decimal strings (no leading zeros) of the integers in [lo, hi]; hi < 0: no upper bound
// (up to kMaxDigits digits). REQUIRES: 0 <= lo, and hi < 10^kMaxDigits.
void UnsignedRange(int64_t lo, int64_t hi, std::vector<std::string>* alts) {
  auto digits = [](int64_t v) { return (int)std::to_string(v).size(); };
  auto pow10 = [](int n) {
    int64_t p = 1;
    for (int i = 0; i < n; ++i) p *= 10;
    return p;
  };
  const int lo_len = digits(lo), hi_len = hi < 0 ? std::max(kMaxDigits, lo_len) : digits(hi);
  for (int len = lo_len; len <= hi_len; ++len) {
    if (hi < 0 && len > lo_len) {  // every longer length up to the cap at once
      alts->push_back(StrFormat("[1-9] [0-9]{%d,%d}", len - 1, hi_len - 1));
      break;
    }
    const int64_t first = len == 1 ? 0 : pow10(len - 1), last = pow10(len) - 1;
    const int64_t a = std::max(lo, first), b = hi < 0 ? last : std::min(hi, last);
    if (a <= b) alts->push_back(SameLength(std::to_string(a), std::to_string(b)));
  }
}

// GBNF for the integers in [lo, hi] (has_lo / has_hi: bounded on that side), as JSON writes them.
std::string IntegerRange(bool has_lo, int64_t lo, bool has_hi, int64_t hi) {
  std::vector<std::string> alts;
  if (!has_lo || lo < 0) {  // negatives: "-" and a magnitude in [max(1, -hi), -lo]
    const int64_t mlo = has_hi && hi < 0 ? -hi : 1;
    std::vector<std::string> neg;
    UnsignedRange(mlo, has_lo ? -lo : -1, &neg);
    for (auto& n : neg) alts.push_back("\"-\" " + n);
  }
  if (!has_hi || hi >= 0) UnsignedRange(has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1, &alts);
  return GbnfAlternatives(alts);
}

// A decimal bound of a number schema, exactly as the schema's text writes it: sign, integer digits (no leading
// zeros, "0" for zero) and fraction digits (no trailing zeros).
struct Decimal {
  bool neg = false;
  std::string i = "0", f;
  bool zero() const { return i == "0" && f.empty(); }
};

// From a JSON number's shortest text ("0.1", "-90", "1e-05", "2.5E+3"); false beyond kMaxDigits integer digits or
// for what is not a finite number.
bool ParseDecimal(const std::string& text, Decimal* d) {
  size_t p = 0;
  d->neg = p < text.size() && text[p] == '-';
  if (d->neg) ++p;
  std::string digits;
  int point = -1;
  for (; p < text.size() && text[p] != 'e' && text[p] != 'E'; ++p) {
    if (text[p] == '.') {
      point = (int)digits.size();
    } else if (text[p] >= '0' && text[p] <= '9') {
      digits += text[p];
    } else {
      return false;  // not a finite number's text ("null" is how an infinity dumps)
    }
  }
  if (digits.empty()) return false;
  if (point < 0) point = (int)digits.size();
  if (p < text.size()) point += std::atoi(text.c_str() + p + 1);
  if (point > kMaxDigits + 1) return false;
  if (point < 0) {
    digits = std::string((size_t)-point, '0') + digits;
    point = 0;
  }
  if ((int)digits.size() < point) digits += std::string((size_t)point - digits.size(), '0');
  d->i = digits.substr(0, (size_t)point);
  d->f = digits.substr((size_t)point);
  d->i.erase(0, std::min(d->i.find_first_not_of('0'), d->i.size()));
  if (d->i.empty()) d->i = "0";
  while (!d->f.empty() && d->f.back() == '0') d->f.pop_back();
  if ((int)d->i.size() > kMaxDigits) return false;
  if (d->zero()) d->neg = false;
  return true;
}

// -1, 0, 1 as a < b, a == b, a > b (of the magnitudes: signs ignored).
int CompareMagnitude(const Decimal& a, const Decimal& b) {
  if (a.i.size() != b.i.size()) return a.i.size() < b.i.size() ? -1 : 1;
  if (int c = a.i.compare(b.i)) return c < 0 ? -1 : 1;
  if (int c = a.f.compare(b.f)) return c < 0 ? -1 : 1;  // no trailing zeros: lexicographic is numeric
  return 0;
}
int Compare(const Decimal& a, const Decimal& b) {
  if (a.neg != b.neg) return a.neg ? -1 : 1;
  return a.neg ? -CompareMagnitude(a, b) : CompareMagnitude(a, b);
}

// The fraction digit strings f (value 0.f) with lo <| 0.f <| hi, where lo is 0.L (or nothing: "free") and hi is 0.H
// (or free), each strict or not; `need_digit`: f may not be empty. Nullopt: no such string.
std::optional<std::string> FractionRange(const std::string* L, bool lo_excl, const std::string* H, bool hi_excl,
                                         bool need_digit) {
  const bool lo_free = L == nullptr, hi_free = H == nullptr;
  // What the empty rest is worth (0): allowed when 0 satisfies both sides.
  const bool zero_ok = (lo_free || (L->empty() && !lo_excl)) && (hi_free || !H->empty() || !hi_excl);
  if (lo_free && hi_free) return std::string(need_digit ? "[0-9]+" : "[0-9]*");
  // Exhausted tight sides repeat with "0": settle them without recursing.
  if (!hi_free && H->empty()) {  // the rest must be 0 (all zeros)
    if (hi_excl || (!lo_free && (!L->empty() || lo_excl))) return std::nullopt;
    return std::string(need_digit ? "\"0\"+" : "\"0\"*");
  }
  if (!lo_free && L->empty() && hi_free) {
    if (!lo_excl) return std::string(need_digit ? "[0-9]+" : "[0-9]*");
    return std::string("[0-9]* [1-9] [0-9]*");
  }
  const int a = lo_free || L->empty() ? 0 : (*L)[0] - '0';
  const int b = hi_free ? 9 : (*H)[0] - '0';
  std::vector<std::string> alts;
  auto digit_class = [](int x, int y) {
    return x == y ? GbnfLiteral(std::string(1, (char)('0' + x))) : StrFormat("[%c-%c]", '0' + x, '0' + y);
  };
  // A first digit on a tight side's own digit keeps that side tight for the rest.
  for (int d : a == b ? std::vector<int>{a} : std::vector<int>{a, b}) {
    const bool tight_lo = !lo_free && d == a, tight_hi = !hi_free && d == b;
    if (!tight_lo && !tight_hi) continue;
    std::string l_rest = tight_lo && !L->empty() ? L->substr(1) : "", h_rest = tight_hi ? H->substr(1) : "";
    auto rest = FractionRange(tight_lo ? &l_rest : nullptr, lo_excl, tight_hi ? &h_rest : nullptr, hi_excl, false);
    if (rest) alts.push_back(digit_class(d, d) + (rest->empty() ? "" : " " + *rest));
  }
  // First digits strictly between the tight ones (or any digit on a free side) leave the rest free.
  const int from = lo_free ? 0 : a + 1, to = hi_free ? 9 : b - 1;
  if (from <= to) alts.insert(alts.begin(), digit_class(from, to) + " [0-9]*");
  if (alts.empty()) return zero_ok && !need_digit ? std::optional<std::string>("") : std::nullopt;
  std::string g = GbnfAlternatives(alts);
  if (zero_ok && !need_digit) g = "( " + g + " )?";
  return g;
}

// Alternatives for the unsigned decimals "I" or "I.F" (no exponent) with lo <| value <| hi (hi null: unbounded),
// lo >= 0.
void UnsignedDecimalRange(const Decimal& lo, bool lo_excl, const Decimal* hi, bool hi_excl, std::vector<std::string>* alts) {
  const int64_t li = std::stoll(lo.i), hi_i = hi ? std::stoll(hi->i) : -1;
  auto with = [&](const std::string& int_part, const std::string* L, const std::string* H) {
    // The integer part, then the written fraction (or none, worth 0).
    const bool bare = (L == nullptr || (L->empty() && !lo_excl)) && (H == nullptr || !H->empty() || !hi_excl);
    if (bare) alts->push_back(int_part);
    if (auto f = FractionRange(L, lo_excl, H, hi_excl, true)) alts->push_back(int_part + " \".\" " + *f);
  };
  if (hi && li == hi_i) {
    with(GbnfLiteral(lo.i), &lo.f, &hi->f);
    return;
  }
  with(GbnfLiteral(lo.i), &lo.f, nullptr);
  if (!hi || li + 1 <= hi_i - 1) {
    std::vector<std::string> mid;
    UnsignedRange(li + 1, hi ? hi_i - 1 : -1, &mid);
    alts->push_back(GbnfAlternatives(mid) + " ( \".\" [0-9]+ )?");
  }
  if (hi) with(GbnfLiteral(hi->i), nullptr, &hi->f);
}

// GBNF for the JSON numbers x with lo <| x <| hi (either side may be absent), written without an exponent.
std::optional<std::string> NumberRange(const Decimal* lo, bool lo_excl, const Decimal* hi, bool hi_excl) {
  std::vector<std::string> alts;
  const Decimal zero;
  // x < 0, as "-" and a magnitude y in (0 or -hi, -lo).
  if (!lo || lo->neg) {
    Decimal ylo = zero, yhi;
    bool ylo_excl = true, yhi_excl = lo_excl;
    if (hi && hi->neg) {
      ylo = *hi;
      ylo.neg = false;
      ylo_excl = hi_excl;
    }
    if (lo) {
      yhi = *lo;
      yhi.neg = false;
    }
    std::vector<std::string> neg;
    if (!lo || CompareMagnitude(ylo, yhi) < 0 || (CompareMagnitude(ylo, yhi) == 0 && !ylo_excl && !yhi_excl))
      UnsignedDecimalRange(ylo, ylo_excl, lo ? &yhi : nullptr, yhi_excl, &neg);
    if (!neg.empty()) alts.push_back("\"-\" " + GbnfAlternatives(neg));
  }
  // x >= 0.
  if (!hi || !hi->neg) {
    Decimal xlo = zero;
    bool xlo_excl = false;
    if (lo && !lo->neg) {
      xlo = *lo;
      xlo_excl = lo_excl;
    }
    if (!hi || CompareMagnitude(xlo, *hi) < 0 || (CompareMagnitude(xlo, *hi) == 0 && !xlo_excl && !hi_excl))
      UnsignedDecimalRange(xlo, xlo_excl, hi, hi_excl, &alts);
  }
  if (alts.empty()) return std::nullopt;
  return GbnfAlternatives(alts);
}

// JSON Schema formats the grammar writes (strings that the format's usual validators accept: real calendar
// dates in 1000-9999 without February 29th, RFC 3339 times, RFC 4122-shaped UUIDs, dotted-quad IPv4 without
// leading zeros, plain e-mail addresses). Other formats are annotations.
const char* FormatRegex(const std::string& format) {
  static const std::map<std::string, std::string> k = [] {
    const std::string date =
        "[1-9][0-9]{3}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|"
        "02-(0[1-9]|1[0-9]|2[0-8]))";
    const std::string time = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
    const std::string octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
    return std::map<std::string, std::string>{
        {"date", date},
        {"time", time},
        {"date-time", date + "T" + time},
        {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
        {"ipv4", "(" + octet + "\\.){3}" + octet},
        {"email", "[a-zA-Z0-9._%+-]{1,64}@[a-zA-Z0-9-]{1,63}(\\.[a-zA-Z0-9-]{1,63}){0,3}\\.[a-zA-Z]{2,24}"},
    };
  }();
  auto it = k.find(format);
  return it == k.end() ? nullptr : it->second.c_str();
}

class Converter {
 public:
  explicit Converter(const ordered_json& root, std::string prefix = "") : root_(root), prefix_(std::move(prefix)) {}

  // The root's expression; the rules it refers to are appended to `rules`, the primitives it uses to `primitives`.
  Result<std::string> Expression(std::string* rules, std::set<std::string>* primitives) {
    std::string expr = Visit(root_, "root", "$");
    if (!err_.ok()) return err_;
    for (const auto& [name, body] : rules_) *rules += name + " ::= " + body + "\n";
    primitives->insert(used_.begin(), used_.end());
    return expr;
  }

  Result<std::string> Run() {
    std::string expr = Visit(root_, "root", "$");
    if (!err_.ok()) return err_;
    std::string out = "root ::= " + expr + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    for (const auto& p : kPrimitives) {
      if (used_.count(p[0])) out += std::string(p[0]) + " ::= " + p[1] + "\n";
    }
    return out;
  }

 private:
  void Fail(const std::string& path, const std::string& what) {
    if (err_.ok()) err_ = Status::Error(StrFormat("JSON schema %s: %s", path.c_str(), what.c_str()));
  }
  // A primitive rule, with the ones it refers to.
  std::string Use(const std::string& name) {
    if (used_.insert(name).second) {
      if (name == "string") Use("char");
      if (name == "value") {
        for (const char* d : {"object", "array", "string", "number", "boolean", "null"}) Use(d);
      }
      if (name == "object" || name == "array") {
        Use("ws");
        Use("value");
        Use("string");
      }
    }
    return name;
  }
  std::string NewRule(const std::string& hint, const std::string& body) {
    std::string name = Unique(hint);
    rules_[name] = body;
    return name;
  }
  std::string Unique(const std::string& hint) {
    std::string base = prefix_ + Sanitize(hint), name = base;
    for (int i = 1; rules_.count(name) || reserved_.count(name) || IsPrimitive(name); ++i) name = StrFormat("%s-%d", base.c_str(), i);
    reserved_.insert(name);
    return name;
  }
  static bool IsPrimitive(const std::string& n) {
    for (const auto& p : kPrimitives)
      if (n == p[0]) return true;
    return n == "root";
  }

  std::string Ref(const std::string& ref, const std::string& path) {
    if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
    if (ref.empty() || ref[0] != '#') {
      Fail(path, StrFormat("$ref '%s': only references into this schema ('#', '#/$defs/...') are supported", ref.c_str()));
      return "value";
    }
    const ordered_json* target = &root_;
    std::string pointer = ref.substr(1);
    if (!pointer.empty()) {
      try {
        target = &root_.at(ordered_json::json_pointer(pointer));
      } catch (const std::exception&) {
        Fail(path, StrFormat("$ref '%s' points at nothing in the schema", ref.c_str()));
        return "value";
      }
    }
    std::string name = Unique(ref == "#" ? "root-ref" : pointer.substr(pointer.rfind('/') + 1));
    refs_[ref] = name;
    std::string body = Visit(*target, name, ref);
    rules_[name] = body;
    return name;
  }

  // A GBNF expression for the instances of schema s (named rules made for objects, arrays and refs).
  std::string Visit(const ordered_json& s, const std::string& hint, const std::string& path) {
    if (!err_.ok()) return "value";
    struct Depth {
      int& d;
      explicit Depth(int& x) : d(++x) {}
      ~Depth() { --d; }
    } depth(depth_);
    if (depth_ > 64) {
      Fail(path, "schemas nested deeper than 64 levels are not supported");
      return "value";
    }
    if (s.is_boolean()) {
      if (!s.get<bool>()) Fail(path, "the schema 'false' allows nothing");
      return Use("value");
    }
    if (!s.is_object()) {
      Fail(path, "a schema must be an object or a boolean");
      return "value";
    }
    for (const auto& [key, v] : s.items()) {
      if (Unsupported().count(key)) {
        Fail(path, StrFormat("'%s' is not supported in structured outputs (the grammar cannot enforce it)",
                             key.c_str()));
        return "value";
      }
    }
    // Keywords that apply to one type: the schema must say it is of that type (a list of types may hold others).
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "pattern"}) {
      if (!s.contains(k) || s.contains("enum") || s.contains("const")) continue;
      const bool pattern = std::string(k) == "pattern";
      auto t = s.find("type");
      bool typed = false, integer = false, number = false;
      if (t != s.end()) {
        for (const auto& x : t->is_array() ? *t : ordered_json::array({*t})) {
          typed = typed || x == (pattern ? "string" : "integer") || (!pattern && x == "number");
          integer = integer || x == "integer";
          number = number || x == "number";
        }
      }
      if (!typed || (integer && number)) {
        Fail(path, StrFormat("'%s' is supported with \"type\": %s only", k,
                             pattern ? "\"string\"" : "\"integer\" or \"number\" (not both)"));
        return "value";
      }
    }
    if (auto it = s.find("$ref"); it != s.end()) {
      if (!it->is_string()) {
        Fail(path + ".$ref", "must be a string");
        return "value";
      }
      return Ref(it->get<std::string>(), path + ".$ref");
    }
    if (auto it = s.find("const"); it != s.end()) return GbnfLiteral(SafeDump(*it));
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) {
        Fail(path + ".enum", "must be a non-empty array");
        return "value";
      }
      std::string alts;
      for (const auto& v : *it) alts += (alts.empty() ? "" : " | ") + GbnfLiteral(SafeDump(v));
      return "(" + alts + ")";
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      if (auto it = s.find(k); it != s.end()) {
        if (!it->is_array() || it->empty()) {
          Fail(path + "." + k, "must be a non-empty array of schemas");
          return "value";
        }
        std::string alts;
        for (size_t i = 0; i < it->size(); ++i) {
          std::string sub = Visit((*it)[i], hint, StrFormat("%s.%s[%zu]", path.c_str(), k, i));
          alts += (alts.empty() ? "" : " | ") + sub;
        }
        return "(" + alts + ")";
      }
    }
    if (auto it = s.find("allOf"); it != s.end()) {
      if (!it->is_array() || it->size() != 1) {
        Fail(path + ".allOf", "only an allOf with one schema is supported");
        return "value";
      }
      return Visit((*it)[0], hint, path + ".allOf[0]");
    }
    auto type = s.find("type");
    if (type == s.end()) {
      // No type: what the other keywords imply, else any value.
      if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
        return Object(s, hint, path);
      }
      if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return Array(s, hint, path);
      return Use("value");
    }
    if (type->is_array()) {
      if (type->empty()) {
        Fail(path + ".type", "an empty list of types allows nothing");
        return "value";
      }
      std::string alts;
      for (const auto& t : *type) {
        if (!t.is_string()) {
          Fail(path + ".type", "must be a string or a list of strings");
          return "value";
        }
        alts += (alts.empty() ? "" : " | ") + OfType(t.get<std::string>(), s, hint, path);
      }
      return "(" + alts + ")";
    }
    if (!type->is_string()) {
      Fail(path + ".type", "must be a string or a list of strings");
      return "value";
    }
    return OfType(type->get<std::string>(), s, hint, path);
  }

  std::string OfType(const std::string& t, const ordered_json& s, const std::string& hint, const std::string& path) {
    if (t == "object") return Object(s, hint, path);
    if (t == "array") return Array(s, hint, path);
    if (t == "string") return String(s, path);
    if (t == "integer") return Integer(s, path);
    if (t == "number") return Number(s, path);
    if (t == "boolean") return Use("boolean");
    if (t == "null") return Use("null");
    Fail(path + ".type", StrFormat("unknown type '%s' (expected object, array, string, integer, number, boolean or null)",
                                   t.c_str()));
    return "value";
  }

  bool Count(const ordered_json& s, const char* key, const std::string& path, int64_t* out) {
    auto it = s.find(key);
    if (it == s.end()) return false;
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      Fail(path + "." + key, "must be a non-negative integer");
      return false;
    }
    if (it->get<int64_t>() > 4096) {
      Fail(path + "." + key, "above 4096 is not supported");
      return false;
    }
    *out = it->get<int64_t>();
    return true;
  }

  // "{m,n}" / "{m,}" as GBNF wants them (an empty string for {0,} is "*").
  static std::string Repeat(int64_t lo, int64_t hi) {
    if (hi < 0) return lo == 0 ? "*" : lo == 1 ? "+" : StrFormat("{%lld,}", (long long)lo);
    if (lo == hi) return StrFormat("{%lld}", (long long)lo);
    return StrFormat("{%lld,%lld}", (long long)lo, (long long)hi);
  }

  // Calls f(value, key, lower, exclusive) for each of minimum, exclusiveMinimum, maximum, exclusiveMaximum the
  // schema gives as a number (other values fail, naming the key).
  template <class F>
  void ForEachBound(const ordered_json& s, const std::string& path, F f) {
    for (const auto& [key, lower, exclusive] : {std::tuple<const char*, bool, bool>{"minimum", true, false},
                                                {"exclusiveMinimum", true, true},
                                                {"maximum", false, false},
                                                {"exclusiveMaximum", false, true}}) {
      auto it = s.find(key);
      if (it == s.end()) continue;
      if (!it->is_number()) {
        Fail(path + "." + key, "must be a number");
        continue;
      }
      f(*it, std::string(key), lower, exclusive);
    }
  }

  // An integer, within minimum / maximum / exclusiveMinimum / exclusiveMaximum when the schema gives them.
  std::string Integer(const ordered_json& s, const std::string& path) {
    bool has_lo = false, has_hi = false;
    int64_t lo = 0, hi = 0;
    const double cap = 1e16;  // integers are written with at most 16 digits
    ForEachBound(s, path, [&](const ordered_json& v_json, const std::string& key, bool lower, bool exclusive) {
      const double v = v_json.get<double>();
      const double b = lower ? (exclusive ? std::floor(v) + 1 : std::ceil(v)) : (exclusive ? std::ceil(v) - 1 : std::floor(v));
      if (lower ? b <= -cap : b >= cap) return;  // no tighter than the digits
      if (lower ? b >= cap : b <= -cap) {
        Fail(path + "." + key, "beyond 16 digits is not supported");
        return;
      }
      const int64_t x = (int64_t)b;
      if (lower) {
        lo = has_lo ? std::max(lo, x) : x;
        has_lo = true;
      } else {
        hi = has_hi ? std::min(hi, x) : x;
        has_hi = true;
      }
    });
    if (!has_lo && !has_hi) return Use("integer");
    if (has_lo && has_hi && lo > hi) {
      Fail(path, "no integer lies within its minimum and maximum");
      return "value";
    }
    return IntegerRange(has_lo, lo, has_hi, hi);
  }

  // A number, within minimum / maximum / exclusiveMinimum / exclusiveMaximum when the schema gives them: then
  // written as a plain decimal (no exponent), every one in range and only those.
  std::string Number(const ordered_json& s, const std::string& path) {
    std::optional<Decimal> lo, hi;
    bool lo_excl = false, hi_excl = false;
    ForEachBound(s, path, [&](const ordered_json& v, const std::string& key, bool lower, bool exclusive) {
      Decimal d;
      if (!ParseDecimal(v.dump(), &d)) {
        Fail(path + "." + key, "must be a finite number of at most 16 integer digits");
        return;
      }
      std::optional<Decimal>& cur = lower ? lo : hi;
      bool& cur_excl = lower ? lo_excl : hi_excl;
      const int c = cur ? Compare(d, *cur) : 0;
      if (!cur || (lower ? c > 0 : c < 0) || (c == 0 && exclusive)) {
        cur = d;
        cur_excl = exclusive;
      }
    });
    if (!lo && !hi) return Use("number");
    auto g = NumberRange(lo ? &*lo : nullptr, lo_excl, hi ? &*hi : nullptr, hi_excl);
    if (!g) {
      Fail(path, "no number lies within its minimum and maximum");
      return "value";
    }
    return "( " + *g + " )";
  }

  std::string String(const ordered_json& s, const std::string& path) {
    auto pattern = s.find("pattern");
    const char* format = nullptr;
    if (auto f = s.find("format"); f != s.end() && f->is_string()) format = FormatRegex(f->get<std::string>());
    if (pattern != s.end() || format) {
      const char* key = pattern != s.end() ? "pattern" : "format";
      if (s.contains("minLength") || s.contains("maxLength") || (pattern != s.end() && format)) {
        Fail(path, StrFormat("'%s' together with %s is not supported", key,
                             pattern != s.end() && format ? "a 'format' the grammar writes" : "minLength / maxLength"));
        return "value";
      }
      if (pattern != s.end() && !pattern->is_string()) {
        Fail(path + ".pattern", "must be a string (a regular expression)");
        return "value";
      }
      RegexOptions o;
      o.json_string = true;
      if (pattern != s.end()) o.any_char = Use("char");  // a search: any text around a match
      const std::string regex = pattern != s.end() ? pattern->get<std::string>() : std::string(format);
      auto g = RegexToGbnf(regex, o);
      if (!g.ok()) {
        Fail(path + "." + key, g.status().message());
        return "value";
      }
      return "\"\\\"\" " + g.value() + " \"\\\"\"";
    }
    int64_t lo = 0, hi = -1;
    Count(s, "minLength", path, &lo);
    Count(s, "maxLength", path, &hi);
    if (hi >= 0 && hi < lo) Fail(path, "maxLength is below minLength");
    if (lo == 0 && hi < 0) return Use("string");
    Use("char");
    if (hi == 0) return "\"\\\"\\\"\"";
    return "\"\\\"\" char" + Repeat(lo, hi) + " \"\\\"\"";
  }

  std::string Array(const ordered_json& s, const std::string& hint, const std::string& path) {
    std::string item = Use("value");
    if (auto it = s.find("items"); it != s.end()) item = Visit(*it, hint + "-item", path + ".items");
    int64_t lo = 0, hi = -1;
    Count(s, "minItems", path, &lo);
    Count(s, "maxItems", path, &hi);
    if (hi >= 0 && hi < lo) Fail(path, "maxItems is below minItems");
    Use("ws");
    std::string body;
    if (hi == 0) {
      body = "\"[\" ws \"]\"";
    } else {
      // The first item, then the others after commas: lo - 1 .. hi - 1 of them (none when hi is 1).
      const int64_t more_lo = lo > 0 ? lo - 1 : 0, more_hi = hi < 0 ? -1 : hi - 1;
      const std::string more = more_hi == 0 ? "" : "( \",\" ws " + item + " ws )" + Repeat(more_lo, more_hi);
      std::string list = item + " ws " + more;
      body = "\"[\" ws " + (lo > 0 ? list : "( " + list + " )?") + " \"]\"";
    }
    return NewRule(hint, body);
  }

  std::string Object(const ordered_json& s, const std::string& hint, const std::string& path) {
    Use("ws");
    auto props = s.find("properties");
    auto extra = s.find("additionalProperties");
    if (props != s.end() && !props->is_object()) {
      Fail(path + ".properties", "must be an object");
      return "value";
    }
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) {
        Fail(path + ".required", "must be an array of property names");
        return "value";
      }
      for (const auto& r : *it) {
        if (!r.is_string()) {
          Fail(path + ".required", "must be an array of property names");
          return "value";
        }
        required.insert(r.get<std::string>());
      }
    }
    const bool listed = props != s.end();  // `properties` given, perhaps empty: only those keys by default
    if (!listed || props->empty()) {
      if (!required.empty()) {
        Fail(path + ".required", StrFormat("'%s' is required but has no schema in properties", required.begin()->c_str()));
        return "value";
      }
      const bool closed = extra != s.end() ? extra->is_boolean() && !extra->get<bool>() : listed;
      if (closed) return NewRule(hint, "\"{\" ws \"}\"");
      std::string v = Use("value");
      if (extra != s.end() && !extra->is_boolean()) v = Visit(*extra, hint + "-value", path + ".additionalProperties");
      Use("string");
      if (v == "value") return Use("object");
      return NewRule(hint, "\"{\" ws ( string ws \":\" ws " + v + " ws ( \",\" ws string ws \":\" ws " + v +
                               " ws )* )? \"}\"");
    }
    if (extra != s.end() && !(extra->is_boolean() && !extra->get<bool>())) {
      Fail(path + ".additionalProperties",
           "other keys beside 'properties' are not supported (leave it out or set it to false)");
      return "value";
    }
    for (const auto& r : required) {
      if (!props->contains(r)) {
        Fail(path + ".required", StrFormat("'%s' is required but has no schema in properties", r.c_str()));
        return "value";
      }
    }
    // Members in the listed order; the optional ones may be left out. rest(i, first): members i.. when
    // none (first) or some came before, so that commas only separate.
    std::vector<std::string> kv;
    std::vector<bool> req;
    for (const auto& [name, sub] : props->items()) {
      std::string v = Visit(sub, hint + "-" + name, path + ".properties." + name);
      kv.push_back(GbnfLiteral(SafeDump(ordered_json(name))) + " ws \":\" ws " + v + " ws");
      req.push_back(required.count(name) > 0);
    }
    const size_t n = kv.size();
    std::vector<std::string> first(n + 1), after(n + 1);
    // Built from the end: an empty tail is "".
    std::string first_next = "", after_next = "";
    for (size_t k = n; k-- > 0;) {
      std::string f, a;
      if (req[k]) {
        f = kv[k] + (after_next.empty() ? "" : " " + after_next);
        a = "\",\" ws " + f;
      } else {
        std::string take = kv[k] + (after_next.empty() ? "" : " " + after_next);
        f = "( " + take + " | " + (first_next.empty() ? "\"\"" : first_next) + " )";
        a = "( \",\" ws " + take + " | " + (after_next.empty() ? "\"\"" : after_next) + " )";
      }
      first_next = NewRule(hint + "-rest", f);
      after_next = NewRule(hint + "-more", a);
    }
    return NewRule(hint, "\"{\" ws " + first_next + " \"}\"");
  }

  const ordered_json& root_;
  int depth_ = 0;
  Status err_;
  std::string prefix_;  // of the rules made here
  std::map<std::string, std::string> rules_;
  std::set<std::string> reserved_;
  std::map<std::string, std::string> refs_;
  std::set<std::string> used_;
};

}  // namespace

std::string GbnfAlternatives(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : " ") + alts[i];
  return out + " )";
}

std::string GbnfLiteral(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          out += StrFormat("\\x%02X", c);
        } else {
          out += (char)c;
        }
    }
  }
  return out + "\"";
}

Result<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema) { return Converter(schema).Run(); }

Result<std::string> JsonSchemaExpression(const nlohmann::ordered_json& schema, const std::string& prefix,
                                         std::string* rules, std::set<std::string>* primitives) {
  return Converter(schema, prefix).Expression(rules, primitives);
}

std::string JsonPrimitiveRules(const std::set<std::string>& used) {
  std::string out;
  for (const auto& p : kPrimitives)
    if (used.count(p[0])) out += std::string(p[0]) + " ::= " + p[1] + "\n";
  return out;
}

std::string JsonObjectGbnf() {
  std::string out = "root ::= object\n";
  for (const auto& p : kPrimitives) out += std::string(p[0]) + " ::= " + p[1] + "\n";
  return out;
}

std::string ChoiceGbnf(const std::vector<std::string>& choices) {
  std::string out = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) out += (i ? " | " : "") + GbnfLiteral(choices[i]);
  return out + "\n";
}

}  // namespace lathe::server
