#include "tokenizer/hf_export.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <unordered_map>

#include "core/strings.h"
#include "formats/gguf.h"
#include "tokenizer/bpe.h"
#include "tokenizer/spm.h"

namespace lathe::tokenizer {

namespace {

using nlohmann::ordered_json;

const char* BehaviorName(SplitBehavior b) {
  switch (b) {
    case SplitBehavior::kIsolated: return "Isolated";
    case SplitBehavior::kRemoved: return "Removed";
    case SplitBehavior::kMergedWithPrevious: return "MergedWithPrevious";
    case SplitBehavior::kMergedWithNext: return "MergedWithNext";
    case SplitBehavior::kContiguous: return "Contiguous";
  }
  return "Isolated";
}

// What both vocabulary kinds write the same way.
struct VocabView {
  const std::vector<std::string>& pieces;
  const std::vector<TokenType>& types;
  int32_t bos_id, eos_id, unk_id;
  bool add_bos, add_eos;
  const std::string& chat_template;
};

ordered_json PieceOrNull(const VocabView& v, int32_t id) {
  if (id < 0 || id >= (int32_t)v.pieces.size()) return nullptr;
  return v.pieces[id];
}

// BOS / EOS around each sequence, as the GGUF's add_bos_token / add_eos_token ask.
ordered_json TemplatePostProcessor(const VocabView& v, bool bos, bool eos) {
  auto special = [&](int32_t id, int type_id) {
    return ordered_json{{"SpecialToken", {{"id", v.pieces[id]}, {"type_id", type_id}}}};
  };
  auto seq = [](const char* name, int type_id) {
    return ordered_json{{"Sequence", {{"id", name}, {"type_id", type_id}}}};
  };
  ordered_json single = ordered_json::array(), pair = ordered_json::array(), specials = ordered_json::object();
  for (int part = 0; part < 2; ++part) {
    ordered_json& out = part == 0 ? single : pair;
    for (int s = 0; s < (part == 0 ? 1 : 2); ++s) {
      if (bos) out.push_back(special(v.bos_id, s));
      out.push_back(seq(s == 0 ? "A" : "B", s));
      if (eos) out.push_back(special(v.eos_id, s));
    }
  }
  for (int32_t id : {bos ? v.bos_id : -1, eos ? v.eos_id : -1}) {
    if (id < 0) continue;
    specials[v.pieces[id]] = {{"id", v.pieces[id]}, {"ids", {id}}, {"tokens", {v.pieces[id]}}};
  }
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", specials}};
}


// Merges as "left right", or as [left, right] pairs where a piece holds a space (tokenizers >= 0.20 reads both;
// the string form is what older versions read).
ordered_json MergesJson(const std::vector<std::pair<std::string, std::string>>& merges) {
  bool spaces = false;
  for (const auto& [a, b] : merges) spaces = spaces || a.find(' ') != std::string::npos || b.find(' ') != std::string::npos;
  ordered_json out = ordered_json::array();
  for (const auto& [a, b] : merges) {
    if (spaces) {
      out.push_back({a, b});
    } else {
      out.push_back(a + " " + b);
    }
  }
  return out;
}

// The merges a SentencePiece BPE vocabulary implies, as transformers derives them for a GGUF without merges
// (tokenization_utils_base.generate_merges(vocab, scores)): for each token in vocabulary order, every split into
// two vocabulary pieces (at code points), those ordered by the pieces' ids; then all of them by the merged
// token's score, the left piece's length and the right's (code points), highest first, ties kept in that order.
std::vector<std::pair<std::string, std::string>> SpmMerges(const std::vector<std::string>& pieces,
                                                           const std::vector<float>& scores) {
  std::unordered_map<std::string, int32_t> id_of;  // as a Python dict built in order: the last id of a piece
  std::unordered_map<std::string, float> score_of;
  std::vector<const std::string*> order;           // first appearances
  for (int32_t i = 0; i < (int32_t)pieces.size(); ++i) {
    if (id_of.find(pieces[i]) == id_of.end()) order.push_back(&pieces[i]);
    id_of[pieces[i]] = i;
    score_of[pieces[i]] = scores[i];
  }
  auto code_points = [](const std::string& t) {
    int64_t n = 0;
    for (unsigned char ch : t) n += (ch & 0xC0) != 0x80;
    return n;
  };
  struct Merge {
    std::string l, r;
    float score;
    int64_t ll, lr;
  };
  std::vector<Merge> all;
  for (const std::string* t : order) {
    std::vector<Merge> local;
    for (size_t b = 1; b < t->size(); ++b) {
      if (((unsigned char)(*t)[b] & 0xC0) == 0x80) continue;  // inside a code point
      std::string l = t->substr(0, b), r = t->substr(b);
      if (id_of.count(l) && id_of.count(r)) local.push_back({l, r, score_of[*t], code_points(l), code_points(r)});
    }
    std::stable_sort(local.begin(), local.end(), [&](const Merge& a, const Merge& b) {
      return std::make_pair(id_of[a.l], id_of[a.r]) < std::make_pair(id_of[b.l], id_of[b.r]);
    });
    for (Merge& m : local) all.push_back(std::move(m));
  }
  std::stable_sort(all.begin(), all.end(), [](const Merge& a, const Merge& b) {
    return std::make_tuple(a.score, a.ll, a.lr) > std::make_tuple(b.score, b.ll, b.lr);
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(all.size());
  for (Merge& m : all) out.emplace_back(std::move(m.l), std::move(m.r));
  return out;
}

// tokenizer.json (around the model and the pipeline the vocabulary kind gives), tokenizer_config.json and
// special_tokens_map.json. added: which token types are added tokens, and which of those special.
Result<std::vector<std::pair<std::string, std::string>>> WriteFiles(const formats::GgufFile& g, const VocabView& v,
                                                                  ordered_json normalizer, ordered_json pre,
                                                                  ordered_json decoder, ordered_json model) {
  const int32_t n = (int32_t)v.pieces.size();
  auto type_of = [&](int32_t id) { return v.types.empty() ? TokenType::kNormal : v.types[id]; };
  for (int32_t id : {v.bos_id, v.eos_id, v.unk_id}) {
    if (id >= n) {
      return Status::Error(StrFormat("%s: a special token id (%d) is past the vocabulary (%d tokens)",
                                     g.path().c_str(), id, n));
    }
  }
  const bool add_bos = v.add_bos && v.bos_id >= 0, add_eos = v.add_eos && v.eos_id >= 0;
  ordered_json added = ordered_json::array();
  for (int32_t id = 0; id < n; ++id) {
    const TokenType t = type_of(id);
    if (t != TokenType::kControl && t != TokenType::kUserDefined && t != TokenType::kUnknown) continue;
    added.push_back({{"id", id},
                     {"content", v.pieces[id]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", t != TokenType::kUserDefined}});
  }
  const ordered_json byte_level_post = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  const bool byte_level = model.value("byte_fallback", false) == false;
  ordered_json post = nullptr;
  if (add_bos || add_eos) {
    post = TemplatePostProcessor(v, add_bos, add_eos);
    if (byte_level) post = {{"type", "Sequence"}, {"processors", {byte_level_post, post}}};
  } else if (byte_level) {
    post = byte_level_post;
  }
  ordered_json tok = {
      {"version", "1.0"},  {"truncation", nullptr}, {"padding", nullptr},  {"added_tokens", added},
      {"normalizer", normalizer}, {"pre_tokenizer", pre}, {"post_processor", post}, {"decoder", decoder},
      {"model", model},
  };
  LATHE_ASSIGN_OR_RETURN(int64_t pad, g.GetIntOr("tokenizer.ggml.padding_token_id", -1));
  const int32_t pad_id = pad >= 0 && pad < n ? (int32_t)pad : -1;
  ordered_json special_map = ordered_json::object();
  for (const auto& [name, id] : {std::pair<const char*, int32_t>{"bos_token", v.bos_id},
                                 {"eos_token", v.eos_id},
                                 {"unk_token", v.unk_id},
                                 {"pad_token", pad_id}}) {
    if (id >= 0) special_map[name] = v.pieces[id];
  }
  ordered_json config = {{"add_bos_token", add_bos},
                         {"add_eos_token", add_eos},
                         {"bos_token", PieceOrNull(v, v.bos_id)},
                         {"eos_token", PieceOrNull(v, v.eos_id)},
                         {"unk_token", PieceOrNull(v, v.unk_id)},
                         {"pad_token", PieceOrNull(v, pad_id)},
                         {"clean_up_tokenization_spaces", false},
                         {"tokenizer_class", "PreTrainedTokenizerFast"}};
  if (!v.chat_template.empty()) config["chat_template"] = v.chat_template;
  try {
    return std::vector<std::pair<std::string, std::string>>{{"tokenizer.json", tok.dump(2) + "\n"},
                                                            {"tokenizer_config.json", config.dump(2) + "\n"},
                                                            {"special_tokens_map.json", special_map.dump(2) + "\n"}};
  } catch (const nlohmann::json::exception& e) {  // a piece or the template that is not UTF-8
    return Status::Error(g.path() + ": the tokenizer.ggml.* strings cannot be written as JSON: " + e.what());
  }
}

ordered_json VocabJson(const std::vector<std::string>& pieces) {
  ordered_json vocab = ordered_json::object();
  for (int32_t id = 0; id < (int32_t)pieces.size(); ++id) vocab[pieces[id]] = id;
  return vocab;
}

}  // namespace

Result<std::vector<std::pair<std::string, std::string>>> HfTokenizerFilesFromGguf(const formats::GgufFile& g) {
  LATHE_ASSIGN_OR_RETURN(std::string model, g.GetStringOr("tokenizer.ggml.model", ""));
  if (model == "gpt2") {
    LATHE_ASSIGN_OR_RETURN(BpeVocab v, ReadGgufBpeVocab(g));
    ordered_json pre = ordered_json::array();
    for (const PreTokenizer::SplitStep& s : v.pre.Steps()) {
      pre.push_back({{"type", "Split"},
                     {"pattern", {{"Regex", s.pattern}}},
                     {"behavior", BehaviorName(s.behavior)},
                     {"invert", s.invert}});
    }
    pre.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}});
    const VocabView view{v.pieces, v.types, v.bos_id, v.eos_id, v.unk_id, v.add_bos, v.add_eos, v.chat_template};
    return WriteFiles(g, view, nullptr, {{"type", "Sequence"}, {"pretokenizers", pre}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}},
                      {{"type", "BPE"},
                       {"dropout", nullptr},
                       {"unk_token", PieceOrNull(view, v.unk_id)},
                       {"continuing_subword_prefix", nullptr},
                       {"end_of_word_suffix", nullptr},
                       {"fuse_unk", false},
                       {"byte_fallback", false},
                       {"ignore_merges", v.ignore_merges},
                       {"vocab", VocabJson(v.pieces)},
                       {"merges", MergesJson(v.merges)}});
  }
  if (model == "llama") {
    LATHE_ASSIGN_OR_RETURN(SpmVocab v, ReadGgufSpmVocab(g));
    if (v.remove_extra_whitespaces) {
      return Status::Error(g.path() + ": key tokenizer.ggml.remove_extra_whitespaces is true: that normalization is "
                           "not written to tokenizer.json");
    }
    // As HF's Llama tokenizer.json (legacy): U+2581 for spaces and, with add_space_prefix, one before the text and
    // after each special token (llama.cpp's rule); pieces of unknown bytes as <0xXX> (byte_fallback).
    const std::string ws = "\u2581";
    ordered_json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", ws}};
    ordered_json normalizer =
        v.add_space_prefix
            ? ordered_json{{"type", "Sequence"},
                           {"normalizers", {{{"type", "Prepend"}, {"prepend", ws}}, replace}}}
            : replace;
    ordered_json decoders = {{{"type", "Replace"}, {"pattern", {{"String", ws}}}, {"content", " "}},
                             {{"type", "ByteFallback"}},
                             {{"type", "Fuse"}}};
    if (v.add_space_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    const VocabView view{v.pieces, v.types, v.bos_id, v.eos_id, v.unk_id, v.add_bos, v.add_eos, v.chat_template};
    return WriteFiles(g, view, normalizer, nullptr, {{"type", "Sequence"}, {"decoders", decoders}},
                      {{"type", "BPE"},
                       {"dropout", nullptr},
                       {"unk_token", PieceOrNull(view, v.unk_id)},
                       {"continuing_subword_prefix", nullptr},
                       {"end_of_word_suffix", nullptr},
                       {"fuse_unk", true},
                       {"byte_fallback", true},
                       {"ignore_merges", false},
                       {"vocab", VocabJson(v.pieces)},
                       {"merges", MergesJson(SpmMerges(v.pieces, v.scores))}});
  }
  return Status::Error(g.path() + ": key tokenizer.ggml.model is '" + model +
                       "': tokenizer.json is written for 'gpt2' (byte-level BPE) and 'llama' (SentencePiece BPE)");
}

}  // namespace lathe::tokenizer
