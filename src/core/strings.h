// Small string helpers: edit distance and "did you mean" suggestions for bad keys and flags, trimming.
#pragma once

#include <string>
#include <vector>

namespace lathe {

// Levenshtein distance.
int EditDistance(const std::string& a, const std::string& b);
// Python's str.strip() for ASCII whitespace (jinja's trim).
std::string Trim(const std::string& s);
// The candidate nearest to `word`, or "" if none is reasonably close.
std::string Nearest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace lathe
