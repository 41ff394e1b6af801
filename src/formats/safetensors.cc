// safetensors parsing (header JSON + bounds checks), sharded sets via the HF index, and writing.
#include "formats/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "formats/atomic_file.h"

namespace lathe::formats {

namespace {

using json = nlohmann::json;

struct StDType {
  const char* name;
  int bytes;
  bool supported;
  DType dtype;
};

// In the order of the Rust library's Dtype enum; the writer sorts by this rank (descending), so
// the data layout matches what the Python library writes.
const StDType kStDTypes[] = {
    {"BOOL", 1, true, DType::kBool},       {"U8", 1, true, DType::kU8},
    {"I8", 1, true, DType::kI8},           {"F8_E5M2", 1, false, DType::kU8},
    {"F8_E4M3", 1, false, DType::kU8},     {"F8_E8M0", 1, false, DType::kU8},
    {"I16", 2, true, DType::kI16},         {"U16", 2, false, DType::kI16},
    {"F16", 2, true, DType::kF16},         {"BF16", 2, true, DType::kBF16},
    {"I32", 4, true, DType::kI32},         {"U32", 4, false, DType::kI32},
    {"F32", 4, true, DType::kF32},         {"F64", 8, true, DType::kF64},
    {"I64", 8, true, DType::kI64},         {"U64", 8, false, DType::kI64},
};

const StDType* FindStDType(const std::string& name) {
  for (const StDType& d : kStDTypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

int DTypeRank(DType t) {
  int i = 0;
  for (const StDType& d : kStDTypes) {
    if (d.supported && d.dtype == t) return i;
    ++i;
  }
  return -1;
}

// nlohmann's parser is iterative but destroying a deeply nested value recurses; a safetensors
// header is at most 3 levels deep, so anything deeper is rejected before parsing.
bool NestingWithin(const char* p, size_t n, int max_depth, size_t* bad_at) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < n; ++i) {
    char c = p[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') {
      if (++depth > max_depth) {
        *bad_at = i;
        return false;
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

bool IsDir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool IsFile(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

const char* SafetensorsDTypeName(DType t) {
  int r = DTypeRank(t);
  return r < 0 ? nullptr : kStDTypes[r].name;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  LATHE_ASSIGN_OR_RETURN(auto mf, MappedFile::Open(path));
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->data_ = mf->data();
  f->size_ = mf->size();
  f->name_ = path;
  f->file_ = std::move(mf);
  LATHE_RETURN_IF_ERROR(f->ParseAll());
  return f;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(const uint8_t* data, size_t size,
                                                                const std::string& name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->data_ = data;
  f->size_ = size;
  f->name_ = name;
  LATHE_RETURN_IF_ERROR(f->ParseAll());
  return f;
}

Status SafetensorsFile::ParseAll() {
  const char* file = name_.c_str();
  if (size_ < 8) {
    return Status::Error(StrFormat("%s: truncated at offset 0: need 8 bytes for the header length, file has %zu",
                                   file, size_));
  }
  uint64_t header_len;
  std::memcpy(&header_len, data_, 8);
  if (header_len > kMaxHeaderBytes) {
    return Status::Error(StrFormat("%s: header length %llu at offset 0 exceeds the %llu-byte limit (not a "
                                   "safetensors file?)", file, (unsigned long long)header_len,
                                   (unsigned long long)kMaxHeaderBytes));
  }
  if (header_len > size_ - 8) {
    return Status::Error(StrFormat("%s: header length %llu at offset 0 runs past the end of the %zu-byte file "
                                   "(truncated?)", file, (unsigned long long)header_len, size_));
  }
  if (header_len < 2) {
    return Status::Error(StrFormat("%s: header length %llu at offset 0 is too small for a JSON object", file,
                                   (unsigned long long)header_len));
  }
  data_offset_ = 8 + header_len;
  const char* h = (const char*)data_ + 8;
  // The format pads with spaces; tolerate writers that pad with NULs.
  while (header_len > 0 && h[header_len - 1] == '\0') --header_len;
  size_t bad_at = 0;
  if (!NestingWithin(h, header_len, 4, &bad_at)) {
    return Status::Error(StrFormat("%s: header JSON nests too deeply at offset %zu", file, 8 + bad_at));
  }
  json doc;
  try {
    doc = json::parse(h, h + header_len);
  } catch (const json::parse_error& e) {
    return Status::Error(StrFormat("%s: header is not valid JSON (offset %zu): %s", file, (size_t)(8 + e.byte),
                                   e.what()));
  } catch (const std::exception& e) {
    return Status::Error(StrFormat("%s: header is not valid JSON: %s", file, e.what()));
  }
  if (!doc.is_object()) return Status::Error(StrFormat("%s: header at offset 8 is not a JSON object", file));

  const uint64_t data_size = size_ - data_offset_;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) return Status::Error(StrFormat("%s: \"__metadata__\" is not an object", file));
      for (auto m = v.begin(); m != v.end(); ++m) {
        // The format says strings; keep anything else as its JSON text rather than refuse the file.
        metadata_[m.key()] = m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
      }
      continue;
    }
    auto err = [&](const std::string& what) {
      return Status::Error(StrFormat("%s: tensor '%s': %s", file, key.c_str(), what.c_str()));
    };
    if (!v.is_object()) return err("header entry is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return err("missing or non-string \"dtype\"");
    if (sh == v.end() || !sh->is_array()) return err("missing or non-array \"shape\"");
    if (off == v.end() || !off->is_array() || off->size() != 2) return err("\"data_offsets\" must be [begin, end]");
    SafetensorsTensorInfo ti;
    ti.name = key;
    ti.dtype_name = dt->get<std::string>();
    const StDType* sd = FindStDType(ti.dtype_name);
    if (!sd) return err("unknown dtype \"" + ti.dtype_name + "\"");
    ti.supported = sd->supported;
    ti.dtype = sd->dtype;
    uint64_t numel = 1;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned()) return err("shape " + sh->dump() + " has a dimension that is not a non-negative integer");
      uint64_t x = d.get<uint64_t>();
      if (x > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, x, &numel) || numel > (uint64_t)INT64_MAX) {
        return err("shape " + sh->dump() + " overflows");
      }
      ti.shape.push_back((int64_t)x);
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, (uint64_t)sd->bytes, &nbytes)) return err("shape " + sh->dump() + " overflows");
    if (!(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned()) {
      return err("\"data_offsets\" " + off->dump() + " must be non-negative integers");
    }
    uint64_t b = (*off)[0].get<uint64_t>(), e = (*off)[1].get<uint64_t>();
    if (b > e) return err(StrFormat("data_offsets [%llu, %llu] end before they begin", (unsigned long long)b,
                                    (unsigned long long)e));
    if (e > data_size) {
      return err(StrFormat("data_offsets [%llu, %llu] (file offset %llu) run past the end of the data: %llu bytes "
                           "after the header (truncated file?)", (unsigned long long)b, (unsigned long long)e,
                           (unsigned long long)(data_offset_ + b), (unsigned long long)data_size));
    }
    if (e - b != nbytes) {
      return err(StrFormat("%s shape %s needs %llu bytes but data_offsets [%llu, %llu] hold %llu",
                           ti.dtype_name.c_str(), sh->dump().c_str(), (unsigned long long)nbytes,
                           (unsigned long long)b, (unsigned long long)e, (unsigned long long)(e - b)));
    }
    ti.offset = data_offset_ + b;
    ti.nbytes = nbytes;
    tensors_.push_back(std::move(ti));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const SafetensorsTensorInfo& t = tensors_[i];
    if (i > 0) {
      const SafetensorsTensorInfo& p = tensors_[i - 1];
      if (t.nbytes > 0 && p.nbytes > 0 && t.offset < p.offset + p.nbytes) {
        return Status::Error(StrFormat("%s: tensor '%s' (bytes %llu..%llu) overlaps tensor '%s' (bytes %llu..%llu)",
                                       file, t.name.c_str(), (unsigned long long)t.offset,
                                       (unsigned long long)(t.offset + t.nbytes), p.name.c_str(),
                                       (unsigned long long)p.offset, (unsigned long long)(p.offset + p.nbytes)));
      }
    }
    index_[t.name] = i;
  }
  return Status::Ok();
}

const SafetensorsTensorInfo* SafetensorsFile::FindTensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<Tensor> SafetensorsFile::GetTensor(const std::string& name) const {
  const SafetensorsTensorInfo* ti = FindTensor(name);
  if (!ti) return Status::Error(StrFormat("%s: missing tensor '%s'", name_.c_str(), name.c_str()));
  if (!ti->supported) {
    return Status::Error(StrFormat("%s: tensor '%s' has dtype %s, which lathe does not support; supported: F32, "
                                   "F16, BF16, F64, I64, I32, I16, I8, U8, BOOL", name_.c_str(), name.c_str(),
                                   ti->dtype_name.c_str()));
  }
  Tensor t;
  t.data = data_ + ti->offset;
  t.dtype = ti->dtype;
  t.shape = ti->shape;
  return t;
}

// ---- SafetensorsSet ----

Result<std::unique_ptr<SafetensorsSet>> SafetensorsSet::Open(const std::string& path) {
  std::unique_ptr<SafetensorsSet> set(new SafetensorsSet());
  std::string index_path, single_path;
  if (IsDir(path)) {
    std::string dir = EndsWith(path, "/") ? path : path + "/";
    if (IsFile(dir + "model.safetensors.index.json")) index_path = dir + "model.safetensors.index.json";
    else if (IsFile(dir + "model.safetensors")) single_path = dir + "model.safetensors";
    else {
      return Status::Error(StrFormat("%s: no model.safetensors.index.json or model.safetensors in this folder",
                                     path.c_str()));
    }
  } else if (EndsWith(path, ".json")) {
    index_path = path;
  } else {
    single_path = path;
  }
  if (!single_path.empty()) {
    LATHE_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(single_path));
    for (const auto& ti : f->tensors()) set->where_[ti.name] = 0;
    set->source_ = single_path;
    set->files_.push_back(std::move(f));
    return set;
  }
  set->source_ = index_path;
  const char* ip = index_path.c_str();
  LATHE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
  json doc;
  try {
    doc = json::parse(text);
  } catch (const std::exception& e) {
    return Status::Error(StrFormat("%s: not valid JSON: %s", ip, e.what()));
  }
  if (!doc.is_object() || !doc.contains("weight_map") || !doc["weight_map"].is_object()) {
    return Status::Error(StrFormat("%s: missing object key 'weight_map'", ip));
  }
  std::string dir;
  size_t slash = index_path.rfind('/');
  if (slash != std::string::npos) dir = index_path.substr(0, slash + 1);
  std::map<std::string, size_t> file_index;
  for (auto it = doc["weight_map"].begin(); it != doc["weight_map"].end(); ++it) {
    if (!it.value().is_string()) {
      return Status::Error(StrFormat("%s: weight_map entry '%s' is not a file name", ip, it.key().c_str()));
    }
    std::string shard = it.value().get<std::string>();
    // Shards live beside the index; refuse paths that would escape the folder.
    if (shard.empty() || shard[0] == '/' || shard.find("..") != std::string::npos) {
      return Status::Error(StrFormat("%s: weight_map entry '%s' names shard '%s', which is not a plain file name "
                                     "beside the index", ip, it.key().c_str(), shard.c_str()));
    }
    auto fi = file_index.find(shard);
    if (fi == file_index.end()) {
      auto f = SafetensorsFile::Open(dir + shard);
      if (!f.ok()) return f.status().WithContext(StrFormat("%s: shard for tensor '%s'", ip, it.key().c_str()));
      fi = file_index.emplace(shard, set->files_.size()).first;
      set->files_.push_back(std::move(f).value());
    }
    const SafetensorsFile& f = *set->files_[fi->second];
    if (!f.FindTensor(it.key())) {
      return Status::Error(StrFormat("%s: weight_map puts tensor '%s' in %s, which does not contain it", ip,
                                     it.key().c_str(), f.path().c_str()));
    }
    set->where_[it.key()] = fi->second;
  }
  return set;
}

const SafetensorsFile* SafetensorsSet::FileFor(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : files_[it->second].get();
}

Result<Tensor> SafetensorsSet::GetTensor(const std::string& name) const {
  const SafetensorsFile* f = FileFor(name);
  if (!f) return Status::Error(StrFormat("%s: missing tensor '%s'", source_.c_str(), name.c_str()));
  return f->GetTensor(name);
}

std::vector<std::string> SafetensorsSet::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(where_.size());
  for (const auto& [n, i] : where_) names.push_back(n);
  return names;
}

// ---- writer ----

namespace {

struct Prepared {
  std::string header;  // JSON, padded, without the 8-byte length
  std::vector<const SafetensorsWriteEntry*> order;
};

Result<Prepared> Prepare(const std::vector<SafetensorsWriteEntry>& tensors,
                         const std::map<std::string, std::string>& metadata, const std::string& where) {
  Prepared p;
  std::map<std::string, int> seen;
  for (const SafetensorsWriteEntry& t : tensors) {
    auto err = [&](const std::string& what) {
      return Status::Error(StrFormat("%s: tensor '%s': %s", where.c_str(), t.name.c_str(), what.c_str()));
    };
    if (t.name == "__metadata__") return err("reserved name");
    if (seen[t.name]++) return err("duplicate tensor name");
    if (DTypeRank(t.dtype) < 0) return err(std::string("dtype ") + DTypeName(t.dtype) + " cannot be stored in safetensors");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(numel, (uint64_t)d, &numel)) return err("bad shape");
    }
    uint64_t want = numel * (uint64_t)GetDTypeInfo(t.dtype).block_bytes;
    if (want != t.nbytes) {
      return err(StrFormat("shape needs %llu bytes, got %zu", (unsigned long long)want, t.nbytes));
    }
    if (t.nbytes > 0 && !t.data && !t.fill) return err("no data");
    p.order.push_back(&t);
  }
  std::stable_sort(p.order.begin(), p.order.end(), [](const SafetensorsWriteEntry* a, const SafetensorsWriteEntry* b) {
    int ra = DTypeRank(a->dtype), rb = DTypeRank(b->dtype);
    return ra != rb ? ra > rb : a->name < b->name;
  });
  std::string& h = p.header;
  h = "{";
  try {
    if (!metadata.empty()) {
      h += "\"__metadata__\":{";
      bool first = true;
      for (const auto& [k, v] : metadata) {
        if (!first) h += ",";
        first = false;
        h += json(k).dump() + ":" + json(v).dump();
      }
      h += "}";
    }
    uint64_t offset = 0;
    for (const SafetensorsWriteEntry* t : p.order) {
      if (h.size() > 1) h += ",";
      h += json(t->name).dump() + ":{\"dtype\":\"" + SafetensorsDTypeName(t->dtype) + "\",\"shape\":[";
      for (size_t i = 0; i < t->shape.size(); ++i) {
        if (i) h += ",";
        h += std::to_string(t->shape[i]);
      }
      h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + t->nbytes) + "]}";
      offset += t->nbytes;
    }
  } catch (const std::exception& e) {  // names or metadata that are not valid UTF-8
    return Status::Error(StrFormat("%s: cannot encode header: %s", where.c_str(), e.what()));
  }
  h += "}";
  while (h.size() % 8 != 0) h += ' ';
  return p;
}

}  // namespace

Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsWriteEntry>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  LATHE_ASSIGN_OR_RETURN(Prepared p, Prepare(tensors, metadata, path));
  AtomicFileWriter w;
  LATHE_RETURN_IF_ERROR(w.Open(path));
  uint64_t n = p.header.size();
  LATHE_RETURN_IF_ERROR(w.Write(&n, 8));
  LATHE_RETURN_IF_ERROR(w.Write(p.header.data(), p.header.size()));
  std::vector<uint8_t> filled;  // the bytes of fill entries, one at a time
  for (const SafetensorsWriteEntry* t : p.order) {
    const void* data = t->data;
    if (t->fill) {
      filled.resize(t->nbytes);
      LATHE_RETURN_IF_ERROR(t->fill(filled.data()));
      data = filled.data();
    }
    LATHE_RETURN_IF_ERROR(w.Write(data, t->nbytes));
  }
  return w.Commit();
}

Result<std::vector<uint8_t>> SerializeSafetensors(const std::vector<SafetensorsWriteEntry>& tensors,
                                                  const std::map<std::string, std::string>& metadata) {
  LATHE_ASSIGN_OR_RETURN(Prepared p, Prepare(tensors, metadata, "<buffer>"));
  std::vector<uint8_t> out(8);
  uint64_t n = p.header.size();
  std::memcpy(out.data(), &n, 8);
  out.insert(out.end(), p.header.begin(), p.header.end());
  for (const SafetensorsWriteEntry* t : p.order) {
    const size_t at = out.size();
    out.resize(at + t->nbytes);
    if (t->fill) {
      LATHE_RETURN_IF_ERROR(t->fill(out.data() + at));
    } else if (t->nbytes > 0) {
      std::memcpy(out.data() + at, t->data, t->nbytes);
    }
  }
  return out;
}

}  // namespace lathe::formats
