#include "process/user.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

namespace spotvisor {

StatusOr<UserInfo> LookupUser(const std::string& name) {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* result = nullptr;
  int rc = getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &result);
  if (rc != 0) return ErrnoToStatus(rc, fmt::format("looking up user \"{}\"", name));
  if (result == nullptr) return NotFoundError(fmt::format("user \"{}\" does not exist on this machine", name));
  UserInfo u{pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir ? pw.pw_dir : "/", pw.pw_shell ? pw.pw_shell : "", {}};
  int n = 64;
  for (int attempt = 0; attempt < 4; ++attempt) {
    u.groups.resize(static_cast<std::size_t>(n));
    int want = n;
    if (getgrouplist(u.name.c_str(), u.gid, u.groups.data(), &want) >= 0) {
      u.groups.resize(static_cast<std::size_t>(want));
      return u;
    }
    n = want;
  }
  return InternalError(fmt::format("could not list the groups of user \"{}\"", name));
}

std::string CurrentUserName() {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* result = nullptr;
  if (getpwuid_r(geteuid(), &pw, buf.data(), buf.size(), &result) == 0 && result != nullptr) {
    return pw.pw_name;
  }
  return std::to_string(geteuid());
}

Status MakeDirs(const std::string& path, const std::optional<UserInfo>& owner) {
  std::error_code ec;
  std::filesystem::path p(path);
  std::vector<std::filesystem::path> created;
  for (auto cur = p; !cur.empty() && !std::filesystem::exists(cur, ec); cur = cur.parent_path()) {
    created.push_back(cur);
    if (cur == cur.parent_path()) break;
  }
  std::filesystem::create_directories(p, ec);
  if (ec) return ErrnoToStatus(ec.value(), fmt::format("cannot create \"{}\"", path));
  if (!std::filesystem::is_directory(p, ec)) return FailedPreconditionError(fmt::format("\"{}\" is not a directory", path));
  if (owner && geteuid() == 0) {
    for (auto const& d : created) {
      if (chown(d.c_str(), owner->uid, owner->gid) != 0) {
        return ErrnoToStatus(errno, fmt::format("cannot give \"{}\" to user {}", d.string(), owner->name));
      }
    }
  }
  return OkStatus();
}

}  // namespace spotvisor
