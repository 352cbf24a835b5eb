#include "config/config_file.h"

#include <cerrno>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "common/strings.h"

namespace spotvisor {
namespace {

StatusOr<std::string> Unquote(std::string_view v, const std::string& where) {
  if (v.size() < 2 || v.back() != '"') {
    return InvalidArgumentError(where + ": unterminated quoted value (missing closing \")");
  }
  std::string out;
  for (std::size_t i = 1; i + 1 < v.size(); ++i) {
    char c = v[i];
    if (c == '"') return InvalidArgumentError(where + ": unescaped \" inside a quoted value (write \\\")");
    if (c != '\\') {
      out += c;
      continue;
    }
    if (i + 2 >= v.size()) return InvalidArgumentError(where + ": value ends with a lone backslash");
    switch (v[++i]) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      default:
        return InvalidArgumentError(fmt::format("{}: unknown escape \\{} (use \\n, \\t, \\\" or \\\\)", where, v[i]));
    }
  }
  return out;
}

}  // namespace

StatusOr<std::vector<FileEntry>> ParseConfigText(std::string_view text, const std::string& filename) {
  std::vector<FileEntry> out;
  int n = 0;
  for (auto const& raw : SplitLines(text)) {
    ++n;
    auto line = Trim(raw);
    if (line.empty() || line.front() == '#') continue;
    auto where = fmt::format("{}:{}", filename, n);
    auto eq = line.find('=');
    if (eq == std::string_view::npos) {
      return InvalidArgumentError(fmt::format("{}: expected `key = value`, got \"{}\"", where, line));
    }
    std::string key(Trim(line.substr(0, eq)));
    auto value = Trim(line.substr(eq + 1));
    if (key.empty()) return InvalidArgumentError(where + ": missing key before '='");
    FileEntry e{key, std::string(value), n};
    if (!value.empty() && value.front() == '"') {
      auto unquoted = Unquote(value, where);
      if (!unquoted.ok()) return unquoted.status();
      e.value = *std::move(unquoted);
    }
    out.push_back(std::move(e));
  }
  return out;
}

StatusOr<std::vector<FileEntry>> ReadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return ErrnoToStatus(errno, "config file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseConfigText(ss.str(), path);
}

}  // namespace spotvisor
