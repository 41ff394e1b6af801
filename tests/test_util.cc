// Test path helpers, and the test binaries' main.
#include "test_util.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "core/cpu.h"
#include "kernels/cpu/train_dispatch.h"
#include "kernels/kernels.h"

namespace lathe::testing {

std::string SharedDir() {
  if (const char* e = std::getenv("LATHE_SHARED")) return e;
  return LATHE_SHARED_DIR;
}

std::string SharedPath(const std::string& rel) { return SharedDir() + "/" + rel; }

namespace {
// A file scripts/fetch-models.sh puts in the lathe cache ($LATHE_CACHE, else ~/.cache/lathe).
std::string CachedModel(const std::string& name) {
  std::string cache;
  if (const char* c = std::getenv("LATHE_CACHE")) cache = c;
  else if (const char* h = std::getenv("HOME")) cache = std::string(h) + "/.cache/lathe";
  return cache + "/models/" + name;
}
}  // namespace

std::string SmolLM2Path() {
  if (const char* e = std::getenv("LATHE_SMOLLM2")) return e;
  return CachedModel("SmolLM2-135M-Instruct.Q4_1.gguf");
}

std::string MistralV3TokenizerPath() {
  // Beside the SmolLM2 file when $LATHE_SMOLLM2 names it (the CI sets it to the cache's copy).
  if (const char* e = std::getenv("LATHE_SMOLLM2")) {
    const std::string s = e;
    const size_t slash = s.rfind('/');
    if (slash != std::string::npos) return s.substr(0, slash + 1) + "mistral_instruct_tokenizer_240323.model.v3";
  }
  return CachedModel("mistral_instruct_tokenizer_240323.model.v3");
}

std::string SourceDir() { return LATHE_SOURCE_DIR; }

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool RequireAllInputs() {
  const char* e = std::getenv("LATHE_REQUIRE_ALL");
  return e && e[0] == '1';
}

ScopedTempDir::ScopedTempDir(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) {
    ADD_FAILURE() << "mkdtemp " << tmpl << " failed";
    return;
  }
  path = buf.data();
}

ScopedTempDir::~ScopedTempDir() {
  std::error_code ec;
  if (!path.empty()) std::filesystem::remove_all(path, ec);
}

namespace {

// The tuning switches ctest forces in its extra runs of a suite (CMakeLists.txt: ops.bf16_pairs_*,
// ops.train_gemm_subchunks_*, golden.smollm2_int16_prompt_*): true when at least one is set and each set one lands
// on this CPU's own choice, the form the discovered tests ran already.
bool ForcedFormsAreTheDefault(std::string* which) {
  bool any = false, same = true;
  auto check = [&](const char* name, bool forced, bool dflt) {
    if (!std::getenv(name)) return;
    any = true;
    same = same && forced == dflt;
    const std::string set = std::string(name) + "=" + std::getenv(name);
    if (which->find(set) == std::string::npos) *which += (which->empty() ? "" : ", ") + set;
  };
  check("LATHE_BF16_PAIRS", Bf16PairsOnFma(), Bf16PairsOnFmaDefault());
  check("LATHE_BF16_PAIRS", UsesAmxBf16(), UsesAmxBf16Default());
  check("LATHE_GEMM_SUBCHUNKS", kernels::cpu::GemmSubChunks(), kernels::cpu::GemmSubChunksDefault());
  check("LATHE_INT16_PROMPT", kernels::Int16PromptRows(), kernels::Int16PromptRowsDefault());
  return any && same;
}

}  // namespace

}  // namespace lathe::testing

// With LATHE_SKIP_DEFAULT_FORM=1 (those ctest entries), a run whose forced forms are all this CPU's own choices
// exits 77, which ctest reports as skipped: it would repeat the discovered run test for test.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string which;
  if (std::getenv("LATHE_SKIP_DEFAULT_FORM") && lathe::testing::ForcedFormsAreTheDefault(&which)) {
    std::printf("skipped: %s is this CPU's own choice, which the discovered tests run\n", which.c_str());
    return 77;
  }
  return RUN_ALL_TESTS();
}
