#include "process/spawn.h"

#include "process/proc.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <string_view>
#include <utility>

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

// Owns one fd in the parent, so every early return closes what was opened.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    Reset(std::exchange(o.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

struct Pipe {
  Fd read, write;
};

Status MakePipe(Pipe& p) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe");
  p.read.Reset(fds[0]);
  p.write.Reset(fds[1]);
  return OkStatus();
}

[[noreturn]] void ChildFail(int fd, int stage) {
  ExecError e{errno, stage};
  ssize_t ignored = write(fd, &e, sizeof e);
  (void)ignored;
  _exit(127);
}

// 0, 1 and 2 are about to be overwritten: a pipe end that happens to be one
// of them (spotvisor started with a standard fd closed) moves up first.
int AboveStdio(int fd) {
  if (fd < 0 || fd > 2) return fd;
  return fcntl(fd, F_DUPFD_CLOEXEC, 3);
}

// dup2 that also works when from == to (dup2 would keep O_CLOEXEC then).
bool MoveTo(int from, int to) {
  if (from == to) return fcntl(to, F_SETFD, 0) == 0;
  return dup2(from, to) == to;
}

void CloseInheritedFds(int keep) {
  if (internal::CloseFdsWithCloseRange(keep)) return;
  if (internal::CloseFdsListedInProc(keep)) return;
  internal::CloseFdsUpToLimit(keep);
}

// Only async-signal-safe calls from here on: we are a fork of a threaded process.
[[noreturn]] void RunChild(const SpawnOptions& o, char* const* argv, char* const* envp, int err_fd, int out_w,
                           int errout_w, pid_t parent, bool die_with_parent) {
  if (setpgid(0, 0) != 0) ChildFail(err_fd, kStageGroup);
  err_fd = AboveStdio(err_fd);
  out_w = AboveStdio(out_w);
  errout_w = AboveStdio(errout_w);
  sigset_t mask;
  sigemptyset(&mask);
  for (int s : o.blocked_signals) sigaddset(&mask, s);
  sigprocmask(SIG_SETMASK, &mask, nullptr);
  for (int sig = 1; sig < NSIG; ++sig) signal(sig, SIG_DFL);
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0 || !MoveTo(devnull, 0)) ChildFail(err_fd, kStageIo);
  if (out_w >= 0 && (!MoveTo(out_w, 1) || !MoveTo(errout_w, 2))) ChildFail(err_fd, kStageIo);
  if (o.user) {
    if (setgroups(o.user->groups.size(), o.user->groups.data()) != 0 || setgid(o.user->gid) != 0 ||
        setuid(o.user->uid) != 0) {
      ChildFail(err_fd, kStageUser);
    }
  }
  // After the user switch: changing credentials clears the parent-death
  // signal. If spotvisor died before this, nobody would send it: the parent
  // we were forked by is then no longer our parent.
  if (die_with_parent) {
    prctl(PR_SET_PDEATHSIG, static_cast<unsigned long>(o.parent_death_signal));
    if (getppid() != parent) _exit(128 + o.parent_death_signal);
  }
  if (!o.workdir.empty() && chdir(o.workdir.c_str()) != 0) ChildFail(err_fd, kStageChdir);
  CloseInheritedFds(err_fd);
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

bool OnMainThread() { return static_cast<pid_t>(syscall(SYS_gettid)) == getpid(); }

// ---------------------------------------------------------------- ExecIfSimple

// Builtins and reserved words of dash and bash: `exec NAME` would fail (cd,
// export, if) or run an external program that differs from the builtin
// (echo, printf, test), so such a command is left as it is.
bool IsBuiltinOrKeyword(std::string_view w) {
  static constexpr std::string_view kNames[] = {
      "!",       "{",       "}",       "[[",      "]]",      ".",        ":",       "[",       "alias",   "bg",
      "bind",    "break",   "builtin", "caller",  "case",    "cd",       "chdir",   "command", "compgen", "complete",
      "compopt", "continue", "coproc", "declare", "dirs",    "disown",   "do",      "done",    "echo",    "elif",
      "else",    "enable",  "esac",    "eval",    "exec",    "exit",     "export",  "false",   "fc",      "fg",
      "fi",      "for",     "function", "getopts", "hash",   "help",     "history", "if",      "in",      "jobs",
      "kill",    "let",     "local",   "logout",  "mapfile", "newgrp",   "popd",    "printf",  "pushd",   "pwd",
      "read",    "readarray", "readonly", "return", "select", "set",     "shift",   "shopt",   "source",  "suspend",
      "test",    "then",    "time",    "times",   "trap",    "true",     "type",    "typeset", "ulimit",  "umask",
      "unalias", "unset",   "until",   "wait",    "while"};
  for (auto n : kNames) {
    if (n == w) return true;
  }
  return false;
}

constexpr std::size_t kNotSimple = std::string::npos;

std::size_t SkipDoubleQuoted(const std::string& s, std::size_t i);

// s[i] is the '(' or '{' after a '$': returns the index after the matching
// closer, or kNotSimple (unbalanced, a backquote inside). What is inside runs
// in a subshell or is a parameter expansion: exec does not change it.
std::size_t SkipExpansion(const std::string& s, std::size_t i) {
  const char open = s[i];
  const char closer = open == '(' ? ')' : '}';
  int depth = 0;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '\\') {
      ++i;
    } else if (c == '\'') {
      i = s.find('\'', i + 1);
      if (i == std::string::npos) return kNotSimple;
    } else if (c == '"') {
      i = SkipDoubleQuoted(s, i);
      if (i == kNotSimple) return kNotSimple;
      --i;  // the loop's ++i
    } else if (c == '`') {
      return kNotSimple;
    } else if (c == open) {
      ++depth;
    } else if (c == closer && --depth == 0) {
      return i + 1;
    }
  }
  return kNotSimple;
}

// s[i] is '"': returns the index after the closing quote, or kNotSimple.
std::size_t SkipDoubleQuoted(const std::string& s, std::size_t i) {
  for (++i; i < s.size(); ++i) {
    char c = s[i];
    if (c == '"') return i + 1;
    if (c == '`') return kNotSimple;
    if (c == '\\') {
      ++i;
    } else if (c == '$' && i + 1 < s.size() && (s[i + 1] == '(' || s[i + 1] == '{')) {
      i = SkipExpansion(s, i + 1);
      if (i == kNotSimple) return kNotSimple;
      --i;
    }
  }
  return kNotSimple;
}

struct Word {
  std::size_t begin = 0;
  std::string literal;  // with quotes and backslashes removed
};

bool IsAssignment(const std::string& s, std::size_t begin) {
  std::size_t i = begin;
  auto name_char = [](char c, bool first) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9');
  };
  while (i < s.size() && name_char(s[i], i == begin)) ++i;
  return i > begin && i < s.size() && s[i] == '=';
}

// The words of one simple command, or nullopt when it is anything more.
std::optional<std::vector<Word>> SimpleCommandWords(const std::string& s) {
  std::vector<Word> words;
  std::optional<Word> cur;
  auto start = [&](std::size_t i) {
    if (!cur) cur = Word{i, {}};
  };
  for (std::size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == ' ' || c == '\t') {
      if (cur) words.push_back(std::move(*cur));
      cur.reset();
      continue;
    }
    if (c == '#' && !cur) break;  // a comment, to the end: there is no newline
    if (std::strchr("\n;&|<>()`", c) != nullptr) return std::nullopt;
    start(i);
    if (c == '\\') {
      if (i + 1 >= s.size() || s[i + 1] == '\n') return std::nullopt;
      cur->literal += s[++i];
    } else if (c == '\'') {
      auto end = s.find('\'', i + 1);
      if (end == std::string::npos) return std::nullopt;
      cur->literal += s.substr(i + 1, end - i - 1);
      i = end;
    } else if (c == '"') {
      auto end = SkipDoubleQuoted(s, i);
      if (end == kNotSimple) return std::nullopt;
      cur->literal += s.substr(i + 1, end - i - 2);
      i = end - 1;
    } else if (c == '$' && i + 1 < s.size() && (s[i + 1] == '(' || s[i + 1] == '{')) {
      auto end = SkipExpansion(s, i + 1);
      if (end == kNotSimple) return std::nullopt;
      cur->literal += s.substr(i, end - i);
      i = end - 1;
    } else {
      cur->literal += c;
    }
  }
  if (cur) words.push_back(std::move(*cur));
  return words;
}

}  // namespace

std::string ExecIfSimple(const std::string& cmd) {
  auto words = SimpleCommandWords(cmd);
  if (!words) return cmd;
  auto it = words->begin();
  while (it != words->end() && IsAssignment(cmd, it->begin)) ++it;
  // Nothing to exec (only assignments or a comment), or a builtin/keyword.
  if (it == words->end() || IsBuiltinOrKeyword(it->literal)) return cmd;
  return cmd.substr(0, it->begin) + "exec " + cmd.substr(it->begin);
}

namespace internal {

bool CloseFdsWithCloseRange(int keep) {
#ifdef SYS_close_range
  auto close_range = [](unsigned lo, unsigned hi) { return syscall(SYS_close_range, lo, hi, 0U) == 0; };
  if (keep < 3) return close_range(3, ~0U);
  if (keep > 3 && !close_range(3, static_cast<unsigned>(keep) - 1)) return false;
  return close_range(static_cast<unsigned>(keep) + 1, ~0U);
#else
  (void)keep;
  return false;
#endif
}

// What Boost.Process v2 does without close_range: the fds that are open,
// from /proc/self/fd read with getdents64 (opendir would allocate).
bool CloseFdsListedInProc(int keep) {
  int dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return false;
  alignas(8) char buf[4096];
  for (;;) {
    long n = syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n < 0) {
      close(dir);
      return false;
    }
    if (n == 0) break;
    for (long off = 0; off < n;) {
      // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name.
      unsigned short reclen;
      std::memcpy(&reclen, buf + off + 16, sizeof reclen);
      const char* name = buf + off + 19;
      int fd = 0;
      bool digits = *name != '\0';
      for (const char* p = name; *p; ++p) {
        if (*p < '0' || *p > '9') digits = false;
        fd = fd * 10 + (*p - '0');
      }
      // Closing what was already listed does not disturb the listing: its
      // position is the next fd number.
      if (digits && fd > 2 && fd != keep && fd != dir) close(fd);
      off += reclen;
    }
  }
  close(dir);
  return true;
}

void CloseFdsUpToLimit(int keep) {
  rlimit r{};
  rlim_t limit = getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY ? r.rlim_cur : 1 << 20;
  for (rlim_t fd = 3; fd < limit; ++fd) {
    if (static_cast<int>(fd) != keep) close(static_cast<int>(fd));
  }
}

}  // namespace internal

StatusOr<SpawnedProcess> Spawn(const SpawnOptions& o) {
  if (o.argv.empty()) return InvalidArgumentError("nothing to run: empty argv");
  std::vector<std::string> args = o.argv;
  if (args.size() == 3 && args[0] == "/bin/sh" && args[1] == "-c") args[2] = ExecIfSimple(args[2]);
  auto argv = CStrings(args);
  auto envp = CStrings(o.env);
  Pipe err_pipe, out_pipe, errout_pipe;
  if (auto s = MakePipe(err_pipe); !s.ok()) return s;
  if (o.capture_output) {
    if (auto s = MakePipe(out_pipe); !s.ok()) return s;
    if (auto s = MakePipe(errout_pipe); !s.ok()) return s;
  }
  const pid_t parent = getpid();
  const bool die_with_parent = o.parent_death_signal > 0 && OnMainThread();
  pid_t pid = fork();
  if (pid < 0) return ErrnoToStatus(errno, "fork");
  if (pid == 0) {
    RunChild(o, argv.data(), envp.data(), err_pipe.write.get(), out_pipe.write.get(), errout_pipe.write.get(), parent,
             die_with_parent);
  }
  // Also from the parent, so the group exists before we might signal it.
  setpgid(pid, pid);
  err_pipe.write.Reset();
  out_pipe.write.Reset();
  errout_pipe.write.Reset();
  ExecError e{};
  ssize_t n;
  do {
    n = read(err_pipe.read.get(), &e, sizeof e);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof e)) {
    // The child has exited with 127; the caller's reaper collects it.
    errno = e.err;
    return ErrnoToStatus(e.err, fmt::format("starting {}: {}", o.argv[0], StageName(e.stage)));
  }
  return SpawnedProcess{pid, out_pipe.read.release(), errout_pipe.read.release()};
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
