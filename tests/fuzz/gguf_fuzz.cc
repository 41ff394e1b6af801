// libFuzzer target for the GGUF reader: any bytes must parse or fail cleanly; whatever parses
// must expose in-bounds tensor data and survive a round trip through GgufWriter.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "formats/gguf.h"
#include "formats/gguf_writer.h"

using lathe::formats::GgufFile;
using lathe::formats::GgufWriter;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto g = GgufFile::Parse(data, size, "fuzz.gguf");
  if (!g.ok()) return 0;
  const GgufFile& f = **g;
  for (const std::string& k : f.keys()) {
    (void)f.GetString(k);
    (void)f.GetInt(k);
    (void)f.GetFloat(k);
    (void)f.GetBool(k);
  }
  uint64_t total = 0;
  volatile uint8_t sink = 0;
  for (const auto& ti : f.tensors()) {
    if (ti.known_size && ti.nbytes > 0) {  // ASan reports if the data leaves the buffer
      sink = sink + f.base()[ti.offset] + f.base()[ti.offset + ti.nbytes - 1];
    }
    total += ti.nbytes;
    auto t = f.GetTensor(ti.name);
    if (t.ok() && t->nbytes() != ti.nbytes) __builtin_trap();
  }
  // Round trip: what we parsed, we must be able to write and parse again with the same content.
  if (total > (1u << 20)) return 0;  // tensor views may overlap; bound the copy
  GgufWriter w;
  for (const std::string& k : f.keys()) w.Set(k, *f.Find(k));
  for (const auto& ti : f.tensors()) {
    if (!ti.known_size || !w.AddRawTensor(ti.name, ti.ggml_type, ti.shape, f.base() + ti.offset, ti.nbytes).ok()) {
      return 0;
    }
  }
  auto bytes = w.Serialize();
  if (!bytes.ok()) return 0;
  auto g2 = GgufFile::Parse(bytes->data(), bytes->size(), "roundtrip.gguf");
  if (!g2.ok() || (*g2)->keys() != f.keys() || (*g2)->tensors().size() != f.tensors().size()) __builtin_trap();
  for (const auto& ti : f.tensors()) {
    const auto* b = (*g2)->FindTensor(ti.name);
    if (!b || b->ggml_type != ti.ggml_type || b->shape != ti.shape ||
        std::memcmp(f.base() + ti.offset, (*g2)->base() + b->offset, ti.nbytes) != 0) {
      __builtin_trap();
    }
  }
  return 0;
}
