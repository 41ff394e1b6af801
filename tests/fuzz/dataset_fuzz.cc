// libFuzzer target for training data (datasets are downloaded, untrusted): one data file read
// through a dataset_info.json registry as alpaca (.json array or .jsonl, with system / history
// columns), sharegpt (from/value), OpenAI-style messages (role/content tags) or plain text (.txt,
// `pt`), then rendered with a chat template, tokenized with labels masked, cut to cutoff_len and
// packed; sharegpt's tool turns (function_call / observation, tools) in each template's tool format. The first byte picks the dataset entry, template, cutoff and flags; the rest is the
// file. Any bytes must give examples or an error naming the file, never crash or hit UB.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "fuzz_file.h"
#include "tokenizer/bpe.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/unicode.h"
#include "train/dataset.h"

namespace {

using namespace lathe;

constexpr const char* kRegistry = R"({
  "alpaca_json": {"file_name": "data.json", "columns": {"prompt": "instruction", "query": "input",
                  "response": "output", "system": "system", "history": "history"}},
  "alpaca_jsonl": {"file_name": "data.jsonl"},
  "sharegpt": {"file_name": "data.json", "formatting": "sharegpt",
               "columns": {"messages": "conversations", "system": "system", "tools": "tools"}},
  "openai": {"file_name": "data.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
             "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                      "assistant_tag": "assistant", "system_tag": "system"}},
  "text": {"file_name": "data.txt", "columns": {"prompt": "text"}}
})";

struct Setup {
  std::string dir;
  std::unique_ptr<tokenizer::Tokenizer> tok;
};

// A byte-level BPE: the 256 byte tokens, a few merges and the chat templates' special tokens.
const Setup& Init() {
  static Setup s = [] {
    Setup r;
    r.dir = fuzz::TempDir("dataset_fuzz");
    fuzz::WriteFile(r.dir + "/dataset_info.json", kRegistry, std::strlen(kRegistry));
    tokenizer::BpeVocab v;
    for (int b = 0; b < 256; ++b) v.pieces.push_back(tokenizer::ByteToUnicode()[b]);
    const char* merges[][2] = {{"t", "h"}, {"th", "e"}, {"Ġ", "t"}, {"Ġt", "he"}, {"a", "n"}, {"i", "n"}};
    for (auto& m : merges) {
      v.merges.emplace_back(m[0], m[1]);
      v.pieces.push_back(std::string(m[0]) + m[1]);
    }
    if (!v.pre.AddByteLevelRegex().ok()) std::abort();
    v.has_added_tokens = true;
    for (const char* special : {"<|im_start|>", "<|im_end|>", "<s>", "</s>", "<|begin_of_text|>",
                                "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "[INST]", "[/INST]"}) {
      v.added.push_back({special, (int32_t)v.pieces.size(), true});
      v.pieces.push_back(special);
    }
    v.bos_id = 258 + 6;  // "<s>"
    v.eos_id = 259 + 6;  // "</s>"
    auto t = tokenizer::MakeBpeTokenizer(std::move(v), "fuzz");
    if (!t.ok()) std::abort();
    r.tok = std::move(*t);
    return r;
  }();
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Setup& s = Init();
  const uint8_t f = data[0];
  static const char* kNames[] = {"alpaca_json", "alpaca_jsonl", "sharegpt", "openai", "text"};
  static const char* kFiles[] = {"data.json", "data.jsonl", "data.json", "data.jsonl", "data.txt"};
  static const char* kTemplates[] = {"chatml", "llama3", "llama2", "mistral", "alpaca", "mistral-v3"};
  const int which = f % 5;
  fuzz::WriteFile(s.dir + "/" + kFiles[which], data + 1, size - 1);
  const bool pt = which == 4;
  auto ex = train::LoadExamples(s.dir, kNames[which], pt ? "pt" : "sft", (f & 0x80) ? 3 : 0);
  if (!ex.ok()) return 0;
  const int64_t cutoff = 4 + (f >> 3 & 7) * 9;  // 4 .. 67 tokens
  if (pt) {
    auto samples = train::EncodePretrain(*ex, *s.tok, cutoff);
    (void)train::Pack(std::move(samples), cutoff);
    return 0;
  }
  auto tmpl = tokenizer::ChatTemplate::ByName(kTemplates[(f >> 3) % 6]);
  if (!tmpl.ok()) std::abort();
  std::vector<train::TokenizedSample> samples;
  for (const train::Example& e : *ex) {
    bool truncated = false;
    auto t = train::EncodeConversation(e, *s.tok, *tmpl, cutoff, (f & 0x40) != 0, (f & 0x20) != 0, &truncated);
    if (!t.ok()) continue;
    if ((int64_t)t->input_ids.size() > cutoff || t->labels.size() != t->input_ids.size()) __builtin_trap();
    samples.push_back(std::move(*t));
  }
  for (const auto& p : train::Pack(std::move(samples), cutoff))
    if ((int64_t)p.input_ids.size() > cutoff || p.segment_ids.size() != p.input_ids.size()) __builtin_trap();
  return 0;
}
