// SentencePiece-style BPE encode: the algorithm of sentencepiece's bpe_model.cc (and llama.cpp's
// llm_tokenizer_spm): symbols are code points; the adjacent pair whose concatenation is the
// highest-scoring vocabulary piece merges first (ties: leftmost); unknown symbols fall back to
// byte tokens. A linked list plus a priority queue keep it O(n log n) on long texts.
#include "tokenizer/spm.h"

#include <mutex>
#include <queue>

#include "core/status.h"
#include "tokenizer/unicode.h"

namespace lathe::tokenizer {
namespace {

constexpr char kSpaceMark[] = "\xE2\x96\x81";  // U+2581

class SpmTokenizer final : public TokenizerBase {
 public:
  explicit SpmTokenizer(SpmVocab v) : scores_(std::move(v.scores)), remove_extra_ws_(v.remove_extra_whitespaces) {
    pieces_ = std::move(v.pieces);
    types_ = std::move(v.types);
    bos_id_ = v.bos_id;
    eos_id_ = v.eos_id;
    unk_id_ = v.unk_id;
    add_bos_ = v.add_bos;
    add_eos_ = v.add_eos;
    add_space_prefix_ = v.add_space_prefix;
    chat_template_ = std::move(v.chat_template);
    for (int& b : byte_ids_) b = -1;
    for (int32_t id = 0; id < static_cast<int32_t>(pieces_.size()); ++id) {
      const std::string& p = pieces_[id];
      int b = types_[id] == TokenType::kByte ? ParseByteToken(p) : -1;
      if (b >= 0 && byte_ids_[b] < 0) byte_ids_[b] = id;
    }
    FinishVocab();
    // Only pieces sentencepiece keeps in its merge table take part in merges (not control,
    // unknown or byte tokens).
    for (int32_t id = 0; id < vocab_size(); ++id) {
      TokenType t = types_[id];
      if (t == TokenType::kNormal || t == TokenType::kUserDefined || t == TokenType::kUnused) {
        merge_pieces_.emplace(pieces_[id], id);
      }
      if (t == TokenType::kUnused) has_unused_ = true;
    }
    // If no mergeable piece has U+2581 after another character, no merge crosses the start of a
    // run of U+2581 that follows other text: the text can be encoded word by word (and cached).
    chunkable_ = true;
    for (const auto& [piece, id] : merge_pieces_) {
      size_t lead = 0;
      while (piece.compare(lead, 3, kSpaceMark) == 0) lead += 3;
      if (piece.find(kSpaceMark, lead) != std::string::npos) chunkable_ = false;
    }
    ComputeStopIds(v.extra_stop_ids);
  }

  const char* kind() const override { return "spm"; }

 protected:
  std::string NormalTokenBytes(int32_t id) const override {
    const std::string& p = pieces_[id];
    if (types_[id] == TokenType::kByte) {
      for (int b = 0; b < 256; ++b) {
        if (byte_ids_[b] == id) return std::string(1, static_cast<char>(b));
      }
    }
    std::string out;
    out.reserve(p.size());
    for (size_t i = 0; i < p.size();) {
      if (p.compare(i, 3, kSpaceMark) == 0) {
        out.push_back(' ');
        i += 3;
      } else {
        out.push_back(p[i++]);
      }
    }
    return out;
  }

  void EncodeText(std::string_view raw, bool prev_special, bool /*at_start*/, std::vector<int32_t>* out) const override {
    std::string text;
    text.reserve(raw.size() + 8);
    std::string_view body = raw;
    std::string collapsed;
    if (remove_extra_ws_) {
      // sentencepiece's normalizer: trim, and collapse runs of spaces to one.
      size_t b = 0, e = body.size();
      while (b < e && body[b] == ' ') ++b;
      while (e > b && body[e - 1] == ' ') --e;
      for (size_t i = b; i < e; ++i) {
        if (body[i] == ' ' && !collapsed.empty() && collapsed.back() == ' ') continue;
        collapsed.push_back(body[i]);
      }
      body = collapsed;
      if (body.empty()) return;
    }
    if (add_space_prefix_ && prev_special) text += kSpaceMark;
    for (char c : body) {
      if (c == ' ') {
        text += kSpaceMark;
      } else {
        text.push_back(c);
      }
    }
    if (!chunkable_) {
      Tokenize(text, out);
      return;
    }
    size_t start = 0;
    for (size_t i = 1; i + 3 <= text.size(); ++i) {
      if (text.compare(i, 3, kSpaceMark) == 0 && !(i >= 3 && text.compare(i - 3, 3, kSpaceMark) == 0)) {
        EncodeChunk(std::string_view(text).substr(start, i - start), out);
        start = i;
        i += 2;
      }
    }
    EncodeChunk(std::string_view(text).substr(start), out);
  }

 private:
  struct Symbol {
    int prev, next;
    uint32_t off, len;
  };
  struct Bigram {
    float score;
    int left, right;
    uint32_t size;
  };
  struct BigramLess {
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };

  void EncodeChunk(std::string_view chunk, std::vector<int32_t>* out) const {
    if (chunk.empty()) return;
    cache_.Append(chunk, out, [this](std::string_view c, std::vector<int32_t>* ids) { Tokenize(c, ids); });
  }

  int32_t MergeId(std::string_view s) const {
    auto it = merge_pieces_.find(s);
    return it == merge_pieces_.end() ? -1 : it->second;
  }

  void Tokenize(std::string_view text, std::vector<int32_t>* out) const {
    std::vector<Symbol> sym;
    sym.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      size_t len = std::min<size_t>(Utf8SeqLen(static_cast<uint8_t>(text[i])), text.size() - i);
      int idx = static_cast<int>(sym.size());
      sym.push_back({idx - 1, idx + 1, static_cast<uint32_t>(i), static_cast<uint32_t>(len)});
      i += len;
    }
    if (sym.empty()) return;
    sym.back().next = -1;
    std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue;
    // Length of the left half of each merged symbol, keyed by (offset, length), for resegmenting
    // pieces that may not be emitted (unused).
    std::unordered_map<uint64_t, uint32_t> rev_merge;
    auto try_add = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      std::string_view s(text.data() + sym[left].off, sym[left].len + sym[right].len);
      int32_t id = MergeId(s);
      if (id < 0) return;
      queue.push({scores_[id], left, right, static_cast<uint32_t>(s.size())});
    };
    for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);
    while (!queue.empty()) {
      Bigram b = queue.top();
      queue.pop();
      Symbol& l = sym[b.left];
      Symbol& r = sym[b.right];
      if (l.len == 0 || r.len == 0 || l.len + r.len != b.size) continue;  // stale
      if (has_unused_) rev_merge[(static_cast<uint64_t>(l.off) << 32) | (l.len + r.len)] = l.len;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }
    for (int i = 0; i >= 0; i = sym[i].next) Resegment(text, sym[i].off, sym[i].len, rev_merge, out);
  }

  void Resegment(std::string_view text, uint32_t off, uint32_t len,
                 const std::unordered_map<uint64_t, uint32_t>& rev_merge,
                 std::vector<int32_t>* out) const {
    std::string_view s(text.data() + off, len);
    int32_t id = MergeId(s);
    if (id >= 0 && types_[id] != TokenType::kUnused) {
      out->push_back(id);
      return;
    }
    auto it = rev_merge.find((static_cast<uint64_t>(off) << 32) | len);
    if (it != rev_merge.end()) {
      uint32_t left_len = it->second;
      Resegment(text, off, left_len, rev_merge, out);
      Resegment(text, off + left_len, len - left_len, rev_merge, out);
      return;
    }
    for (uint32_t k = 0; k < len; ++k) {
      int b = byte_ids_[static_cast<uint8_t>(s[k])];
      if (b >= 0) {
        out->push_back(b);
      } else if (unk_id_ >= 0) {
        out->push_back(unk_id_);
      }
    }
  }

  std::vector<float> scores_;
  bool remove_extra_ws_;
  bool has_unused_ = false;
  bool chunkable_ = false;
  ChunkCache cache_;
  int byte_ids_[256];
  PieceMap merge_pieces_;
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> MakeSpmTokenizer(SpmVocab v, const std::string& source) {
  const size_t n = v.pieces.size();
  if (n == 0) return Status::Error(source + ": empty vocabulary");
  if (v.scores.size() != n) {
    return Status::Error(StrFormat("%s: %zu scores for %zu tokens", source.c_str(), v.scores.size(), n));
  }
  if (v.types.empty()) v.types.assign(n, TokenType::kNormal);
  if (v.types.size() != n) {
    return Status::Error(StrFormat("%s: %zu token types for %zu tokens", source.c_str(), v.types.size(), n));
  }
  auto check_id = [&](int32_t& id) {
    if (id >= static_cast<int64_t>(n) || id < 0) id = -1;
  };
  check_id(v.bos_id);
  check_id(v.eos_id);
  check_id(v.unk_id);
  return std::unique_ptr<Tokenizer>(std::make_unique<SpmTokenizer>(std::move(v)));
}

}  // namespace lathe::tokenizer
