// fake_trainer: a purpose-built child process for spotvisor tests.
//
// Its argv picks its behaviour (run time, exit code, checkpointing, how it
// reacts to SIGINT/SIGTERM, descendants, odd output), so tests and the
// latency benchmark can exercise the supervisor against a known child, in
// the way Boost.Process tests use a dedicated target program.
// See tests/fakes/README.md for the flag reference.
//
// Build: g++ -std=c++20 -Wall -Wextra -Werror -O1 -o fake_trainer fake_trainer.cc
// libc and the standard library only.

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

extern char** environ;

namespace {

// Descendants are meant to be killed by the supervisor under test; if a test
// fails they would otherwise live forever, so they die on SIGALRM after this.
constexpr unsigned kDescendantLifetimeSec = 300;

// ---------------------------------------------------------------- signals
// Shared with the signal handler: only sig_atomic_t flags and plain fds.
volatile sig_atomic_t g_pending_signal = 0;  // first non-ignored signal
volatile sig_atomic_t g_sigint_count = 0;
volatile sig_atomic_t g_sigterm_count = 0;
volatile sig_atomic_t g_ignore_sigint = 0;
volatile sig_atomic_t g_ignore_sigterm = 0;
int g_marker_fd = -1;
int g_wake_read = -1;   // self-pipe: the handler writes, the main loop polls
int g_wake_write = -1;

// Async-signal-safe: loops over write() only.
void raw_write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Async-signal-safe decimal formatting (snprintf is not safe in handlers).
char* append_u64(char* out, uint64_t v) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0) *out++ = tmp[--n];
  return out;
}

char* append_str(char* out, const char* s) {
  while (*s) *out++ = *s++;
  return out;
}

void on_signal(int sig) {
  const int saved_errno = errno;
  // Timestamp first: the benchmark measures signal delivery to this point.
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  const bool is_int = sig == SIGINT;
  if (g_marker_fd >= 0) {
    char buf[64];
    char* p = append_str(buf, is_int ? "sigint realtime_ns=" : "sigterm realtime_ns=");
    p = append_u64(p, static_cast<uint64_t>(ts.tv_sec) * 1000000000ull +
                          static_cast<uint64_t>(ts.tv_nsec));
    *p++ = '\n';
    raw_write_all(g_marker_fd, buf, static_cast<size_t>(p - buf));
  }
  if (is_int) {
    g_sigint_count = g_sigint_count + 1;
  } else {
    g_sigterm_count = g_sigterm_count + 1;
  }
  const bool ignored = is_int ? g_ignore_sigint : g_ignore_sigterm;
  if (!ignored && g_pending_signal == 0) g_pending_signal = sig;
  if (g_wake_write >= 0) {
    char c = 0;
    ssize_t r = write(g_wake_write, &c, 1);  // full pipe: a wake-up is queued anyway
    (void)r;
  }
  errno = saved_errno;
}

// What was open at exec, listed before we open anything ourselves:
// " 0=/dev/null 1=pipe:[123] 2=pipe:[124]".
std::string g_inherited_fds;

void list_inherited_fds() {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) {
    g_inherited_fds = " ?";
    return;
  }
  std::vector<int> fds;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    if (fd != dirfd(d)) fds.push_back(fd);
  }
  closedir(d);
  std::sort(fds.begin(), fds.end());
  for (int fd : fds) {
    char target[512];
    const ssize_t n = readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), target, sizeof target - 1);
    g_inherited_fds += " " + std::to_string(fd) + "=" + (n > 0 ? std::string(target, static_cast<size_t>(n)) : "?");
  }
}

// ---------------------------------------------------------------- output
// Blocking-safe full write for normal context; a pipe whose reader set
// O_NONBLOCK on our end is waited on with poll rather than spun on.
void write_all(int fd, std::string_view s) {
  const char* p = s.data();
  size_t n = s.size();
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd pfd{fd, POLLOUT, 0};
        poll(&pfd, 1, -1);
        continue;
      }
      return;  // EPIPE etc.: the reader is gone, nothing useful to do
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// stdout is written with write(2) directly, one call per line: unbuffered,
// so the supervisor sees each line as soon as it is produced.
void out(std::string_view s) { write_all(STDOUT_FILENO, s); }
void err(std::string_view s) { write_all(STDERR_FILENO, s); }

void marker(std::string_view s) {
  if (g_marker_fd >= 0) write_all(g_marker_fd, s);
}

[[noreturn]] void usage_error(const std::string& msg) {
  err("fake_trainer: " + msg + " (see tests/fakes/README.md)\n");
  _exit(2);
}

// ---------------------------------------------------------------- time
int64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void drain_wake_pipe() {
  char buf[64];
  while (read(g_wake_read, buf, sizeof buf) > 0) {
  }
}

// Sleeps until deadline_ns (monotonic; -1 = forever); returns false then.
// If return_on_signal, returns true as soon as any SIGINT/SIGTERM arrives
// (or one is already pending). Race-free: a signal landing between the
// flag check and ppoll leaves a byte in the self-pipe, so ppoll returns.
bool wait_until(int64_t deadline_ns, bool return_on_signal) {
  for (;;) {
    if (return_on_signal && g_pending_signal != 0) return true;
    timespec ts{};
    timespec* tsp = nullptr;
    if (deadline_ns >= 0) {
      const int64_t left = deadline_ns - mono_ns();
      if (left <= 0) return false;
      ts.tv_sec = static_cast<time_t>(left / 1000000000);
      ts.tv_nsec = static_cast<long>(left % 1000000000);
      tsp = &ts;
    }
    pollfd pfd{g_wake_read, POLLIN, 0};
    if (ppoll(&pfd, 1, tsp, nullptr) > 0) {
      drain_wake_pipe();
      if (return_on_signal) return true;
    }
  }
}

// ---------------------------------------------------------------- options
struct Action {
  enum Kind { kProgress, kPrintEnv, kPrintFds, kPrintPdeathsig, kPrint, kStderr, kLongLine, kInvalidUtf8, kFlood };
  Kind kind;
  long n = 0;
  std::string text;
};

struct Options {
  long run_for_ms = -1;  // -1: until signalled
  int exit_code = 0;
  long checkpoint_every_ms = -1;
  bool ignore_sigint = false;
  bool ignore_sigterm = false;
  long sigint_exit_delay_ms = 0;
  int sigint_exit_code = 130;
  long sigterm_exit_delay_ms = 0;
  int sigterm_exit_code = 143;
  std::string marker_file;
  long spawn_grandchildren = 0;
  bool spawn_escapee = false;
  std::string pid_file;
  std::vector<Action> actions;  // output actions, run in argv order
};

long parse_long(const std::string& flag, const char* s, long min, long max) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < min || v > max) {
    usage_error(flag + ": expected an integer in [" + std::to_string(min) + ", " +
                std::to_string(max) + "], got '" + s + "'");
  }
  return v;
}

Options parse_args(int argc, char** argv) {
  constexpr long kMaxMs = 24L * 3600 * 1000;
  constexpr long kMaxCount = 1L << 40;
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      return argv[++i];
    };
    auto ms = [&] { return parse_long(flag, value(), 0, kMaxMs); };
    auto code = [&] { return static_cast<int>(parse_long(flag, value(), 0, 255)); };
    auto count = [&] { return parse_long(flag, value(), 0, kMaxCount); };
    if (flag == "--run-for") {
      o.run_for_ms = ms();
    } else if (flag == "--exit-code") {
      o.exit_code = code();
    } else if (flag == "--checkpoint-every") {
      o.checkpoint_every_ms = parse_long(flag, value(), 1, kMaxMs);
    } else if (flag == "--ignore-sigint") {
      o.ignore_sigint = true;
    } else if (flag == "--ignore-sigterm") {
      o.ignore_sigterm = true;
    } else if (flag == "--sigint-exit-delay") {
      o.sigint_exit_delay_ms = ms();
    } else if (flag == "--sigint-exit-code") {
      o.sigint_exit_code = code();
    } else if (flag == "--sigterm-exit-delay") {
      o.sigterm_exit_delay_ms = ms();
    } else if (flag == "--sigterm-exit-code") {
      o.sigterm_exit_code = code();
    } else if (flag == "--marker-file") {
      o.marker_file = value();
    } else if (flag == "--spawn-grandchildren") {
      o.spawn_grandchildren = parse_long(flag, value(), 0, 1000);
    } else if (flag == "--spawn-escapee") {
      o.spawn_escapee = true;
    } else if (flag == "--pid-file") {
      o.pid_file = value();
    } else if (flag == "--progress") {
      o.actions.push_back({Action::kProgress, parse_long(flag, value(), 1, kMaxCount), {}});
    } else if (flag == "--print-env") {
      o.actions.push_back({Action::kPrintEnv, 0, {}});
    } else if (flag == "--print-fds") {
      o.actions.push_back({Action::kPrintFds, 0, {}});
    } else if (flag == "--print-pdeathsig") {
      o.actions.push_back({Action::kPrintPdeathsig, 0, {}});
    } else if (flag == "--print") {
      o.actions.push_back({Action::kPrint, 0, value()});
    } else if (flag == "--stderr") {
      o.actions.push_back({Action::kStderr, 0, value()});
    } else if (flag == "--long-line") {
      o.actions.push_back({Action::kLongLine, count(), {}});
    } else if (flag == "--invalid-utf8") {
      o.actions.push_back({Action::kInvalidUtf8, 0, {}});
    } else if (flag == "--flood") {
      o.actions.push_back({Action::kFlood, count(), {}});
    } else {
      usage_error("unknown flag '" + flag + "'");
    }
  }
  return o;
}

// ---------------------------------------------------------------- files
const char* checkpoint_dir() {
  const char* d = std::getenv("SPOTVISOR_CHECKPOINT_DIR");
  return (d != nullptr && *d != '\0') ? d : nullptr;
}

bool write_file_atomic(const std::string& path, std::string_view content, bool sync_dir) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  write_all(fd, content);
  const bool ok = fsync(fd) == 0;
  close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return false;
  }
  if (sync_dir) {
    // The rename is only durable once the directory entry is on disk.
    const std::string::size_type slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
    const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      fsync(dfd);
      close(dfd);
    }
  }
  return true;
}

std::string step_name(long step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt-%06ld", step);
  return buf;
}

// Like a real trainer restoring from its latest checkpoint: continue the
// step numbering after the highest ckpt-N already in the directory.
long latest_checkpoint_step(const char* dir) {
  DIR* d = opendir(dir);
  if (d == nullptr) return 0;
  long best = 0;
  while (const dirent* e = readdir(d)) {
    const std::string_view name = e->d_name;
    if (!name.starts_with("ckpt-") || name.size() == 5) continue;
    const std::string_view digits = name.substr(5);
    if (digits.find_first_not_of("0123456789") != std::string_view::npos) continue;
    best = std::max(best, std::strtol(std::string(digits).c_str(), nullptr, 10));
  }
  closedir(d);
  return best;
}

[[noreturn]] void finish(int code) {
  marker("exit code=" + std::to_string(code) + "\n");
  out("fake_trainer exiting code=" + std::to_string(code) + "\n");
  _exit(code);
}

void write_checkpoint(long step, bool final_checkpoint) {
  const char* dir = checkpoint_dir();
  mkdir(dir, 0755);  // the supervisor normally creates it; EEXIST is fine
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  const std::string body = "step=" + std::to_string(step) + "\npid=" + std::to_string(getpid()) +
                           "\nrealtime_ns=" +
                           std::to_string(static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec) +
                           "\n";
  if (!write_file_atomic(std::string(dir) + "/" + step_name(step), body, true)) {
    err("fake_trainer: checkpoint step=" + std::to_string(step) + " failed: " +
        std::strerror(errno) + "\n");
    finish(1);  // a trainer that cannot save is a crashed trainer
  }
  out("checkpoint step=" + std::to_string(step) + (final_checkpoint ? " final\n" : "\n"));
}

// ---------------------------------------------------------------- actions
// Returns false if a signal interrupted it (the caller then handles it).
bool run_progress(long n) {
  const std::string_view kBlock = "\u2588";  // the full block tqdm draws
  for (long i = 1; i <= n; ++i) {
    const long pct = i * 100 / n;
    const long filled = i * 10 / n;
    char head[32];
    std::snprintf(head, sizeof head, "\r%3ld%%|", pct);
    std::string line = head;
    for (long k = 0; k < 10; ++k) line += k < filled ? kBlock : std::string_view(" ");
    line += "| " + std::to_string(i) + "/" + std::to_string(n);
    out(line);
    if (i == n) break;
    const int64_t next = mono_ns() + 1000000;
    while (wait_until(next, true)) {
      if (g_pending_signal != 0) {
        out("\n");
        return false;
      }
    }
  }
  out("\n");
  return true;
}

void run_flood(long lines) {
  // Batched like a buffered stdout would be: "as fast as possible".
  std::string buf;
  buf.reserve(1 << 16);
  for (long i = 1; i <= lines; ++i) {
    buf += "flood ";
    buf += std::to_string(i);
    buf += '\n';
    if (buf.size() > (1 << 16) - 64) {
      out(buf);
      buf.clear();
    }
  }
  out(buf);
}

void run_long_line(long bytes) {
  const std::string chunk(1 << 16, 'x');
  while (bytes > 0) {
    const long n = std::min<long>(bytes, static_cast<long>(chunk.size()));
    out(std::string_view(chunk.data(), static_cast<size_t>(n)));
    bytes -= n;
  }
  out("\n");
}

// Returns false if a signal arrived (only --progress waits).
bool run_actions(const std::vector<Action>& actions) {
  for (const Action& a : actions) {
    switch (a.kind) {
      case Action::kProgress:
        if (!run_progress(a.n)) return false;
        break;
      case Action::kPrintEnv: {
        std::string all;
        for (char** e = environ; *e != nullptr; ++e) (all += *e) += '\n';
        out(all);
        break;
      }
      case Action::kPrintFds:
        out("fake_trainer fds:" + g_inherited_fds + "\n");
        break;
      case Action::kPrintPdeathsig: {
        int sig = 0;
        prctl(PR_GET_PDEATHSIG, &sig);
        out("fake_trainer pdeathsig=" + std::to_string(sig) + "\n");
        break;
      }
      case Action::kPrint:
        out(a.text + "\n");
        break;
      case Action::kStderr:
        err(a.text + "\n");
        break;
      case Action::kLongLine:
        run_long_line(a.n);
        break;
      case Action::kInvalidUtf8:
        // Two bytes that never occur in UTF-8, then the first two bytes of
        // the three-byte euro sign with its last byte missing.
        out("invalid-utf8 \xff\xfe end \xe2\x82\n");
        break;
      case Action::kFlood:
        run_flood(a.n);
        break;
    }
  }
  return true;
}

// ---------------------------------------------------------------- children
// In a descendant right after fork: plain default signal handling, none of
// the trainer's fds, and a lifetime cap against leaks from failed tests.
void become_plain_descendant() {
  struct sigaction sa {};
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  close(g_wake_read);
  close(g_wake_write);
  g_wake_read = g_wake_write = -1;
  if (g_marker_fd >= 0) close(g_marker_fd);
  g_marker_fd = -1;
  alarm(kDescendantLifetimeSec);
}

[[noreturn]] void pause_forever() {
  for (;;) pause();
}

// SIGINT/SIGTERM stay blocked from just before fork until the child has
// reset its handlers, so a child never runs the trainer's handler (which
// would write a misleading line to the shared marker file).
class SignalsBlocked {
 public:
  SignalsBlocked() {
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigprocmask(SIG_BLOCK, &block, &saved_);
  }
  ~SignalsBlocked() { restore(); }
  void restore() const { sigprocmask(SIG_SETMASK, &saved_, nullptr); }
  SignalsBlocked(const SignalsBlocked&) = delete;
  SignalsBlocked& operator=(const SignalsBlocked&) = delete;

 private:
  sigset_t saved_{};
};

pid_t spawn_grandchild() {
  const SignalsBlocked blocked;
  const pid_t pid = fork();
  if (pid < 0) {
    err(std::string("fake_trainer: fork: ") + std::strerror(errno) + "\n");
    finish(1);
  }
  if (pid == 0) {
    become_plain_descendant();
    blocked.restore();
    pause_forever();
  }
  return pid;
}

// Fork a child that leaves the session (setsid) and forks again, so the
// grandchild ends up orphaned outside our process group: killpg on the
// trainer's group cannot reach it. Returns the escapee's pid.
pid_t spawn_escapee() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    err(std::string("fake_trainer: pipe: ") + std::strerror(errno) + "\n");
    finish(1);
  }
  const SignalsBlocked blocked;
  const pid_t mid = fork();
  if (mid < 0) {
    err(std::string("fake_trainer: fork: ") + std::strerror(errno) + "\n");
    finish(1);
  }
  if (mid == 0) {
    close(fds[0]);
    setsid();
    const pid_t esc = fork();
    if (esc == 0) {
      close(fds[1]);
      become_plain_descendant();
      blocked.restore();
      pause_forever();
    }
    raw_write_all(fds[1], reinterpret_cast<const char*>(&esc), sizeof esc);
    _exit(esc > 0 ? 0 : 1);
  }
  close(fds[1]);
  pid_t esc = -1;
  size_t got = 0;
  char* dst = reinterpret_cast<char*>(&esc);
  while (got < sizeof esc) {
    const ssize_t r = read(fds[0], dst + got, sizeof esc - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(mid, &status, 0) < 0 && errno == EINTR) {
  }
  if (got != sizeof esc || esc <= 0) {
    err("fake_trainer: spawning the escapee failed\n");
    finish(1);
  }
  return esc;
}

// ---------------------------------------------------------------- main
void warn_about_inherited_signal_state() {
  // A supervisor that leaks a blocked mask or SIG_IGN into its child is a
  // real bug (e.g. SIGINT ignored in background jobs). The mask is left as
  // inherited so such a bug shows up in tests; dispositions are replaced
  // below, as a trainer installing its own handlers would.
  sigset_t mask;
  sigprocmask(SIG_BLOCK, nullptr, &mask);
  for (const auto& [sig, name] : {std::pair{SIGINT, "SIGINT"}, std::pair{SIGTERM, "SIGTERM"}}) {
    if (sigismember(&mask, sig) == 1) {
      err(std::string("fake_trainer: warning: ") + name + " is blocked (inherited signal mask)\n");
    }
    struct sigaction old {};
    sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN) {
      err(std::string("fake_trainer: warning: ") + name + " was ignored at exec (inherited SIG_IGN)\n");
    }
  }
}

void install_handlers(const Options& o) {
  g_ignore_sigint = o.ignore_sigint ? 1 : 0;
  g_ignore_sigterm = o.ignore_sigterm ? 1 : 0;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  // Block both during the handler so the two never interleave their marker
  // lines or race on g_pending_signal.
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);
  sigaddset(&sa.sa_mask, SIGTERM);
  sa.sa_flags = SA_RESTART;  // keep blocking stdout writes simple; ppoll still wakes
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

[[noreturn]] void exit_on_signal(int sig, const Options& o, long& step) {
  const bool is_int = sig == SIGINT;
  out(std::string("fake_trainer received ") + (is_int ? "SIGINT" : "SIGTERM") + "\n");
  if (checkpoint_dir() != nullptr) write_checkpoint(++step, true);
  const long delay_ms = is_int ? o.sigint_exit_delay_ms : o.sigterm_exit_delay_ms;
  // Not cut short by further signals: the trainer is "busy saving"; the
  // handler still records them in the marker file.
  wait_until(mono_ns() + static_cast<int64_t>(delay_ms) * 1000000, false);
  finish(is_int ? o.sigint_exit_code : o.sigterm_exit_code);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t start_ns = mono_ns();
  list_inherited_fds();
  const Options o = parse_args(argc, argv);
  if (o.checkpoint_every_ms > 0 && checkpoint_dir() == nullptr) {
    usage_error("--checkpoint-every needs SPOTVISOR_CHECKPOINT_DIR in the environment");
  }

  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    err(std::string("fake_trainer: pipe: ") + std::strerror(errno) + "\n");
    return 1;
  }
  g_wake_read = wake[0];
  g_wake_write = wake[1];
  if (!o.marker_file.empty()) {
    g_marker_fd = open(o.marker_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (g_marker_fd < 0) {
      err("fake_trainer: cannot open marker file " + o.marker_file + ": " + std::strerror(errno) +
          "\n");
      return 2;
    }
  }
  warn_about_inherited_signal_state();
  install_handlers(o);

  const std::string pid = std::to_string(getpid());
  out("fake_trainer started pid=" + pid + "\n");
  marker("start pid=" + pid + " pgid=" + std::to_string(getpgrp()) + "\n");

  long step = 0;
  if (const char* dir = checkpoint_dir()) {
    step = latest_checkpoint_step(dir);
    if (step > 0) out("fake_trainer resumed step=" + std::to_string(step) + "\n");
  }

  if (run_actions(o.actions)) {
    std::vector<pid_t> descendants;
    for (long i = 0; i < o.spawn_grandchildren; ++i) {
      descendants.push_back(spawn_grandchild());
      out("fake_trainer spawned grandchild pid=" + std::to_string(descendants.back()) + "\n");
    }
    if (o.spawn_escapee) {
      descendants.push_back(spawn_escapee());
      out("fake_trainer spawned escapee pid=" + std::to_string(descendants.back()) + "\n");
    }
    if (!o.pid_file.empty()) {
      std::string lines;
      for (pid_t p : descendants) lines += std::to_string(p) + "\n";
      if (!write_file_atomic(o.pid_file, lines, false)) {
        err("fake_trainer: cannot write pid file " + o.pid_file + ": " + std::strerror(errno) + "\n");
        finish(1);
      }
    }
  }

  const int64_t deadline = o.run_for_ms >= 0 ? start_ns + o.run_for_ms * 1000000 : -1;
  const int64_t every = o.checkpoint_every_ms * 1000000;
  int64_t next_checkpoint = o.checkpoint_every_ms > 0 ? mono_ns() + every : -1;
  sig_atomic_t seen_int = 0;
  sig_atomic_t seen_term = 0;
  for (;;) {
    if (g_pending_signal != 0) exit_on_signal(g_pending_signal, o, step);
    // Report ignored signals so logs show they were delivered.
    for (; seen_int < g_sigint_count; ++seen_int) out("fake_trainer ignoring SIGINT\n");
    for (; seen_term < g_sigterm_count; ++seen_term) out("fake_trainer ignoring SIGTERM\n");
    const int64_t now = mono_ns();
    if (deadline >= 0 && now >= deadline) finish(o.exit_code);
    if (next_checkpoint >= 0 && now >= next_checkpoint) {
      write_checkpoint(++step, false);
      next_checkpoint += every;
      if (next_checkpoint <= mono_ns()) next_checkpoint = mono_ns() + every;  // fell behind
      continue;
    }
    int64_t wake_at = deadline;
    if (next_checkpoint >= 0 && (wake_at < 0 || next_checkpoint < wake_at)) wake_at = next_checkpoint;
    wait_until(wake_at, true);
  }
}
