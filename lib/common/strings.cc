#include "common/strings.h"

#include <algorithm>
#include <numeric>

namespace spotvisor {

std::string_view Trim(std::string_view s) {
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::vector<std::string> SplitLines(std::string_view s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    auto nl = s.find('\n', start);
    if (nl == std::string_view::npos) {
      if (start < s.size()) out.emplace_back(s.substr(start));
      break;
    }
    out.emplace_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

std::size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  std::iota(prev.begin(), prev.end(), 0);
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  // Allow roughly one typo per four characters, at least two.
  std::size_t best_distance = std::max<std::size_t>(2, word.size() / 4) + 1;
  for (auto const& c : candidates) {
    // The distance is at least the difference in length: a candidate that far
    // off cannot win, and skipping it keeps a long unknown key (any bytes from
    // a file or metadata) from costing length x candidates x key length.
    auto gap = word.size() > c.size() ? word.size() - c.size() : c.size() - word.size();
    if (gap >= best_distance) continue;
    auto d = EditDistance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

std::vector<std::string> SplitOn(std::string_view s, char sep) {
  std::vector<std::string> out;
  for (;;) {
    auto i = s.find(sep);
    out.emplace_back(s.substr(0, i));
    if (i == std::string_view::npos) return out;
    s.remove_prefix(i + 1);
  }
}

bool PathIsUnder(std::string_view path, std::string_view dir) {
  if (dir.empty()) return false;
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  if (path == dir) return true;
  return path.size() > dir.size() && StartsWith(path, dir) && (dir == "/" || path[dir.size()] == '/');
}

std::optional<std::uint64_t> ParseUint64(std::string_view s) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

std::string UrlEncode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
        c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace spotvisor
