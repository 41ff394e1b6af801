// GGUF parsing with a bounds-checked cursor.
#include "formats/gguf.h"

#include <cstring>
#include <limits>

namespace lathe::formats {

namespace {

constexpr uint64_t kMaxDims = 4;

class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& name) : d_(data), n_(size), name_(name) {}
  size_t pos() const { return p_; }
  size_t remaining() const { return n_ - p_; }

  Status Need(size_t k, const char* what) const {
    if (k > remaining()) {
      return Status::Error(StrFormat("%s: truncated at offset %zu: need %zu bytes for %s, %zu left",
                                     name_.c_str(), p_, k, what, remaining()));
    }
    return Status::Ok();
  }
  template <typename T>
  Status Read(T* out, const char* what) {
    LATHE_RETURN_IF_ERROR(Need(sizeof(T), what));
    std::memcpy(out, d_ + p_, sizeof(T));
    p_ += sizeof(T);
    return Status::Ok();
  }
  Status ReadString(std::string* out, const char* what) {
    uint64_t len;
    size_t at = p_;
    LATHE_RETURN_IF_ERROR(Read(&len, what));
    if (len > remaining()) {
      return Status::Error(StrFormat("%s: string length %llu at offset %zu (%s) exceeds the %zu bytes left",
                                     name_.c_str(), (unsigned long long)len, at, what, remaining()));
    }
    out->assign((const char*)d_ + p_, len);
    p_ += len;
    return Status::Ok();
  }

 private:
  const uint8_t* d_;
  size_t n_;
  size_t p_ = 0;
  const std::string& name_;
};

size_t ScalarSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16: case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32: case GgufValueType::kInt32: case GgufValueType::kFloat32: return 4;
    case GgufValueType::kUint64: case GgufValueType::kInt64: case GgufValueType::kFloat64: return 8;
    default: return 0;
  }
}

// Reads one scalar of type t at the cursor into (i, u, f).
Status ReadScalar(Cursor& c, GgufValueType t, int64_t* i, uint64_t* u, double* f, const char* what) {
  switch (t) {
    case GgufValueType::kUint8: { uint8_t v{}; LATHE_RETURN_IF_ERROR(c.Read(&v, what)); *i = v; *u = v; *f = v; break; }
    case GgufValueType::kInt8: { int8_t v{}; LATHE_RETURN_IF_ERROR(c.Read(&v, what)); *i = v; *u = (uint64_t)v; *f = v; break; }
    case GgufValueType::kBool: { uint8_t v{}; LATHE_RETURN_IF_ERROR(c.Read(&v, what)); *i = v != 0; *u = v != 0; *f = v != 0; break; }
    case GgufValueType::kUint16: { uint16_t v{}; LATHE_RETURN_IF_ERROR(c.Read(&v, what)); *i = v; *u = v; *f = v; break; }
    case GgufValueType::kInt16: { int16_t v{}; LATHE_RETURN_IF_ERROR(c.Read(&v, what)); *i = v; *u = (uint64_t)v; *f = v; break; }
    case GgufValueType::kUint32: { uint32_t v{}; LATHE_RETURN_IF_ERROR(c.Read(&v, what)); *i = v; *u = v; *f = v; break; }
    case GgufValueType::kInt32: { int32_t v{}; LATHE_RETURN_IF_ERROR(c.Read(&v, what)); *i = v; *u = (uint64_t)v; *f = v; break; }
    case GgufValueType::kFloat32: { float v{}; LATHE_RETURN_IF_ERROR(c.Read(&v, what)); *f = v; *i = 0; *u = 0; break; }
    case GgufValueType::kUint64: { uint64_t v{}; LATHE_RETURN_IF_ERROR(c.Read(&v, what)); *u = v; *i = (int64_t)v; *f = (double)v; break; }
    case GgufValueType::kInt64: { int64_t v{}; LATHE_RETURN_IF_ERROR(c.Read(&v, what)); *i = v; *u = (uint64_t)v; *f = (double)v; break; }
    case GgufValueType::kFloat64: { double v{}; LATHE_RETURN_IF_ERROR(c.Read(&v, what)); *f = v; *i = 0; *u = 0; break; }
    default: return Status::Error("not a scalar type");
  }
  return Status::Ok();
}

}  // namespace

const char* GgufValueTypeName(GgufValueType t) {
  static const char* kNames[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                 "bool", "string", "array", "uint64", "int64", "float64"};
  uint32_t i = (uint32_t)t;
  return i < 13 ? kNames[i] : "unknown";
}

bool GgmlTypeToDType(uint32_t ggml_type, DType* out) {
  switch ((GgmlType)ggml_type) {
    case GgmlType::kF32: *out = DType::kF32; return true;
    case GgmlType::kF16: *out = DType::kF16; return true;
    case GgmlType::kBF16: *out = DType::kBF16; return true;
    case GgmlType::kQ8_0: *out = DType::kQ8_0; return true;
    case GgmlType::kQ4_0: *out = DType::kQ4_0; return true;
    case GgmlType::kQ4_1: *out = DType::kQ4_1; return true;
    case GgmlType::kQ5_0: *out = DType::kQ5_0; return true;
    case GgmlType::kQ5_1: *out = DType::kQ5_1; return true;
    case GgmlType::kQ2_K: *out = DType::kQ2_K; return true;
    case GgmlType::kQ3_K: *out = DType::kQ3_K; return true;
    case GgmlType::kQ4_K: *out = DType::kQ4_K; return true;
    case GgmlType::kQ5_K: *out = DType::kQ5_K; return true;
    case GgmlType::kQ6_K: *out = DType::kQ6_K; return true;
    case GgmlType::kI8: *out = DType::kI8; return true;
    case GgmlType::kI16: *out = DType::kI16; return true;
    case GgmlType::kI32: *out = DType::kI32; return true;
    case GgmlType::kI64: *out = DType::kI64; return true;
    case GgmlType::kF64: *out = DType::kF64; return true;
    default: return false;
  }
}

bool DTypeToGgmlType(DType t, uint32_t* out) {
  for (uint32_t g = 0; g <= 40; ++g) {
    DType d;
    if (GgmlTypeToDType(g, &d) && d == t) {
      *out = g;
      return true;
    }
  }
  return false;
}

namespace {
struct GgmlBlock {
  uint32_t type;
  const char* name;
  int block_size, block_bytes;
};
// From gguf-py's GGML_QUANT_SIZES.
const GgmlBlock kGgmlBlocks[] = {
    {0, "F32", 1, 4},        {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},      {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},     {7, "Q5_1", 32, 24},      {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 40},
    {10, "Q2_K", 256, 84},   {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},  {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},  {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},
    {22, "IQ2_S", 256, 82},  {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},       {27, "I64", 1, 8},        {28, "F64", 1, 8},        {29, "IQ1_M", 256, 56},
    {30, "BF16", 1, 2},      {34, "TQ1_0", 256, 54},   {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
};
const GgmlBlock* FindGgmlBlock(uint32_t t) {
  for (const GgmlBlock& b : kGgmlBlocks) {
    if (b.type == t) return &b;
  }
  return nullptr;
}
}  // namespace

bool GgmlTypeBlock(uint32_t ggml_type, int* block_size, int* block_bytes) {
  const GgmlBlock* b = FindGgmlBlock(ggml_type);
  if (!b) return false;
  *block_size = b->block_size;
  *block_bytes = b->block_bytes;
  return true;
}

const char* GgmlTypeName(uint32_t t) {
  if (const GgmlBlock* b = FindGgmlBlock(t)) return b->name;
  return "unknown";
}

bool GgufValue::IsInteger() const {
  switch (type) {
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kUint16:
    case GgufValueType::kInt16: case GgufValueType::kUint32: case GgufValueType::kInt32:
    case GgufValueType::kUint64: case GgufValueType::kInt64: return true;
    default: return false;
  }
}

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  LATHE_ASSIGN_OR_RETURN(auto mf, MappedFile::Open(path));
  std::unique_ptr<GgufFile> g(new GgufFile());
  g->data_ = mf->data();
  g->size_ = mf->size();
  g->name_ = path;
  g->file_ = std::move(mf);
  LATHE_RETURN_IF_ERROR(g->ParseAll());
  return g;
}

Result<std::unique_ptr<GgufFile>> GgufFile::Parse(const uint8_t* data, size_t size, const std::string& name) {
  std::unique_ptr<GgufFile> g(new GgufFile());
  g->data_ = data;
  g->size_ = size;
  g->name_ = name;
  LATHE_RETURN_IF_ERROR(g->ParseAll());
  return g;
}

Status GgufFile::ParseAll() {
  Cursor c(data_, size_, name_);
  uint32_t magic;
  LATHE_RETURN_IF_ERROR(c.Read(&magic, "magic"));
  if (magic != kGgufMagic) {
    return Status::Error(StrFormat("%s: not a GGUF file (magic 0x%08x at offset 0, expected \"GGUF\")",
                                   name_.c_str(), magic));
  }
  LATHE_RETURN_IF_ERROR(c.Read(&version_, "version"));
  if (version_ != 2 && version_ != 3) {
    return Status::Error(StrFormat("%s: unsupported GGUF version %u (expected 2 or 3)", name_.c_str(), version_));
  }
  uint64_t n_tensors, n_kv;
  LATHE_RETURN_IF_ERROR(c.Read(&n_tensors, "tensor count"));
  LATHE_RETURN_IF_ERROR(c.Read(&n_kv, "metadata count"));
  // Each kv needs >= 8+0+4+1 bytes and each tensor info >= 8+4+8+4+8; reject impossible counts
  // before allocating anything.
  if (n_kv > c.remaining() / 13 || n_tensors > c.remaining() / 32) {
    return Status::Error(StrFormat("%s: header claims %llu tensors and %llu metadata entries, more than the "
                                   "%zu-byte file can hold", name_.c_str(), (unsigned long long)n_tensors,
                                   (unsigned long long)n_kv, size_));
  }
  for (uint64_t k = 0; k < n_kv; ++k) {
    size_t at = c.pos();
    std::string key;
    LATHE_RETURN_IF_ERROR(c.ReadString(&key, "metadata key"));
    uint32_t type_raw;
    LATHE_RETURN_IF_ERROR(c.Read(&type_raw, "metadata value type"));
    GgufValue v;
    v.type = (GgufValueType)type_raw;
    auto err = [&](const std::string& what) {
      return Status::Error(StrFormat("%s: metadata key '%s' at offset %zu: %s", name_.c_str(), key.c_str(), at,
                                     what.c_str()));
    };
    if (v.type == GgufValueType::kString) {
      LATHE_RETURN_IF_ERROR(c.ReadString(&v.s, "metadata string").WithContext("key '" + key + "'"));
    } else if (v.type == GgufValueType::kArray) {
      uint32_t et;
      LATHE_RETURN_IF_ERROR(c.Read(&et, "array element type"));
      v.elem_type = (GgufValueType)et;
      uint64_t n;
      LATHE_RETURN_IF_ERROR(c.Read(&n, "array length"));
      v.array_size = n;
      if (v.elem_type == GgufValueType::kString) {
        if (n > c.remaining() / 8) return err(StrFormat("string array of %llu entries exceeds the file", (unsigned long long)n));
        v.strings.reserve(n < 65536 ? n : 65536);  // grow with the bytes actually read
        for (uint64_t j = 0; j < n; ++j) {
          v.strings.emplace_back();
          LATHE_RETURN_IF_ERROR(c.ReadString(&v.strings.back(), "array string").WithContext("key '" + key + "'"));
        }
      } else {
        size_t es = ScalarSize(v.elem_type);
        if (es == 0) return err(StrFormat("unsupported array element type %u", et));
        if (n > c.remaining() / es) return err(StrFormat("array of %llu elements exceeds the file", (unsigned long long)n));
        bool is_float = v.elem_type == GgufValueType::kFloat32 || v.elem_type == GgufValueType::kFloat64;
        if (is_float) v.floats.resize(n); else v.ints.resize(n);
        for (uint64_t j = 0; j < n; ++j) {
          int64_t i; uint64_t u; double f;
          LATHE_RETURN_IF_ERROR(ReadScalar(c, v.elem_type, &i, &u, &f, "array element"));
          if (is_float) v.floats[j] = f; else v.ints[j] = i;
        }
      }
    } else {
      if (ScalarSize(v.type) == 0) return err(StrFormat("unknown value type %u", type_raw));
      LATHE_RETURN_IF_ERROR(ReadScalar(c, v.type, &v.i, &v.u, &v.f, "metadata value").WithContext("key '" + key + "'"));
    }
    if (kv_.count(key)) return err("duplicate key");
    key_order_.push_back(key);
    kv_.emplace(std::move(key), std::move(v));
  }
  if (const GgufValue* a = Find("general.alignment")) {
    if (!a->IsInteger() || a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > (1u << 20)) {
      return Status::Error(StrFormat("%s: metadata key 'general.alignment' must be a power-of-two integer",
                                     name_.c_str()));
    }
    alignment_ = a->u;
  }
  // Grow as infos are actually read: a corrupt count must not allocate before the bytes are seen.
  tensors_.reserve(n_tensors < 4096 ? n_tensors : 4096);
  for (uint64_t t = 0; t < n_tensors; ++t) {
    tensors_.emplace_back();
    GgufTensorInfo& ti = tensors_.back();
    size_t at = c.pos();
    LATHE_RETURN_IF_ERROR(c.ReadString(&ti.name, "tensor name"));
    uint32_t n_dims;
    LATHE_RETURN_IF_ERROR(c.Read(&n_dims, "tensor n_dims"));
    auto err = [&](const std::string& what) {
      return Status::Error(StrFormat("%s: tensor '%s' (info at offset %zu): %s", name_.c_str(), ti.name.c_str(), at,
                                     what.c_str()));
    };
    if (n_dims == 0 || n_dims > kMaxDims) return err(StrFormat("%u dimensions (expected 1..4)", n_dims));
    ti.ne.resize(n_dims);
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne;
      LATHE_RETURN_IF_ERROR(c.Read(&ne, "tensor dimension"));
      if (ne == 0 || ne > (uint64_t)std::numeric_limits<int64_t>::max() / (uint64_t)numel) {
        return err(StrFormat("dimension %u is %llu (must be positive and not overflow)", d, (unsigned long long)ne));
      }
      ti.ne[d] = (int64_t)ne;
      numel *= (int64_t)ne;
    }
    ti.shape.assign(ti.ne.rbegin(), ti.ne.rend());
    LATHE_RETURN_IF_ERROR(c.Read(&ti.ggml_type, "tensor type"));
    LATHE_RETURN_IF_ERROR(c.Read(&ti.offset, "tensor offset"));
    ti.supported = GgmlTypeToDType(ti.ggml_type, &ti.dtype);
    int block_size, block_bytes;
    ti.known_size = GgmlTypeBlock(ti.ggml_type, &block_size, &block_bytes);
    if (ti.known_size) {
      if (ti.ne[0] % block_size != 0) {
        return err(StrFormat("row length %lld is not a multiple of the %s block size %d", (long long)ti.ne[0],
                             GgmlTypeName(ti.ggml_type), block_size));
      }
      if ((uint64_t)numel / block_size > std::numeric_limits<uint64_t>::max() / block_bytes) {
        return err("size overflows");
      }
      ti.nbytes = (uint64_t)numel / block_size * block_bytes;
    }
    if (tensor_index_.count(ti.name)) return err("duplicate tensor name");
    tensor_index_[ti.name] = t;
  }
  uint64_t pos = c.pos();
  data_offset_ = (pos + alignment_ - 1) / alignment_ * alignment_;
  for (GgufTensorInfo& ti : tensors_) {
    auto err = [&](const std::string& what) {
      return Status::Error(StrFormat("%s: tensor '%s': %s", name_.c_str(), ti.name.c_str(), what.c_str()));
    };
    if (ti.offset % alignment_ != 0) {
      return err(StrFormat("data offset %llu is not aligned to %llu", (unsigned long long)ti.offset,
                           (unsigned long long)alignment_));
    }
    if (ti.offset > size_ || data_offset_ > size_ - ti.offset) {
      return err(StrFormat("data offset %llu is past the end of the file (%zu bytes)",
                           (unsigned long long)(data_offset_ + ti.offset), size_));
    }
    ti.offset += data_offset_;
    if (ti.known_size && ti.nbytes > size_ - ti.offset) {
      return err(StrFormat("data at offset %llu needs %llu bytes but the file ends after %llu (truncated file?)",
                           (unsigned long long)ti.offset, (unsigned long long)ti.nbytes,
                           (unsigned long long)(size_ - ti.offset)));
    }
  }
  return Status::Ok();
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

Result<std::string> GgufFile::GetString(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Status::Error(StrFormat("%s: missing metadata key '%s'", name_.c_str(), key.c_str()));
  if (v->type != GgufValueType::kString) {
    return Status::Error(StrFormat("%s: metadata key '%s' is %s, expected string", name_.c_str(), key.c_str(),
                                   GgufValueTypeName(v->type)));
  }
  return v->s;
}

Result<int64_t> GgufFile::GetInt(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Status::Error(StrFormat("%s: missing metadata key '%s'", name_.c_str(), key.c_str()));
  if (!v->IsInteger()) {
    return Status::Error(StrFormat("%s: metadata key '%s' is %s, expected an integer", name_.c_str(), key.c_str(),
                                   GgufValueTypeName(v->type)));
  }
  return v->i;
}

Result<double> GgufFile::GetFloat(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Status::Error(StrFormat("%s: missing metadata key '%s'", name_.c_str(), key.c_str()));
  if (v->IsFloat()) return v->f;
  if (v->IsInteger()) return (double)v->i;
  return Status::Error(StrFormat("%s: metadata key '%s' is %s, expected a number", name_.c_str(), key.c_str(),
                                 GgufValueTypeName(v->type)));
}

Result<bool> GgufFile::GetBool(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Status::Error(StrFormat("%s: missing metadata key '%s'", name_.c_str(), key.c_str()));
  if (v->type != GgufValueType::kBool) {
    return Status::Error(StrFormat("%s: metadata key '%s' is %s, expected bool", name_.c_str(), key.c_str(),
                                   GgufValueTypeName(v->type)));
  }
  return v->i != 0;
}

Result<int64_t> GgufFile::GetIntOr(const std::string& key, int64_t def) const {
  return Has(key) ? GetInt(key) : Result<int64_t>(def);
}
Result<double> GgufFile::GetFloatOr(const std::string& key, double def) const {
  return Has(key) ? GetFloat(key) : Result<double>(def);
}
Result<bool> GgufFile::GetBoolOr(const std::string& key, bool def) const {
  return Has(key) ? GetBool(key) : Result<bool>(def);
}
Result<std::string> GgufFile::GetStringOr(const std::string& key, const std::string& def) const {
  return Has(key) ? GetString(key) : Result<std::string>(def);
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<Tensor> GgufFile::GetTensor(const std::string& name) const {
  const GgufTensorInfo* ti = FindTensor(name);
  if (!ti) return Status::Error(StrFormat("%s: missing tensor '%s'", name_.c_str(), name.c_str()));
  if (!ti->supported) {
    return Status::Error(StrFormat("%s: tensor '%s' has type %s (%u), which lathe does not support; supported: "
                                   "F32, F16, BF16, Q8_0, Q4_0, Q4_1", name_.c_str(), name.c_str(),
                                   GgmlTypeName(ti->ggml_type), ti->ggml_type));
  }
  Tensor t;
  t.data = data_ + ti->offset;
  t.dtype = ti->dtype;
  t.shape = ti->shape;
  return t;
}

}  // namespace lathe::formats
