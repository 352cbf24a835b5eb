#include "process/user.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

namespace {

// The steps of a probe; the number is what a probing child reports.
constexpr const char* kProbeSteps[] = {"", "create a file in", "write to a file in", "rename a file in",
                                       "delete a file in"};

// 0, or the failed step * 1000 + errno. Only system calls: safe in a child
// forked from a process with threads.
int ProbeSteps(const char* a, const char* b) {
  int fd = open(a, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return 1000 + errno;
  if (write(fd, "p", 1) != 1) {
    int e = errno;
    close(fd);
    unlink(a);
    return 2000 + e;
  }
  close(fd);
  if (rename(a, b) != 0) {
    int e = errno;
    unlink(a);
    return 3000 + e;
  }
  if (unlink(b) != 0) return 4000 + errno;
  return 0;
}

}  // namespace

Status ProbeWritable(const std::string& dir, const std::optional<UserInfo>& user) {
  std::string a = fmt::format("{}/.spotvisor-write-probe.{}", dir, getpid());
  std::string b = a + ".renamed";
  int result = 0;
  if (user && geteuid() == 0 && user->uid != 0) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe");
    pid_t pid = fork();
    if (pid < 0) {
      int e = errno;
      close(fds[0]);
      close(fds[1]);
      return ErrnoToStatus(e, "fork");
    }
    if (pid == 0) {
      int r = -1;  // could not take the user's identity
      if (setgroups(user->groups.size(), user->groups.data()) == 0 && setgid(user->gid) == 0 && setuid(user->uid) == 0) {
        r = ProbeSteps(a.c_str(), b.c_str());
      }
      (void)!write(fds[1], &r, sizeof r);
      _exit(0);
    }
    close(fds[1]);
    ssize_t n;
    do {
      n = read(fds[0], &result, sizeof result);
    } while (n < 0 && errno == EINTR);
    close(fds[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (n != static_cast<ssize_t>(sizeof result)) return InternalError(fmt::format("probing \"{}\": the probe did not finish", dir));
    if (result < 0) {
      return PermissionDeniedError(fmt::format("cannot take the identity of user {} to probe \"{}\"", user->name, dir));
    }
    unlink(a.c_str());  // whatever the child left behind
    unlink(b.c_str());
  } else {
    result = ProbeSteps(a.c_str(), b.c_str());
  }
  if (result == 0) return OkStatus();
  int step = result / 1000, err = result % 1000;
  return Status(err == EACCES || err == EPERM ? StatusCode::kPermissionDenied : StatusCode::kFailedPrecondition,
                fmt::format("{} cannot {} \"{}\": {}", user ? "user " + user->name : std::string("spotvisor"),
                            kProbeSteps[step >= 1 && step <= 4 ? step : 1], dir, std::strerror(err)));
}

Status GiveTreeTo(const std::string& dir, const UserInfo& user) {
  std::error_code ec;
  if (lchown(dir.c_str(), user.uid, user.gid) != 0) return ErrnoToStatus(errno, fmt::format("cannot give \"{}\" to {}", dir, user.name));
  for (auto it = std::filesystem::recursive_directory_iterator(dir, std::filesystem::directory_options::none, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (lchown(it->path().c_str(), user.uid, user.gid) != 0) {
      return ErrnoToStatus(errno, fmt::format("cannot give \"{}\" to {}", it->path().string(), user.name));
    }
  }
  if (ec) return ErrnoToStatus(ec.value(), fmt::format("walking \"{}\"", dir));
  return OkStatus();
}

}  // namespace spotvisor
