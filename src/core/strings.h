// Small string helpers: edit distance and "did you mean" suggestions for bad keys and flags, trimming, markers in
// streamed text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lathe {

// Levenshtein distance.
int EditDistance(const std::string& a, const std::string& b);
// Python's str.strip() for ASCII whitespace (jinja's trim).
std::string Trim(const std::string& s);
// The length of the longest end of `text` that is the beginning of `marker` but not all of it: what a reader of
// streamed text holds back because the next piece may complete the marker.
size_t MarkerPrefixAtEnd(std::string_view text, std::string_view marker);
// The candidate nearest to `word`, or "" if none is reasonably close.
std::string Nearest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace lathe
