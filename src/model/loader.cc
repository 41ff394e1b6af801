// LoadModel: format detection and tokenizer discovery.
#include "model/loader.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstring>

#include "core/mapped_file.h"
#include "formats/gguf.h"
#include "model/load_gguf.h"
#include "model/load_hf.h"
#include "model/load_llama2c.h"

namespace lathe::model {

namespace {

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
std::string DirOf(const std::string& p) {
  size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

// First 4 bytes of a file, or "" if unreadable.
std::string Magic(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return "";
  char m[4] = {0, 0, 0, 0};
  size_t n = std::fread(m, 1, 4, f);
  std::fclose(f);
  return std::string(m, n);
}

// Vocab size of a llama2.c tokenizer .bin: count the entries until EOF.
Result<int> CountLlama2cTokens(const std::string& path) {
  LATHE_ASSIGN_OR_RETURN(auto mf, MappedFile::Open(path));
  const uint8_t* d = mf->data();
  size_t n = mf->size(), p = 4;
  int count = 0;
  while (p + 8 <= n) {
    int32_t len;
    std::memcpy(&len, d + p + 4, 4);
    if (len < 0 || (size_t)len > n - p - 8) {
      return Status::Error(StrFormat("%s: bad token length %d at offset %zu", path.c_str(), len, p + 4));
    }
    p += 8 + len;
    ++count;
  }
  if (p != n || count == 0) return Status::Error(path + ": not a llama2.c tokenizer file");
  return count;
}

}  // namespace

Result<std::unique_ptr<tokenizer::Tokenizer>> LoadTokenizer(const std::string& path) {
  if (IsDir(path)) {
    if (IsFile(path + "/tokenizer.json")) return tokenizer::Tokenizer::FromTokenizerJson(path + "/tokenizer.json");
    if (IsFile(path + "/tokenizer.model")) return tokenizer::Tokenizer::FromSentencePieceModel(path + "/tokenizer.model");
    return Status::Error(path + ": no tokenizer.json or tokenizer.model in this directory");
  }
  if (!IsFile(path)) return Status::Error(path + ": no such file or directory");
  if (Magic(path) == "GGUF") {
    LATHE_ASSIGN_OR_RETURN(auto g, formats::GgufFile::Open(path));
    return tokenizer::Tokenizer::FromGguf(*g);
  }
  if (EndsWith(path, ".json")) return tokenizer::Tokenizer::FromTokenizerJson(path);
  if (EndsWith(path, ".model")) return tokenizer::Tokenizer::FromSentencePieceModel(path);
  if (EndsWith(path, ".bin")) {
    LATHE_ASSIGN_OR_RETURN(int n, CountLlama2cTokens(path));
    return tokenizer::Tokenizer::FromLlama2cBin(path, n);
  }
  return Status::Error(path + ": unrecognized tokenizer file (expected .gguf, tokenizer.json, .model or a llama2.c .bin)");
}

Result<std::unique_ptr<LoadedModel>> LoadModel(const std::string& path, const LoadOptions& options) {
  auto lm = std::make_unique<LoadedModel>();
  lm->path = path;
  if (IsDir(path)) {
    lm->format = "hf";
    LATHE_ASSIGN_OR_RETURN(lm->weights, LoadHfModelDir(path));
    LATHE_ASSIGN_OR_RETURN(lm->tokenizer, LoadTokenizer(options.tokenizer_path.empty() ? path : options.tokenizer_path));
  } else if (!IsFile(path)) {
    return Status::Error(path + ": no such file or directory");
  } else if (Magic(path) == "GGUF") {
    lm->format = "gguf";
    LATHE_ASSIGN_OR_RETURN(auto g, formats::GgufFile::Open(path));
    std::shared_ptr<formats::GgufFile> shared(std::move(g));
    LATHE_ASSIGN_OR_RETURN(lm->weights, LoadGgufWeights(shared));
    if (options.tokenizer_path.empty()) {
      LATHE_ASSIGN_OR_RETURN(lm->tokenizer, tokenizer::Tokenizer::FromGguf(*shared));
    } else {
      LATHE_ASSIGN_OR_RETURN(lm->tokenizer, LoadTokenizer(options.tokenizer_path));
    }
  } else if (EndsWith(path, ".bin")) {
    lm->format = "llama2c";
    LATHE_ASSIGN_OR_RETURN(lm->weights, LoadLlama2cBin(path));
    std::string tok = options.tokenizer_path;
    if (tok.empty()) {
      // llama2.c conventions: tok{vocab}.bin or tokenizer.bin beside the model.
      std::string dir = DirOf(path);
      std::string sized = dir + "/tok" + std::to_string(lm->weights.config.vocab_size) + ".bin";
      if (IsFile(sized)) tok = sized;
      else if (IsFile(dir + "/tokenizer.bin")) tok = dir + "/tokenizer.bin";
      else return Status::Error(path + ": no tokenizer found beside the model (tok<vocab>.bin or tokenizer.bin); pass --tokenizer");
    }
    LATHE_ASSIGN_OR_RETURN(lm->tokenizer, LoadTokenizer(tok));
  } else {
    return Status::Error(path + ": unrecognized model file (expected a .gguf, an HF model directory, or a llama2.c .bin)");
  }
  if (!options.adapter_path.empty()) {
    LATHE_ASSIGN_OR_RETURN(lm->adapter, LoadPeftAdapter(options.adapter_path, lm->weights.config));
  }
  if (lm->tokenizer->vocab_size() > lm->weights.config.vocab_size) {
    return Status::Error(StrFormat("%s: tokenizer has %d tokens but the model's vocabulary is %lld", path.c_str(),
                                   lm->tokenizer->vocab_size(), (long long)lm->weights.config.vocab_size));
  }
  return lm;
}

}  // namespace lathe::model
