// Training data as LLaMA-Factory defines it: datasets named in a dataset_info.json registry,
// in alpaca or sharegpt format (or plain text for `pt`), rendered with the model's chat template,
// tokenized turn by turn with labels masked to the assistant turns, cut to cutoff_len the way
// LLaMA-Factory does, optionally packed (with segment ids so packed samples never attend to each
// other), shuffled by seed and split into train/eval.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tool_turns.h"
#include "train/train_config.h"

namespace lathe::train {

constexpr int32_t kIgnoreIndex = -100;

// Roles of sharegpt's tool turns in Example::messages, written in the template's tool format by ChatMessages: a
// function call (content: {"name", "arguments"} or a list of them, as JSON) and an observation (a tool's result).
inline constexpr char kFunctionCall[] = "function_call";
inline constexpr char kObservation[] = "observation";

// One record after format conversion: a conversation (sft) or a text (pt).
struct Example {
  std::vector<tokenizer::ChatMessage> messages;  // may start with a system message
  std::string tools;  // sharegpt: the tools the conversation may call (a JSON list), empty when none
  std::string text;
  std::string source;  // "file.json#12", for error messages
};

struct TokenizedSample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;       // kIgnoreIndex where no loss is taken
  std::vector<int32_t> segment_ids;  // per token; tokens attend only within their segment
  int64_t target_tokens() const;
};

struct DatasetSplit {
  std::vector<TokenizedSample> train, eval;
  int64_t examples = 0;     // records read
  int64_t truncated = 0;    // samples cut to cutoff_len
  int64_t dropped = 0;      // samples with no target token left
};

// Reads one dataset of the registry in dataset_dir (file formats: .json array, .jsonl).
Result<std::vector<Example>> LoadExamples(const std::string& dataset_dir, const std::string& name,
                                          const std::string& stage, int64_t max_samples);

// LLaMA-Factory's split of a cutoff budget between a turn's prompt and response.
std::pair<int64_t, int64_t> InferSeqLen(int64_t source_len, int64_t target_len, int64_t cutoff_len);

// The messages the chat template renders for an example: tool calls, results and the tools themselves written
// as the template's model family writes them (tokenizer/tool_turns.h), so the model learns the format it is served
// with.
Result<std::vector<tokenizer::ChatMessage>> ChatMessages(const Example& ex, const tokenizer::ChatTemplate& tmpl);

// Tokenizes a conversation (ChatMessages, rendered once): every assistant turn is a target (only the last with mask_history),
// the rest masked unless train_on_prompt.
Result<TokenizedSample> EncodeConversation(const Example& ex, const tokenizer::Tokenizer& tok,
                                           const tokenizer::ChatTemplate& tmpl, int64_t cutoff_len,
                                           bool train_on_prompt, bool mask_history, bool* truncated);

// Concatenates texts (each + EOS) and cuts the stream into cutoff_len blocks (the `pt` stage).
std::vector<TokenizedSample> EncodePretrain(const std::vector<Example>& examples, const tokenizer::Tokenizer& tok,
                                            int64_t cutoff_len);

// Greedily packs samples (longest first) into sequences of at most cutoff_len tokens, giving each
// original sample its own segment id.
std::vector<TokenizedSample> Pack(std::vector<TokenizedSample> samples, int64_t cutoff_len);

// Everything above for a TrainConfig: all datasets, shuffled with `seed`, val_size split off.
Result<DatasetSplit> BuildDatasets(const TrainConfig& config, const tokenizer::Tokenizer& tok,
                                   const tokenizer::ChatTemplate& tmpl);

}  // namespace lathe::train
