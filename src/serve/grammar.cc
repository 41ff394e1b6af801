// Grammar: the GBNF parser, the token table, and the matcher (see grammar.h).
#include "serve/grammar.h"

#include <algorithm>
#include <array>
#include <map>

#include "core/strings.h"
#include "tokenizer/tokenizer.h"

namespace lathe::serve {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
// The smallest code point a UTF-8 sequence of each length may encode (below it: an overlong form).
constexpr uint32_t kMinOfLength[5] = {0, 0, 0x80, 0x800, 0x10000};
constexpr int kMaxRepeat = 4096;           // {m,n} bounds: each copy is a sequence of its own
constexpr int kMaxNesting = 256;           // ( groups ) inside groups: the parser recurses on them
constexpr size_t kMaxElems = size_t{1} << 20;  // elements after repetitions are written out

void SortMerge(std::vector<std::pair<uint32_t, uint32_t>>* r) {
  std::sort(r->begin(), r->end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (const auto& x : *r) {
    if (!out.empty() && x.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  *r = std::move(out);
}

}  // namespace

bool Grammar::CharClass::Matches(uint32_t cp) const {
  bool in = false;
  for (const auto& [lo, hi] : ranges) {
    if (cp < lo) break;
    if (cp <= hi) {
      in = true;
      break;
    }
  }
  return in != negated;
}

bool Grammar::CharClass::MatchesSome(uint32_t lo, uint32_t hi) const {
  if (!negated) {
    for (const auto& r : ranges)
      if (r.first <= hi && r.second >= lo) return true;
    return false;
  }
  // Negated: some code point of [lo, hi] outside every range.
  uint32_t next = lo;
  for (const auto& r : ranges) {
    if (r.second < next) continue;
    if (r.first > next) return true;
    if (r.second >= hi) return false;
    next = r.second + 1;
  }
  return next <= hi;
}

// ---------------------------------------------------------------------------------------------------------
// GBNF parser.

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view src) : s_(src) {}

  Result<std::shared_ptr<const Grammar>> Run(std::string_view root) {
    SkipSpace(true);
    while (ok() && pos_ < s_.size()) {
      const size_t at = pos_;
      std::string name = ParseName();
      if (name.empty()) {
        Fail(at, StrFormat("expected a rule name, found '%s'", Shown(at).c_str()));
        break;
      }
      const uint32_t id = RuleId(name, at);
      if (defined_[id]) {
        Fail(at, StrFormat("rule '%s' is defined twice", name.c_str()));
        break;
      }
      defined_[id] = true;
      SkipSpace(false);
      if (s_.substr(pos_, 3) != "::=") {
        Fail(pos_, StrFormat("expected '::=' after rule name '%s'", name.c_str()));
        break;
      }
      pos_ += 3;
      SkipSpace(true);
      auto alts = ParseAlternates(false);
      if (!ok()) break;
      alts_[id] = std::move(alts);
      if (pos_ < s_.size() && s_[pos_] != '\n' && s_[pos_] != '\r') {
        Fail(pos_, StrFormat("unexpected '%s' in rule '%s'", Shown(pos_).c_str(), name.c_str()));
        break;
      }
      SkipSpace(true);
    }
    if (!ok()) return err_;
    for (size_t r = 0; r < names_.size(); ++r) {
      if (!defined_[r]) {
        return Status::Error(StrFormat("grammar: rule '%s' is used (%s) but not defined", names_[r].c_str(),
                                       LineCol(first_use_[r]).c_str()));
      }
    }
    auto it = ids_.find(std::string(root));
    if (it == ids_.end()) {
      return Status::Error(StrFormat("grammar: no rule named '%s' (the start rule)", std::string(root).c_str()));
    }
    auto g = std::make_shared<Grammar>();
    g->root_ = it->second;
    g->names_ = names_;
    g->classes_ = std::move(classes_);
    g->rules_.resize(alts_.size());
    for (size_t r = 0; r < alts_.size(); ++r) {
      for (const auto& seq : alts_[r]) {
        g->rules_[r].push_back((uint32_t)g->elems_.size());
        g->elems_.insert(g->elems_.end(), seq.begin(), seq.end());
        g->elems_.push_back({Grammar::Elem::kEnd, 0});
      }
    }
    if (Status s = CheckLeftRecursion(*g); !s.ok()) return s;
    return std::shared_ptr<const Grammar>(std::move(g));
  }

 private:
  using Seq = std::vector<Grammar::Elem>;

  bool ok() const { return err_.ok(); }
  std::string LineCol(size_t at) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return StrFormat("line %d, column %d", line, col);
  }
  std::string Shown(size_t at) const {
    if (at >= s_.size()) return "end of text";
    std::string t(s_.substr(at, std::min<size_t>(12, s_.size() - at)));
    if (auto nl = t.find('\n'); nl != std::string::npos) t.resize(nl);
    return t.empty() ? "newline" : t;
  }
  void Fail(size_t at, const std::string& what) {
    if (ok()) err_ = Status::Error(StrFormat("grammar: %s: %s", LineCol(at).c_str(), what.c_str()));
  }

  static bool IsNameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }
  std::string ParseName() {
    size_t b = pos_;
    while (pos_ < s_.size() && IsNameChar(s_[pos_])) ++pos_;
    return std::string(s_.substr(b, pos_ - b));
  }
  // Skips blanks and comments; newlines too when newline_ok.
  void SkipSpace(bool newline_ok) {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  uint32_t RuleId(const std::string& name, size_t at) {
    auto [it, inserted] = ids_.emplace(name, (uint32_t)names_.size());
    if (inserted) {
      names_.push_back(name);
      defined_.push_back(false);
      first_use_.push_back(at);
      alts_.emplace_back();
    }
    return it->second;
  }
  // A rule of the parser's own (a group or a repetition); its name cannot clash with a GBNF name.
  uint32_t NewRule(const std::string& base, std::vector<Seq> alts) {
    uint32_t id = RuleId(StrFormat("%s#%zu", base.c_str(), names_.size()), pos_);
    defined_[id] = true;
    alts_[id] = std::move(alts);
    return id;
  }

  // One UTF-8 code point of the source, or an escape (in literals and classes).
  uint32_t ParseChar() {
    if (pos_ >= s_.size()) {
      Fail(pos_, "unexpected end of text");
      return 0;
    }
    const size_t at = pos_;
    unsigned char c = (unsigned char)s_[pos_];
    if (c == '\\') {
      ++pos_;
      if (pos_ >= s_.size()) {
        Fail(at, "unfinished escape");
        return 0;
      }
      char e = s_[pos_++];
      int digits = 0;
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': return (uint32_t)e;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
          Fail(at, StrFormat("unknown escape '\\%c'", e));
          return 0;
      }
      uint32_t v = 0;
      for (int i = 0; i < digits; ++i) {
        if (pos_ >= s_.size() || !std::isxdigit((unsigned char)s_[pos_])) {
          Fail(at, StrFormat("escape '\\%c' needs %d hex digits", e, digits));
          return 0;
        }
        char h = s_[pos_++];
        v = v * 16 + (uint32_t)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      if (v > kMaxCodePoint) Fail(at, "escape beyond U+10FFFF");
      return v;
    }
    int n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    if (n < 0 || pos_ + n >= s_.size()) {
      Fail(at, "invalid UTF-8");
      return 0;
    }
    uint32_t v = n == 0 ? c : n == 1 ? (c & 0x1Fu) : n == 2 ? (c & 0x0Fu) : (c & 0x07u);
    ++pos_;
    for (int i = 0; i < n; ++i) {
      unsigned char b = (unsigned char)s_[pos_++];
      if ((b & 0xC0) != 0x80) {
        Fail(at, "invalid UTF-8");
        return 0;
      }
      v = (v << 6) | (b & 0x3Fu);
    }
    return v;
  }

  uint32_t AddClass(Grammar::CharClass cls) {
    SortMerge(&cls.ranges);
    classes_.push_back(std::move(cls));
    return (uint32_t)classes_.size() - 1;
  }

  std::vector<Seq> ParseAlternates(bool nested) {
    std::vector<Seq> alts;
    alts.push_back(ParseSequence(nested));
    while (ok() && pos_ < s_.size() && s_[pos_] == '|') {
      ++pos_;
      SkipSpace(true);
      alts.push_back(ParseSequence(nested));
    }
    return alts;
  }

  Seq ParseSequence(bool nested) {
    Seq seq;
    size_t last = 0;  // where the last symbol starts in seq (what a postfix operator repeats)
    bool have_last = false;
    while (ok()) {
      SkipSpace(nested);
      if (pos_ >= s_.size()) break;
      const size_t at = pos_;
      char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        last = seq.size();
        have_last = true;
        while (ok() && (pos_ >= s_.size() || s_[pos_] != '"')) {
          if (pos_ >= s_.size() || s_[pos_] == '\n') {
            Fail(at, "unterminated string literal");
            break;
          }
          uint32_t cp = ParseChar();
          Grammar::CharClass cls;
          cls.ranges.push_back({cp, cp});
          seq.push_back({Grammar::Elem::kChars, AddClass(std::move(cls))});
        }
        ++pos_;
        if (seq.size() == last) have_last = false;  // "" matches the empty text: nothing to repeat
      } else if (c == '[') {
        ++pos_;
        Grammar::CharClass cls;
        if (pos_ < s_.size() && s_[pos_] == '^') {
          cls.negated = true;
          ++pos_;
        }
        while (ok() && (pos_ >= s_.size() || s_[pos_] != ']')) {
          if (pos_ >= s_.size() || s_[pos_] == '\n') {
            Fail(at, "unterminated character class");
            break;
          }
          uint32_t lo = ParseChar(), hi = lo;
          if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
            ++pos_;
            hi = ParseChar();
            if (ok() && hi < lo) Fail(at, "character range out of order");
          }
          cls.ranges.push_back({lo, hi});
        }
        ++pos_;
        last = seq.size();
        have_last = true;
        seq.push_back({Grammar::Elem::kChars, AddClass(std::move(cls))});
      } else if (c == '.') {
        ++pos_;
        Grammar::CharClass cls;
        cls.negated = true;  // excludes nothing
        last = seq.size();
        have_last = true;
        seq.push_back({Grammar::Elem::kChars, AddClass(std::move(cls))});
      } else if (IsNameChar(c)) {
        std::string name = ParseName();
        last = seq.size();
        have_last = true;
        seq.push_back({Grammar::Elem::kRule, RuleId(name, at)});
      } else if (c == '(') {
        ++pos_;
        if (++nesting_ > kMaxNesting) {
          Fail(at, StrFormat("groups nested deeper than %d", kMaxNesting));
          break;
        }
        SkipSpace(true);
        auto alts = ParseAlternates(true);
        --nesting_;
        if (!ok()) break;
        if (pos_ >= s_.size() || s_[pos_] != ')') {
          Fail(at, "unclosed '('");
          break;
        }
        ++pos_;
        last = seq.size();
        have_last = true;
        seq.push_back({Grammar::Elem::kRule, NewRule("group", std::move(alts))});
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_last) {
          Fail(at, StrFormat("'%c' follows nothing it could repeat", c));
          break;
        }
        ++pos_;
        int lo = 0, hi = -1;  // hi -1: unbounded
        if (c == '+') lo = 1;
        if (c == '?') hi = 1;
        if (c == '{') {
          auto number = [&](int* out) {
            size_t b = pos_;
            long v = 0;
            while (pos_ < s_.size() && std::isdigit((unsigned char)s_[pos_]) && v <= kMaxRepeat) {
              v = v * 10 + (s_[pos_++] - '0');
            }
            if (pos_ == b) return false;
            if (v > kMaxRepeat) {
              Fail(b, StrFormat("repetition bound above %d", kMaxRepeat));
              return false;
            }
            *out = (int)v;
            return true;
          };
          SkipSpace(false);
          if (pos_ < s_.size() && s_[pos_] == ',') {
            lo = 0;  // {,n}
          } else if (!number(&lo)) {
            if (ok()) Fail(at, "expected a number after '{'");
            break;
          }
          SkipSpace(false);
          hi = lo;
          if (pos_ < s_.size() && s_[pos_] == ',') {
            ++pos_;
            SkipSpace(false);
            hi = -1;
            if (pos_ < s_.size() && s_[pos_] != '}' && !number(&hi)) {
              if (ok()) Fail(at, "expected a number or '}' after ','");
              break;
            }
            SkipSpace(false);
          }
          if (pos_ >= s_.size() || s_[pos_] != '}') {
            Fail(at, "expected '}'");
            break;
          }
          ++pos_;
          if (hi >= 0 && hi < lo) {
            Fail(at, StrFormat("repetition {%d,%d}: the maximum is below the minimum", lo, hi));
            break;
          }
        }
        Seq sym(seq.begin() + (long)last, seq.end());
        seq.resize(last);
        elems_ += sym.size() * (size_t)std::max(lo, hi);
        if (elems_ > kMaxElems) {
          Fail(at, StrFormat("the repetitions write out more than %zu elements", kMaxElems));
          break;
        }
        for (int i = 0; i < lo; ++i) seq.insert(seq.end(), sym.begin(), sym.end());
        if (hi < 0) {
          // R ::= sym R |
          uint32_t r = NewRule("star", {});
          Seq loop = sym;
          loop.push_back({Grammar::Elem::kRule, r});
          alts_[r] = {loop, Seq{}};
          seq.push_back({Grammar::Elem::kRule, r});
        } else if (hi > lo) {
          // Nested optionals, innermost first: R_k ::= sym R_{k+1} |
          int64_t inner = -1;
          for (int i = hi - lo; i > 0; --i) {
            Seq opt = sym;
            if (inner >= 0) opt.push_back({Grammar::Elem::kRule, (uint32_t)inner});
            inner = NewRule("opt", {opt, Seq{}});
          }
          seq.push_back({Grammar::Elem::kRule, (uint32_t)inner});
        }
        last = seq.size();
        have_last = false;  // "a**" is refused, as llama.cpp does
      } else {
        break;  // '|', ')', a newline at the top level, or something the caller reports
      }
    }
    return seq;
  }

  // A top-down matcher loops forever on a rule that can reach itself before consuming a character.
  static Status CheckLeftRecursion(const Grammar& g) {
    const auto& el = g.elems();
    const size_t n = g.rule_count();
    std::vector<uint8_t> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (uint32_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (uint32_t a : g.alternatives(r)) {
          bool all = true;
          for (uint32_t p = a; el[p].kind != Grammar::Elem::kEnd; ++p) {
            if (el[p].kind == Grammar::Elem::kChars || !nullable[el[p].value]) {
              all = false;
              break;
            }
          }
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    // Depth-first over "can start with" edges, iteratively (a chain of 10^5 rules must not recurse 10^5 deep):
    // reaching a rule that is still on the path is a cycle.
    std::vector<std::vector<uint32_t>> starts(n);  // the rules each rule can start with
    for (uint32_t r = 0; r < n; ++r) {
      for (uint32_t a : g.alternatives(r)) {
        for (uint32_t p = a; el[p].kind == Grammar::Elem::kRule; ++p) {
          starts[r].push_back(el[p].value);
          if (!nullable[el[p].value]) break;
        }
      }
    }
    std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<uint32_t, size_t>> path;  // (rule, next edge)
    for (uint32_t r0 = 0; r0 < n; ++r0) {
      if (color[r0]) continue;
      color[r0] = 1;
      path.push_back({r0, 0});
      while (!path.empty()) {
        auto& [r, k] = path.back();
        if (k == starts[r].size()) {
          color[r] = 2;
          path.pop_back();
          continue;
        }
        const uint32_t t = starts[r][k++];
        if (color[t] == 1) {
          return Status::Error(StrFormat(
              "grammar: rule '%s' is left-recursive (it can reach itself before matching a character; a "
              "repetition of something that can be empty does too)",
              g.rule_name(t).c_str()));
        }
        if (color[t] == 0) {
          color[t] = 1;
          path.push_back({t, 0});
        }
      }
    }
    return Status::Ok();
  }

  std::string_view s_;
  size_t pos_ = 0;
  int nesting_ = 0;
  size_t elems_ = 0;  // written out by repetitions so far
  Status err_;
  std::map<std::string, uint32_t> ids_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::vector<size_t> first_use_;
  std::vector<std::vector<Seq>> alts_;
  std::vector<Grammar::CharClass> classes_;
};

Result<std::shared_ptr<const Grammar>> Grammar::Parse(std::string_view gbnf, std::string_view root) {
  return GbnfParser(gbnf).Run(root);
}

// ---------------------------------------------------------------------------------------------------------
// Token table.

GrammarVocab::GrammarVocab(std::vector<std::string> pieces, std::vector<uint8_t> text, std::vector<int32_t> end)
    : pieces_(std::move(pieces)), text_(std::move(text)), end_(std::move(end)) {
  text_.resize(pieces_.size(), 0);
  Decode();
}

std::shared_ptr<const GrammarVocab> GrammarVocab::FromTokenizer(const tokenizer::Tokenizer& tok) {
  const int32_t n = tok.vocab_size();
  std::vector<std::string> pieces(n);
  std::vector<uint8_t> text(n);
  for (int32_t i = 0; i < n; ++i) {
    pieces[i] = tok.TokenBytes(i);
    text[i] = !tok.IsControl(i);
  }
  std::vector<int32_t> end = tok.stop_ids();
  for (int32_t e : end)
    if (e >= 0 && e < n) text[e] = 0;
  return std::make_shared<GrammarVocab>(std::move(pieces), std::move(text), std::move(end));
}

std::shared_ptr<const GrammarVocab> GrammarVocab::Bytes() {
  static const std::shared_ptr<const GrammarVocab> kBytes = [] {
    std::vector<std::string> pieces;
    for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, (char)b));
    return std::make_shared<const GrammarVocab>(pieces, std::vector<uint8_t>(256, 1), std::vector<int32_t>{});
  }();
  return kBytes;
}

bool GrammarVocab::is_end(int32_t id) const { return std::find(end_.begin(), end_.end(), id) != end_.end(); }

void GrammarVocab::Decode() {
  Decoded& d = decoded_;
  const size_t n = pieces_.size();
  d.cp_begin.assign(n + 1, 0);
  d.tail.assign(n, {});
  d.valid.assign(n, 0);
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < n; ++i) {
    d.cp_begin[i] = (uint32_t)d.cps.size();
    if (!text_[i] || pieces_[i].empty()) continue;
    cps.clear();
    Utf8Partial p;
    // A token that starts with a continuation byte needs a pending character: decoded when one is.
    if (!DecodeUtf8(pieces_[i], &p, &cps)) continue;
    d.valid[i] = 1;
    d.cps.insert(d.cps.end(), cps.begin(), cps.end());
    d.tail[i] = p;
  }
  d.cp_begin[n] = (uint32_t)d.cps.size();
  BuildTrie();
}

void GrammarVocab::BuildTrie() {
  const Decoded& d = decoded_;
  struct Node {
    std::map<uint32_t, uint32_t> kids;
    std::vector<int32_t> toks;
  };
  std::vector<Node> b(1);
  for (size_t i = 0; i < pieces_.size(); ++i) {
    if (!d.valid[i]) continue;
    uint32_t node = 0;
    for (uint32_t k = d.cp_begin[i]; k < d.cp_begin[i + 1]; ++k) {
      auto it = b[node].kids.find(d.cps[k]);
      if (it == b[node].kids.end()) {
        const uint32_t child = (uint32_t)b.size();
        b[node].kids.emplace(d.cps[k], child);
        b.emplace_back();  // after the emplace into b[node]: growing b moves the nodes
        node = child;
      } else {
        node = it->second;
      }
    }
    b[node].toks.push_back((int32_t)i);
  }
  // Breadth first, so that each node's children are consecutive.
  trie_.assign(b.size(), TrieNode{});
  trie_tokens_.clear();
  std::vector<uint32_t> order = {0}, index(b.size(), 0);
  uint32_t next = 1;
  for (size_t q = 0; q < order.size(); ++q) {
    const uint32_t u = order[q];
    TrieNode& t = trie_[index[u]];
    t.first_child = next;
    t.n_children = (uint32_t)b[u].kids.size();
    t.tok_begin = (uint32_t)trie_tokens_.size();
    trie_tokens_.insert(trie_tokens_.end(), b[u].toks.begin(), b[u].toks.end());
    t.tok_end = (uint32_t)trie_tokens_.size();
    for (const auto& [cp, v] : b[u].kids) {
      index[v] = next;
      trie_[next].cp = cp;
      ++next;
      order.push_back(v);
    }
  }
}

std::pair<uint32_t, uint32_t> Utf8Partial::Range() const {
  const uint32_t lo = std::max(value << (6 * remaining), kMinOfLength[length <= 4 ? length : 0]);
  const uint32_t hi = std::min((value << (6 * remaining)) | ((1u << (6 * remaining)) - 1), kMaxCodePoint);
  if (lo >= 0xD800 && hi <= 0xDFFF) return {1, 0};  // only surrogates: not characters
  return {lo, hi};
}

bool DecodeUtf8(std::string_view bytes, Utf8Partial* p, std::vector<uint32_t>* cps) {
  for (unsigned char b : bytes) {
    if (p->remaining) {
      if ((b & 0xC0) != 0x80) return false;
      p->value = (p->value << 6) | (b & 0x3Fu);
      if (--p->remaining == 0) {
        const uint32_t cp = p->value;
        if (cp < kMinOfLength[p->length] || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        cps->push_back(cp);
      } else {
        // Already impossible (overlong, or beyond U+10FFFF)? Refuse it at once.
        auto [lo, hi] = p->Range();
        if (lo > hi) return false;
      }
    } else if (b < 0x80) {
      cps->push_back(b);
    } else if (b >= 0xC2 && b <= 0xDF) {
      *p = {b & 0x1Fu, 1, 2};
    } else if ((b & 0xF0) == 0xE0) {
      *p = {b & 0x0Fu, 2, 3};
    } else if (b >= 0xF0 && b <= 0xF4) {
      *p = {b & 0x07u, 3, 4};
    } else {
      return false;
    }
  }
  return true;
}

// ---------------------------------------------------------------------------------------------------------
// Matcher.

bool GrammarMaskCache::Find(const std::string& key, std::vector<uint64_t>* bits) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) {
    ++misses_;
    return false;
  }
  ++hits_;
  *bits = it->second;
  return true;
}

void GrammarMaskCache::Insert(const std::string& key, std::vector<uint64_t> bits) {
  std::lock_guard<std::mutex> lock(mu_);
  if (map_.size() >= max_entries_) map_.clear();
  map_.emplace(key, std::move(bits));
}

size_t GrammarMaskCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

size_t GrammarMaskCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const GrammarVocab> vocab,
                               std::shared_ptr<GrammarMaskCache> cache)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), cache_(std::move(cache)) {
  for (uint32_t a : grammar_->alternatives(grammar_->root())) Expand(Stack{a}, &stacks_);
  SortUnique(&stacks_);
}

// A stack set in canonical form: sorted, each stack once (sets are compared and interned by value).
void GrammarMatcher::SortUnique(std::vector<Stack>* stacks) {
  std::sort(stacks->begin(), stacks->end());
  stacks->erase(std::unique(stacks->begin(), stacks->end()), stacks->end());
}

// Follows rule references and alternative ends until every stack's top is a character class (or the stack
// is empty: the text may end here). Iterative: a chain of rules referring to rules must not exhaust the thread's
// stack. At most kMaxStacks come out (a hostile, very ambiguous grammar): fewer stacks accept less text, never
// text outside the grammar.
void GrammarMatcher::Expand(Stack stack, std::vector<Stack>* out) const {
  const auto& el = grammar_->elems();
  std::vector<Stack> work;
  work.push_back(std::move(stack));
  while (!work.empty() && out->size() < kMaxStacks) {
    Stack s = std::move(work.back());
    work.pop_back();
    while (true) {
      if (s.empty()) {
        out->push_back(std::move(s));
        break;
      }
      const uint32_t pos = s.back();
      const Grammar::Elem e = el[pos];
      if (e.kind == Grammar::Elem::kEnd) {
        s.pop_back();
        continue;
      }
      if (e.kind == Grammar::Elem::kChars) {
        out->push_back(std::move(s));
        break;
      }
      s.pop_back();
      if (el[pos + 1].kind != Grammar::Elem::kEnd) s.push_back(pos + 1);  // the return position
      const auto& alts = grammar_->alternatives(e.value);
      for (size_t k = 1; k < alts.size(); ++k) {
        work.push_back(s);
        work.back().push_back(alts[k]);
      }
      s.push_back(alts[0]);
    }
  }
}

std::vector<GrammarMatcher::Stack> GrammarMatcher::Advance(const std::vector<Stack>& stacks, uint32_t cp) const {
  const auto& el = grammar_->elems();
  std::vector<Stack> out;
  for (const Stack& s : stacks) {
    if (s.empty()) continue;
    const uint32_t pos = s.back();
    if (!grammar_->char_class(el[pos].value).Matches(cp)) continue;
    Stack next = s;
    next.pop_back();
    if (el[pos + 1].kind != Grammar::Elem::kEnd) next.push_back(pos + 1);
    Expand(std::move(next), &out);
  }
  SortUnique(&out);
  return out;
}

bool GrammarMatcher::PartialFits(const std::vector<Stack>& stacks, Utf8Partial p) const {
  if (p.remaining == 0) return !stacks.empty();
  auto [lo, hi] = p.Range();
  if (lo > hi) return false;
  for (const Stack& s : stacks) {
    if (!s.empty() && grammar_->char_class(grammar_->elems()[s.back()].value).MatchesSome(lo, hi)) return true;
  }
  return false;
}

bool GrammarMatcher::Complete() const {
  if (partial_.remaining) return false;
  for (const Stack& s : stacks_)
    if (s.empty()) return true;
  return false;
}

bool GrammarMatcher::Finished() const {
  if (!Complete()) return false;
  for (const Stack& s : stacks_)
    if (!s.empty()) return false;
  return true;
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  Utf8Partial p = partial_;
  std::vector<uint32_t> cps;
  if (!DecodeUtf8(bytes, &p, &cps)) return false;
  std::vector<Stack> stacks = stacks_;
  for (uint32_t cp : cps) {
    stacks = Advance(stacks, cp);
    if (stacks.empty()) return false;
  }
  if (!PartialFits(stacks, p)) return false;
  stacks_ = std::move(stacks);
  partial_ = p;
  return true;
}

bool GrammarMatcher::Allows(int32_t id) const {
  if (id < 0 || id >= vocab_->size()) return false;
  if (vocab_->is_end(id)) return Complete();
  if (!vocab_->is_text(id) || vocab_->bytes(id).empty()) return false;
  GrammarMatcher copy = *this;
  return copy.AcceptBytes(vocab_->bytes(id));
}

bool GrammarMatcher::AcceptToken(int32_t id) {
  if (id < 0 || id >= vocab_->size()) return false;
  if (vocab_->is_end(id)) return Complete();
  if (!vocab_->is_text(id) || vocab_->bytes(id).empty()) return false;
  return AcceptBytes(vocab_->bytes(id));
}

void GrammarMatcher::AllowedTokens(std::vector<uint8_t>* allowed) const {
  if (!cache_) return ComputeAllowedTokens(allowed);
  // The state: every stack, and the pending character.
  std::string key;
  key.reserve(64);
  auto put = [&](uint32_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(partial_.value);
  put(partial_.remaining);
  for (const Stack& s : stacks_) {
    put((uint32_t)s.size());
    for (uint32_t p : s) put(p);
  }
  const int32_t n = vocab_->size();
  std::vector<uint64_t> bits;
  if (cache_->Find(key, &bits)) {
    allowed->resize(n);
    for (int32_t i = 0; i < n; ++i) (*allowed)[i] = (bits[i >> 6] >> (i & 63)) & 1;
    return;
  }
  ComputeAllowedTokens(allowed);
  bits.assign(((size_t)n + 63) / 64, 0);
  for (int32_t i = 0; i < n; ++i)
    if ((*allowed)[i]) bits[i >> 6] |= uint64_t{1} << (i & 63);
  cache_->Insert(key, std::move(bits));
}

// Stack sets met during one trie walk, interned, with their transitions memoized: inside a JSON string every
// ordinary character leads from a set back to itself, so most of the walk is table lookups.
class GrammarMatcher::StateTable {
 public:
  explicit StateTable(const GrammarMatcher& m) : m_(m) {}
  // The set's id; -1 for no stacks (a dead end).
  int32_t Intern(std::vector<Stack> stacks) {
    if (stacks.empty()) return -1;
    auto [it, inserted] = ids_.emplace(std::move(stacks), (int32_t)sets_.size());
    if (inserted) {
      sets_.push_back(&it->first);
      ascii_.emplace_back();
      ascii_.back().fill(kUnknown);
    }
    return it->second;
  }
  int32_t Next(int32_t set, uint32_t cp) {
    if (cp < 128) {
      if (ascii_[set][cp] != kUnknown) return ascii_[set][cp];
      const int32_t to = Intern(m_.Advance(*sets_[set], cp));
      ascii_[set][cp] = to;  // by index: Intern may have grown ascii_
      return to;
    }
    const uint64_t key = (uint64_t)set << 32 | cp;
    if (auto it = other_.find(key); it != other_.end()) return it->second;
    const int32_t to = Intern(m_.Advance(*sets_[set], cp));
    other_.emplace(key, to);
    return to;
  }
  const std::vector<Stack>& stacks(int32_t set) const { return *sets_[set]; }

 private:
  static constexpr int32_t kUnknown = -2;
  const GrammarMatcher& m_;
  std::map<std::vector<Stack>, int32_t> ids_;
  std::vector<const std::vector<Stack>*> sets_;  // keys of ids_ (std::map nodes do not move)
  std::vector<std::array<int32_t, 128>> ascii_;
  std::unordered_map<uint64_t, int32_t> other_;
};

void GrammarMatcher::TrieAllowedTokens(StateTable& table, int32_t start, std::vector<uint8_t>* allowed) const {
  const auto& trie = vocab_->trie();
  const auto& toks = vocab_->trie_tokens();
  const auto& tail = vocab_->decoded().tail;
  // A token whose complete code points led to `set` is allowed when it has no tail, or its tail can still
  // become a character some stack takes.
  auto mark = [&](uint32_t node, int32_t set) {
    for (uint32_t k = trie[node].tok_begin; k < trie[node].tok_end; ++k) {
      const int32_t id = toks[k];
      if (PartialFits(table.stacks(set), tail[id])) (*allowed)[id] = 1;
    }
  };
  mark(0, start);  // tokens that only start a character
  std::vector<std::pair<uint32_t, int32_t>> todo = {{0, start}};  // (node, the set its prefix leads to)
  while (!todo.empty()) {
    auto [node, set] = todo.back();
    todo.pop_back();
    const GrammarVocab::TrieNode& t = trie[node];
    for (uint32_t c = t.first_child; c < t.first_child + t.n_children; ++c) {
      const int32_t next = table.Next(set, trie[c].cp);
      if (next < 0) continue;  // no token with this prefix
      mark(c, next);
      if (trie[c].n_children) todo.push_back({c, next});
    }
  }
}

void GrammarMatcher::ComputeAllowedTokens(std::vector<uint8_t>* allowed) const {
  const int32_t n = vocab_->size();
  allowed->assign(n, 0);
  StateTable table(*this);
  const int32_t start = table.Intern(stacks_);
  if (start >= 0 && partial_.remaining == 0) {
    TrieAllowedTokens(table, start, allowed);
  } else if (start >= 0) {
    // A character is pending: each token's bytes continue it, so they decode differently from the prefix tree's
    // clean start. The tokens go one by one through the same memoized transitions (a rare state: mid-character).
    std::vector<uint32_t> cps;
    for (int32_t i = 0; i < n; ++i) {
      if (!vocab_->is_text(i) || vocab_->bytes(i).empty()) continue;
      Utf8Partial p = partial_;
      cps.clear();
      if (!DecodeUtf8(vocab_->bytes(i), &p, &cps)) continue;
      int32_t set = start;
      for (size_t k = 0; k < cps.size() && set >= 0; ++k) set = table.Next(set, cps[k]);
      if (set >= 0 && PartialFits(table.stacks(set), p)) (*allowed)[i] = 1;
    }
  }
  const bool complete = Complete();
  for (int32_t e : vocab_->end_ids())
    if (e >= 0 && e < n) (*allowed)[e] = complete;
}

}  // namespace lathe::serve
