// File helpers shared by the unit tests (test code only: no checks, a
// failure shows up as the test's own assertion on what was read).
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace spotvisor::testfiles {

// Writes `data` to `path`, creating its parent directories.
inline void Write(const std::string& path, const std::string& data) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << data;
}

// The whole file; empty if it cannot be read.
inline std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace spotvisor::testfiles
