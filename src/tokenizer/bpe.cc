// Rank-based BPE encode, as HF tokenizers' BPE model and llama.cpp's llm_tokenizer_bpe do it:
// per pre-tokenized word, the adjacent pair with the lowest merge rank merges first (ties:
// leftmost). A linked list plus a priority queue per word, and a cache of encoded words.
#include "tokenizer/bpe.h"

#include <mutex>
#include <queue>
#include <unordered_map>

#include "tokenizer/unicode.h"

namespace lathe::tokenizer {
namespace {


class BpeTokenizer final : public TokenizerBase {
 public:
  explicit BpeTokenizer(BpeVocab v)
      : byte_level_(v.byte_level),
        ignore_merges_(v.ignore_merges),
        byte_fallback_(v.byte_fallback),
        normalize_(std::move(v.normalize)),
        pre_(std::move(v.pre)) {
    pieces_ = std::move(v.pieces);
    types_ = std::move(v.types);
    bos_id_ = v.bos_id;
    eos_id_ = v.eos_id;
    unk_id_ = v.unk_id;
    add_bos_ = v.add_bos;
    add_eos_ = v.add_eos;
    add_space_prefix_ = v.add_space_prefix;
    chat_template_ = std::move(v.chat_template);
    if (v.has_added_tokens) {
      specials_from_types_ = false;
      for (const AddedToken& t : v.added) {
        specials_.Add(t.text, t.id, t.special, t.lstrip, t.rstrip);
        types_[t.id] = t.special ? TokenType::kControl : TokenType::kUserDefined;
      }
    }
    FinishVocab();
    for (int& b : byte_ids_) b = -1;
    if (byte_level_) {
      const auto& map = ByteToUnicode();
      for (int b = 0; b < 256; ++b) byte_ids_[b] = PieceToId(map[b]);
      raw_to_id_.reserve(pieces_.size());
      for (int32_t id = 0; id < vocab_size(); ++id) {
        if (types_[id] == TokenType::kNormal) raw_to_id_.emplace(token_bytes_[id], id);
      }
    } else {
      for (int32_t id = 0; id < vocab_size(); ++id) {
        int b = ParseByteToken(pieces_[id]);
        if (b >= 0 && byte_ids_[b] < 0) byte_ids_[b] = id;
      }
    }
    merges_.reserve(v.merges.size());
    std::string joined;
    for (size_t rank = 0; rank < v.merges.size(); ++rank) {
      const auto& [a, b] = v.merges[rank];
      int32_t ia = PieceToId(a), ib = PieceToId(b);
      joined = a;
      joined += b;
      int32_t ij = PieceToId(joined);
      if (ia < 0 || ib < 0 || ij < 0) continue;  // as llama.cpp: a merge outside the vocab never fires
      merges_.emplace(Key(ia, ib), Merge{static_cast<int32_t>(rank), ij});
    }
    ComputeStopIds(v.extra_stop_ids);
  }

  const char* kind() const override { return "bpe"; }

 protected:
  std::string NormalTokenBytes(int32_t id) const override {
    const std::string& p = pieces_[id];
    if (byte_level_) return ByteLevelDecode(p);
    if (int b = ParseByteToken(p); b >= 0) return std::string(1, static_cast<char>(b));
    std::string out;
    for (size_t i = 0; i < p.size();) {
      if (p.compare(i, 3, "\xE2\x96\x81") == 0) {
        out.push_back(' ');
        i += 3;
      } else {
        out.push_back(p[i++]);
      }
    }
    return out;
  }

  void EncodeText(std::string_view text, bool /*prev_special*/, bool at_start, std::vector<int32_t>* out) const override {
    std::string normalized;
    bool owned = false;
    for (const NormalizeOp& op : normalize_) {
      std::string_view cur = owned ? std::string_view(normalized) : text;
      std::string next;
      switch (op.kind) {
        case NormalizeOp::kNfc:
          if (!NormalizeNfc(cur, &next)) continue;
          break;
        case NormalizeOp::kMetaspaceFirst:
          if (!at_start) continue;
          [[fallthrough]];
        case NormalizeOp::kMetaspaceAlways:
          if (cur.substr(0, op.a.size()) == op.a) continue;
          [[fallthrough]];
        case NormalizeOp::kPrepend:
          if (cur.empty()) continue;
          next = op.a;
          next += cur;
          break;
        case NormalizeOp::kReplace: {
          if (op.a.empty() || cur.find(op.a) == std::string_view::npos) continue;
          for (size_t i = 0; i < cur.size();) {
            if (cur.compare(i, op.a.size(), op.a) == 0) {
              next += op.b;
              i += op.a.size();
            } else {
              next.push_back(cur[i++]);
            }
          }
          break;
        }
      }
      normalized = std::move(next);
      owned = true;
    }
    std::string_view src = owned ? std::string_view(normalized) : text;
    thread_local std::vector<std::string_view> words;
    if (pre_.empty()) {
      words.assign(1, src);
    } else {
      pre_.Split(src, &words);
    }
    for (std::string_view w : words) EncodeWord(w, out);
  }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  static uint64_t Key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
    if (word.empty()) return;
    if (byte_level_ && ignore_merges_) {
      auto it = raw_to_id_.find(word);
      if (it != raw_to_id_.end()) {
        out->push_back(it->second);
        return;
      }
    }
    cache_.Append(word, out, [this](std::string_view w, std::vector<int32_t>* ids) { Merge_(w, ids); });
  }

  // Initial symbols (token ids, or -1 with the bytes they cover) then merges.
  void Merge_(std::string_view word, std::vector<int32_t>* out) const {
    struct Sym {
      int32_t id;
      int prev, next;
      uint32_t off, len;  // bytes of the word (for fallback of unknown symbols)
    };
    std::vector<Sym> sym;
    sym.reserve(word.size());
    if (byte_level_) {
      for (size_t i = 0; i < word.size(); ++i) {
        sym.push_back({byte_ids_[static_cast<uint8_t>(word[i])], 0, 0, static_cast<uint32_t>(i), 1});
      }
    } else {
      for (size_t i = 0; i < word.size();) {
        size_t len = std::min<size_t>(Utf8SeqLen(static_cast<uint8_t>(word[i])), word.size() - i);
        sym.push_back({PieceToId(word.substr(i, len)), 0, 0, static_cast<uint32_t>(i), static_cast<uint32_t>(len)});
        i += len;
      }
    }
    const int n = static_cast<int>(sym.size());
    for (int i = 0; i < n; ++i) {
      sym[i].prev = i - 1;
      sym[i].next = i + 1 < n ? i + 1 : -1;
    }
    struct Cand {
      int32_t rank;
      int left;
      int32_t left_id, right_id;
      bool operator<(const Cand& o) const { return rank > o.rank || (rank == o.rank && left > o.left); }
    };
    std::priority_queue<Cand> queue;
    auto try_add = [&](int l) {
      if (l < 0) return;
      int r = sym[l].next;
      if (r < 0 || sym[l].id < 0 || sym[r].id < 0) return;
      auto it = merges_.find(Key(sym[l].id, sym[r].id));
      if (it == merges_.end()) return;
      queue.push({it->second.rank, l, sym[l].id, sym[r].id});
    };
    for (int i = 0; i + 1 < n; ++i) try_add(i);
    while (!queue.empty()) {
      Cand c = queue.top();
      queue.pop();
      Sym& l = sym[c.left];
      if (l.len == 0 || l.id != c.left_id || l.next < 0) continue;
      Sym& r = sym[l.next];
      if (r.id != c.right_id) continue;  // stale
      l.id = merges_.find(Key(c.left_id, c.right_id))->second.id;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = c.left;
      try_add(l.prev);
      try_add(c.left);
    }
    for (int i = 0; i >= 0; i = sym[i].next) {
      if (sym[i].id >= 0) {
        out->push_back(sym[i].id);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (uint32_t k = 0; k < sym[i].len; ++k) all = all && byte_ids_[static_cast<uint8_t>(word[sym[i].off + k])] >= 0;
        if (all) {
          for (uint32_t k = 0; k < sym[i].len; ++k) out->push_back(byte_ids_[static_cast<uint8_t>(word[sym[i].off + k])]);
          continue;
        }
      }
      if (unk_id_ >= 0) out->push_back(unk_id_);
    }
  }

  bool byte_level_, ignore_merges_, byte_fallback_;
  std::vector<NormalizeOp> normalize_;
  PreTokenizer pre_;
  int byte_ids_[256];
  PieceMap raw_to_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  ChunkCache cache_;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> MakeBpeTokenizer(BpeVocab v, const std::string& source) {
  const size_t n = v.pieces.size();
  if (n == 0) return Status::Error(source + ": empty vocabulary");
  if (v.types.empty()) v.types.assign(n, TokenType::kNormal);
  if (v.types.size() != n) {
    return Status::Error(StrFormat("%s: %zu token types for %zu tokens", source.c_str(), v.types.size(), n));
  }
  for (const AddedToken& t : v.added) {
    if (t.id < 0 || t.id >= static_cast<int32_t>(n)) {
      return Status::Error(StrFormat("%s: added token '%s' has id %d outside the vocabulary (%zu)", source.c_str(),
                                     t.text.c_str(), t.id, n));
    }
  }
  auto check_id = [&](int32_t& id) {
    if (id >= static_cast<int64_t>(n) || id < 0) id = -1;
  };
  check_id(v.bos_id);
  check_id(v.eos_id);
  check_id(v.unk_id);
  return std::unique_ptr<Tokenizer>(std::make_unique<BpeTokenizer>(std::move(v)));
}

}  // namespace lathe::tokenizer
