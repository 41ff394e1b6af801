// Test path helpers.
#include "test_util.h"

#include <sys/stat.h>

#include <cstdlib>

namespace lathe::testing {

std::string SharedDir() {
  if (const char* e = std::getenv("LATHE_SHARED")) return e;
  return LATHE_SHARED_DIR;
}

std::string SharedPath(const std::string& rel) { return SharedDir() + "/" + rel; }

std::string SmolLM2Path() {
  if (const char* e = std::getenv("LATHE_SMOLLM2")) return e;
  std::string cache;
  if (const char* c = std::getenv("LATHE_CACHE")) cache = c;
  else if (const char* h = std::getenv("HOME")) cache = std::string(h) + "/.cache/lathe";
  return cache + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string SourceDir() { return LATHE_SOURCE_DIR; }

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

bool RequireAllInputs() {
  const char* e = std::getenv("LATHE_REQUIRE_ALL");
  return e && e[0] == '1';
}

}  // namespace lathe::testing
