#include "config/config_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "common/strings.h"
#include "config/keys.h"
#include "output/utf8.h"

namespace spotvisor {
namespace {

// A line as an error message quotes it: readable whatever its bytes, and
// not all of a line that is one megabyte long.
std::string Shown(std::string_view line) {
  constexpr std::size_t kMax = 100;
  if (line.size() <= kMax) return output::EscapeInvalidUtf8(line);
  return output::EscapeInvalidUtf8(line.substr(0, output::Utf8SafePrefixLength(line, kMax))) + "...";
}

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

ParsedConfig ParseConfigLines(std::string_view text, const std::string& filename) {
  // Editors on Windows save UTF-8 with a byte order mark; left in, it would
  // make the first key unknown ("\xef\xbb\xbfcommand").
  constexpr std::string_view kBom = "\xef\xbb\xbf";
  if (StartsWith(text, kBom)) text.remove_prefix(kBom.size());
  ParsedConfig out;
  int n = 0;
  // Every line is read: one mistake does not hide the next one, nor the
  // good lines around it (issue #32: a false "no command to run" though
  // `command` was on line 1).
  for (auto const& raw : SplitLines(text)) {
    ++n;
    auto line = Trim(raw);
    if (line.empty() || line.front() == '#') continue;
    auto where = fmt::format("{}:{}", filename, n);
    auto eq = line.find('=');
    if (eq == std::string_view::npos) {
      out.errors.push_back(fmt::format("{}: expected `key = value`, got \"{}\"", where, Shown(line)));
      continue;
    }
    std::string key(Trim(line.substr(0, eq)));
    auto value = Trim(line.substr(eq + 1));
    if (key.empty()) {
      out.errors.push_back(where + ": missing key before '='");
      continue;
    }
    FileEntry e{key, std::string(value), n};
    if (!value.empty() && value.front() == '"') {
      auto unquoted = Unquote(value, where);
      if (!unquoted.ok()) {
        out.errors.push_back(unquoted.status().message());
        continue;
      }
      e.value = *std::move(unquoted);
    }
    out.entries.push_back(std::move(e));
  }
  return out;
}

StatusOr<std::vector<FileEntry>> ParseConfigText(std::string_view text, const std::string& filename) {
  auto parsed = ParseConfigLines(text, filename);
  if (parsed.errors.empty()) return std::move(parsed.entries);
  std::string all = parsed.errors.front();
  for (std::size_t i = 1; i < parsed.errors.size(); ++i) all += "; " + parsed.errors[i];
  return InvalidArgumentError(all);
}

StatusOr<ParsedConfig> ReadConfigFileLines(const std::string& path) {
  // open(2) and read(2), not an ifstream: an ifstream opens a directory
  // without complaint and reads it as empty, and hides read errors the same way.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block the open
  if (fd < 0) return ErrnoToStatus(errno, "config file " + path);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoToStatus(err, "config file " + path);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return InvalidArgumentError(fmt::format("config file {}: {}, not a file", path,
                                            S_ISDIR(st.st_mode) ? "is a directory" : "is a special file"));
  }
  if (st.st_size > kMaxConfigFileBytes) {
    close(fd);
    return InvalidArgumentError(fmt::format("config file {}: {} bytes is too large for a config file (at most {})", path,
                                            st.st_size, kMaxConfigFileBytes));
  }
  std::string text;
  char buf[8192];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      return ErrnoToStatus(err, "reading config file " + path);
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > static_cast<std::size_t>(kMaxConfigFileBytes)) {
      close(fd);
      return InvalidArgumentError(fmt::format("config file {}: too large for a config file (at most {} bytes)", path,
                                              kMaxConfigFileBytes));
    }
  }
  close(fd);
  return ParseConfigLines(text, path);
}

StatusOr<std::vector<FileEntry>> ReadConfigFile(const std::string& path) {
  auto parsed = ReadConfigFileLines(path);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->errors.empty()) return InvalidArgumentError(parsed->errors.front());
  return std::move(parsed->entries);
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
