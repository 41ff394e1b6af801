// Test path helpers.
#include "test_util.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

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

}  // namespace lathe::testing
