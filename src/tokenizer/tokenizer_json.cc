// Loader for HF tokenizer.json (+ tokenizer_config.json beside it): BPE model, added tokens,
// normalizers (NFC, Prepend, Replace), pre-tokenizers (Split, ByteLevel, Digits, Metaspace) and
// the post-processor / config that decide BOS and EOS. Unsupported components are errors that
// name the file and the JSON field.
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "tokenizer/bpe.h"

namespace lathe::tokenizer {
namespace {

using nlohmann::json;

struct Ctx {
  const std::string& path;
  Status Err(const std::string& field, const std::string& msg) const {
    return Status::Error(path + ": field " + field + ": " + msg);
  }
};

Result<json> ParseJsonFile(const std::string& path) {
  LATHE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  try {
    return json::parse(text);
  } catch (const std::exception& e) {
    return Status::Error(path + ": not valid JSON: " + e.what());
  }
}

// j[key] where j is an object holding it (null counts as absent), else def; a value of another
// type is an error naming the field (json::value would throw).
Result<bool> BoolField(const Ctx& c, const json& j, const char* key, bool def, const std::string& field) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_boolean()) return c.Err(field + "." + key, "expected true or false");
  return j[key].get<bool>();
}
Result<std::string> StrField(const Ctx& c, const json& j, const char* key, const std::string& def,
                             const std::string& field) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return def;
  if (!j[key].is_string()) return c.Err(field + "." + key, "expected a string");
  return j[key].get<std::string>();
}

std::string TypeOf(const json& j) { return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : ""; }

bool ByteLevelIn(const json& j) {
  if (j.is_null()) return false;
  std::string t = TypeOf(j);
  if (t == "ByteLevel") return true;
  for (const char* key : {"pretokenizers", "decoders", "normalizers", "processors"}) {
    if (j.is_object() && j.contains(key) && j[key].is_array()) {
      for (const json& c : j[key]) {
        if (ByteLevelIn(c)) return true;
      }
    }
  }
  return false;
}

Result<std::string> PatternOf(const Ctx& c, const json& j, const std::string& field, bool* is_regex) {
  if (!j.is_object()) return c.Err(field, "expected {\"Regex\": ...} or {\"String\": ...}");
  if (j.contains("Regex") && j["Regex"].is_string()) {
    *is_regex = true;
    return j["Regex"].get<std::string>();
  }
  if (j.contains("String") && j["String"].is_string()) {
    *is_regex = false;
    return j["String"].get<std::string>();
  }
  return c.Err(field, "expected {\"Regex\": ...} or {\"String\": ...}");
}

Status ParseNormalizer(const Ctx& c, const json& j, const std::string& field, BpeVocab* v) {
  if (j.is_null()) return Status::Ok();
  std::string t = TypeOf(j);
  if (t == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array()) return c.Err(field + ".normalizers", "expected an array");
    for (size_t i = 0; i < j["normalizers"].size(); ++i) {
      LATHE_RETURN_IF_ERROR(ParseNormalizer(c, j["normalizers"][i], field + ".normalizers[" + std::to_string(i) + "]", v));
    }
    return Status::Ok();
  }
  if (t == "NFC") {
    v->normalize.push_back({NormalizeOp::kNfc, "", ""});
    return Status::Ok();
  }
  if (t == "Prepend") {
    if (!j.contains("prepend") || !j["prepend"].is_string()) return c.Err(field + ".prepend", "expected a string");
    v->normalize.push_back({NormalizeOp::kPrepend, j["prepend"].get<std::string>(), ""});
    if (v->normalize.back().a == "\xE2\x96\x81") v->add_space_prefix = true;
    return Status::Ok();
  }
  if (t == "Replace") {
    bool is_regex = false;
    LATHE_ASSIGN_OR_RETURN(std::string pat, PatternOf(c, j.value("pattern", json()), field + ".pattern", &is_regex));
    if (is_regex) return c.Err(field + ".pattern", "regex Replace normalizers are not supported");
    if (!j.contains("content") || !j["content"].is_string()) return c.Err(field + ".content", "expected a string");
    v->normalize.push_back({NormalizeOp::kReplace, pat, j["content"].get<std::string>()});
    return Status::Ok();
  }
  return c.Err(field + ".type", "normalizer '" + t + "' is not supported (NFC, Prepend, Replace, Sequence are)");
}

Result<SplitBehavior> ParseBehavior(const Ctx& c, const json& j, const std::string& field) {
  std::string b = j.is_string() ? j.get<std::string>() : "";
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return c.Err(field, "unknown split behavior '" + b + "'");
}

Status ParsePreTokenizer(const Ctx& c, const json& j, const std::string& field, BpeVocab* v) {
  if (j.is_null()) return Status::Ok();
  std::string t = TypeOf(j);
  if (t == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) {
      return c.Err(field + ".pretokenizers", "expected an array");
    }
    for (size_t i = 0; i < j["pretokenizers"].size(); ++i) {
      LATHE_RETURN_IF_ERROR(
          ParsePreTokenizer(c, j["pretokenizers"][i], field + ".pretokenizers[" + std::to_string(i) + "]", v));
    }
    return Status::Ok();
  }
  if (t == "Split") {
    bool is_regex = false;
    LATHE_ASSIGN_OR_RETURN(std::string pat, PatternOf(c, j.value("pattern", json()), field + ".pattern", &is_regex));
    LATHE_ASSIGN_OR_RETURN(SplitBehavior b, ParseBehavior(c, j.value("behavior", json()), field + ".behavior"));
    LATHE_ASSIGN_OR_RETURN(bool invert, BoolField(c, j, "invert", false, field));
    Status st = is_regex ? v->pre.AddRegex(pat, b, invert) : v->pre.AddLiteral(pat, b, invert);
    return st.WithContext(c.path + ": field " + field + ".pattern");
  }
  if (t == "ByteLevel") {
    v->byte_level = true;
    LATHE_ASSIGN_OR_RETURN(bool prefix_space, BoolField(c, j, "add_prefix_space", false, field));
    LATHE_ASSIGN_OR_RETURN(bool use_regex, BoolField(c, j, "use_regex", true, field));
    if (prefix_space) v->normalize.push_back({NormalizeOp::kPrepend, " ", ""});
    if (use_regex) return v->pre.AddByteLevelRegex();
    return Status::Ok();
  }
  if (t == "Digits") {
    LATHE_ASSIGN_OR_RETURN(bool individual, BoolField(c, j, "individual_digits", false, field));
    return v->pre.AddRegex(individual ? "[0-9]" : "[0-9]+", SplitBehavior::kIsolated, false);
  }
  if (t == "Metaspace") {
    LATHE_ASSIGN_OR_RETURN(std::string repl, StrField(c, j, "replacement", "\xE2\x96\x81", field));
    LATHE_ASSIGN_OR_RETURN(bool prefix_space, BoolField(c, j, "add_prefix_space", true, field));
    LATHE_ASSIGN_OR_RETURN(std::string scheme,
                           StrField(c, j, "prepend_scheme", prefix_space ? "always" : "never", field));
    LATHE_ASSIGN_OR_RETURN(bool split, BoolField(c, j, "split", true, field));
    v->byte_level = false;
    v->normalize.push_back({NormalizeOp::kReplace, " ", repl});
    if (scheme == "always") v->normalize.push_back({NormalizeOp::kMetaspaceAlways, repl, ""});
    if (scheme == "first") v->normalize.push_back({NormalizeOp::kMetaspaceFirst, repl, ""});
    if (scheme != "never") v->add_space_prefix = true;
    if (split) return v->pre.AddLiteral(repl, SplitBehavior::kMergedWithNext, false);
    return Status::Ok();
  }
  return c.Err(field + ".type",
               "pre-tokenizer '" + t + "' is not supported (Sequence, Split, ByteLevel, Digits, Metaspace are)");
}

// A token given in tokenizer_config.json as a string or as {"content": ...}.
std::string ConfigToken(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return {};
  const json& t = cfg[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  return {};
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromTokenizerJson(const std::string& path) {
  LATHE_ASSIGN_OR_RETURN(json j, ParseJsonFile(path));
  Ctx c{path};
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) return c.Err("model", "missing");
  const json& m = j["model"];
  LATHE_ASSIGN_OR_RETURN(std::string mtype, StrField(c, m, "type", "BPE", "model"));
  if (mtype != "BPE") return c.Err("model.type", "'" + mtype + "' is not supported (only BPE)");
  if (!m.contains("vocab") || !m["vocab"].is_object()) return c.Err("model.vocab", "expected an object");
  if (!m.contains("merges") || !m["merges"].is_array()) return c.Err("model.merges", "expected an array");

  BpeVocab v;
  v.byte_level = ByteLevelIn(j.value("pre_tokenizer", json())) || ByteLevelIn(j.value("decoder", json()));
  int64_t max_id = -1;
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > (1 << 26)) {
      return c.Err("model.vocab[\"" + it.key() + "\"]", "expected a non-negative integer id");
    }
    max_id = std::max<int64_t>(max_id, it.value().get<int64_t>());
  }
  const json added = j.value("added_tokens", json::array());
  if (!added.is_array()) return c.Err("added_tokens", "expected an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 ||
        a["id"].get<int64_t>() > (1 << 26) || !a.contains("content") || !a["content"].is_string()) {
      return c.Err("added_tokens[" + std::to_string(i) + "]", "expected {id: int, content: string}");
    }
    max_id = std::max<int64_t>(max_id, a["id"].get<int64_t>());
  }
  if (max_id < 0) return c.Err("model.vocab", "empty");
  v.pieces.assign(max_id + 1, std::string());
  v.types.assign(max_id + 1, TokenType::kUnused);
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    int64_t id = it.value().get<int64_t>();
    v.pieces[id] = it.key();
    v.types[id] = TokenType::kNormal;
  }
  v.has_added_tokens = true;
  for (const json& a : added) {
    AddedToken t;
    t.id = static_cast<int32_t>(a["id"].get<int64_t>());
    t.text = a["content"].get<std::string>();
    const std::string at = "added_tokens[" + std::to_string(v.added.size()) + "]";
    LATHE_ASSIGN_OR_RETURN(t.special, BoolField(c, a, "special", false, at));
    LATHE_ASSIGN_OR_RETURN(t.lstrip, BoolField(c, a, "lstrip", false, at));
    LATHE_ASSIGN_OR_RETURN(t.rstrip, BoolField(c, a, "rstrip", false, at));
    v.pieces[t.id] = t.text;
    v.types[t.id] = t.special ? TokenType::kControl : TokenType::kUserDefined;
    v.added.push_back(std::move(t));
  }
  const json& merges = m["merges"];
  v.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& e = merges[i];
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) return c.Err("model.merges[" + std::to_string(i) + "]", "'" + s + "' is not 'left right'");
      v.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      v.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      return c.Err("model.merges[" + std::to_string(i) + "]", "expected \"a b\" or [\"a\", \"b\"]");
    }
  }
  LATHE_ASSIGN_OR_RETURN(v.ignore_merges, BoolField(c, m, "ignore_merges", false, "model"));
  LATHE_ASSIGN_OR_RETURN(v.byte_fallback, BoolField(c, m, "byte_fallback", false, "model"));
  auto id_of = [&](const std::string& text) -> int32_t {
    if (text.empty()) return -1;
    for (const AddedToken& t : v.added) {
      if (t.text == text) return t.id;
    }
    if (m["vocab"].contains(text)) return static_cast<int32_t>(m["vocab"][text].get<int64_t>());
    return -1;
  };
  if (m.contains("unk_token") && m["unk_token"].is_string()) v.unk_id = id_of(m["unk_token"].get<std::string>());

  LATHE_RETURN_IF_ERROR(ParseNormalizer(c, j.value("normalizer", json()), "normalizer", &v));
  LATHE_RETURN_IF_ERROR(ParsePreTokenizer(c, j.value("pre_tokenizer", json()), "pre_tokenizer", &v));

  // BOS/EOS: from the post-processor template, overridden by tokenizer_config.json.
  const json post = j.value("post_processor", json());
  if (TypeOf(post) == "TemplateProcessing" && post.contains("single") && post["single"].is_array() &&
      !post["single"].empty()) {
    const json& single = post["single"];
    auto special_id = [&](const json& item) -> int32_t {
      if (item.is_object() && item.contains("SpecialToken") && item["SpecialToken"].is_object()) {
        const json& st = item["SpecialToken"];
        return st.contains("id") && st["id"].is_string() ? id_of(st["id"].get<std::string>()) : -1;
      }
      return -1;
    };
    int32_t first = special_id(single.front()), last = special_id(single.back());
    if (first >= 0) {
      v.bos_id = first;
      v.add_bos = true;
    }
    if (last >= 0 && single.size() > 1) {
      v.eos_id = last;
      v.add_eos = true;
    }
  }
  std::string dir = path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  std::string cfg_path = dir + "tokenizer_config.json";
  if (auto cfg_text = ReadFileToString(cfg_path); cfg_text.ok()) {
    json cfg;
    try {
      cfg = json::parse(*cfg_text);
    } catch (const std::exception& e) {
      return Status::Error(cfg_path + ": not valid JSON: " + e.what());
    }
    Ctx cc{cfg_path};
    std::string bos = ConfigToken(cfg, "bos_token"), eos = ConfigToken(cfg, "eos_token");
    if (!bos.empty()) {
      v.bos_id = id_of(bos);
      if (v.bos_id < 0) return cc.Err("bos_token", "'" + bos + "' is not in the vocabulary of " + path);
      // Llama-3 adds BOS (llama.cpp does) even when the file's post-processor forgets to.
      if (bos == "<|begin_of_text|>") v.add_bos = true;
    }
    if (!eos.empty()) {
      v.eos_id = id_of(eos);
      if (v.eos_id < 0) return cc.Err("eos_token", "'" + eos + "' is not in the vocabulary of " + path);
    }
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) v.add_bos = cfg["add_bos_token"].get<bool>();
    if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) v.add_eos = cfg["add_eos_token"].get<bool>();
    if (cfg.contains("chat_template")) {
      const json& ct = cfg["chat_template"];
      if (ct.is_string()) {
        v.chat_template = ct.get<std::string>();
      } else if (ct.is_array()) {
        for (const json& e : ct) {
          if (e.is_object() && e.contains("name") && e["name"] == "default" && e.contains("template") &&
              e["template"].is_string()) {
            v.chat_template = e["template"].get<std::string>();
          }
        }
      }
    }
  }
  if (v.add_bos && v.bos_id < 0) v.add_bos = false;
  return MakeBpeTokenizer(std::move(v), path);
}

}  // namespace lathe::tokenizer
