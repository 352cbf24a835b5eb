#include "process/proc.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <iterator>
#include <sstream>
#include <string>

#include <fmt/format.h>

namespace spotvisor {
namespace {

// open(O_CLOEXEC) + read, not an ifstream: libstdc++ opens without
// O_CLOEXEC, and a fork on another thread meanwhile would inherit it.
StatusOr<std::string> ReadSmallFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, fmt::format("reading {}", path));
  std::string out;
  char buf[1024];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      // ESRCH: the process exited between the open and the read.
      return ErrnoToStatus(err == ESRCH ? ENOENT : err, fmt::format("reading {}", path));
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > 65536) break;  // /proc files we read are far smaller
  }
  close(fd);
  return out;
}

std::string Basename(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string ExeName(pid_t pid) {
  char buf[4096];
  ssize_t n = readlink(fmt::format("/proc/{}/exe", pid).c_str(), buf, sizeof buf - 1);
  if (n <= 0) return "";  // EACCES for another user's process without CAP_SYS_PTRACE
  std::string exe(buf, static_cast<std::size_t>(n));
  // A binary replaced by a package upgrade while it runs.
  static constexpr std::string_view kDeleted = " (deleted)";
  if (exe.size() > kDeleted.size() && exe.compare(exe.size() - kDeleted.size(), kDeleted.size(), kDeleted) == 0) {
    exe.resize(exe.size() - kDeleted.size());
  }
  return Basename(exe);
}

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

}  // namespace

std::optional<ProcStat> ParseProcStat(const std::string& s) {
  auto open = s.find(" (");
  auto close = s.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open || close + 2 > s.size()) return std::nullopt;
  char* end = nullptr;
  long pid = std::strtol(s.c_str(), &end, 10);
  if (end != s.c_str() + open || pid <= 0) return std::nullopt;
  std::istringstream rest(s.substr(close + 2));
  std::vector<std::string> f{std::istream_iterator<std::string>(rest), {}};
  // After "(comm) ": state(0) ppid(1) pgrp(2) ... utime(11) stime(12) ...
  // starttime(19), which is field 22 counting from pid as 1.
  if (f.size() < 20) return std::nullopt;
  static const double kTicks = static_cast<double>(sysconf(_SC_CLK_TCK));
  ProcStat p;
  p.pid = static_cast<pid_t>(pid);
  p.ppid = static_cast<pid_t>(std::atol(f[1].c_str()));
  p.pgrp = static_cast<pid_t>(std::atol(f[2].c_str()));
  p.cpu_seconds = (std::atof(f[11].c_str()) + std::atof(f[12].c_str())) / kTicks;
  p.start_ticks = std::strtoull(f[19].c_str(), nullptr, 10);
  p.comm = s.substr(open + 2, close - open - 2);
  return p;
}

StatusOr<ProcStat> ReadProcStat(pid_t pid) {
  auto text = ReadSmallFile(fmt::format("/proc/{}/stat", pid));
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return NotFoundError(fmt::format("no process {}", pid));
    return text.status();
  }
  auto p = ParseProcStat(*text);
  if (!p) return InternalError(fmt::format("cannot parse /proc/{}/stat: \"{}\"", pid, *text));
  return *p;
}

std::vector<ProcStat> ListProcesses() {
  std::vector<ProcStat> out;
  DIR* d = opendir("/proc");  // glibc opens it O_CLOEXEC
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    auto p = ReadProcStat(static_cast<pid_t>(pid));
    if (p.ok()) out.push_back(*std::move(p));  // else gone meanwhile
  }
  closedir(d);
  return out;
}

StatusOr<std::uint64_t> SelfStartTicks() {
  auto p = ReadProcStat(getpid());
  if (!p.ok()) return p.status();
  return p->start_ticks;
}

std::string BootId() {
  auto id = ReadSmallFile("/proc/sys/kernel/random/boot_id");
  if (!id.ok()) return "";
  while (!id->empty() && (id->back() == '\n' || id->back() == ' ')) id->pop_back();
  return *id;
}

Status CheckSameProcess(const RecordedProcess& r, const ProcStat& now, const std::string& exe_name_now,
                        const std::string& boot_id_now) {
  auto who = [&] { return fmt::format("pid {} is now \"{}\"", r.pid, exe_name_now.empty() ? now.comm : exe_name_now); };
  if (!r.boot_id.empty() && !boot_id_now.empty() && r.boot_id != boot_id_now) {
    return FailedPreconditionError(fmt::format("it was recorded before the machine rebooted; {}", who()));
  }
  if (r.start_ticks) {
    if (*r.start_ticks == now.start_ticks) return OkStatus();
    return FailedPreconditionError(
        fmt::format("{}, started {} ticks after boot, not {}", who(), now.start_ticks, *r.start_ticks));
  }
  // No start time recorded: the program must at least be the right one.
  // comm is cut to 15 bytes; the exe is unreadable for another user's
  // process unless we are root.
  std::string comm_name = r.name.substr(0, 15);
  if (exe_name_now == r.name || (exe_name_now.empty() && now.comm == comm_name)) return OkStatus();
  return FailedPreconditionError(fmt::format("{}, not {}", who(), r.name));
}

Status SignalRecordedProcess(const RecordedProcess& r, int signo) {
  if (r.pid <= 0) return InvalidArgumentError(fmt::format("no valid pid recorded ({})", r.pid));
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, r.pid, 0));
  if (pidfd < 0 && errno == ESRCH) return NotFoundError(fmt::format("process {} has exited", r.pid));
  // Otherwise (ENOSYS before 5.3) a check then kill(): a tiny window.
  auto done = [&](Status s) {
    if (pidfd >= 0) close(pidfd);
    return s;
  };
  auto now = ReadProcStat(r.pid);
  if (!now.ok()) return done(now.status().code() == StatusCode::kNotFound
                                 ? NotFoundError(fmt::format("process {} has exited", r.pid))
                                 : now.status());
  if (auto s = CheckSameProcess(r, *now, ExeName(r.pid), BootId()); !s.ok()) return done(s);
  long rc = pidfd >= 0 ? syscall(SYS_pidfd_send_signal, pidfd, signo, nullptr, 0) : kill(r.pid, signo);
  if (rc != 0) {
    int err = errno;
    if (err == ESRCH) return done(NotFoundError(fmt::format("process {} has exited", r.pid)));
    return done(ErrnoToStatus(err, fmt::format("signalling process {}", r.pid)));
  }
  return done(OkStatus());
}

}  // namespace spotvisor
