// Tool-call reader helper shared by the OpenAI API tests.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "server/openai_api.h"

namespace lathe::testing {

// Feeds `text` to `reader` `step` bytes at a time (then finished) and returns the content and the calls, their
// streamed deltas joined as the server joins them. `pieces` / `deltas`, when given, receive each Update's content
// and calls.
inline std::pair<std::string, std::vector<server::ToolCall>> FeedToolCallReader(
    server::ToolCallReader& reader, const std::string& text, size_t step, std::vector<std::string>* pieces = nullptr,
    std::vector<std::vector<server::ToolCall>>* deltas = nullptr) {
  std::string content;
  std::vector<server::ToolCall> calls;
  for (size_t n = 0;; n = std::min(text.size(), n + step)) {
    std::string piece;
    std::vector<server::ToolCall> delta;
    reader.Update(text.substr(0, n), n == text.size(), &piece, &delta);
    content += piece;
    server::AppendToolCalls(delta, &calls);
    if (pieces) pieces->push_back(piece);
    if (deltas) deltas->push_back(delta);
    if (n == text.size()) break;
  }
  return {content, calls};
}

}  // namespace lathe::testing
