#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace spotvisor {

struct FileEntry {
  std::string key;
  std::string value;
  int line = 0;
};

// `key = value` lines; `#` starts a comment only at the start of a line (a
// command may well contain '#'). A value may be double-quoted, with \n, \t,
// \" and \\ escapes. Errors name the file and line.
// A UTF-8 byte order mark at the start is skipped.
StatusOr<std::vector<FileEntry>> ParseConfigText(std::string_view text, const std::string& filename);
// The same, reading every line: the good ones, and an error for each bad one.
struct ParsedConfig {
  std::vector<FileEntry> entries;
  std::vector<std::string> errors;
};
ParsedConfig ParseConfigLines(std::string_view text, const std::string& filename);
// Only a regular file (a directory is an error, not an empty file), of at
// most kMaxConfigFileBytes.
StatusOr<std::vector<FileEntry>> ReadConfigFile(const std::string& path);
// Every line of it (ParseConfigLines); the status is for the file itself.
StatusOr<ParsedConfig> ReadConfigFileLines(const std::string& path);
inline constexpr long kMaxConfigFileBytes = 1 << 20;

// A config file listing every key with its help as a comment: `# key = default`,
// or `key = value` (quoted when needed) for the keys given in `set`. The image
// default file /etc/spotvisor/spotvisor.conf is generated with this, so it
// cannot fall behind the key registry. Unknown keys in `set` are an error.
StatusOr<std::string> ConfigTemplate(const std::vector<std::pair<std::string, std::string>>& set);

// How a value is written in a config file: bare when it reads back unchanged,
// else double-quoted with escapes.
std::string QuoteConfigValue(const std::string& value);

}  // namespace spotvisor
