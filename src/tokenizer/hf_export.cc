#include "tokenizer/hf_export.h"

#include <nlohmann/json.hpp>

#include "core/strings.h"
#include "formats/gguf.h"
#include "tokenizer/bpe.h"

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

ordered_json PieceOrNull(const BpeVocab& v, int32_t id) {
  if (id < 0 || id >= (int32_t)v.pieces.size()) return nullptr;
  return v.pieces[id];
}

// BOS / EOS around each sequence, as the GGUF's add_bos_token / add_eos_token ask.
ordered_json TemplatePostProcessor(const BpeVocab& v, bool bos, bool eos) {
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

}  // namespace

Result<std::vector<std::pair<std::string, std::string>>> HfTokenizerFilesFromGguf(const formats::GgufFile& g) {
  LATHE_ASSIGN_OR_RETURN(std::string model, g.GetStringOr("tokenizer.ggml.model", ""));
  if (model != "gpt2") {
    return Status::Error(g.path() + ": key tokenizer.ggml.model is '" + model +
                         "': tokenizer.json is written for byte-level BPE vocabularies ('gpt2') only; a SentencePiece "
                         "one ('llama') stores no merges to write");
  }
  LATHE_ASSIGN_OR_RETURN(BpeVocab v, ReadGgufBpeVocab(g));
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
    if (t != TokenType::kControl && t != TokenType::kUserDefined) continue;
    added.push_back({{"id", id},
                     {"content", v.pieces[id]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", t == TokenType::kControl}});
  }
  ordered_json pre = ordered_json::array();
  for (const PreTokenizer::SplitStep& s : v.pre.Steps()) {
    pre.push_back({{"type", "Split"},
                   {"pattern", {{"Regex", s.pattern}}},
                   {"behavior", BehaviorName(s.behavior)},
                   {"invert", s.invert}});
  }
  pre.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}});
  const ordered_json byte_level_post = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  ordered_json vocab = ordered_json::object();
  for (int32_t id = 0; id < n; ++id) vocab[v.pieces[id]] = id;
  ordered_json merges = ordered_json::array();
  for (const auto& [a, b] : v.merges) {
    // "left right": byte-level pieces spell a space as U+0120, so the one separator is unambiguous (and every
    // tokenizers version reads this form).
    if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos) {
      return Status::Error(g.path() + ": key tokenizer.ggml.merges has a piece with a space ('" + a + "' '" + b +
                           "'), not byte-level BPE");
    }
    merges.push_back(a + " " + b);
  }
  ordered_json tok = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", pre}}},
      {"post_processor", add_bos || add_eos ? ordered_json{{"type", "Sequence"},
                                                           {"processors", {byte_level_post,
                                                                           TemplatePostProcessor(v, add_bos, add_eos)}}}
                                            : byte_level_post},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", PieceOrNull(v, v.unk_id)},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", v.ignore_merges},
        {"vocab", vocab},
        {"merges", merges}}},
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

}  // namespace lathe::tokenizer
