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

}  // namespace spotvisor
