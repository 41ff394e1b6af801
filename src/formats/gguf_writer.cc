// GgufWriter: serialization of metadata, tensor infos and padded tensor data.
#include "formats/gguf_writer.h"

#include <cmath>
#include <cstring>

#include "formats/atomic_file.h"

namespace lathe::formats {

namespace {

constexpr size_t kMaxTensorName = 64;        // GGML_MAX_NAME, including the NUL

bool IsIntType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kUint16:
    case GgufValueType::kInt16: case GgufValueType::kUint32: case GgufValueType::kInt32:
    case GgufValueType::kUint64: case GgufValueType::kInt64: case GgufValueType::kBool: return true;
    default: return false;
  }
}

// Appends little-endian scalars to a byte string.
class Bytes {
 public:
  template <typename T>
  void Put(T v) {
    out.append((const char*)&v, sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    out += s;
  }
  void PutInt(GgufValueType t, int64_t i, uint64_t u) {
    switch (t) {
      case GgufValueType::kUint8: Put<uint8_t>((uint8_t)i); break;
      case GgufValueType::kInt8: Put<int8_t>((int8_t)i); break;
      case GgufValueType::kBool: Put<uint8_t>(i != 0); break;
      case GgufValueType::kUint16: Put<uint16_t>((uint16_t)i); break;
      case GgufValueType::kInt16: Put<int16_t>((int16_t)i); break;
      case GgufValueType::kUint32: Put<uint32_t>((uint32_t)i); break;
      case GgufValueType::kInt32: Put<int32_t>((int32_t)i); break;
      case GgufValueType::kUint64: Put<uint64_t>(u); break;
      case GgufValueType::kInt64: Put<int64_t>(i); break;
      default: break;
    }
  }
  void PutFloat(GgufValueType t, double f) {
    if (t == GgufValueType::kFloat32) {
      // Saturate instead of the undefined conversion of an out-of-range double.
      if (f > 3.4028234663852886e38) Put<float>(HUGE_VALF);
      else if (f < -3.4028234663852886e38) Put<float>(-HUGE_VALF);
      else Put<float>((float)f);
    }
    else Put<double>(f);
  }
  std::string out;
};

GgufValue Scalar(GgufValueType t, int64_t i, uint64_t u, double f) {
  GgufValue v;
  v.type = t;
  v.i = i;
  v.u = u;
  v.f = f;
  return v;
}

}  // namespace

void GgufWriter::Set(const std::string& key, GgufValue value) {
  for (Kv& kv : kv_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  kv_.push_back({key, std::move(value)});
}

void GgufWriter::SetString(const std::string& key, const std::string& v) {
  GgufValue g;
  g.type = GgufValueType::kString;
  g.s = v;
  Set(key, std::move(g));
}
void GgufWriter::SetBool(const std::string& key, bool v) { Set(key, Scalar(GgufValueType::kBool, v, v, v)); }
void GgufWriter::SetUint8(const std::string& key, uint8_t v) { Set(key, Scalar(GgufValueType::kUint8, v, v, v)); }
void GgufWriter::SetInt8(const std::string& key, int8_t v) { Set(key, Scalar(GgufValueType::kInt8, v, (uint64_t)v, v)); }
void GgufWriter::SetUint16(const std::string& key, uint16_t v) { Set(key, Scalar(GgufValueType::kUint16, v, v, v)); }
void GgufWriter::SetInt16(const std::string& key, int16_t v) { Set(key, Scalar(GgufValueType::kInt16, v, (uint64_t)v, v)); }
void GgufWriter::SetUint32(const std::string& key, uint32_t v) { Set(key, Scalar(GgufValueType::kUint32, v, v, v)); }
void GgufWriter::SetInt32(const std::string& key, int32_t v) { Set(key, Scalar(GgufValueType::kInt32, v, (uint64_t)v, v)); }
void GgufWriter::SetUint64(const std::string& key, uint64_t v) {
  Set(key, Scalar(GgufValueType::kUint64, (int64_t)v, v, (double)v));
}
void GgufWriter::SetInt64(const std::string& key, int64_t v) {
  Set(key, Scalar(GgufValueType::kInt64, v, (uint64_t)v, (double)v));
}
void GgufWriter::SetFloat32(const std::string& key, float v) { Set(key, Scalar(GgufValueType::kFloat32, 0, 0, v)); }
void GgufWriter::SetFloat64(const std::string& key, double v) { Set(key, Scalar(GgufValueType::kFloat64, 0, 0, v)); }

void GgufWriter::SetStringArray(const std::string& key, std::vector<std::string> v) {
  GgufValue g;
  g.type = GgufValueType::kArray;
  g.elem_type = GgufValueType::kString;
  g.array_size = v.size();
  g.strings = std::move(v);
  Set(key, std::move(g));
}

void GgufWriter::SetIntArray(const std::string& key, GgufValueType elem, std::vector<int64_t> v) {
  GgufValue g;
  g.type = GgufValueType::kArray;
  g.elem_type = elem;
  g.array_size = v.size();
  g.ints = std::move(v);
  Set(key, std::move(g));
}

void GgufWriter::SetFloatArray(const std::string& key, GgufValueType elem, std::vector<double> v) {
  GgufValue g;
  g.type = GgufValueType::kArray;
  g.elem_type = elem;
  g.array_size = v.size();
  g.floats = std::move(v);
  Set(key, std::move(g));
}

namespace {

// A tensor's GGML type; the error names it when its dtype has none.
Result<uint32_t> GgmlTypeOf(const std::string& name, DType dtype) {
  uint32_t ggml_type;
  if (!DTypeToGgmlType(dtype, &ggml_type)) {
    return Status::Error(StrFormat("GGUF writer: tensor '%s': dtype %s has no GGML type", name.c_str(),
                                   DTypeName(dtype)));
  }
  return ggml_type;
}

}  // namespace

Status GgufWriter::AddTensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                             const void* data, size_t nbytes) {
  LATHE_ASSIGN_OR_RETURN(uint32_t ggml_type, GgmlTypeOf(name, dtype));
  return AddRawTensor(name, ggml_type, shape, data, nbytes);
}

Status GgufWriter::AddRawTensor(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& shape,
                                const void* data, size_t nbytes) {
  return Add(name, ggml_type, shape, data, nbytes, nullptr);
}

Status GgufWriter::AddTensorFilled(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                                   size_t nbytes, TensorFill fill) {
  LATHE_ASSIGN_OR_RETURN(uint32_t ggml_type, GgmlTypeOf(name, dtype));
  return Add(name, ggml_type, shape, nullptr, nbytes, std::move(fill));
}

Status GgufWriter::Add(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& shape,
                       const void* data, size_t nbytes, TensorFill fill) {
  auto err = [&](const std::string& what) {
    return Status::Error(StrFormat("GGUF writer: tensor '%s': %s", name.c_str(), what.c_str()));
  };
  if (name.size() >= kMaxTensorName) return err("name is longer than 63 bytes (ggml's limit)");
  for (const TensorEntry& t : tensors_) {
    if (t.name == name) return err("duplicate tensor name");
  }
  if (shape.empty() || shape.size() > 4) return err(StrFormat("%zu dimensions (GGUF holds 1..4)", shape.size()));
  int block_size, block_bytes;
  if (!GgmlTypeBlock(ggml_type, &block_size, &block_bytes)) return err(StrFormat("unknown GGML type %u", ggml_type));
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d <= 0 || __builtin_mul_overflow(numel, d, &numel)) return err("dimensions must be positive");
  }
  if (shape.back() % block_size != 0) {
    return err(StrFormat("row length %lld is not a multiple of the %s block size %d", (long long)shape.back(),
                         GgmlTypeName(ggml_type), block_size));
  }
  uint64_t want;
  if (__builtin_mul_overflow((uint64_t)(numel / block_size), (uint64_t)block_bytes, &want)) return err("size overflows");
  if (want != nbytes) return err(StrFormat("shape needs %llu bytes, got %zu", (unsigned long long)want, nbytes));
  if (!data && !fill) return err("no data");
  tensors_.push_back(
      {name, ggml_type, std::vector<int64_t>(shape.rbegin(), shape.rend()), data, nbytes, std::move(fill)});
  return Status::Ok();
}

Result<uint64_t> GgufWriter::Alignment(const std::string& where) const {
  for (const Kv& kv : kv_) {
    if (kv.key != "general.alignment") continue;
    uint64_t a = kv.value.type == GgufValueType::kUint64 ? kv.value.u : (uint64_t)kv.value.i;
    if (!kv.value.IsInteger() || a == 0 || (a & (a - 1)) != 0 || a > (1u << 20)) {
      return Status::Error(where + ": metadata key 'general.alignment' must be a power-of-two integer");
    }
    return a;
  }
  return uint64_t{32};
}

template <typename Sink>
Status GgufWriter::Emit(Sink&& sink, const std::string& where) const {
  LATHE_ASSIGN_OR_RETURN(uint64_t align, Alignment(where));
  Bytes h;
  h.Put<uint32_t>(kGgufMagic);
  h.Put<uint32_t>(3);
  h.Put<uint64_t>(tensors_.size());
  h.Put<uint64_t>(kv_.size());
  for (const Kv& kv : kv_) {
    const GgufValue& v = kv.value;
    auto err = [&](const std::string& what) {
      return Status::Error(StrFormat("%s: metadata key '%s': %s", where.c_str(), kv.key.c_str(), what.c_str()));
    };
    h.PutString(kv.key);
    h.Put<uint32_t>((uint32_t)v.type);
    if (v.type == GgufValueType::kString) {
      h.PutString(v.s);
    } else if (v.type == GgufValueType::kArray) {
      h.Put<uint32_t>((uint32_t)v.elem_type);
      if (v.elem_type == GgufValueType::kString) {
        h.Put<uint64_t>(v.strings.size());
        for (const std::string& s : v.strings) h.PutString(s);
      } else if (IsIntType(v.elem_type)) {
        h.Put<uint64_t>(v.ints.size());
        for (int64_t x : v.ints) h.PutInt(v.elem_type, x, (uint64_t)x);
      } else if (v.elem_type == GgufValueType::kFloat32 || v.elem_type == GgufValueType::kFloat64) {
        h.Put<uint64_t>(v.floats.size());
        for (double x : v.floats) h.PutFloat(v.elem_type, x);
      } else {
        return err(StrFormat("arrays of %s are not supported", GgufValueTypeName(v.elem_type)));
      }
    } else if (IsIntType(v.type)) {
      h.PutInt(v.type, v.i, v.u);
    } else if (v.type == GgufValueType::kFloat32 || v.type == GgufValueType::kFloat64) {
      h.PutFloat(v.type, v.f);
    } else {
      return err(StrFormat("unknown value type %u", (uint32_t)v.type));
    }
  }
  uint64_t offset = 0;
  auto pad = [align](uint64_t n) { return (n + align - 1) / align * align; };
  for (const TensorEntry& t : tensors_) {
    h.PutString(t.name);
    h.Put<uint32_t>((uint32_t)t.ne.size());
    for (int64_t d : t.ne) h.Put<uint64_t>((uint64_t)d);
    h.Put<uint32_t>(t.ggml_type);
    h.Put<uint64_t>(offset);
    offset += pad(t.nbytes);
  }
  h.out.resize(pad(h.out.size()), '\0');
  LATHE_RETURN_IF_ERROR(sink(h.out.data(), h.out.size(), 0));
  std::vector<uint8_t> filled;  // the bytes of AddTensorFilled's tensors, one at a time
  for (const TensorEntry& t : tensors_) {
    const void* data = t.data;
    if (t.fill) {
      filled.resize(t.nbytes);
      LATHE_RETURN_IF_ERROR(t.fill(filled.data()));
      data = filled.data();
    }
    LATHE_RETURN_IF_ERROR(sink(data, t.nbytes, pad(t.nbytes) - t.nbytes));
  }
  return Status::Ok();
}

Status GgufWriter::Write(const std::string& path) const {
  AtomicFileWriter w;
  LATHE_RETURN_IF_ERROR(w.Open(path));
  LATHE_RETURN_IF_ERROR(Emit(
      [&w](const void* d, size_t n, size_t zeros) {
        LATHE_RETURN_IF_ERROR(w.Write(d, n));
        return w.WriteZeros(zeros);
      },
      path));
  return w.Commit();
}

Result<std::vector<uint8_t>> GgufWriter::Serialize() const {
  std::vector<uint8_t> out;
  LATHE_RETURN_IF_ERROR(Emit(
      [&out](const void* d, size_t n, size_t zeros) {
        const uint8_t* p = (const uint8_t*)d;
        out.insert(out.end(), p, p + n);
        out.insert(out.end(), zeros, 0);
        return Status::Ok();
      },
      "<buffer>"));
  return out;
}

}  // namespace lathe::formats
