// libFuzzer target for model files (downloaded, untrusted) past their container parsers. The first byte picks
// - a GGUF file: GgufFile::Parse, then LoadGgufWeights (the architecture's hyper-parameters against the tensors'
//   names, shapes and types);
// - a llama2.c .bin: LoadLlama2cBin (the header against the file size);
// - a HF model directory: LoadHfModelDir on config.json, a 0 byte, then model.safetensors (names, shapes and dtypes
//   against the config, conversions, the Q/K permutation);
// the rest is the file(s). Any bytes must load or give an error, never crash or hit UB. A model that loads (a small
// one: its weights are in the input) must run a forward of a two-token prompt and one more token through a KV cache,
// token ids taken from the input's first bytes (within the vocabulary the model declares).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "fuzz_file.h"
#include "model/load_gguf.h"
#include "model/load_hf.h"
#include "model/load_llama2c.h"
#include "model/transformer.h"

using lathe::Result;
using lathe::model::ModelWeights;

namespace {

// Weights past this many parameters are not run (a forward over every one of them per input would slow the
// fuzzer to a crawl; the loaders' checks still ran).
constexpr int64_t kMaxForwardParams = int64_t{1} << 20;

void RunForward(const ModelWeights& w, const uint8_t* data, size_t size) {
  const lathe::model::ModelConfig& c = w.config;
  int64_t params = c.vocab_size * c.dim + c.n_layers * (2 * c.dim * c.dim + 3 * c.dim * c.ffn_dim);
  if (params > kMaxForwardParams || c.max_seq_len < 3) return;
  static lathe::ThreadPool pool(1);
  lathe::model::Transformer tf(w, pool);
  lathe::model::KvCache cache(c, 1, 3);
  int32_t ids[3];
  for (int i = 0; i < 3; ++i) ids[i] = (int32_t)((size > (size_t)i ? data[i] : 0) % c.vocab_size);
  std::vector<float> logits;
  lathe::model::SeqInput prompt{0, {ids, 2}, true};
  if (!tf.Forward(cache, {&prompt, 1}, &logits).ok()) return;
  if ((int64_t)logits.size() != 2 * c.vocab_size) __builtin_trap();
  lathe::model::SeqInput next{0, {ids + 2, 1}, false};
  if (!tf.Forward(cache, {&next, 1}, &logits).ok()) return;
  if ((int64_t)logits.size() != c.vocab_size || cache.length(0) != 3) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int kind = data[0] % 3;  // 0: GGUF, 1: llama2.c, 2: HF directory
  ++data, --size;
  Result<ModelWeights> w = lathe::Status::Error("unset");
  // The GGUF at an aligned address, as a mapping puts it (the input after the selector byte is not).
  std::vector<uint64_t> copy;
  if (kind == 0) {
    copy.resize(size / 8 + 1);  // never empty: memcpy takes no null pointer
    std::memcpy(copy.data(), data, size);
    auto g = lathe::formats::GgufFile::Parse((const uint8_t*)copy.data(), size, "fuzz.gguf");
    if (!g.ok()) return 0;
    w = lathe::model::LoadGgufWeights(std::shared_ptr<lathe::formats::GgufFile>(std::move(*g)));
  } else if (kind == 1) {
    lathe::fuzz::MemFile file("model.bin", data, size);
    w = lathe::model::LoadLlama2cBin(file.path());
  } else {
    static const std::string dir = lathe::fuzz::TempDir("model_fuzz");
    const uint8_t* zero = static_cast<const uint8_t*>(std::memchr(data, 0, size));
    const size_t cfg_len = zero ? (size_t)(zero - data) : size, st_off = zero ? cfg_len + 1 : size;
    lathe::fuzz::WriteFile(dir + "/config.json", data, cfg_len);
    lathe::fuzz::WriteFile(dir + "/model.safetensors", data + st_off, size - st_off);
    w = lathe::model::LoadHfModelDir(dir);
  }
  if (!w.ok()) return 0;
  RunForward(*w, data, size);
  return 0;
}
