// Regular expressions -> GBNF (see regex.h).
#include "server/regex.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/strings.h"
#include "server/json_schema.h"

namespace lathe::server {

namespace {

constexpr uint32_t kMaxCp = 0x10FFFF;
constexpr int kMaxDepth = 256;
constexpr int64_t kMaxRepeat = 4096;

// A set of code points: sorted, merged, inclusive ranges.
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges Normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

Ranges Complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCp && (r.empty() || r.back().second < kMaxCp)) out.push_back({next, kMaxCp});
  return out;
}

Ranges Intersect(const Ranges& a, const Ranges& b) {
  Ranges out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (lo <= hi) out.push_back({lo, hi});
    (a[i].second < b[j].second ? i : j)++;
  }
  return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};  // \t \n \v \f \r and space
// Characters a JSON string writes escaped: the controls, '"', '\' (and DEL, which the JSON rules here escape too).
const Ranges kJsonEscaped = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0x7F, 0x7F}};

struct Node {
  enum Kind { kSet, kSeq, kAlt, kRepeat } kind = kSeq;
  Ranges set;
  std::vector<Node> kids;
  int64_t min = 0, max = -1;  // kRepeat; max -1: unbounded
};

std::string Utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += (char)cp;
  } else if (cp < 0x800) {
    out += (char)(0xC0 | (cp >> 6));
    out += (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += (char)(0xE0 | (cp >> 12));
    out += (char)(0x80 | ((cp >> 6) & 0x3F));
    out += (char)(0x80 | (cp & 0x3F));
  } else {
    out += (char)(0xF0 | (cp >> 18));
    out += (char)(0x80 | ((cp >> 12) & 0x3F));
    out += (char)(0x80 | ((cp >> 6) & 0x3F));
    out += (char)(0x80 | (cp & 0x3F));
  }
  return out;
}

// The text a JSON string literal holds for code point cp.
std::string JsonEncoded(uint32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: break;
  }
  if (cp < 0x20 || cp == 0x7F) return StrFormat("\\u%04x", cp);
  return Utf8(cp);
}

bool Nullable(const Node& n) {
  switch (n.kind) {
    case Node::kSet: return false;
    case Node::kSeq:
      for (const Node& k : n.kids)
        if (!Nullable(k)) return false;
      return true;
    case Node::kAlt:
      for (const Node& k : n.kids)
        if (Nullable(k)) return true;
      return false;
    case Node::kRepeat: return n.min == 0 || Nullable(n.kids[0]);
  }
  return true;
}

// *out = alt, or its one alternative; false when it has none.
bool TakeAlternatives(Node alt, Node* out) {
  if (alt.kids.empty()) return false;
  *out = alt.kids.size() == 1 ? std::move(alt.kids[0]) : std::move(alt);
  return true;
}

// The strings n matches but the empty one (false: it matches only the empty string). A repetition of a
// nullable group becomes a repetition of its non-empty strings: GBNF's expansion of `( x )*` with a nullable x
// would reach itself before matching a character (refused as left recursion), and the strings are the same.
// Copies cost `budget` (nodes): a long sequence of optional items under a star would otherwise grow the rewrite
// quadratically; past the budget the caller reports the pattern as too complex.
int64_t Size(const Node& n) {
  int64_t s = 1;
  for (const Node& k : n.kids) s += Size(k);
  return s;
}

bool NonEmpty(const Node& n, Node* out, int64_t* budget) {
  if (*budget < 0) return false;
  if (!Nullable(n)) {
    *budget -= Size(n);
    *out = n;
    return true;
  }
  switch (n.kind) {
    case Node::kSet: return false;
    case Node::kSeq: {
      // {xy != ""} = (X - "") Y  |  (Y - "")  when "" is in X (it is: the sequence is nullable).
      if (n.kids.empty()) return false;
      Node alt;
      alt.kind = Node::kAlt;
      Node head, rest;
      rest.kind = Node::kSeq;
      rest.kids.assign(n.kids.begin() + 1, n.kids.end());
      if (NonEmpty(n.kids[0], &head, budget)) {
        *budget -= Size(rest);
        Node first;
        first.kind = Node::kSeq;
        first.kids.push_back(std::move(head));
        first.kids.insert(first.kids.end(), rest.kids.begin(), rest.kids.end());
        alt.kids.push_back(std::move(first));
      }
      Node tail;
      if (NonEmpty(rest, &tail, budget)) alt.kids.push_back(std::move(tail));
      return TakeAlternatives(std::move(alt), out);
    }
    case Node::kAlt: {
      Node alt;
      alt.kind = Node::kAlt;
      for (const Node& k : n.kids) {
        Node x;
        if (NonEmpty(k, &x, budget)) alt.kids.push_back(std::move(x));
      }
      return TakeAlternatives(std::move(alt), out);
    }
    case Node::kRepeat: {
      // X{m,n} with "" in X (or m = 0) is (X - ""){0,n}: its non-empty strings are (X - ""){1,n}.
      Node inner;
      if (n.max == 0 || !NonEmpty(n.kids[0], &inner, budget)) return false;
      Node rep;
      rep.kind = Node::kRepeat;
      rep.min = 1;
      rep.max = n.max;
      rep.kids.push_back(std::move(inner));
      *out = std::move(rep);
      return true;
    }
  }
  return false;
}

// A code point inside a GBNF class.
std::string ClassChar(uint32_t cp) {
  if ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return std::string(1, (char)cp);
  if (cp <= 0xFF) return StrFormat("\\x%02X", cp);
  if (cp <= 0xFFFF) return StrFormat("\\u%04X", cp);
  return StrFormat("\\U%08X", cp);
}

std::string ClassOf(const Ranges& r) {
  // The shorter of [...] and [^...].
  const Ranges c = Complement(r);
  const bool negate = c.size() < r.size();
  std::string out = negate ? "[^" : "[";
  for (const auto& [lo, hi] : negate ? c : r) {
    out += ClassChar(lo);
    if (hi != lo) out += (hi == lo + 1 ? "" : "-") + ClassChar(hi);
  }
  return out + "]";
}

class RegexParser {
 public:
  RegexParser(std::string_view s, const RegexOptions& o) : s_(s), opt_(o) {}

  Result<std::string> Run() {
    // Top level: branches, each perhaps anchored at its start and its end.
    std::vector<std::string> branches;
    while (true) {
      bool begin = false, end = false;
      if (Eat('^') || EatEscape('A')) begin = true;
      Node seq = ParseSeq(0, &end);
      if (!err_.ok()) return err_;
      std::string e = Emit(seq);
      if (!err_.ok()) return err_;
      if (!opt_.any_char.empty()) {
        if (!begin) e = opt_.any_char + "* " + e;
        if (!end) e += " " + opt_.any_char + "*";
      }
      branches.push_back(e);
      if (pos_ >= s_.size()) break;
      if (!Eat('|')) {
        Fail(pos_, "unbalanced ')'");
        return err_;
      }
    }
    return branches.size() == 1 ? "( " + branches[0] + " )" : GbnfAlternatives(branches);
  }

 private:
  void Fail(size_t at, const std::string& what) {
    if (err_.ok()) err_ = Status::Error(StrFormat("regex at offset %zu: %s", at, what.c_str()));
  }
  bool Peek(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  bool Eat(char c) {
    if (!Peek(c)) return false;
    ++pos_;
    return true;
  }
  bool EatEscape(char c) {
    if (pos_ + 1 < s_.size() && s_[pos_] == '\\' && s_[pos_ + 1] == c) {
      pos_ += 2;
      return true;
    }
    return false;
  }
  // One UTF-8 character of the pattern.
  uint32_t NextCp() {
    const unsigned char c = (unsigned char)s_[pos_];
    const int n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    if (n < 0 || pos_ + (size_t)n >= s_.size()) {
      Fail(pos_, "the pattern is not UTF-8");
      pos_ = s_.size();
      return 0;
    }
    uint32_t cp = n == 0 ? c : c & (0x3F >> n);
    for (int i = 1; i <= n; ++i) {
      const unsigned char k = (unsigned char)s_[pos_ + i];
      if ((k & 0xC0) != 0x80) {
        Fail(pos_, "the pattern is not UTF-8");
        pos_ = s_.size();
        return 0;
      }
      cp = (cp << 6) | (k & 0x3F);
    }
    pos_ += (size_t)n + 1;
    return cp;
  }
  // At the end of a branch: the end of the pattern, '|' or ')'.
  bool AtBranchEnd() const { return pos_ >= s_.size() || s_[pos_] == '|' || s_[pos_] == ')'; }

  Node ParseAlt(int depth) {
    Node alt;
    alt.kind = Node::kAlt;
    while (err_.ok()) {
      alt.kids.push_back(ParseSeq(depth, nullptr));
      if (!Eat('|')) break;
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }

  // A sequence up to '|', ')' or the end. end_anchor: at the top level, set when it ends with $ (elsewhere an
  // anchor is an error).
  Node ParseSeq(int depth, bool* end_anchor) {
    Node seq;
    seq.kind = Node::kSeq;
    while (err_.ok() && !AtBranchEnd()) {
      const size_t at = pos_;
      if (Peek('$') || (pos_ + 1 < s_.size() && s_[pos_] == '\\' && (s_[pos_ + 1] == 'Z' || s_[pos_ + 1] == 'z'))) {
        pos_ += Peek('$') ? 1 : 2;
        if (!end_anchor || !AtBranchEnd() || Peek(')')) {
          Fail(at, "anchors ($, \\Z) are supported only at the end of the pattern or of a top-level branch");
          break;
        }
        *end_anchor = true;
        break;
      }
      if (Peek('^') || EatEscape('A')) {
        Fail(at, "anchors (^, \\A) are supported only at the start of the pattern or of a top-level branch");
        break;
      }
      Node atom = ParseAtom(depth);
      if (!err_.ok()) break;
      ParseQuantifiers(&atom);
      seq.kids.push_back(std::move(atom));
    }
    return seq;
  }

  void ParseQuantifiers(Node* atom) {
    bool quantified = false;
    while (err_.ok() && pos_ < s_.size()) {
      const size_t at = pos_;
      int64_t lo = 0, hi = -1;
      const char c = s_[pos_];
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        ++pos_;
        lo = 1;
      } else if (c == '?') {
        ++pos_;
        hi = 1;
      } else if (c == '{' && Braces(&lo, &hi)) {
        if (hi >= 0 && hi < lo) {
          Fail(at, "min repeat greater than max repeat");
          return;
        }
        if (lo > kMaxRepeat || hi > kMaxRepeat) {
          Fail(at, StrFormat("repeat counts above %lld are not supported", (long long)kMaxRepeat));
          return;
        }
      } else {
        return;
      }
      if (quantified) {
        Fail(at, "multiple repeat");
        return;
      }
      quantified = true;
      if (Eat('+')) {
        Fail(at, "possessive quantifiers are not supported");
        return;
      }
      Eat('?');  // lazy: the same strings
      Node rep;
      rep.kind = Node::kRepeat;
      rep.min = lo;
      rep.max = hi;
      rep.kids.push_back(std::move(*atom));
      *atom = std::move(rep);
    }
  }

  // {m}, {m,}, {,n}, {m,n} at pos_; anything else is a literal '{' (as Python's re reads it).
  bool Braces(int64_t* lo, int64_t* hi) {
    size_t p = pos_ + 1;
    auto number = [&](int64_t* v) {
      const size_t start = p;
      int64_t x = 0;
      while (p < s_.size() && s_[p] >= '0' && s_[p] <= '9') {
        x = std::min<int64_t>(x * 10 + (s_[p] - '0'), 1 << 30);
        ++p;
      }
      if (p == start) return false;
      *v = x;
      return true;
    };
    int64_t a = -1, b = -1;
    const bool has_a = number(&a);
    if (p < s_.size() && s_[p] == '}') {
      if (!has_a) return false;
      *lo = *hi = a;
      pos_ = p + 1;
      return true;
    }
    if (p >= s_.size() || s_[p] != ',') return false;
    ++p;
    const bool has_b = number(&b);
    if (p >= s_.size() || s_[p] != '}') return false;
    *lo = has_a ? a : 0;
    *hi = has_b ? b : -1;
    pos_ = p + 1;
    return true;
  }

  Node Set(Ranges r) {
    Node n;
    n.kind = Node::kSet;
    n.set = Normalize(std::move(r));
    return n;
  }

  Node ParseAtom(int depth) {
    const size_t at = pos_;
    const char c = s_[pos_];
    if (c == '(') {
      ++pos_;
      if (depth + 1 > kMaxDepth) {
        Fail(at, StrFormat("groups nested deeper than %d", kMaxDepth));
        return {};
      }
      if (Eat('?')) {
        if (Eat(':')) {
        } else if (Eat('P') || Peek('<')) {
          if (Peek('=')) {
            Fail(at, "backreferences are not supported");
            return {};
          }
          if (!Eat('<') || Peek('=') || Peek('!')) {
            Fail(at, Peek('=') || Peek('!') ? "lookbehind is not supported" : "expected '<name>' after '(?P'");
            return {};
          }
          while (pos_ < s_.size() && s_[pos_] != '>') ++pos_;
          if (!Eat('>')) {
            Fail(at, "unterminated group name");
            return {};
          }
        } else if (Peek('=') || Peek('!')) {
          Fail(at, "lookahead is not supported");
          return {};
        } else if (Eat('#')) {  // a comment
          while (pos_ < s_.size() && s_[pos_] != ')') ++pos_;
          if (!Eat(')')) Fail(at, "missing ), unterminated comment");
          Node empty;
          return empty;
        } else {
          Fail(at, "inline flags and other (?...) groups are not supported");
          return {};
        }
      }
      Node inner = ParseAlt(depth + 1);
      if (!err_.ok()) return {};
      if (!Eat(')')) {
        Fail(at, "missing ), unterminated subpattern");
        return {};
      }
      return inner;
    }
    if (c == '[') return ParseClass();
    if (c == '.') {
      ++pos_;
      return Set(Complement({{'\n', '\n'}}));
    }
    if (c == '*' || c == '+' || c == '?') {
      Fail(at, "nothing to repeat");
      return {};
    }
    if (c == '{') {
      int64_t lo, hi;
      const size_t save = pos_;
      if (Braces(&lo, &hi)) {
        pos_ = save;
        Fail(at, "nothing to repeat");
        return {};
      }
    }
    if (c == '\\') {
      Ranges r;
      if (!ParseEscape(false, &r)) return {};
      return Set(std::move(r));
    }
    const uint32_t cp = NextCp();
    return Set({{cp, cp}});
  }

  // An escape at pos_ ('\'); its characters in *out. Inside a class, \b is a backspace.
  bool ParseEscape(bool in_class, Ranges* out) {
    const size_t at = pos_;
    ++pos_;
    if (pos_ >= s_.size()) {
      Fail(at, "bad escape (end of pattern)");
      return false;
    }
    const char e = s_[pos_];
    auto one = [&](uint32_t cp) {
      ++pos_;
      *out = {{cp, cp}};
      return true;
    };
    auto set = [&](const Ranges& r, bool negate) {
      ++pos_;
      *out = negate ? Complement(r) : r;
      return true;
    };
    switch (e) {
      case 'd': return set(kDigit, false);
      case 'D': return set(kDigit, true);
      case 'w': return set(kWord, false);
      case 'W': return set(kWord, true);
      case 's': return set(kSpace, false);
      case 'S': return set(kSpace, true);
      case 'n': return one('\n');
      case 'r': return one('\r');
      case 't': return one('\t');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case 'a': return one(0x07);
      case '0': return one(0);
      case 'b':
        if (in_class) return one('\b');
        Fail(at, "word boundaries (\\b) are not supported");
        return false;
      case 'B':
        Fail(at, "word boundaries (\\B) are not supported");
        return false;
      case 'x':
      case 'u':
      case 'U': {
        const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t v = 0;
        ++pos_;
        for (int i = 0; i < digits; ++i) {
          if (pos_ >= s_.size() || !std::isxdigit((unsigned char)s_[pos_])) {
            Fail(at, StrFormat("escape '\\%c' needs %d hex digits", e, digits));
            return false;
          }
          const char h = s_[pos_++];
          v = v * 16 + (uint32_t)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        if (v > kMaxCp) {
          Fail(at, "escape beyond U+10FFFF");
          return false;
        }
        *out = {{v, v}};
        return true;
      }
      default: break;
    }
    if (e >= '1' && e <= '9') {
      Fail(at, "backreferences are not supported");
      return false;
    }
    if (std::isalnum((unsigned char)e)) {
      Fail(at, StrFormat("bad escape '\\%c'", e));
      return false;
    }
    const uint32_t cp = NextCp();  // escaped punctuation (or any other character): itself
    *out = {{cp, cp}};
    return err_.ok();
  }

  // One character of a class, or an escape's set (\d, ...).
  bool ParseClassItem(Ranges* out) {
    if (s_[pos_] == '\\') return ParseEscape(true, out);
    const uint32_t cp = NextCp();
    *out = {{cp, cp}};
    return err_.ok();
  }

  Node ParseClass() {
    const size_t at = pos_;
    ++pos_;
    const bool negate = Eat('^');
    Ranges r;
    bool first = true;
    while (err_.ok()) {
      if (pos_ >= s_.size()) {
        Fail(at, "unterminated character set");
        return {};
      }
      if (s_[pos_] == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      const size_t item = pos_;
      Ranges lo_set;
      if (!ParseClassItem(&lo_set)) return {};
      const bool single = lo_set.size() == 1 && lo_set[0].first == lo_set[0].second;
      if (single && pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
        ++pos_;
        Ranges hi_set;
        if (!ParseClassItem(&hi_set)) return {};
        if (hi_set.size() != 1 || hi_set[0].first != hi_set[0].second) {
          Fail(item, "bad character range");
          return {};
        }
        if (hi_set[0].first < lo_set[0].first) {
          Fail(item, "bad character range (out of order)");
          return {};
        }
        r.push_back({lo_set[0].first, hi_set[0].first});
      } else {
        r.insert(r.end(), lo_set.begin(), lo_set.end());
      }
    }
    r = Normalize(std::move(r));
    return Set(negate ? Complement(r) : r);
  }

  // GBNF for a set: a literal for one character, else a class; in a JSON string the escaped characters are
  // alternatives of their own.
  std::string EmitSet(const Ranges& r) {
    if (r.empty()) {
      Fail(0, "a character set matches nothing");
      return "\"\"";
    }
    if (!opt_.json_string) {
      if (r.size() == 1 && r[0].first == r[0].second) return GbnfLiteral(Utf8(r[0].first));
      return ClassOf(r);
    }
    std::vector<std::string> alts;
    const Ranges plain = Intersect(r, Complement(kJsonEscaped));
    if (!plain.empty()) {
      alts.push_back(plain.size() == 1 && plain[0].first == plain[0].second
                         ? GbnfLiteral(JsonEncoded(plain[0].first))
                         : ClassOf(plain));
    }
    for (const auto& [lo, hi] : Intersect(r, kJsonEscaped)) {
      for (uint32_t cp = lo; cp <= hi; ++cp) alts.push_back(GbnfLiteral(JsonEncoded(cp)));
    }
    return GbnfAlternatives(alts);
  }

  std::string Emit(const Node& n) {
    switch (n.kind) {
      case Node::kSet: return EmitSet(n.set);
      case Node::kSeq: {
        // Runs of single characters become one literal.
        std::string out, run;
        bool any = false;
        auto flush = [&] {
          if (run.empty()) return;
          out += (out.empty() ? "" : " ") + GbnfLiteral(run);
          run.clear();
        };
        for (const Node& k : n.kids) {
          if (k.kind == Node::kSet && k.set.size() == 1 && k.set[0].first == k.set[0].second) {
            run += opt_.json_string ? JsonEncoded(k.set[0].first) : Utf8(k.set[0].first);
            any = true;
            continue;
          }
          flush();
          std::string e = Emit(k);
          if (!e.empty()) {
            out += (out.empty() ? "" : " ") + e;
            any = true;
          }
        }
        flush();
        return any && !out.empty() ? out : "\"\"";
      }
      case Node::kAlt: {
        std::vector<std::string> alts;
        for (const Node& k : n.kids) alts.push_back(Emit(k));
        return alts.size() == 1 ? alts[0] : GbnfAlternatives(alts);
      }
      case Node::kRepeat: {
        int64_t min = n.min;
        std::string inner;
        if (Nullable(n.kids[0])) {
          Node x;
          const bool some = n.max != 0 && NonEmpty(n.kids[0], &x, &budget_);
          if (budget_ < 0) Fail(0, "the pattern is too complex (a repetition of optional items too long to rewrite)");
          if (!some || budget_ < 0) return "\"\"";
          inner = "( " + Emit(x) + " )";
          min = 0;
        } else {
          inner = "( " + Emit(n.kids[0]) + " )";
        }
        if (n.max < 0) return inner + (min == 0 ? "*" : min == 1 ? "+" : StrFormat("{%lld,}", (long long)min));
        if (min == 0 && n.max == 1) return inner + "?";
        if (min == n.max) return inner + StrFormat("{%lld}", (long long)min);
        return inner + StrFormat("{%lld,%lld}", (long long)min, (long long)n.max);
      }
    }
    return "\"\"";
  }

  std::string_view s_;
  const RegexOptions& opt_;
  size_t pos_ = 0;
  int64_t budget_ = 1 << 20;  // nodes the rewrite of repeated nullable groups may make
  Status err_;
};

}  // namespace

Result<std::string> RegexToGbnf(std::string_view pattern, const RegexOptions& options) {
  if (pattern.size() > (1u << 16)) return Status::Error("regex: patterns longer than 65536 bytes are not supported");
  return RegexParser(pattern, options).Run();
}

}  // namespace lathe::server
