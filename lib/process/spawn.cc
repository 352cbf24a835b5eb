#include "process/spawn.h"

#include "process/proc.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include <fmt/format.h>

namespace spotvisor {
namespace {

struct ExecError {
  int err;
  int stage;
};
enum Stage { kStageGroup, kStageUser, kStageChdir, kStageExec, kStageIo };

const char* StageName(int stage) {
  switch (stage) {
    case kStageGroup: return "setpgid";
    case kStageUser: return "switching user";
    case kStageChdir: return "chdir";
    case kStageExec: return "exec";
    default: return "redirecting stdio";
  }
}

[[noreturn]] void ChildFail(int fd, int stage) {
  ExecError e{errno, stage};
  ssize_t ignored = write(fd, &e, sizeof e);
  (void)ignored;
  _exit(127);
}

// Only async-signal-safe calls from here on: we are a fork of a threaded process.
[[noreturn]] void RunChild(const SpawnOptions& o, char* const* argv, char* const* envp, int err_fd,
                           int out_w, int errout_w) {
  if (setpgid(0, 0) != 0) ChildFail(err_fd, kStageGroup);
  sigset_t empty;
  sigemptyset(&empty);
  sigprocmask(SIG_SETMASK, &empty, nullptr);
  for (int sig = 1; sig < NSIG; ++sig) signal(sig, SIG_DFL);
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull < 0 || dup2(devnull, 0) < 0) ChildFail(err_fd, kStageIo);
  if (out_w >= 0 && (dup2(out_w, 1) < 0 || dup2(errout_w, 2) < 0)) ChildFail(err_fd, kStageIo);
  if (o.user) {
    if (setgroups(o.user->groups.size(), o.user->groups.data()) != 0 || setgid(o.user->gid) != 0 ||
        setuid(o.user->uid) != 0) {
      ChildFail(err_fd, kStageUser);
    }
  }
  if (!o.workdir.empty() && chdir(o.workdir.c_str()) != 0) ChildFail(err_fd, kStageChdir);
  execve(argv[0], argv, envp);
  // Like execvp: search PATH (from the child's environment) when argv[0] has no slash.
  if (std::strchr(argv[0], '/') == nullptr) {
    const char* path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    for (char* const* e = envp; *e; ++e) {
      if (std::strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
    }
    char buf[4096];
    int saved = ENOENT;
    for (const char* p = path;; ++p) {
      const char* end = std::strchr(p, ':');
      std::size_t len = end ? static_cast<std::size_t>(end - p) : std::strlen(p);
      std::size_t name_len = std::strlen(argv[0]);
      if (len + name_len + 2 < sizeof buf) {
        std::memcpy(buf, p, len);
        buf[len] = '/';
        std::memcpy(buf + len + 1, argv[0], name_len + 1);
        execve(buf, argv, envp);
        if (errno != ENOENT && errno != ENOTDIR) saved = errno;
      }
      if (!end) break;
      p = end;
    }
    errno = saved;
  }
  ChildFail(err_fd, kStageExec);
}

std::vector<char*> CStrings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto const& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

StatusOr<SpawnedProcess> Spawn(const SpawnOptions& o) {
  if (o.argv.empty()) return InvalidArgumentError("nothing to run: empty argv");
  auto argv = CStrings(o.argv);
  auto envp = CStrings(o.env);
  int err_pipe[2];
  if (pipe2(err_pipe, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe");
  int out_pipe[2] = {-1, -1}, errout_pipe[2] = {-1, -1};
  if (o.capture_output && (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(errout_pipe, O_CLOEXEC) != 0)) {
    return ErrnoToStatus(errno, "pipe");
  }
  pid_t pid = fork();
  if (pid < 0) return ErrnoToStatus(errno, "fork");
  if (pid == 0) RunChild(o, argv.data(), envp.data(), err_pipe[1], out_pipe[1], errout_pipe[1]);
  // Also from the parent, so the group exists before we might signal it.
  setpgid(pid, pid);
  close(err_pipe[1]);
  if (o.capture_output) {
    close(out_pipe[1]);
    close(errout_pipe[1]);
  }
  ExecError e{};
  ssize_t n;
  do {
    n = read(err_pipe[0], &e, sizeof e);
  } while (n < 0 && errno == EINTR);
  close(err_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof e)) {
    // The child has exited with 127; the caller's reaper collects it.
    if (o.capture_output) {
      close(out_pipe[0]);
      close(errout_pipe[0]);
    }
    errno = e.err;
    return ErrnoToStatus(e.err, fmt::format("starting {}: {}", o.argv[0], StageName(e.stage)));
  }
  return SpawnedProcess{pid, out_pipe[0], errout_pipe[0]};
}

Status BecomeSubreaper() {
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return ErrnoToStatus(errno, "prctl(PR_SET_CHILD_SUBREAPER)");
  return OkStatus();
}

std::vector<pid_t> ListChildren() {
  pid_t self = getpid();
  std::vector<pid_t> out;
  for (auto const& p : ListProcesses()) {
    if (p.ppid == self) out.push_back(p.pid);
  }
  return out;
}

std::vector<pid_t> ListProcessGroup(pid_t pgid) {
  std::vector<pid_t> out;
  for (auto const& p : ListProcesses()) {
    if (p.pgrp == pgid) out.push_back(p.pid);
  }
  return out;
}

}  // namespace spotvisor
