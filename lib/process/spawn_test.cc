#include "process/spawn.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace spotvisor {
namespace {

SpawnOptions Argv(std::vector<std::string> argv) {
  SpawnOptions o;
  o.argv = std::move(argv);
  o.env = {"PATH=/usr/bin:/bin"};
  o.capture_output = true;
  return o;
}

// Everything the child wrote to stdout, then its wait status.
std::pair<std::string, int> Collect(const SpawnedProcess& p) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(p.stdout_fd, buf, sizeof buf)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  close(p.stdout_fd);
  close(p.stderr_fd);
  int status = 0;
  while (waitpid(p.pid, &status, 0) < 0 && errno == EINTR) {
  }
  return {out, status};
}

std::string Run(std::vector<std::string> argv) {
  auto p = Spawn(Argv(std::move(argv)));
  REQUIRE(p.ok());
  return Collect(*p).first;
}

std::vector<int> OpenFds() {
  std::vector<int> fds;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && std::atoi(e->d_name) != dirfd(d)) fds.push_back(std::atoi(e->d_name));
  }
  closedir(d);
  return fds;
}

TEST_CASE("ExecIfSimple replaces the shell by a simple command") {
  CHECK(ExecIfSimple("python train.py --lr 0.1") == "exec python train.py --lr 0.1");
  CHECK(ExecIfSimple("  python train.py") == "  exec python train.py");
  // Quoting, expansions and globs are expanded before the exec.
  CHECK(ExecIfSimple("python train.py --name 'a; b' --x \"c && d\"") ==
        "exec python train.py --name 'a; b' --x \"c && d\"");
  CHECK(ExecIfSimple("python train.py --x a\\;b") == "exec python train.py --x a\\;b");
  CHECK(ExecIfSimple("python \"$HOME/train.py\" ${ARGS:-x} data/*.bin") ==
        "exec python \"$HOME/train.py\" ${ARGS:-x} data/*.bin");
  CHECK(ExecIfSimple("python train.py --run $(date +%s)") == "exec python train.py --run $(date +%s)");
  CHECK(ExecIfSimple("python train.py --run \"$(cat 'a b'; echo x)\"") ==
        "exec python train.py --run \"$(cat 'a b'; echo x)\"");
  CHECK(ExecIfSimple("python train.py --n $((1 + 2))") == "exec python train.py --n $((1 + 2))");
  // Leading assignments stay in front: `exec A=1 python` would run "A=1".
  CHECK(ExecIfSimple("CUDA_VISIBLE_DEVICES=0 LR='0.1 x' python train.py") ==
        "CUDA_VISIBLE_DEVICES=0 LR='0.1 x' exec python train.py");
  CHECK(ExecIfSimple("_A1=$(pwd) torchrun train.py") == "_A1=$(pwd) exec torchrun train.py");
  // A word with = that is not an assignment is the command.
  CHECK(ExecIfSimple("./a=b x") == "exec ./a=b x");
  // Comments.
  CHECK(ExecIfSimple("python train.py # the 7B run; really") == "exec python train.py # the 7B run; really");
  CHECK(ExecIfSimple("python train.py --tag a#b") == "exec python train.py --tag a#b");
}

TEST_CASE("ExecIfSimple leaves everything but one simple command alone") {
  for (std::string cmd : {"cd x && python train.py", "python a.py || true", "python a.py; python b.py",
                          "python a.py & wait", "python a.py | tee log", "python a.py > log", "python a.py 2>&1",
                          "python a.py < in", "python a.py\npython b.py", "(python a.py)", "{ python a.py; }",
                          "python `cat args`", "python \"`cat args`\"", "if true; then python a.py; fi",
                          "while true; do python a.py; done", "for i in 1 2; do x; done", "! python a.py",
                          "time python a.py", "exec python a.py", "A=1 exec python a.py", "cd /tmp", "export A=1",
                          "echo \"lr=${LR}\"", "printf x", "true", ":", ". ./env.sh", "source env.sh", "A=1",
                          "A=1 B=2", "# nothing", "", "   ", "python 'unterminated", "python \"unterminated",
                          "python $(unterminated", "python a.py \\", "python a.py \\\nb", "python $(case x in a) y;; esac)",
                          "'exec' python", "python a.py; # c"}) {
    CAPTURE(cmd);
    CHECK(ExecIfSimple(cmd) == cmd);
  }
}

TEST_CASE("a simple shell command becomes the spawned process itself") {
  // readlink /proc/self prints its own pid: the spawned pid only if the
  // shell exec'd it rather than forking it.
  auto p = Spawn(Argv({"/bin/sh", "-c", "readlink /proc/self"}));
  REQUIRE(p.ok());
  auto [out, status] = Collect(*p);
  CHECK(out == std::to_string(p->pid) + "\n");
  CHECK(WEXITSTATUS(status) == 0);
  // Anything else still runs under the shell.
  auto q = Spawn(Argv({"/bin/sh", "-c", "readlink /proc/self; true"}));
  REQUIRE(q.ok());
  CHECK(Collect(*q).first != std::to_string(q->pid) + "\n");
  // Exit codes are the command's, also for "not found".
  auto r = Spawn(Argv({"/bin/sh", "-c", "no-such-program-here --x"}));
  REQUIRE(r.ok());
  CHECK(WEXITSTATUS(Collect(*r).second) == 127);
}

TEST_CASE("the child inherits no file descriptor but 0, 1 and 2") {
  // Like curl's sockets: opened without O_CLOEXEC.
  int devnull = open("/dev/null", O_RDONLY);
  REQUIRE(devnull >= 0);
  REQUIRE(dup2(devnull, 100) == 100);
  int plain[2];
  REQUIRE(pipe(plain) == 0);
  std::string script = "for fd in 0 1 2 " + std::to_string(devnull) + " 100 " + std::to_string(plain[0]) + " " +
                       std::to_string(plain[1]) + "; do [ -e /proc/self/fd/$fd ] && echo $fd; done; echo end";
  CHECK(Run({"/bin/sh", "-c", script}) == "0\n1\n2\nend\n");
  // stdin is /dev/null.
  CHECK(Run({"/bin/sh", "-c", "exec readlink /proc/self/fd/0"}) == "/dev/null\n");
  for (int fd : {devnull, 100, plain[0], plain[1]}) close(fd);
}

TEST_CASE("no pipe is left open when spawning fails") {
  auto before = OpenFds();
  auto o = Argv({"/no/such/program"});
  CHECK(Spawn(o).status().code() == StatusCode::kNotFound);
  o = Argv({"/bin/true"});
  o.workdir = "/no/such/dir";
  auto s = Spawn(o);
  CHECK_FALSE(s.ok());
  CHECK(s.status().message().find("chdir") != std::string::npos);
  while (waitpid(-1, nullptr, 0) > 0) {
  }
  CHECK(OpenFds() == before);
}

TEST_CASE("no pipe is left open when a pipe cannot be made") {
  // Room for exactly three more fds: the error pipe fits, the stdout pipe not.
  rlimit saved{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &saved) == 0);
  auto before = OpenFds();
  int highest = before.back();
  std::vector<int> fillers;
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  fillers.push_back(devnull);
  for (int fd = 3; fd <= highest + 1; ++fd) {
    if (fcntl(fd, F_GETFD) < 0) fillers.push_back(fcntl(devnull, F_DUPFD_CLOEXEC, fd));
  }
  int top = *std::max_element(fillers.begin(), fillers.end());
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(top + 4);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
  auto fds_before = OpenFds();
  auto p = Spawn(Argv({"/bin/true"}));
  auto fds_after = OpenFds();
  REQUIRE(setrlimit(RLIMIT_NOFILE, &saved) == 0);
  CHECK_FALSE(p.ok());
  CHECK(p.status().message().find("pipe") != std::string::npos);
  CHECK(fds_after == fds_before);
  for (int fd : fillers) close(fd);
}

// Runs one way of closing fds in a forked child with fd 50 (not
// O_CLOEXEC) open and the result pipe at `keep_at`: 50 must be gone, the
// pipe and 0/1/2 still there.
bool ClosesAllButKeep(bool (*close_all)(int), int keep_at) {
  int result[2];
  REQUIRE(pipe2(result, O_CLOEXEC) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int keep = dup2(result[1], keep_at);
    if (keep != result[1]) close(result[1]);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 50);
    bool closed = close_all(keep);
    bool ok = closed && fcntl(50, F_GETFD) < 0 && fcntl(devnull, F_GETFD) < 0 &&
              (result[0] == keep || fcntl(result[0], F_GETFD) < 0) && fcntl(0, F_GETFD) >= 0 &&
              fcntl(1, F_GETFD) >= 0 && fcntl(2, F_GETFD) >= 0;
    char c = ok ? 'y' : 'n';
    _exit(write(keep, &c, 1) == 1 ? 0 : 1);
  }
  close(result[1]);
  char c = 0;
  ssize_t n = read(result[0], &c, 1);
  close(result[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return n == 1 && c == 'y';
}

TEST_CASE("each way of closing inherited fds closes all but the error pipe") {
  auto up_to_limit = [](int keep) {
    internal::CloseFdsUpToLimit(keep);
    return true;
  };
  for (int keep_at : {3, 4, 200}) {
    CAPTURE(keep_at);
    CHECK(ClosesAllButKeep(internal::CloseFdsWithCloseRange, keep_at));
    CHECK(ClosesAllButKeep(internal::CloseFdsListedInProc, keep_at));
    CHECK(ClosesAllButKeep(up_to_limit, keep_at));
  }
}

// prctl(PR_GET_PDEATHSIG) as the child sees it after exec, through Python's
// ctypes (PR_GET_PDEATHSIG is 2).
const char* kPrintPdeathsig =
    "import ctypes; s = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(s)); print(s.value)";

TEST_CASE("a child spawned on the main thread dies with spotvisor (SIGKILL), one from a worker thread does not") {
  CHECK(Run({"/usr/bin/python3", "-c", kPrintPdeathsig}) == "9\n");
  std::string from_worker;
  std::thread([&] { from_worker = Run({"/usr/bin/python3", "-c", kPrintPdeathsig}); }).join();
  CHECK(from_worker == "0\n");
  auto o = Argv({"/usr/bin/python3", "-c", kPrintPdeathsig});
  o.parent_death_signal = 0;
  auto p = Spawn(o);
  REQUIRE(p.ok());
  CHECK(Collect(*p).first == "0\n");
}

TEST_CASE("the parent-death signal survives switching to the trainer's user") {
  if (geteuid() != 0) return;  // only root can switch
  auto o = Argv({"/usr/bin/python3", "-c", kPrintPdeathsig});
  o.user = UserInfo{"nobody", 65534, 65534, "/", "", {65534}};
  auto p = Spawn(o);
  REQUIRE(p.ok());
  CHECK(Collect(*p).first == "9\n");
}

TEST_CASE("when the spawning process dies, the child is killed") {
  // A forked stand-in for spotvisor spawns a long-lived child, reports its
  // pid, and exits when told to: the child must go with it.
  int report[2], go[2];
  REQUIRE(pipe2(report, O_CLOEXEC) == 0);
  REQUIRE(pipe2(go, O_CLOEXEC) == 0);
  pid_t standin = fork();
  REQUIRE(standin >= 0);
  if (standin == 0) {
    close(report[0]);
    close(go[1]);
    SpawnOptions o;
    o.argv = {"/bin/sleep", "600"};
    auto p = Spawn(o);
    pid_t pid = p.ok() ? p->pid : -1;
    ssize_t w = write(report[1], &pid, sizeof pid);
    char c;
    ssize_t r = read(go[0], &c, 1);  // EOF when the test says so
    _exit(w == sizeof pid && r >= 0 ? 0 : 1);
  }
  close(report[1]);
  close(go[0]);
  pid_t child = -1;
  REQUIRE(read(report[0], &child, sizeof child) == sizeof child);
  close(report[0]);
  REQUIRE(child > 0);
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, child, 0));
  REQUIRE(pidfd >= 0);
  close(go[1]);  // the stand-in exits
  int status = 0;
  REQUIRE(waitpid(standin, &status, 0) == standin);
  pollfd pfd{pidfd, POLLIN, 0};
  int ready = poll(&pfd, 1, 10000);  // an event, not a sleep: the bound is for failure only
  if (ready != 1) kill(child, SIGKILL);
  close(pidfd);
  CHECK(ready == 1);
}

}  // namespace
}  // namespace spotvisor
