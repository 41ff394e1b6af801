// Tokenizer factories for GGUF, tokenizer.model and tokenizer.bin, and the StreamDecoder.
#include "tokenizer/tokenizer.h"

#include "formats/gguf.h"
#include "tokenizer/bpe.h"
#include "tokenizer/spm.h"
#include "tokenizer/unicode.h"

namespace lathe::tokenizer {
namespace {

using formats::GgufFile;
using formats::GgufValue;
using formats::GgufValueType;

Result<const GgufValue*> FindArray(const GgufFile& g, const std::string& key, GgufValueType elem, bool required) {
  const GgufValue* v = g.Find(key);
  if (!v) {
    if (required) return Status::Error(g.path() + ": missing key " + key);
    return static_cast<const GgufValue*>(nullptr);
  }
  bool ok = v->type == GgufValueType::kArray;
  if (ok && elem == GgufValueType::kString) ok = v->elem_type == GgufValueType::kString;
  if (ok && elem == GgufValueType::kFloat32) ok = !v->floats.empty() || v->array_size == 0 || !v->ints.empty();
  if (ok && elem == GgufValueType::kInt32) ok = v->elem_type != GgufValueType::kString;
  if (!ok) {
    return Status::Error(StrFormat("%s: key %s has type %s (elements %s), expected an array of %s", g.path().c_str(),
                                   key.c_str(), formats::GgufValueTypeName(v->type),
                                   formats::GgufValueTypeName(v->elem_type), formats::GgufValueTypeName(elem)));
  }
  return v;
}

Result<int32_t> OptionalId(const GgufFile& g, const std::string& key) {
  LATHE_ASSIGN_OR_RETURN(int64_t id, g.GetIntOr(key, -1));
  // Some converters write UINT32_MAX for "none".
  if (id < 0 || id > INT32_MAX) return int32_t{-1};
  return static_cast<int32_t>(id);
}

}  // namespace

namespace {

// What every GGUF vocabulary has (tokenizer.ggml.*): the model kind, tokens and their types, the special ids, the
// chat template.
struct GgufVocabCommon {
  std::string model;
  const GgufValue* tokens = nullptr;
  std::vector<TokenType> types;
  int32_t bos = -1, eos = -1, unk = -1;
  std::vector<int32_t> extra_stop;
  std::string chat_template;
  bool add_eos = false;
};

Result<GgufVocabCommon> ReadGgufVocabCommon(const GgufFile& g) {
  const std::string& path = g.path();
  GgufVocabCommon c;
  LATHE_ASSIGN_OR_RETURN(c.model, g.GetString("tokenizer.ggml.model"));
  LATHE_ASSIGN_OR_RETURN(c.tokens, FindArray(g, "tokenizer.ggml.tokens", GgufValueType::kString, true));
  const size_t n = c.tokens->strings.size();
  if (n == 0) return Status::Error(path + ": key tokenizer.ggml.tokens is empty");
  LATHE_ASSIGN_OR_RETURN(const GgufValue* ttype, FindArray(g, "tokenizer.ggml.token_type", GgufValueType::kInt32, false));
  if (ttype) {
    if (ttype->ints.size() != n) {
      return Status::Error(StrFormat("%s: key tokenizer.ggml.token_type has %zu entries for %zu tokens", path.c_str(),
                                     ttype->ints.size(), n));
    }
    c.types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      int64_t t = ttype->ints[i];
      if (t < 1 || t > 6) {
        return Status::Error(StrFormat("%s: key tokenizer.ggml.token_type[%zu] = %lld is not a token type (1..6)",
                                       path.c_str(), i, static_cast<long long>(t)));
      }
      c.types.push_back(static_cast<TokenType>(t));
    }
  }
  LATHE_ASSIGN_OR_RETURN(c.bos, OptionalId(g, "tokenizer.ggml.bos_token_id"));
  LATHE_ASSIGN_OR_RETURN(c.eos, OptionalId(g, "tokenizer.ggml.eos_token_id"));
  LATHE_ASSIGN_OR_RETURN(c.unk, OptionalId(g, "tokenizer.ggml.unknown_token_id"));
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    LATHE_ASSIGN_OR_RETURN(int32_t id, OptionalId(g, key));
    if (id >= 0) c.extra_stop.push_back(id);
  }
  LATHE_ASSIGN_OR_RETURN(c.chat_template, g.GetStringOr("tokenizer.chat_template", ""));
  LATHE_ASSIGN_OR_RETURN(c.add_eos, g.GetBoolOr("tokenizer.ggml.add_eos_token", false));
  return c;
}

Result<BpeVocab> BpeVocabOf(const GgufFile& g, GgufVocabCommon c) {
  const std::string& path = g.path();
  BpeVocab v;
  v.pieces = c.tokens->strings;
  v.types = std::move(c.types);
  LATHE_ASSIGN_OR_RETURN(const GgufValue* merges, FindArray(g, "tokenizer.ggml.merges", GgufValueType::kString, true));
  v.merges.reserve(merges->strings.size());
  for (size_t i = 0; i < merges->strings.size(); ++i) {
    const std::string& m = merges->strings[i];
    size_t sp = m.find(' ', 1);
    if (sp == std::string::npos) {
      return Status::Error(StrFormat("%s: key tokenizer.ggml.merges[%zu] = '%s' is not 'left right'", path.c_str(), i,
                                     m.c_str()));
    }
    v.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  LATHE_ASSIGN_OR_RETURN(std::string pre, g.GetStringOr("tokenizer.ggml.pre", "default"));
  auto p = PreTokenizer::ForGgufPre(pre);
  if (!p.ok()) return p.status().WithContext(path + ": tokenizer.ggml.pre '" + pre + "'");
  v.pre = std::move(p).value();
  bool llama3 = pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3";
  v.ignore_merges = llama3;
  v.bos_id = c.bos;
  v.eos_id = c.eos;
  v.unk_id = c.unk;
  v.extra_stop_ids = std::move(c.extra_stop);
  LATHE_ASSIGN_OR_RETURN(v.add_bos, g.GetBoolOr("tokenizer.ggml.add_bos_token", llama3));
  v.add_eos = c.add_eos;
  v.chat_template = std::move(c.chat_template);
  return v;
}

Result<SpmVocab> SpmVocabOf(const GgufFile& g, GgufVocabCommon c) {
  const std::string& path = g.path();
  const size_t n = c.tokens->strings.size();
  SpmVocab v;
  v.pieces = c.tokens->strings;
  LATHE_ASSIGN_OR_RETURN(const GgufValue* scores, FindArray(g, "tokenizer.ggml.scores", GgufValueType::kFloat32, false));
  if (scores) {
    if (scores->floats.size() != n) {
      return Status::Error(StrFormat("%s: key tokenizer.ggml.scores has %zu entries for %zu tokens", path.c_str(),
                                     scores->floats.size(), n));
    }
    v.scores.assign(scores->floats.begin(), scores->floats.end());
  } else {
    v.scores.assign(n, 0.0f);
  }
  v.types = std::move(c.types);
  v.bos_id = c.bos;
  v.eos_id = c.eos;
  v.unk_id = c.unk;
  v.extra_stop_ids = c.extra_stop;
  LATHE_ASSIGN_OR_RETURN(v.add_bos, g.GetBoolOr("tokenizer.ggml.add_bos_token", true));
  v.add_eos = c.add_eos;
  LATHE_ASSIGN_OR_RETURN(v.add_space_prefix, g.GetBoolOr("tokenizer.ggml.add_space_prefix", true));
  LATHE_ASSIGN_OR_RETURN(v.remove_extra_whitespaces, g.GetBoolOr("tokenizer.ggml.remove_extra_whitespaces", false));
  v.chat_template = std::move(c.chat_template);
  return v;
}

}  // namespace

Result<BpeVocab> ReadGgufBpeVocab(const formats::GgufFile& g) {
  LATHE_ASSIGN_OR_RETURN(GgufVocabCommon c, ReadGgufVocabCommon(g));
  if (c.model != "gpt2")
    return Status::Error(g.path() + ": key tokenizer.ggml.model is '" + c.model + "', not 'gpt2' (byte-level BPE)");
  return BpeVocabOf(g, std::move(c));
}

Result<SpmVocab> ReadGgufSpmVocab(const formats::GgufFile& g) {
  LATHE_ASSIGN_OR_RETURN(GgufVocabCommon c, ReadGgufVocabCommon(g));
  if (c.model != "llama")
    return Status::Error(g.path() + ": key tokenizer.ggml.model is '" + c.model + "', not 'llama' (SentencePiece)");
  return SpmVocabOf(g, std::move(c));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const formats::GgufFile& g) {
  const std::string& path = g.path();
  LATHE_ASSIGN_OR_RETURN(GgufVocabCommon c, ReadGgufVocabCommon(g));
  if (c.model == "llama") {
    LATHE_ASSIGN_OR_RETURN(SpmVocab v, SpmVocabOf(g, std::move(c)));
    return MakeSpmTokenizer(std::move(v), path);
  }
  if (c.model == "gpt2") {
    LATHE_ASSIGN_OR_RETURN(BpeVocab v, BpeVocabOf(g, std::move(c)));
    return MakeBpeTokenizer(std::move(v), path);
  }
  return Status::Error(path + ": key tokenizer.ggml.model is '" + c.model + "'; supported: llama, gpt2");
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromSentencePieceModel(const std::string& path) {
  LATHE_ASSIGN_OR_RETURN(SpmVocab v, ReadSentencePieceModel(path));
  return MakeSpmTokenizer(std::move(v), path);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromLlama2cBin(const std::string& path, int vocab_size) {
  LATHE_ASSIGN_OR_RETURN(SpmVocab v, ReadLlama2cBin(path, vocab_size));
  return MakeSpmTokenizer(std::move(v), path);
}

std::string StreamDecoder::Push(int32_t id) {
  if (id == tok_.bos_id() && id >= 0 && tok_.add_bos()) {
    after_bos_ = true;
    return {};
  }
  std::string bytes = tok_.TokenBytes(id);
  if (after_bos_ && tok_.add_space_prefix() && !bytes.empty() && bytes[0] == ' ') bytes.erase(0, 1);
  after_bos_ = false;
  pending_ += bytes;
  std::string out;
  size_t keep = AppendCompleteUtf8(pending_, &out);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out;
  if (!pending_.empty()) out = "\xEF\xBF\xBD";  // an incomplete sequence at the end
  pending_.clear();
  return out;
}

}  // namespace lathe::tokenizer
