// /proc/self/mountinfo, parsed: the one source of truth for "is it mounted".
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace spotvisor {

struct MountEntry {
  int mount_id = 0;
  int parent_id = 0;
  unsigned major = 0, minor = 0;
  std::string root;         // within the filesystem
  std::string mount_point;  // octal escapes (\040) decoded
  std::string options;      // per-mount: "ro,relatime"
  std::string fstype;       // "ext4", "fuse.rclone", "fuse.gcsfuse"
  std::string source;       // "/dev/loop3", "bucket"
  std::string super_options;
  bool read_only() const;
};

StatusOr<std::vector<MountEntry>> ParseMountInfo(std::string_view text);
StatusOr<std::vector<MountEntry>> ReadMountInfo(const std::string& path = "/proc/self/mountinfo");
// The topmost mount at exactly `mount_point` (the last one listed wins, as
// later mounts hide earlier ones).
std::optional<MountEntry> FindMountAt(const std::vector<MountEntry>& table, const std::string& mount_point);

}  // namespace spotvisor
