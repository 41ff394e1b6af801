// String helpers.
#include "core/strings.h"

#include <algorithm>

namespace lathe {

std::string Trim(const std::string& s) {
  const char* ws = " \t\n\r\v\f";
  const size_t b = s.find_first_not_of(ws);
  return b == std::string::npos ? std::string() : s.substr(b, s.find_last_not_of(ws) - b + 1);
}

int EditDistance(const std::string& a, const std::string& b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = (int)j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = (int)i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    prev.swap(cur);
  }
  return prev[b.size()];
}

std::string Nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  int best_d = 1 << 30;
  for (const std::string& c : candidates) {
    int d = EditDistance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  if (best_d <= 2) return best;  // a typo
  // Otherwise a candidate that the word extends or abbreviates ("--temperature" for "--temp")
  // beats a merely similar spelling ("--template"); among those, the closest wins.
  std::string prefix_best;
  int prefix_d = 1 << 30;
  for (const std::string& c : candidates) {
    bool related = c.size() >= 3 && word.size() >= 3 &&
                   (word.compare(0, c.size(), c) == 0 || c.compare(0, word.size(), word) == 0);
    if (related && EditDistance(word, c) < prefix_d) {
      prefix_d = EditDistance(word, c);
      prefix_best = c;
    }
  }
  if (!prefix_best.empty()) return prefix_best;
  return best_d <= std::max<int>(2, (int)word.size() / 3) ? best : "";
}

size_t MarkerPrefixAtEnd(std::string_view text, std::string_view marker) {
  for (size_t k = std::min(text.size(), marker.empty() ? 0 : marker.size() - 1); k > 0; --k) {
    if (text.substr(text.size() - k) == marker.substr(0, k)) return k;
  }
  return 0;
}

}  // namespace lathe
