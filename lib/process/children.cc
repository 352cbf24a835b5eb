#include "process/children.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include <fmt/format.h>

namespace spotvisor {

StatusOr<SpawnedProcess> ChildRegistry::Spawn(const SpawnOptions& options, OnExit on_exit,
                                             const std::function<void(pid_t)>& on_spawned) {
  std::lock_guard<std::mutex> l(mu_);
  auto p = spotvisor::Spawn(options);
  if (p.ok()) {
    watched_[p->pid] = std::move(on_exit);
    if (on_spawned) on_spawned(p->pid);
  }
  return p;
}

void ChildRegistry::Deliver(pid_t pid, int status) {
  auto it = watched_.find(pid);
  OnExit cb = std::move(it->second);
  watched_.erase(it);
  exited_[pid] = status;
  if (cb) cb(status);
  cv_.notify_all();
}

void ChildRegistry::ReapAll(const std::function<void(pid_t, int)>& other) {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    if (watched_.count(pid)) {
      Deliver(pid, status);
    } else if (other) {
      l.unlock();
      other(pid, status);
      l.lock();
    }
  }
}

bool ChildRegistry::Registered(pid_t pid) {
  std::lock_guard<std::mutex> l(mu_);
  return watched_.count(pid) > 0;
}

std::optional<int> ChildRegistry::Wait(pid_t pid, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    if (auto it = exited_.find(pid); it != exited_.end()) {
      int s = it->second;
      exited_.erase(it);
      return s;
    }
    if (watched_.count(pid)) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        Deliver(pid, status);
        continue;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    // A reaper wakes us through cv_; the short bound covers a process
    // without one (nothing else would reap the child).
    cv_.wait_for(l, std::chrono::milliseconds(50));
  }
}

StatusOr<int> ChildRegistry::Run(const SpawnOptions& options, std::chrono::milliseconds timeout, std::string* output,
                                 const std::atomic<bool>* cancelled) {
  SpawnOptions o = options;
  o.capture_output = true;
  auto p = Spawn(o);
  if (!p.ok()) return p.status();
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string out;
  pollfd fds[2] = {{p->stdout_fd, POLLIN, 0}, {p->stderr_fd, POLLIN, 0}};
  int open_fds = 2;
  bool timed_out = false, was_cancelled = false;
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    if (cancelled != nullptr && cancelled->load()) {
      was_cancelled = true;
      break;
    }
    int slice = static_cast<int>(cancelled != nullptr ? std::min<long>(left.count(), 100) : left.count());
    int r = poll(fds, 2, slice);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    for (auto& f : fds) {
      if (f.fd < 0 || f.revents == 0) continue;
      char buf[4096];
      ssize_t n = read(f.fd, buf, sizeof buf);
      if (n > 0) {
        out.append(buf, static_cast<std::size_t>(n));
        if (out.size() > 4096) out.erase(0, out.size() - 4096);
      } else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        close(f.fd);
        f.fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  if (timed_out || was_cancelled) killpg(p->pid, SIGKILL);
  auto status = Wait(p->pid, timed_out || was_cancelled ? std::chrono::milliseconds(5000)
                                                        : std::max(std::chrono::milliseconds(5000), timeout));
  if (output) *output = out;
  if (was_cancelled) return CancelledError(fmt::format("{} was cancelled: killed", o.argv.empty() ? "?" : o.argv[0]));
  if (timed_out) {
    return DeadlineExceededError(fmt::format("{} did not finish within {} ms: killed", o.argv.empty() ? "?" : o.argv[0],
                                             timeout.count()));
  }
  if (!status) return DeadlineExceededError(fmt::format("{} closed its output but did not exit", o.argv[0]));
  return *status;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("wait status {}", status);
}

}  // namespace spotvisor
