#include "config/config_file.h"

#include <cerrno>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "common/strings.h"
#include "config/keys.h"

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

std::string QuoteConfigValue(const std::string& value) {
  bool plain = Trim(value) == value && (value.empty() || value.front() != '"') &&
               value.find_first_of("\n\r\t\\") == std::string::npos;
  if (plain) return value;
  std::string out = "\"";
  for (char c : value) {
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      default: out += c;
    }
  }
  return out + "\"";
}

StatusOr<std::string> ConfigTemplate(const std::vector<std::pair<std::string, std::string>>& set) {
  for (auto const& [k, v] : set) {
    if (FindKey(k) == nullptr) return InvalidArgumentError(fmt::format("unknown key \"{}\"", k));
  }
  std::string out =
      "# spotvisor configuration: the image's defaults, the lowest layer.\n"
      "# Project metadata, then instance metadata (spotvisor-KEY attributes), then\n"
      "# `spotvisor run --set` override anything here. `spotvisor config` shows the\n"
      "# resolved values and where each came from; every key is explained in\n"
      "# /usr/share/doc/spotvisor/configuration.md (docs/configuration.md in the source).\n"
      "# Format: `key = value`; # starts a comment only at the start of a line; a value\n"
      "# may be double-quoted with \\n, \\t, \\\" and \\\\ escapes.\n";
  for (auto const& k : AllKeys()) {
    out += "\n";
    for (auto const& line : SplitLines(k.help)) out += fmt::format("# {}\n", line);
    const std::string* value = nullptr;
    for (auto const& [sk, sv] : set) {
      if (sk == k.name) value = &sv;  // the last --set wins, as on the command line
    }
    if (value != nullptr) {
      out += fmt::format("{} = {}\n", k.name, QuoteConfigValue(*value));
    } else {
      out += fmt::format("# {} = {}\n", k.name, QuoteConfigValue(k.default_value));
    }
  }
  return out;
}

}  // namespace spotvisor
