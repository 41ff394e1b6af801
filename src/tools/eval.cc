// Perplexity evaluation.
#include "tools/eval.h"

#include <algorithm>
#include <cmath>

namespace lathe::tools {

double NllResult::perplexity() const { return std::exp(mean_nll()); }
double NllResult::bits_per_byte() const { return bytes ? total_nll / std::log(2.0) / bytes : 0; }

std::vector<std::string> SplitDocuments(const std::string& text, const std::string& separator) {
  std::vector<std::string> docs;
  auto trim_push = [&](std::string s) {
    size_t b = s.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return;
    size_t e = s.find_last_not_of(" \t\r\n");
    docs.push_back(s.substr(b, e - b + 1));
  };
  if (separator.empty()) {
    trim_push(text);
    return docs;
  }
  size_t p = 0;
  for (;;) {
    size_t q = text.find(separator, p);
    trim_push(text.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + separator.size();
  }
  return docs;
}

Result<NllResult> EvaluateNll(model::Transformer& tf, const tokenizer::Tokenizer& tok,
                              const std::vector<std::string>& documents, int64_t max_len, int64_t batch_tokens,
                              DType kv_dtype) {
  const int64_t V = tf.config().vocab_size;
  std::vector<std::vector<int32_t>> seqs;
  NllResult res;
  for (const std::string& d : documents) {
    std::vector<int32_t> ids = tok.Encode(d, false, false);
    // A BOS where the tokenizer adds one (as transformers' tokenizer and llama.cpp's perplexity do); without one
    // (Qwen's, SmolLM2's) the first token only conditions the rest, as in transformers' loss.
    if (tok.add_bos() && tok.bos_id() >= 0) ids.insert(ids.begin(), tok.bos_id());
    if ((int64_t)ids.size() > max_len) ids.resize(max_len);
    if (ids.size() < 2) continue;
    res.bytes += (int64_t)d.size();
    seqs.push_back(std::move(ids));
  }
  // Greedy batching by token count; each sequence gets its own cache slot.
  std::vector<float> logits;
  size_t i = 0;
  while (i < seqs.size()) {
    size_t j = i;
    int64_t tokens = 0;
    while (j < seqs.size() && (j == i || tokens + (int64_t)seqs[j].size() <= batch_tokens)) tokens += (int64_t)seqs[j++].size();
    model::KvCache cache(tf.config(), (int)(j - i), max_len, /*block_size=*/16, kv_dtype);
    std::vector<model::SeqInput> batch;
    for (size_t k = i; k < j; ++k) batch.push_back({(int)(k - i), seqs[k], true});
    LATHE_RETURN_IF_ERROR(tf.Forward(cache, batch, &logits));
    int64_t row = 0;
    for (size_t k = i; k < j; ++k) {
      const auto& ids = seqs[k];
      for (size_t t = 0; t + 1 < ids.size(); ++t) {
        const float* l = &logits[(row + (int64_t)t) * V];
        float mx = l[kernels::Argmax(l, V)];
        double s = 0;
        for (int64_t v = 0; v < V; ++v) s += std::exp((double)l[v] - mx);
        res.total_nll += (mx + std::log(s)) - l[ids[t + 1]];
        res.tokens++;
      }
      row += (int64_t)ids.size();
      res.documents++;
    }
    i = j;
  }
  return res;
}

}  // namespace lathe::tools
