// Readers for SentencePiece tokenizer.model (a protobuf, decoded by hand: only the few fields a
// BPE model needs) and llama2.c tokenizer.bin. Every read is bounds-checked; errors name the
// file, the field and the byte offset.
#include <cctype>
#include <cstring>

#include "core/mapped_file.h"
#include "tokenizer/spm.h"

namespace lathe::tokenizer {
namespace {

// Minimal protobuf wire-format cursor over [p, end).
class ProtoReader {
 public:
  ProtoReader(const uint8_t* base, size_t begin, size_t end, const std::string& file)
      : base_(base), pos_(begin), end_(end), file_(file) {}
  bool done() const { return pos_ >= end_; }
  size_t pos() const { return pos_; }

  Status Varint(uint64_t* v, const char* what) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= end_) return Err(what, "truncated varint");
      uint8_t b = base_[pos_++];
      *v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return Status::Ok();
    }
    return Err(what, "varint longer than 10 bytes");
  }
  Status Fixed32(uint32_t* v, const char* what) {
    if (end_ - pos_ < 4) return Err(what, "truncated fixed32");
    std::memcpy(v, base_ + pos_, 4);
    pos_ += 4;
    return Status::Ok();
  }
  // A length-delimited field: returns its [begin, end) and skips it.
  Status Bytes(size_t* begin, size_t* end, const char* what) {
    uint64_t len;
    LATHE_RETURN_IF_ERROR(Varint(&len, what));
    if (len > end_ - pos_) return Err(what, StrFormat("length %llu runs past the end", (unsigned long long)len));
    *begin = pos_;
    *end = pos_ + len;
    pos_ += len;
    return Status::Ok();
  }
  Status Skip(uint32_t wire, const char* what) {
    uint64_t v;
    size_t b = 0, e = 0;
    switch (wire) {
      case 0: return Varint(&v, what);
      case 1:
        if (end_ - pos_ < 8) return Err(what, "truncated fixed64");
        pos_ += 8;
        return Status::Ok();
      case 2: return Bytes(&b, &e, what);
      case 5:
        if (end_ - pos_ < 4) return Err(what, "truncated fixed32");
        pos_ += 4;
        return Status::Ok();
      default: return Err(what, StrFormat("unsupported wire type %u", wire));
    }
  }
  Status Err(const char* what, const std::string& msg) const {
    return Status::Error(StrFormat("%s: field %s at byte %zu: %s", file_.c_str(), what, pos_, msg.c_str()));
  }

 private:
  const uint8_t* base_;
  size_t pos_, end_;
  const std::string& file_;
};

Status ReadPiece(const uint8_t* base, size_t b, size_t e, const std::string& file, SpmVocab* v) {
  ProtoReader r(base, b, e, file);
  std::string piece;
  float score = 0;
  uint64_t type = 1;
  while (!r.done()) {
    uint64_t key;
    LATHE_RETURN_IF_ERROR(r.Varint(&key, "pieces"));
    uint32_t field = key >> 3, wire = key & 7;
    if (field == 1 && wire == 2) {
      size_t pb = 0, pe = 0;
      LATHE_RETURN_IF_ERROR(r.Bytes(&pb, &pe, "pieces.piece"));
      piece.assign(reinterpret_cast<const char*>(base + pb), pe - pb);
    } else if (field == 2 && wire == 5) {
      uint32_t bits = 0;
      LATHE_RETURN_IF_ERROR(r.Fixed32(&bits, "pieces.score"));
      std::memcpy(&score, &bits, 4);
    } else if (field == 3 && wire == 0) {
      LATHE_RETURN_IF_ERROR(r.Varint(&type, "pieces.type"));
      if (type < 1 || type > 6) return r.Err("pieces.type", StrFormat("unknown piece type %llu", (unsigned long long)type));
    } else {
      LATHE_RETURN_IF_ERROR(r.Skip(wire, "pieces"));
    }
  }
  v->pieces.push_back(std::move(piece));
  v->scores.push_back(score);
  v->types.push_back(static_cast<TokenType>(type));
  return Status::Ok();
}

}  // namespace

Result<SpmVocab> ReadSentencePieceModel(const std::string& path) {
  LATHE_ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  const uint8_t* base = file->data();
  SpmVocab v;
  int64_t model_type = 2, unk_id = 0, bos_id = 1, eos_id = 2;
  ProtoReader r(base, 0, file->size(), path);
  while (!r.done()) {
    uint64_t key;
    LATHE_RETURN_IF_ERROR(r.Varint(&key, "ModelProto"));
    uint32_t field = key >> 3, wire = key & 7;
    if ((field == 1 || field == 2 || field == 3) && wire == 2) {
      size_t b = 0, e = 0;
      LATHE_RETURN_IF_ERROR(r.Bytes(&b, &e, field == 1 ? "pieces" : field == 2 ? "trainer_spec" : "normalizer_spec"));
      if (field == 1) {
        LATHE_RETURN_IF_ERROR(ReadPiece(base, b, e, path, &v));
        continue;
      }
      ProtoReader sub(base, b, e, path);
      while (!sub.done()) {
        uint64_t k;
        LATHE_RETURN_IF_ERROR(sub.Varint(&k, field == 2 ? "trainer_spec" : "normalizer_spec"));
        uint32_t f = k >> 3, w = k & 7;
        uint64_t val = 0;
        if (w != 0) {
          LATHE_RETURN_IF_ERROR(sub.Skip(w, field == 2 ? "trainer_spec" : "normalizer_spec"));
          continue;
        }
        LATHE_RETURN_IF_ERROR(sub.Varint(&val, field == 2 ? "trainer_spec" : "normalizer_spec"));
        auto as_int = static_cast<int64_t>(val);  // negative int32 are sign-extended varints
        if (field == 2) {
          if (f == 3) model_type = as_int;
          if (f == 40) unk_id = as_int;
          if (f == 41) bos_id = as_int;
          if (f == 42) eos_id = as_int;
        } else {
          if (f == 3) v.add_space_prefix = val != 0;
          if (f == 4) v.remove_extra_whitespaces = val != 0;
        }
      }
    } else {
      LATHE_RETURN_IF_ERROR(r.Skip(wire, "ModelProto"));
    }
  }
  if (v.pieces.empty()) return Status::Error(path + ": field pieces: no pieces (not a SentencePiece model?)");
  if (model_type != 2) {
    return Status::Error(StrFormat("%s: field trainer_spec.model_type is %lld; only BPE (2) is supported",
                                   path.c_str(), static_cast<long long>(model_type)));
  }
  v.unk_id = static_cast<int32_t>(unk_id);
  v.bos_id = static_cast<int32_t>(bos_id);
  v.eos_id = static_cast<int32_t>(eos_id);
  v.add_bos = true;
  return v;
}

Result<SpmVocab> ReadLlama2cBin(const std::string& path, int vocab_size) {
  if (vocab_size <= 0) return Status::Error(StrFormat("%s: vocab_size %d must be positive", path.c_str(), vocab_size));
  LATHE_ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  const uint8_t* p = file->data();
  const size_t size = file->size();
  size_t pos = 0;
  auto read32 = [&](void* dst, const char* what, int index) -> Status {
    if (size - pos < 4) {
      return Status::Error(StrFormat("%s: token %d: %s at byte %zu: file ends (expected %d tokens)", path.c_str(),
                                     index, what, pos, vocab_size));
    }
    std::memcpy(dst, p + pos, 4);
    pos += 4;
    return Status::Ok();
  };
  int32_t max_len;
  LATHE_RETURN_IF_ERROR(read32(&max_len, "max_token_length", -1));
  SpmVocab v;
  v.pieces.reserve(vocab_size);
  for (int i = 0; i < vocab_size; ++i) {
    float score = 0;
    int32_t len = 0;
    LATHE_RETURN_IF_ERROR(read32(&score, "score", i));
    LATHE_RETURN_IF_ERROR(read32(&len, "length", i));
    if (len < 0 || static_cast<size_t>(len) > size - pos) {
      return Status::Error(StrFormat("%s: token %d: length %d at byte %zu runs past the end of the file",
                                     path.c_str(), i, len, pos - 4));
    }
    std::string text(reinterpret_cast<const char*>(p + pos), len);
    pos += len;
    // llama2.c's export wrote U+2581 as a plain space and BOS/EOS as "\n<s>\n" / "\n</s>\n".
    TokenType type = TokenType::kNormal;
    if (text == "\n<s>\n" || text == "\n</s>\n") {
      text = text.substr(1, text.size() - 2);
      type = TokenType::kControl;
    } else if (i == 0 && text == "<unk>") {
      type = TokenType::kUnknown;
    } else if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>' &&
               std::isxdigit(static_cast<unsigned char>(text[3])) && std::isxdigit(static_cast<unsigned char>(text[4]))) {
      type = TokenType::kByte;
    } else {
      std::string esc;
      for (char c : text) {
        if (c == ' ') {
          esc += "\xE2\x96\x81";
        } else {
          esc.push_back(c);
        }
      }
      text = std::move(esc);
    }
    v.pieces.push_back(std::move(text));
    v.scores.push_back(score);
    v.types.push_back(type);
  }
  v.unk_id = v.types[0] == TokenType::kUnknown ? 0 : -1;
  v.bos_id = vocab_size > 1 ? 1 : -1;
  v.eos_id = vocab_size > 2 ? 2 : -1;
  v.add_bos = true;
  v.add_space_prefix = true;
  return v;
}

}  // namespace lathe::tokenizer
