#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace spotvisor {

struct UserInfo {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string home;
  std::string shell;
  std::vector<gid_t> groups;  // supplementary groups, resolved before fork
};

StatusOr<UserInfo> LookupUser(const std::string& name);
std::string CurrentUserName();

// mkdir -p; the directories it creates are given to `owner` (when root).
Status MakeDirs(const std::string& path, const std::optional<UserInfo>& owner);

// Whether `user` (nullopt: this process) can create, write, rename and
// delete a file in `dir`, tried for real (a probe file, removed), as that
// user: a forked child takes its identity when spotvisor is root. The
// error names the step and the errno, e.g. "cannot create a file in
// \"/data\": Permission denied" (issue #32: found at the first save, an
// epoch after the start).
Status ProbeWritable(const std::string& dir, const std::optional<UserInfo>& user);
// chown -R of `dir` to `user` (no symlink is followed).
Status GiveTreeTo(const std::string& dir, const UserInfo& user);

}  // namespace spotvisor
