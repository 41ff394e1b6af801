// Grammar-constrained decoding (structured outputs): a context-free grammar over Unicode code points in
// llama.cpp's GBNF notation, and a matcher that follows the text generated so far and says which tokens
// may come next. `lathe serve` compiles OpenAI's response_format (JSON mode, JSON schema) and vLLM's
// guided_* fields into such grammars (server/json_schema.h); the Sampler masks the other tokens.
//
// GBNF, as llama.cpp's grammars/README.md describes it: `name ::= alternatives`, alternatives separated by
// `|`, sequences of "literals" (escapes \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH), [character classes] (ranges,
// ^ negation, the same escapes), `.` (any character), rule names, ( groups ), and the postfix operators *,
// +, ?, {m}, {m,}, {m,n}; `#` starts a comment. A newline ends a rule, except inside parentheses and right
// after `::=` or `|`. Left recursion is refused (the matcher is a top-down parser).
//
// The matcher keeps the set of parse stacks that the text so far leaves open (llama.cpp's design: a
// stack's top is the character class to match next; rule references are expanded as they are reached).
// A token is allowed when its bytes, decoded as UTF-8 (continuing a character an earlier token left
// incomplete), keep at least one stack alive. A mask walks the vocabulary's prefix tree once, carrying the
// stack set each prefix leads to; sets are interned and their transitions memoized per walk (inside a JSON string
// every ordinary character leads from a set back to itself), so the walk is mostly table lookups. While a
// character is pending the tokens go one by one through the same transitions (their bytes continue it, so they
// decode unlike the tree's). Masks are also cached by state across steps and requests (GrammarMaskCache).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace lathe::tokenizer {
class Tokenizer;
}

namespace lathe::serve {

// A UTF-8 character still incomplete at the end of a token (the next token's bytes continue it).
struct Utf8Partial {
  uint32_t value = 0;     // the bits read so far
  uint8_t remaining = 0;  // continuation bytes still due (0: nothing pending)
  uint8_t length = 0;     // the whole sequence's length in bytes
  // The code points it can still become (lo > hi: none: an overlong start, or surrogates only).
  std::pair<uint32_t, uint32_t> Range() const;
};
// Decodes bytes continuing *p, appending each completed code point; false on bytes that are not UTF-8 (a stray
// continuation byte, an overlong form, a surrogate, beyond U+10FFFF).
bool DecodeUtf8(std::string_view bytes, Utf8Partial* p, std::vector<uint32_t>* cps);

class Grammar {
 public:
  // Parses GBNF text; `root` names the start rule. Errors name the line and column, an undefined rule, or
  // a left-recursive one.
  static Result<std::shared_ptr<const Grammar>> Parse(std::string_view gbnf, std::string_view root = "root");

  // One element of a sequence: a character class, a rule reference, or the end of an alternative.
  struct Elem {
    enum Kind : uint8_t { kEnd, kRule, kChars } kind;
    uint32_t value;  // kRule: the rule's index; kChars: the class's index
  };
  struct CharClass {
    bool negated = false;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive, sorted, merged
    bool Matches(uint32_t cp) const;
    // Whether some code point in [lo, hi] matches (for a character still incomplete after a token).
    bool MatchesSome(uint32_t lo, uint32_t hi) const;
  };

  const std::vector<Elem>& elems() const { return elems_; }
  // Start positions (indices into elems()) of each alternative of rule r.
  const std::vector<uint32_t>& alternatives(uint32_t r) const { return rules_[r]; }
  const CharClass& char_class(uint32_t i) const { return classes_[i]; }
  uint32_t root() const { return root_; }
  size_t rule_count() const { return rules_.size(); }
  const std::string& rule_name(uint32_t r) const { return names_[r]; }

 private:
  friend class GbnfParser;
  std::vector<Elem> elems_;
  std::vector<std::vector<uint32_t>> rules_;
  std::vector<std::string> names_;
  std::vector<CharClass> classes_;
  uint32_t root_ = 0;
};

// The tokens as the grammar sees them: each token's bytes (Tokenizer::TokenBytes), whether it may appear
// in constrained text at all (control and unknown tokens may not), and which ids end the text. Built once
// per tokenizer and shared by every request.
class GrammarVocab {
 public:
  static std::shared_ptr<const GrammarVocab> FromTokenizer(const tokenizer::Tokenizer& tok);
  // For tests: token i's bytes are pieces[i]; `text[i]` says whether it may appear; `end` ends the text.
  GrammarVocab(std::vector<std::string> pieces, std::vector<uint8_t> text, std::vector<int32_t> end);
  // The 256 single bytes as tokens (token b is byte b), no end token: for following raw text.
  static std::shared_ptr<const GrammarVocab> Bytes();

  int32_t size() const { return (int32_t)pieces_.size(); }
  const std::string& bytes(int32_t id) const { return pieces_[id]; }
  bool is_text(int32_t id) const { return text_[id] != 0; }
  bool is_end(int32_t id) const;
  const std::vector<int32_t>& end_ids() const { return end_; }
  // Each text token's code points when no character is pending: [cp_begin[i], cp_begin[i + 1]) of cps(),
  // plus the UTF-8 tail it leaves incomplete; valid[i] = 0 for bytes that are not UTF-8.
  struct Decoded {
    std::vector<uint32_t> cps;
    std::vector<uint32_t> cp_begin;
    std::vector<Utf8Partial> tail;
    std::vector<uint8_t> valid;
  };
  const Decoded& decoded() const { return decoded_; }
  // The same tokens as a prefix tree of their code points: node 0 is the empty prefix; a node's children are
  // nodes [first_child, first_child + n_children), and the tokens whose complete code points end there are
  // trie_tokens()[tok_begin, tok_end) (a tail, if any, in decoded().tail). Masks walk it once per distinct prefix
  // instead of once per token.
  struct TrieNode {
    uint32_t cp = 0;
    uint32_t first_child = 0, n_children = 0;
    uint32_t tok_begin = 0, tok_end = 0;
  };
  const std::vector<TrieNode>& trie() const { return trie_; }
  const std::vector<int32_t>& trie_tokens() const { return trie_tokens_; }

 private:
  void Decode();
  void BuildTrie();
  std::vector<TrieNode> trie_;
  std::vector<int32_t> trie_tokens_;
  std::vector<std::string> pieces_;
  std::vector<uint8_t> text_;
  std::vector<int32_t> end_;
  Decoded decoded_;
};

// Masks by matcher state, shared by every request that runs one grammar over one vocabulary (thread-safe).
// The parse stacks inside a JSON string, a number or between two members are the same at every step there,
// so most steps find their mask here instead of walking the vocabulary (~1-5 ms for SmolLM2's 49152 tokens).
class GrammarMaskCache {
 public:
  explicit GrammarMaskCache(size_t max_entries = 512) : max_entries_(max_entries) {}
  // A copy of the mask stored under key (one bit per token), or false.
  bool Find(const std::string& key, std::vector<uint64_t>* bits);
  void Insert(const std::string& key, std::vector<uint64_t> bits);  // when full, the cache starts over
  size_t hits() const;
  size_t misses() const;

 private:
  mutable std::mutex mu_;
  size_t max_entries_;
  size_t hits_ = 0, misses_ = 0;
  std::unordered_map<std::string, std::vector<uint64_t>> map_;
};

// What a request carries: the grammar, the vocabulary it runs over, and the masks its states had (a fresh cache
// unless one is given; null: no cache).
struct CompiledGrammar {
  std::shared_ptr<const Grammar> grammar;
  std::shared_ptr<const GrammarVocab> vocab;
  std::shared_ptr<GrammarMaskCache> cache = std::make_shared<GrammarMaskCache>();
};

class GrammarMatcher {
 public:
  GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const GrammarVocab> vocab,
                 std::shared_ptr<GrammarMaskCache> cache = nullptr);

  // Whether the token may come next (an end token: when the text so far is complete).
  bool Allows(int32_t id) const;
  // Every token's verdict at once: allowed[id] = Allows(id), for id < vocab size (from the cache when it holds
  // this state's mask).
  void AllowedTokens(std::vector<uint8_t>* allowed) const;
  // The same, always walking the vocabulary.
  void ComputeAllowedTokens(std::vector<uint8_t>* allowed) const;
  // Advances over a token. Returns false (and leaves the state as it was) when the token is not allowed.
  bool AcceptToken(int32_t id);
  // Advances over raw bytes (tests, and text forced into the output).
  bool AcceptBytes(std::string_view bytes);
  // The text so far is a complete sentence of the grammar.
  bool Complete() const;
  // Complete, and nothing may follow: the only continuation is to end.
  bool Finished() const;

  using Stack = std::vector<uint32_t>;  // positions in Grammar::elems(); the top is the next class to match

 private:
  class StateTable;
  // The mask by walking the vocabulary's prefix tree from the set `start` (no character pending).
  void TrieAllowedTokens(StateTable& table, int32_t start, std::vector<uint8_t>* allowed) const;
  static void SortUnique(std::vector<Stack>* stacks);
  static constexpr size_t kMaxStacks = 4096;
  void Expand(Stack stack, std::vector<Stack>* out) const;
  std::vector<Stack> Advance(const std::vector<Stack>& stacks, uint32_t cp) const;
  bool PartialFits(const std::vector<Stack>& stacks, Utf8Partial p) const;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const GrammarVocab> vocab_;
  std::shared_ptr<GrammarMaskCache> cache_;
  std::vector<Stack> stacks_;
  Utf8Partial partial_;
};

}  // namespace lathe::serve
