// Checkpoint manifests (crc32c, fsync), training_state.bin and resume_from_checkpoint resolution.
#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "core/strings.h"
#include "train/optimizer_bnb.h"
#include "train/train_outputs.h"

namespace lathe::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kMagic[8] = {'L', 'A', 'T', 'H', 'E', 'C', 'K', '1'};

Result<std::string> ReadWhole(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::Error("cannot read '" + path + "'");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) return Status::Error("cannot read '" + path + "'");
  return s;
}

std::string OptimKind(Optimizer& opt) {
  if (dynamic_cast<AdamW*>(&opt)) return "adamw";
  if (dynamic_cast<BnbAdamW*>(&opt)) return "bnb_adamw";
  if (dynamic_cast<Sgd*>(&opt)) return "sgd";
  return "unknown";
}

}  // namespace

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

Status FsyncPath(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Error("cannot open '" + path + "' to fsync: " + std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Status::Error("fsync '" + path + "': " + std::strerror(err));
  return Status::Ok();
}

void TestSaveDelay() {
  const char* d = std::getenv("LATHE_TEST_SAVE_DELAY_MS");
  if (d && *d) std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(d)));
}

Status SealCheckpointDir(const std::string& dir, int64_t step) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file() && it->path().filename() != kCheckpointManifest)
      names.push_back(it->path().filename().string());
  }
  if (ec) return Status::Error("cannot list '" + dir + "': " + ec.message());
  std::sort(names.begin(), names.end());
  json files = json::object();
  for (const std::string& n : names) {
    std::string path = (fs::path(dir) / n).string();
    LATHE_ASSIGN_OR_RETURN(std::string bytes, ReadWhole(path));
    files[n] = {{"bytes", bytes.size()}, {"crc32c", StrFormat("%08x", Crc32c(bytes.data(), bytes.size()))}};
    LATHE_RETURN_IF_ERROR(FsyncPath(path));
    TestSaveDelay();
  }
  std::string manifest = (fs::path(dir) / kCheckpointManifest).string();
  LATHE_RETURN_IF_ERROR(WriteJsonFile(manifest, {{"format", 1}, {"global_step", step}, {"files", files}}));
  LATHE_RETURN_IF_ERROR(FsyncPath(manifest));
  return FsyncPath(dir);
}

bool IsSealedCheckpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kCheckpointManifest, ec);
}

Status VerifyCheckpoint(const std::string& dir) {
  std::string manifest = (fs::path(dir) / kCheckpointManifest).string();
  if (!IsSealedCheckpoint(dir)) {
    return Status::Error("checkpoint '" + dir + "' is incomplete: it has no " + kCheckpointManifest +
                         " (a save that did not finish, or not a lathe checkpoint)");
  }
  LATHE_ASSIGN_OR_RETURN(std::string text, ReadWhole(manifest));
  json m = json::parse(text, nullptr, false);
  if (m.is_discarded() || !m.is_object() || !m.contains("files") || !m["files"].is_object())
    return Status::Error("checkpoint file '" + manifest + "' is damaged (not a manifest)");
  for (auto& [name, e] : m["files"].items()) {
    std::string path = (fs::path(dir) / name).string();
    Result<std::string> bytes = ReadWhole(path);
    if (!bytes.ok()) return Status::Error("checkpoint file '" + path + "' is missing");
    if (!e.contains("bytes") || !e.contains("crc32c") || bytes->size() != e["bytes"].get<size_t>()) {
      return Status::Error(StrFormat("checkpoint file '%s' is damaged: %zu bytes, the manifest says %s",
                                     path.c_str(), bytes->size(), e.value("bytes", json()).dump().c_str()));
    }
    std::string crc = StrFormat("%08x", Crc32c(bytes->data(), bytes->size()));
    if (crc != e["crc32c"].get<std::string>()) {
      return Status::Error("checkpoint file '" + path + "' is damaged: crc32c " + crc +
                           ", the manifest says " + e["crc32c"].get<std::string>());
    }
  }
  return Status::Ok();
}

Result<std::string> ResolveResumeCheckpoint(const std::string& spec, const std::string& output_dir) {
  std::string dir = spec;
  if (spec == "last") {
    dir.clear();
    std::vector<std::string> cps = ListCheckpoints(output_dir);
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) {
      if (IsSealedCheckpoint(*it)) {
        dir = *it;
        break;
      }
    }
    if (dir.empty()) {
      return Status::Error("key 'resume_from_checkpoint': 'last' found no complete checkpoint-N in '" +
                           output_dir + "'");
    }
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status::Error("key 'resume_from_checkpoint': '" + dir + "' is not a directory");
  Status st = VerifyCheckpoint(dir);
  if (!st.ok()) return st.WithContext("key 'resume_from_checkpoint'");
  return dir;
}

Status SaveTrainingState(const std::string& dir, std::span<const ParamRef> params, Optimizer& opt,
                         const json& scalars) {
  std::string path = (fs::path(dir) / kTrainingStateFile).string();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return Status::Error("cannot write '" + path + "'");
  bool ok = std::fwrite(kMagic, 1, 8, f) == 8;
  auto put = [&](const std::string& name, const void* data, uint64_t bytes) {
    uint32_t len = (uint32_t)name.size();
    ok = ok && std::fwrite(&len, 4, 1, f) == 1 && std::fwrite(name.data(), 1, len, f) == len &&
         std::fwrite(&bytes, 8, 1, f) == 1 && (bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes);
  };
  for (const ParamRef& p : params) put("param/" + p.name, p.data, (uint64_t)p.n * sizeof(float));
  const std::string kind = OptimKind(opt);
  if (auto* a = dynamic_cast<AdamW*>(&opt)) {
    for (size_t i = 0; i < a->state_count(); ++i) {
      put(StrFormat("optim/%zu.m", i), a->m(i).data(), a->m(i).size() * sizeof(float));
      put(StrFormat("optim/%zu.v", i), a->v(i).data(), a->v(i).size() * sizeof(float));
    }
  } else if (auto* b = dynamic_cast<BnbAdamW*>(&opt)) {
    LATHE_RETURN_IF_ERROR(b->Prepare(params));
    for (const BnbAdamW::RawBuffer& r : b->RawState()) put("optim/" + r.name, r.data, r.bytes);
  }
  ok = std::fflush(f) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) return Status::Error("cannot write '" + path + "' (disk full?)");
  json j = scalars;
  j["optimizer"] = kind;
  j["optimizer_steps"] = opt.steps();
  return WriteJsonFile((fs::path(dir) / kTrainingStateJson).string(), j);
}

Result<json> LoadTrainingState(const std::string& dir, std::span<const ParamRef> params, Optimizer& opt) {
  std::string jpath = (fs::path(dir) / kTrainingStateJson).string();
  LATHE_ASSIGN_OR_RETURN(std::string jtext, ReadWhole(jpath));
  json j = json::parse(jtext, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Error("checkpoint file '" + jpath + "' is not JSON");
  const std::string kind = OptimKind(opt);
  const std::string saved =
      j.contains("optimizer") && j["optimizer"].is_string() ? j["optimizer"].get<std::string>() : "";
  if (saved != kind) {
    return Status::Error("checkpoint file '" + jpath + "': the checkpoint's optimizer is '" + saved +
                         "', this run's is '" + kind + "' (key 'optim' must match the checkpointed run)");
  }
  if (j.contains("optimizer_steps") && !j["optimizer_steps"].is_number_integer()) {
    return Status::Error("checkpoint file '" + jpath + "': 'optimizer_steps' must be an integer");
  }
  const int64_t steps = j.contains("optimizer_steps") ? j["optimizer_steps"].get<int64_t>() : 0;

  std::string path = (fs::path(dir) / kTrainingStateFile).string();
  LATHE_ASSIGN_OR_RETURN(std::string blob, ReadWhole(path));
  if (blob.size() < 8 || std::memcmp(blob.data(), kMagic, 8) != 0)
    return Status::Error("checkpoint file '" + path + "' is not a lathe training state");
  std::map<std::string, std::pair<size_t, uint64_t>> entries;  // name -> (offset, bytes)
  size_t pos = 8;
  while (pos < blob.size()) {
    uint32_t len = 0;
    uint64_t bytes = 0;
    if (blob.size() - pos < 4) return Status::Error("checkpoint file '" + path + "' is truncated");
    std::memcpy(&len, blob.data() + pos, 4);
    pos += 4;
    if (blob.size() - pos < (size_t)len + 8)
      return Status::Error("checkpoint file '" + path + "' is truncated");
    std::string name = blob.substr(pos, len);
    pos += len;
    std::memcpy(&bytes, blob.data() + pos, 8);
    pos += 8;
    if (blob.size() - pos < bytes) return Status::Error("checkpoint file '" + path + "' is truncated");
    entries[name] = {pos, bytes};
    pos += bytes;
  }
  auto take = [&](const std::string& name, void* dst, uint64_t bytes) -> Status {
    auto it = entries.find(name);
    if (it == entries.end())
      return Status::Error("checkpoint file '" + path + "' has no tensor '" + name +
                           "' (another model or method?)");
    if (it->second.second != bytes) {
      return Status::Error(
          StrFormat("checkpoint file '%s': tensor '%s' has %llu bytes, this run expects %llu", path.c_str(),
                    name.c_str(), (unsigned long long)it->second.second, (unsigned long long)bytes));
    }
    std::memcpy(dst, blob.data() + it->second.first, bytes);
    return Status::Ok();
  };
  for (const ParamRef& p : params)
    LATHE_RETURN_IF_ERROR(take("param/" + p.name, p.data, (uint64_t)p.n * sizeof(float)));
  if (auto* a = dynamic_cast<AdamW*>(&opt)) {
    std::vector<std::vector<float>> m, v;
    if (entries.count("optim/0.m")) {
      for (size_t i = 0; i < params.size(); ++i) {
        m.emplace_back(params[i].n);
        v.emplace_back(params[i].n);
        LATHE_RETURN_IF_ERROR(
            take(StrFormat("optim/%zu.m", i), m.back().data(), params[i].n * sizeof(float)));
        LATHE_RETURN_IF_ERROR(
            take(StrFormat("optim/%zu.v", i), v.back().data(), params[i].n * sizeof(float)));
      }
    }
    a->Restore(steps, std::move(m), std::move(v));
  } else if (auto* b = dynamic_cast<BnbAdamW*>(&opt)) {
    LATHE_RETURN_IF_ERROR(b->Prepare(params));
    for (const BnbAdamW::RawBuffer& r : b->RawState())
      LATHE_RETURN_IF_ERROR(take("optim/" + r.name, r.data, r.bytes));
    b->set_steps(steps);
  } else if (auto* s = dynamic_cast<Sgd*>(&opt)) {
    s->set_steps(steps);
  }
  return j;
}

}  // namespace lathe::train
