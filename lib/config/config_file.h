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
StatusOr<std::vector<FileEntry>> ParseConfigText(std::string_view text, const std::string& filename);
StatusOr<std::vector<FileEntry>> ReadConfigFile(const std::string& path);

}  // namespace spotvisor
