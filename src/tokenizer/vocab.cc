// Shared vocabulary machinery: special-token matching, the Encode skeleton, detokenization.
#include "tokenizer/vocab.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace lathe::tokenizer {

namespace {
bool IsAsciiSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
}  // namespace

int SpecialMatcher::Child(int node, uint8_t byte) const {
  auto it = children_.find((static_cast<uint64_t>(node) << 8) | byte);
  return it == children_.end() ? -1 : it->second;
}

void SpecialMatcher::Add(const std::string& text, int32_t id, bool special, bool lstrip, bool rstrip) {
  if (text.empty()) return;
  int node = 0;
  for (char c : text) {
    uint8_t b = static_cast<uint8_t>(c);
    uint64_t key = (static_cast<uint64_t>(node) << 8) | b;
    auto it = children_.find(key);
    if (it == children_.end()) {
      nodes_.push_back(Node{});
      int child = static_cast<int>(nodes_.size()) - 1;
      children_.emplace(key, child);
      node = child;
    } else {
      node = it->second;
    }
  }
  first_byte_[static_cast<uint8_t>(text[0])] = true;
  Node& n = nodes_[node];
  if (n.id >= 0) return;  // first definition wins (duplicate texts)
  n.id = id;
  n.special = special;
  n.lstrip = lstrip;
  n.rstrip = rstrip;
}

void SpecialMatcher::Split(std::string_view text, bool parse_special, std::vector<Fragment>* out) const {
  size_t start = 0, i = 0;
  const size_t n = text.size();
  while (i < n) {
    if (!first_byte_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    int node = 0;
    const Node* best = nullptr;
    size_t best_len = 0;
    for (size_t j = i; j < n; ++j) {
      node = Child(node, static_cast<uint8_t>(text[j]));
      if (node < 0) break;
      const Node& nd = nodes_[node];
      if (nd.id >= 0 && (parse_special || !nd.special)) {
        best = &nd;
        best_len = j + 1 - i;
      }
    }
    if (!best) {
      ++i;
      continue;
    }
    size_t text_end = i;
    if (best->lstrip) {
      while (text_end > start && IsAsciiSpace(text[text_end - 1])) --text_end;
    }
    if (text_end > start) out->push_back({false, -1, text.substr(start, text_end - start)});
    out->push_back({true, best->id, {}});
    i += best_len;
    if (best->rstrip) {
      while (i < n && IsAsciiSpace(text[i])) ++i;
    }
    start = i;
  }
  if (start < n) out->push_back({false, -1, text.substr(start)});
}

std::vector<int32_t> TokenizerBase::Encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_bos && add_bos_ && bos_id_ >= 0) out.push_back(bos_id_);
  std::vector<SpecialMatcher::Fragment> frags;
  if (specials_.empty()) {
    if (!text.empty()) frags.push_back({false, -1, text});
  } else {
    specials_.Split(text, parse_special, &frags);
  }
  bool prev_special = true;
  for (const auto& f : frags) {
    if (f.is_token) {
      out.push_back(f.id);
      prev_special = true;
    } else {
      EncodeText(f.text, prev_special, f.text.data() == text.data(), &out);
      prev_special = false;
    }
  }
  if (add_bos && add_eos_ && eos_id_ >= 0) out.push_back(eos_id_);
  return out;
}

std::string TokenizerBase::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return token_bytes_[id];
}

std::string TokenizerBase::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  bool first = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (i == 0 && add_bos_ && id == bos_id_ && bos_id_ >= 0) continue;
    if (id < 0 || id >= vocab_size()) continue;
    const std::string& b = token_bytes_[id];
    if (first && add_space_prefix_ && !b.empty() && b[0] == ' ') {
      out.append(b, 1, std::string::npos);
    } else {
      out += b;
    }
    first = false;
  }
  return out;
}

const std::string& TokenizerBase::Piece(int32_t id) const {
  static const std::string kEmpty;
  if (id < 0 || id >= vocab_size()) return kEmpty;
  return pieces_[id];
}

int32_t TokenizerBase::PieceToId(std::string_view piece) const {
  auto it = piece_to_id_.find(piece);
  return it == piece_to_id_.end() ? -1 : it->second;
}

void TokenizerBase::FinishVocab() {
  piece_to_id_.clear();
  piece_to_id_.reserve(pieces_.size());
  token_bytes_.assign(pieces_.size(), {});
  for (int32_t id = 0; id < vocab_size(); ++id) {
    piece_to_id_.emplace(pieces_[id], id);  // first id wins for duplicate pieces
    TokenType t = types_[id];
    bool special = t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown;
    token_bytes_[id] = special ? pieces_[id] : NormalTokenBytes(id);
  }
  if (specials_from_types_) {
    // Longest texts first does not matter: the matcher always takes the longest match.
    for (int32_t id = 0; id < vocab_size(); ++id) {
      TokenType t = types_[id];
      if (t == TokenType::kControl || t == TokenType::kUnknown) specials_.Add(pieces_[id], id, true, false, false);
      if (t == TokenType::kUserDefined) specials_.Add(pieces_[id], id, false, false, false);
    }
  }
}

void TokenizerBase::ComputeStopIds(const std::vector<int32_t>& extra) {
  static const char* const kEndOfTurn[] = {
      "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "</s>", "<|endoftext|>",
      "<|end|>", "<end_of_turn>", "<|END_OF_TURN_TOKEN|>",
  };
  stop_ids_.clear();
  auto add = [&](int32_t id) {
    if (id < 0 || id >= vocab_size()) return;
    if (std::find(stop_ids_.begin(), stop_ids_.end(), id) == stop_ids_.end()) stop_ids_.push_back(id);
  };
  add(eos_id_);
  for (int32_t id : extra) add(id);
  for (const char* text : kEndOfTurn) {
    int32_t id = PieceToId(text);
    if (id < 0) continue;
    TokenType t = types_[id];
    if (t == TokenType::kControl || t == TokenType::kUserDefined) add(id);
  }
}

}  // namespace lathe::tokenizer
