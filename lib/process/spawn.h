#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "process/user.h"

namespace spotvisor {

struct SpawnOptions {
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "NAME=value", the child's whole environment
  std::string workdir;           // empty: inherit
  std::optional<UserInfo> user;  // switch to this user (needs root) unless it is us
  bool capture_output = false;   // stdout and stderr into pipes
};

struct SpawnedProcess {
  pid_t pid = -1;  // also the process group id: the child leads its own group
  int stdout_fd = -1;
  int stderr_fd = -1;
};

// fork + exec in a new process group with default signal dispositions and an
// empty signal mask (we may block or catch signals the child must not
// inherit), stdin from /dev/null. Failures before exec (chdir, setuid,
// execve) come back here as a Status through a close-on-exec pipe rather
// than as a mysterious exit code.
StatusOr<SpawnedProcess> Spawn(const SpawnOptions& options);

// Makes orphaned descendants our children, so we can reap and stop them.
Status BecomeSubreaper();

// Our children, found through /proc (includes reparented grandchildren).
std::vector<pid_t> ListChildren();
// Members of a process group, through /proc.
std::vector<pid_t> ListProcessGroup(pid_t pgid);

}  // namespace spotvisor
