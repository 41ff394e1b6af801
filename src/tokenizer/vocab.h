// The vocabulary and special-token machinery shared by the SentencePiece-style and byte-level BPE
// tokenizers (internal to tokenizer/): piece table, token types, special-token matching, BOS/EOS,
// stop ids, and the Encode skeleton (split on special tokens, then encode each text fragment).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace lathe::tokenizer {

// Token types as llama.cpp / SentencePiece number them.
enum class TokenType : uint8_t {
  kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6,
};

// Hash that lets unordered_map<std::string, ...> be queried with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using PieceMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Thread-safe memo of the ids of pre-tokenized chunks (words): chunks up to 256 bytes are cached,
// and the whole cache is dropped when it reaches 2^18 entries (text repeats words a lot).
class ChunkCache {
 public:
  // Appends the ids of `chunk` to out, calling encode(chunk, &ids) on a miss.
  template <class Encode>
  void Append(std::string_view chunk, std::vector<int32_t>* out, Encode&& encode) const {
    const bool cacheable = chunk.size() <= kMaxChunkBytes;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(chunk);
      if (it != map_.end()) {
        out->insert(out->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids;
    encode(chunk, &ids);
    out->insert(out->end(), ids.begin(), ids.end());
    if (cacheable) {
      std::lock_guard<std::mutex> lock(mu_);
      if (map_.size() >= kMaxEntries) map_.clear();
      map_.emplace(std::string(chunk), std::move(ids));
    }
  }

 private:
  static constexpr size_t kMaxChunkBytes = 256, kMaxEntries = size_t{1} << 18;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map_;
};

// Special and added tokens, matched in the text before the model sees it (leftmost, longest).
class SpecialMatcher {
 public:
  // special: matched only with parse_special (control tokens); others always (user-defined).
  void Add(const std::string& text, int32_t id, bool special, bool lstrip, bool rstrip);
  struct Fragment {
    bool is_token;
    int32_t id;             // when is_token
    std::string_view text;  // when !is_token
  };
  void Split(std::string_view text, bool parse_special, std::vector<Fragment>* out) const;
  bool empty() const { return nodes_.size() <= 1; }

 private:
  struct Node {
    int32_t id = -1;
    bool special = false, lstrip = false, rstrip = false;
  };
  int Child(int node, uint8_t byte) const;
  std::vector<Node> nodes_{Node{}};
  std::unordered_map<uint64_t, int> children_;  // (node << 8 | byte) -> child
  bool first_byte_[256] = {};
};

class TokenizerBase : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text, bool add_bos, bool parse_special = true) const override;
  std::string TokenBytes(int32_t id) const override;
  std::string Decode(const std::vector<int32_t>& ids) const override;
  const std::string& Piece(int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  bool IsControl(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return true;
    TokenType t = types_[id];
    return t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUnused;
  }

  int32_t PieceToId(std::string_view piece) const;  // -1 when absent
  TokenType type(int32_t id) const { return types_[id]; }

 protected:
  // Encodes one fragment of plain text (no special tokens in it). prev_special: the fragment
  // starts the text or follows a special token (SentencePiece adds its space prefix then);
  // at_start: the fragment begins at the first byte of the input (HF Metaspace "first").
  virtual void EncodeText(std::string_view text, bool prev_special, bool at_start, std::vector<int32_t>* out) const = 0;

  // Call after pieces_/types_ are filled: builds the piece map, the detokenized bytes per token
  // (via TokenText), the special matcher (control + user-defined, unless already added), and
  // the stop ids. Reports duplicate-free lookups; `source` names the file for errors.
  void FinishVocab();
  // Detokenized bytes of a normal token; specials are handled by the base.
  virtual std::string NormalTokenBytes(int32_t id) const = 0;
  void ComputeStopIds(const std::vector<int32_t>& extra);

  std::vector<std::string> pieces_;
  std::vector<TokenType> types_;
  std::vector<std::string> token_bytes_;
  PieceMap piece_to_id_;
  SpecialMatcher specials_;
  bool specials_from_types_ = true;  // add control/user-defined tokens to specials_ in FinishVocab
  int32_t unk_id_ = -1;
};

}  // namespace lathe::tokenizer
