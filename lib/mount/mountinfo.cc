#include "mount/mountinfo.h"

#include <cerrno>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "common/strings.h"

namespace spotvisor {
namespace {

std::string Unescape(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      auto oct = s.substr(i + 1, 3);
      if (oct.size() == 3 && oct.find_first_not_of("01234567") == std::string_view::npos) {
        out += static_cast<char>((oct[0] - '0') * 64 + (oct[1] - '0') * 8 + (oct[2] - '0'));
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

std::vector<std::string_view> Fields(std::string_view line) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    std::size_t j = i;
    while (j < line.size() && line[j] != ' ') ++j;
    if (j > i) out.push_back(line.substr(i, j - i));
    i = j;
  }
  return out;
}

}  // namespace

bool MountEntry::read_only() const {
  for (auto const& o : SplitOn(options, ',')) {
    if (o == "ro") return true;
  }
  return false;
}

// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
StatusOr<std::vector<MountEntry>> ParseMountInfo(std::string_view text) {
  std::vector<MountEntry> out;
  int n = 0;
  for (auto const& line : SplitLines(text)) {
    ++n;
    if (Trim(line).empty()) continue;
    auto f = Fields(line);
    std::size_t dash = 6;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (f.size() < 6 || dash + 3 > f.size()) {
      return InvalidArgumentError(fmt::format("mountinfo line {}: unexpected format: {}", n, line));
    }
    MountEntry e;
    e.mount_id = std::atoi(std::string(f[0]).c_str());
    e.parent_id = std::atoi(std::string(f[1]).c_str());
    auto colon = f[2].find(':');
    if (colon == std::string_view::npos) return InvalidArgumentError(fmt::format("mountinfo line {}: bad device {}", n, f[2]));
    e.major = static_cast<unsigned>(std::stoul(std::string(f[2].substr(0, colon))));
    e.minor = static_cast<unsigned>(std::stoul(std::string(f[2].substr(colon + 1))));
    e.root = Unescape(f[3]);
    e.mount_point = Unescape(f[4]);
    e.options = std::string(f[5]);
    e.fstype = std::string(f[dash + 1]);
    e.source = Unescape(f[dash + 2]);
    if (dash + 3 < f.size()) e.super_options = std::string(f[dash + 3]);
    out.push_back(std::move(e));
  }
  return out;
}

StatusOr<std::vector<MountEntry>> ReadMountInfo(const std::string& path) {
  std::ifstream in(path);
  if (!in) return ErrnoToStatus(errno, path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseMountInfo(ss.str());
}

std::optional<MountEntry> FindMountAt(const std::vector<MountEntry>& table, const std::string& mount_point) {
  std::optional<MountEntry> found;
  for (auto const& e : table) {
    if (e.mount_point == mount_point) found = e;
  }
  return found;
}

}  // namespace spotvisor
