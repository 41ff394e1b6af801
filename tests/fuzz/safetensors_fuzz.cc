// libFuzzer target for the safetensors reader: any bytes must parse or fail cleanly; whatever
// parses must expose in-bounds tensor data and survive a round trip through the writer.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "formats/safetensors.h"

using lathe::formats::SafetensorsFile;
using lathe::formats::SafetensorsWriteEntry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = SafetensorsFile::Parse(data, size, "fuzz.safetensors");
  if (!f.ok()) return 0;
  std::vector<SafetensorsWriteEntry> entries;
  volatile uint8_t sink = 0;
  for (const auto& ti : (*f)->tensors()) {
    auto t = (*f)->GetTensor(ti.name);
    if (!t.ok()) continue;
    size_t n = t->nbytes();
    if (n != ti.nbytes) __builtin_trap();
    if (n > 0) sink = sink + ((const uint8_t*)t->data)[0] + ((const uint8_t*)t->data)[n - 1];
    entries.push_back({ti.name, t->dtype, t->shape, t->data, n});
  }
  auto bytes = lathe::formats::SerializeSafetensors(entries, (*f)->metadata());
  if (!bytes.ok()) __builtin_trap();  // names and metadata came from valid JSON, so they encode
  auto g = SafetensorsFile::Parse(bytes->data(), bytes->size(), "roundtrip.safetensors");
  if (!g.ok() || (*g)->metadata() != (*f)->metadata()) __builtin_trap();
  for (const SafetensorsWriteEntry& e : entries) {
    auto t = (*g)->GetTensor(e.name);
    if (!t.ok() || t->shape != e.shape || t->dtype != e.dtype ||
        (e.nbytes && std::memcmp(t->data, e.data, e.nbytes) != 0)) {
      __builtin_trap();
    }
  }
  return 0;
}
