// libFuzzer target for HF config.json / generation_config.json parsing (downloaded, untrusted
// JSON): any text must parse into a config or give an error, never crash or hit UB.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/load_hf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text((const char*)data, size);
  auto c = lathe::model::ParseHfConfig(text, "fuzz/config.json");
  if (c.ok()) (void)c->Summary();
  (void)lathe::model::ParseHfGenerationConfig(text, "fuzz/generation_config.json");
  return 0;
}
