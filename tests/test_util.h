// Helpers shared by all test suites: where the shared models/data live, and skipping vs failing
// when an optional large file (the SmolLM2 model) is absent.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace lathe::testing {

// ../shared (or $LATHE_SHARED).
std::string SharedDir();
// Path under ../shared/models or ../shared/data.
std::string SharedPath(const std::string& rel);
// The cached SmolLM2-135M-Instruct Q4_1 GGUF ($LATHE_SMOLLM2, else $LATHE_CACHE or ~/.cache/lathe).
std::string SmolLM2Path();
// Mistral-7B-Instruct-v0.3's SentencePiece tokenizer.model, from the mistral-common wheel (fetch-models.sh --tests).
std::string MistralV3TokenizerPath();
// Source tree root (for fixtures under tests/).
std::string SourceDir();
// A file under tests/unit/fixtures/formats.
inline std::string FormatsFixture(const std::string& rel) { return SourceDir() + "/tests/unit/fixtures/formats/" + rel; }
bool FileExists(const std::string& path);
// The whole file's bytes ("" when it cannot be read).
std::string ReadAll(const std::string& path);
// True when a missing optional input must fail the test instead of skipping it (CI sets it).
bool RequireAllInputs();

// A new directory under the system temp directory (prefix + a unique suffix, mkdtemp), removed with
// everything in it when the object is destroyed: a test's files never outlive its binary.
struct ScopedTempDir {
  std::string path;
  explicit ScopedTempDir(const std::string& prefix = "lathe_test_");
  ~ScopedTempDir();
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
};

}  // namespace lathe::testing

// Skips (or, with LATHE_REQUIRE_ALL=1, fails) the current test when `path` does not exist.
#define LATHE_REQUIRE_FILE(path)                                                    \
  do {                                                                              \
    if (!::lathe::testing::FileExists(path)) {                                      \
      if (::lathe::testing::RequireAllInputs()) FAIL() << "missing input " << (path); \
      GTEST_SKIP() << "missing input " << (path) << " (run scripts/fetch-models.sh)"; \
    }                                                                               \
  } while (0)
