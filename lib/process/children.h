// Processes spawned from worker threads (mkfs, the FUSE daemon) while the
// supervisor, as a subreaper, collects every child with waitpid(-1): the
// registry hands each exit status to the code that spawned the process.
// Spawning and reaping share one lock, so a child can never be reaped before
// it is registered.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "common/status.h"
#include "process/spawn.h"

namespace spotvisor {

class ChildRegistry {
 public:
  // Called with the raw wait status, on whichever thread reaped the child.
  using OnExit = std::function<void(int wait_status)>;

  // on_spawned runs under the registry's lock, before the child's exit can be
  // delivered: record the pid there, and on_exit never sees it unrecorded.
  StatusOr<SpawnedProcess> Spawn(const SpawnOptions& options, OnExit on_exit = {},
                                 const std::function<void(pid_t)>& on_spawned = {});

  // The reaper: waitpid(-1, WNOHANG) until nothing is left; statuses of
  // registered children go to them, every other one to `other`.
  void ReapAll(const std::function<void(pid_t, int)>& other);

  // Blocks until `pid` (registered) has exited, reaping it itself if no
  // reaper does; nullopt on timeout. From worker threads only.
  std::optional<int> Wait(pid_t pid, std::chrono::milliseconds timeout);

  bool Registered(pid_t pid);

  // Runs a command to completion with its output captured (stdout and
  // stderr together, last 4 KiB kept); on timeout, or once *cancelled turns
  // true (checked every 100 ms), the process group is SIGKILLed. Returns the
  // wait status.
  StatusOr<int> Run(const SpawnOptions& options, std::chrono::milliseconds timeout, std::string* output,
                    const std::atomic<bool>* cancelled = nullptr);

 private:
  void Deliver(pid_t pid, int status);  // with mu_ held

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<pid_t, OnExit> watched_;
  std::map<pid_t, int> exited_;  // for Wait(): statuses not yet collected
};

// "exited with code 1" / "killed by SIGKILL".
std::string DescribeWaitStatus(int status);

}  // namespace spotvisor
