// Dataset registry, format conversion, tokenization with label masks, packing and splitting.
#include "train/dataset.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/mapped_file.h"
#include "core/strings.h"

namespace lathe::train {

using nlohmann::json;

int64_t TokenizedSample::target_tokens() const {
  return std::count_if(labels.begin(), labels.end(), [](int32_t l) { return l != kIgnoreIndex; });
}

namespace {

using ojson = nlohmann::ordered_json;

// A sharegpt record's tools: a JSON list of function definitions ({"name", "description", "parameters"}, or
// OpenAI's {"type": "function", "function": {...}}); one object is a list of one.
Result<ojson> ParseTools(const std::string& text, const std::string& where) {
  ojson tools = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (tools.is_object()) tools = ojson::array({tools});
  const char* shape = " must be a JSON list of tools ({\"name\": ..., \"description\": ..., \"parameters\": {...}})";
  if (!tools.is_array()) return Status::Error(where + shape);
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const ojson& f = t.is_object() && t.contains("function") ? t["function"] : t;
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty()) {
      return Status::Error(where + shape + "; tool " + std::to_string(i) + " has no \"name\"");
    }
    if (f.contains("parameters") && !f["parameters"].is_object() && !f["parameters"].is_null()) {
      return Status::Error(where + ": tool '" + f["name"].get<std::string>() + "' has \"parameters\" that are not a "
                                   "JSON schema object");
    }
  }
  return tools;
}

// A function_call message: {"name": ..., "arguments": {...}} or a list of them (parallel calls), as LLaMA-Factory
// reads it; arguments given as a JSON string are read as the JSON they hold.
Result<std::vector<tokenizer::ToolCallTurn>> ParseCalls(const std::string& text, const std::string& where) {
  ojson calls = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (calls.is_object()) calls = ojson::array({calls});
  const char* shape = " must be JSON: {\"name\": ..., \"arguments\": {...}} or a list of them";
  if (!calls.is_array() || calls.empty()) return Status::Error(where + shape);
  std::vector<tokenizer::ToolCallTurn> out;
  for (const ojson& c : calls) {
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) return Status::Error(where + shape);
    tokenizer::ToolCallTurn t;
    t.name = c["name"].get<std::string>();
    t.arguments = tokenizer::CallArguments(c.value("arguments", ojson()));
    out.push_back(std::move(t));
  }
  return out;
}

// A call's id for formats that write them (Mistral's v3: 9 letters and digits, which mistral_common's fine-tuning
// mode requires of every call and result): FNV-1a of the call message's text and the call's place in it (mixed by
// MurmurHash3's finalizer), so a
// record's ids never change between runs.
std::string CallId(const std::string& call_text, size_t k) {
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : call_text + "#" + std::to_string(k)) h = (h ^ c) * 1099511628211ull;
  h ^= h >> 33;  // MurmurHash3's finalizer: every digit depends on every byte
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  std::string id;
  for (int i = 0; i < 9; ++i, h /= 62) id += kAlnum[h % 62];
  return id;
}

std::string Col(const json& entry, const char* key, const char* def) {
  if (entry.contains("columns") && entry["columns"].is_object() && entry["columns"].contains(key) &&
      entry["columns"][key].is_string()) {
    return entry["columns"][key].get<std::string>();
  }
  return def;
}

std::string Tag(const json& entry, const char* key, const char* def) {
  if (entry.contains("tags") && entry["tags"].is_object() && entry["tags"].contains(key) &&
      entry["tags"][key].is_string()) {
    return entry["tags"][key].get<std::string>();
  }
  return def;
}

// A string field of a record, "" when absent or null; error when of another type.
Status StrField(const json& rec, const std::string& key, const std::string& where, std::string* out) {
  out->clear();
  if (!rec.contains(key) || rec[key].is_null()) return Status::Ok();
  if (!rec[key].is_string()) return Status::Error(where + ": field '" + key + "' must be a string");
  *out = rec[key].get<std::string>();
  return Status::Ok();
}

Result<std::vector<json>> ReadRecords(const std::string& path) {
  LATHE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  std::vector<json> out;
  auto ends_with = [&](const char* ext) {
    size_t n = std::strlen(ext);
    return path.size() > n && path.compare(path.size() - n, n, ext) == 0;
  };
  if (ends_with(".txt")) {
    // As the `datasets` "text" builder LLaMA-Factory uses for .txt files: one record {"text": line}
    // per line (blank lines carry no text and are dropped here).
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      out.push_back(json{{"text", line}});
    }
    return out;
  }
  if (ends_with(".jsonl")) {
    std::istringstream in(text);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        out.push_back(json::parse(line));
      } catch (const json::exception& e) {
        return Status::Error(StrFormat("%s line %d: invalid JSON: %s", path.c_str(), n, e.what()));
      }
    }
    return out;
  }
  try {
    json j = json::parse(text);
    if (!j.is_array()) return Status::Error(path + ": expected a JSON array of records");
    for (auto& r : j) out.push_back(std::move(r));
  } catch (const json::exception& e) {
    return Status::Error(path + ": invalid JSON: " + e.what());
  }
  return out;
}

}  // namespace

Result<std::vector<Example>> LoadExamples(const std::string& dataset_dir, const std::string& name,
                                          const std::string& stage, int64_t max_samples) {
  std::string info_path = dataset_dir + "/dataset_info.json";
  LATHE_ASSIGN_OR_RETURN(std::string info_text, ReadFileToString(info_path));
  json info;
  try {
    info = json::parse(info_text);
  } catch (const json::exception& e) {
    return Status::Error(info_path + ": invalid JSON: " + e.what());
  }
  if (!info.is_object() || !info.contains(name)) {
    std::vector<std::string> names;
    if (info.is_object()) for (auto& [k, v] : info.items()) names.push_back(k);
    std::string near = Nearest(name, names);
    return Status::Error(StrFormat("dataset '%s' is not in %s%s", name.c_str(), info_path.c_str(),
                                   near.empty() ? "" : (" (did you mean '" + near + "'?)").c_str()));
  }
  const json& e = info[name];
  if (!e.contains("file_name") || !e["file_name"].is_string()) {
    return Status::Error(StrFormat("%s: dataset '%s' has no local file_name (hub datasets are not fetched: lathe "
                                   "reads local files only)", info_path.c_str(), name.c_str()));
  }
  // os.path.join semantics, as LLaMA-Factory: an absolute file_name stands on its own.
  const std::string file_name = e["file_name"].get<std::string>();
  std::string file = !file_name.empty() && file_name[0] == '/' ? file_name : dataset_dir + "/" + file_name;
  const std::string formatting =
      !e.contains("formatting") ? "alpaca"
      : e["formatting"].is_string() ? e["formatting"].get<std::string>()
                                    : e["formatting"].dump();
  if (formatting != "alpaca" && formatting != "sharegpt") {
    return Status::Error(StrFormat("%s: dataset '%s' has formatting '%s' (expected alpaca or sharegpt)",
                                   info_path.c_str(), name.c_str(), formatting.c_str()));
  }
  const bool ranking = e.contains("ranking") && e["ranking"] == true;
  LATHE_ASSIGN_OR_RETURN(std::vector<json> records, ReadRecords(file));
  if (max_samples > 0 && (int64_t)records.size() > max_samples) records.resize(max_samples);
  std::vector<Example> out;
  for (size_t i = 0; i < records.size(); ++i) {
    const json& r = records[i];
    std::string where = file + " record " + std::to_string(i);
    if (!r.is_object()) return Status::Error(where + ": expected a JSON object");
    Example ex;
    ex.source = where;
    if (stage == "pt") {
      LATHE_RETURN_IF_ERROR(StrField(r, Col(e, "prompt", "text"), where, &ex.text));
      out.push_back(std::move(ex));
      continue;
    }
    if (formatting == "alpaca") {
      std::string instruction, input, output, system;
      LATHE_RETURN_IF_ERROR(StrField(r, Col(e, "prompt", "instruction"), where, &instruction));
      LATHE_RETURN_IF_ERROR(StrField(r, Col(e, "query", "input"), where, &input));
      LATHE_RETURN_IF_ERROR(StrField(r, Col(e, "response", "output"), where, &output));
      LATHE_RETURN_IF_ERROR(StrField(r, Col(e, "system", "system"), where, &system));
      if (!system.empty()) ex.messages.push_back({"system", system});
      std::string hist_col = Col(e, "history", "history");
      if (r.contains(hist_col) && r[hist_col].is_array()) {
        for (const json& turn : r[hist_col]) {
          if (!turn.is_array() || turn.size() != 2 || !turn[0].is_string() || !turn[1].is_string()) {
            return Status::Error(where + ": field '" + hist_col + "' must be a list of [user, assistant] pairs");
          }
          ex.messages.push_back({"user", turn[0].get<std::string>()});
          ex.messages.push_back({"assistant", turn[1].get<std::string>()});
        }
      }
      // As LLaMA-Factory: instruction and input joined by a newline.
      ex.messages.push_back({"user", input.empty() ? instruction : instruction + "\n" + input});
      ex.messages.push_back({"assistant", output});
    } else {
      std::string msg_col = Col(e, "messages", "conversations");
      std::string role_tag = Tag(e, "role_tag", "from"), content_tag = Tag(e, "content_tag", "value");
      std::string user = Tag(e, "user_tag", "human"), assistant = Tag(e, "assistant_tag", "gpt");
      std::string observation = Tag(e, "observation_tag", "observation");
      std::string function = Tag(e, "function_tag", "function_call"), system_tag = Tag(e, "system_tag", "system");
      if (!r.contains(msg_col) || !r[msg_col].is_array()) {
        return Status::Error(where + ": field '" + msg_col + "' must be a list of messages");
      }
      std::string system;
      LATHE_RETURN_IF_ERROR(StrField(r, Col(e, "system", "system"), where, &system));
      std::string tools_col = Col(e, "tools", "tools");
      LATHE_RETURN_IF_ERROR(StrField(r, tools_col, where, &ex.tools));
      if (!ex.tools.empty()) LATHE_RETURN_IF_ERROR(ParseTools(ex.tools, where + ": field '" + tools_col + "'").status());
      for (const json& m : r[msg_col]) {
        if (!m.is_object() || !m.contains(role_tag) || !m[role_tag].is_string() || !m.contains(content_tag) ||
            !m[content_tag].is_string()) {
          return Status::Error(where + ": each message needs string fields '" + role_tag + "' and '" + content_tag + "'");
        }
        std::string role = m[role_tag].get<std::string>(), content = m[content_tag].get<std::string>();
        if (role == system_tag) system = content;
        else if (role == user) ex.messages.push_back({"user", content});
        else if (role == assistant) ex.messages.push_back({"assistant", content});
        else if (role == function) {
          LATHE_RETURN_IF_ERROR(ParseCalls(content, where + ": a '" + function + "' message").status());
          ex.messages.push_back({kFunctionCall, content});
        } else if (role == observation) ex.messages.push_back({kObservation, content});
        else return Status::Error(where + ": unknown role '" + role + "'");
      }
      if (ranking) {  // sft on a preference dataset: learn the chosen answer
        std::string chosen_col = Col(e, "chosen", "chosen");
        if (r.contains(chosen_col) && r[chosen_col].is_object() && r[chosen_col].contains(content_tag)) {
          ex.messages.push_back({"assistant", r[chosen_col][content_tag].get<std::string>()});
        }
      }
      if (!system.empty()) ex.messages.insert(ex.messages.begin(), {"system", system});
    }
    out.push_back(std::move(ex));
  }
  return out;
}

std::pair<int64_t, int64_t> InferSeqLen(int64_t source_len, int64_t target_len, int64_t cutoff_len) {
  int64_t max_target_len;
  if (target_len * 2 < cutoff_len) {
    max_target_len = cutoff_len;
  } else if (source_len * 2 < cutoff_len) {
    max_target_len = cutoff_len - source_len;
  } else {
    max_target_len = (int64_t)(cutoff_len * ((double)target_len / (double)(source_len + target_len)));
  }
  int64_t new_target = std::min(max_target_len, target_len);
  int64_t max_source = std::max<int64_t>(cutoff_len - new_target, 0);
  int64_t new_source = std::min(max_source, source_len);
  return {new_source, new_target};
}

Result<std::vector<tokenizer::ChatMessage>> ChatMessages(const Example& ex, const tokenizer::ChatTemplate& tmpl) {
  const tokenizer::ToolFormat format = tokenizer::ToolFormatFor(tmpl);
  std::vector<tokenizer::ChatMessage> out;
  std::string prev;
  std::vector<std::string> ids;  // the last call turn's ids: the results after it answer them in order
  size_t answered = 0;
  for (const tokenizer::ChatMessage& m : ex.messages) {
    if (m.role == kFunctionCall) {
      LATHE_ASSIGN_OR_RETURN(auto calls, ParseCalls(m.content, ex.source + ": a function_call message"));
      ids.clear();
      answered = 0;
      for (size_t k = 0; k < calls.size(); ++k) ids.push_back(calls[k].id = CallId(m.content, k));
      out.push_back({"assistant", tokenizer::ToolCallsText(format, "", calls)});
    } else if (m.role == kObservation) {
      const std::string id = answered < ids.size() ? ids[answered++] : "";
      tokenizer::AppendToolResult(format, m.content, id, prev == kObservation, &out);
    } else {
      out.push_back(m);
    }
    prev = m.role;
  }
  if (ex.tools.empty()) return out;
  LATHE_ASSIGN_OR_RETURN(ojson tools, ParseTools(ex.tools, ex.source + ": tools"));
  if (tools.empty()) return out;
  return tokenizer::WithToolsPrompt(std::move(out), format, tokenizer::ToolsPrompt(format, tools), tmpl);
}

Result<TokenizedSample> EncodeConversation(const Example& ex, const tokenizer::Tokenizer& tok,
                                           const tokenizer::ChatTemplate& tmpl, int64_t cutoff_len,
                                           bool train_on_prompt, bool mask_history, bool* truncated) {
  LATHE_ASSIGN_OR_RETURN(const std::vector<tokenizer::ChatMessage> messages, ChatMessages(ex, tmpl));
  // Split the rendered conversation into (prompt, response) text pairs, one per assistant reply: the prompt runs
  // from the previous reply's end to where this reply begins. The whole conversation is rendered once, as the
  // template renders it for the model (system text or tools placed late, as mistral-v3 does, or Qwen3's think
  // blocks on the last turns, are where they would be).
  std::vector<std::pair<size_t, size_t>> replies;
  const std::string text = tmpl.Apply(messages, false, &replies);
  std::vector<std::pair<std::string, std::string>> pairs;
  size_t done = 0;
  for (const auto& [begin, end] : replies) {
    pairs.push_back({text.substr(done, begin - done), text.substr(begin, end - begin)});
    done = end;
  }
  if (pairs.empty()) return Status::Error(ex.source + ": no assistant turn to train on");
  const bool add_eos = tmpl.name() == "alpaca";  // the other templates end a turn with a stop token
  TokenizedSample s;
  if (tok.add_bos() && !tmpl.text_has_bos() && tok.bos_id() >= 0) {
    s.input_ids.push_back(tok.bos_id());
    s.labels.push_back(kIgnoreIndex);
  }
  *truncated = false;
  for (size_t i = 0; i < pairs.size(); ++i) {
    std::vector<int32_t> src = tok.Encode(pairs[i].first, false, true);
    std::vector<int32_t> tgt = tok.Encode(pairs[i].second, false, true);
    if (add_eos && tok.eos_id() >= 0) tgt.push_back(tok.eos_id());
    int64_t total = (int64_t)s.input_ids.size();
    if (total >= cutoff_len) {
      *truncated = true;
      break;
    }
    auto [sl, tl] = InferSeqLen((int64_t)src.size(), (int64_t)tgt.size(), cutoff_len - total);
    if (sl < (int64_t)src.size() || tl < (int64_t)tgt.size()) *truncated = true;
    src.resize(sl);
    tgt.resize(tl);
    bool learn = !mask_history || i + 1 == pairs.size();
    for (int32_t t : src) {
      s.input_ids.push_back(t);
      s.labels.push_back(train_on_prompt ? t : kIgnoreIndex);
    }
    for (int32_t t : tgt) {
      s.input_ids.push_back(t);
      s.labels.push_back(learn ? t : kIgnoreIndex);
    }
  }
  s.segment_ids.assign(s.input_ids.size(), 0);
  return s;
}

std::vector<TokenizedSample> EncodePretrain(const std::vector<Example>& examples, const tokenizer::Tokenizer& tok,
                                            int64_t cutoff_len) {
  std::vector<int32_t> stream;
  for (const Example& ex : examples) {
    std::vector<int32_t> ids = tok.Encode(ex.text, tok.add_bos(), false);
    stream.insert(stream.end(), ids.begin(), ids.end());
    if (tok.eos_id() >= 0) stream.push_back(tok.eos_id());
  }
  std::vector<TokenizedSample> out;
  for (size_t p = 0; p + cutoff_len <= stream.size(); p += cutoff_len) {
    TokenizedSample s;
    s.input_ids.assign(stream.begin() + p, stream.begin() + p + cutoff_len);
    s.labels = s.input_ids;
    s.segment_ids.assign(cutoff_len, 0);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<TokenizedSample> Pack(std::vector<TokenizedSample> samples, int64_t cutoff_len) {
  std::stable_sort(samples.begin(), samples.end(), [](const TokenizedSample& a, const TokenizedSample& b) {
    return a.input_ids.size() > b.input_ids.size();
  });
  std::vector<TokenizedSample> bins;
  for (TokenizedSample& s : samples) {
    size_t n = s.input_ids.size();
    TokenizedSample* dst = nullptr;
    for (TokenizedSample& b : bins) {  // first fit
      if (b.input_ids.size() + n <= (size_t)cutoff_len) {
        dst = &b;
        break;
      }
    }
    if (!dst) {
      bins.emplace_back();
      dst = &bins.back();
    }
    int32_t seg = dst->segment_ids.empty() ? 0 : dst->segment_ids.back() + 1;
    dst->input_ids.insert(dst->input_ids.end(), s.input_ids.begin(), s.input_ids.end());
    dst->labels.insert(dst->labels.end(), s.labels.begin(), s.labels.end());
    dst->segment_ids.insert(dst->segment_ids.end(), n, seg);
  }
  return bins;
}

Result<DatasetSplit> BuildDatasets(const TrainConfig& c, const tokenizer::Tokenizer& tok,
                                   const tokenizer::ChatTemplate& tmpl) {
  DatasetSplit out;
  std::vector<Example> all;
  for (const std::string& name : c.dataset) {
    LATHE_ASSIGN_OR_RETURN(std::vector<Example> ex, LoadExamples(c.dataset_dir, name, c.stage, c.max_samples));
    all.insert(all.end(), std::make_move_iterator(ex.begin()), std::make_move_iterator(ex.end()));
  }
  out.examples = (int64_t)all.size();
  std::vector<TokenizedSample> samples;
  if (c.stage == "pt") {
    samples = EncodePretrain(all, tok, c.cutoff_len);
  } else {
    for (const Example& ex : all) {
      bool truncated = false;
      LATHE_ASSIGN_OR_RETURN(TokenizedSample s,
                             EncodeConversation(ex, tok, tmpl, c.cutoff_len, c.train_on_prompt, c.mask_history,
                                                &truncated));
      out.truncated += truncated;
      if (s.target_tokens() == 0) {
        out.dropped++;
        continue;
      }
      samples.push_back(std::move(s));
    }
  }
  if (samples.empty()) return Status::Error("no training samples: every example was empty or cut away");
  // Deterministic shuffle (own Fisher-Yates: std::shuffle's output is implementation-defined).
  std::mt19937_64 rng((uint64_t)c.seed);
  for (size_t i = samples.size(); i > 1; --i) std::swap(samples[i - 1], samples[rng() % i]);
  int64_t n_val = c.val_size >= 1 ? (int64_t)c.val_size : (int64_t)(c.val_size * (double)samples.size());
  if (n_val >= (int64_t)samples.size()) {
    return Status::Error(StrFormat("key 'val_size': %g leaves no training samples out of %zu", c.val_size,
                                   samples.size()));
  }
  out.eval.assign(std::make_move_iterator(samples.end() - n_val), std::make_move_iterator(samples.end()));
  samples.resize(samples.size() - n_val);
  out.train = c.packing && c.stage != "pt" ? Pack(std::move(samples), c.cutoff_len) : std::move(samples);
  return out;
}

}  // namespace lathe::train
