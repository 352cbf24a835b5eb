#pragma once

#include <sys/types.h>

#include <csignal>
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
  // Sent to the child by the kernel when spotvisor dies (PR_SET_PDEATHSIG);
  // 0: none. SIGKILL, not SIGTERM: a spotvisor that died will neither sync a
  // checkpoint saved now nor bound how long saving takes, so a trainer told
  // to save would only race the restarted spotvisor's restore (systemd
  // restarts it, KillMode=mixed SIGKILLs the rest of the cgroup anyway) or,
  // if it ignores SIGTERM, outlive us and bill forever. Only honoured when
  // Spawn is called on the main thread: the kernel sends it when the
  // *thread* that forked exits, so a child spawned from a worker thread
  // would die with the worker (and those children, mkfs or the FUSE driver,
  // outliving us is harmless or wanted).
  int parent_death_signal = SIGKILL;
  // Kept blocked across exec (every other signal is unblocked): for a child
  // that takes them with sigwait, so one sent right after the spawn is not
  // lost to the default action (`spotvisor gang-host`).
  std::vector<int> blocked_signals;
};

struct SpawnedProcess {
  pid_t pid = -1;  // also the process group id: the child leads its own group
  int stdout_fd = -1;
  int stderr_fd = -1;
};

// fork + exec in a new process group with default signal dispositions and an
// empty signal mask (we may block or catch signals the child must not
// inherit), stdin from /dev/null, and no file descriptor but 0, 1 and 2
// (curl's sockets and whatever else spotvisor holds without O_CLOEXEC stay
// ours). Failures before exec (chdir, setuid, execve) come back here as a
// Status through a close-on-exec pipe rather than as a mysterious exit code.
//
// argv exactly {"/bin/sh", "-c", CMD} runs ExecIfSimple(CMD) instead: the
// shell-form `command` then becomes the trainer itself (see below).
StatusOr<SpawnedProcess> Spawn(const SpawnOptions& options);

// `exec CMD` (after CMD's leading VAR=value assignments) when CMD is one
// simple command: no ; & | && || newline, redirection, subshell, backquote
// or compound keyword, and not a shell builtin. Otherwise CMD unchanged.
// Docker's advice for shell-form CMD: without exec, /bin/sh (dash does not
// exec the last command itself) stays the trainer's parent and group
// leader, dies of the SIGINT sent to the group while the trainer is still
// saving, and the run reports "killed by SIGINT" (130) for a trainer that
// saved and exited 0. Quoting, $VAR, ${...} and $(...) are fine: they are
// expanded before the exec.
std::string ExecIfSimple(const std::string& shell_command);

// Makes orphaned descendants our children, so we can reap and stop them.
Status BecomeSubreaper();

// Our children, found through /proc (includes reparented grandchildren).
std::vector<pid_t> ListChildren();
// Members of a process group, through /proc.
std::vector<pid_t> ListProcessGroup(pid_t pgid);

namespace internal {
// What the child runs between fork and exec, exposed so tests can run each
// fallback in a forked process. All three close every fd >= 3 but `keep`
// and return false when they could not (the next one is then tried).
bool CloseFdsWithCloseRange(int keep);
bool CloseFdsListedInProc(int keep);
void CloseFdsUpToLimit(int keep);
}  // namespace internal

}  // namespace spotvisor
