#include "common/units.h"

#include <cctype>
#include <cmath>

#include <fmt/format.h>

namespace spotvisor {

std::string FormatBytes(std::uint64_t b) {
  if (b < 1000) return fmt::format("{} bytes", b);
  const char* units[] = {"kB", "MB", "GB", "TB", "PB", "EB"};
  double v = static_cast<double>(b);
  int u = -1;
  while (v >= 1000 && u < 5) {
    v /= 1000;
    ++u;
  }
  // 999.96 kB rounds to "1000.0 kB": say "1.0 MB" instead.
  if (v >= 999.95 && u < 5) {
    v /= 1000;
    ++u;
  }
  return fmt::format("{:.1f} {}", v, units[u]);
}

std::string FormatRate(double bytes_per_second) {
  if (!std::isfinite(bytes_per_second) || bytes_per_second < 0.5) return "0 bytes/s";
  if (bytes_per_second >= 1.8e19) return "more than 18.0 EB/s";
  return FormatBytes(static_cast<std::uint64_t>(std::llround(bytes_per_second))) + "/s";
}

std::string ShellJoin(const std::vector<std::string>& argv) {
  std::string out;
  for (auto const& word : argv) {
    if (!out.empty()) out += ' ';
    bool bare = !word.empty();
    for (unsigned char c : word) {
      if (!(std::isalnum(c) || c == '_' || c == '-' || c == '.' || c == '/' || c == ',' || c == ':' || c == '=' ||
            c == '+' || c == '@' || c == '%')) {
        bare = false;
        break;
      }
    }
    if (bare) {
      out += word;
      continue;
    }
    out += '\'';
    for (char c : word) {
      if (c == '\'') out += "'\\''";
      else out += c;
    }
    out += '\'';
  }
  return out;
}

}  // namespace spotvisor
