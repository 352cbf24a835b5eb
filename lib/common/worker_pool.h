// The one executor for blocking work off the event loop (restore, syncs,
// mounts, the Compute API): a fixed set of threads, so a long run's thread
// count and virtual size stay flat however many syncs it makes. Its threads
// are started with every signal blocked: signals reach the event loop only.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace spotvisor {

// Starts a thread with every signal blocked (tini's model: only the event
// loop's thread takes signals). Use it for every thread spotvisor starts.
std::thread StartSignalFreeThread(std::function<void()> fn);

// Blocks every asynchronous signal in the calling thread (threads it starts
// inherit that) and returns; SIGPIPE is ignored process-wide.
void BlockSignalsInThisThread();

// While alive, the calling thread takes these signals (the event loop's
// thread, around io.run()); restores the previous mask after.
class SignalWindow {
 public:
  explicit SignalWindow(const std::vector<int>& signals);
  ~SignalWindow();
  SignalWindow(const SignalWindow&) = delete;
  SignalWindow& operator=(const SignalWindow&) = delete;

 private:
  struct Saved;
  std::unique_ptr<Saved> saved_;
};

class WorkerPool {
 public:
  explicit WorkerPool(std::size_t threads);
  // Shutdown(kept short) if not done yet.
  ~WorkerPool();
  // Runs `task` on a pool thread; an exception it throws is caught and
  // counted, never let out of the thread.
  void Post(std::function<void()> task);
  // Stops taking work and waits up to `bound` for queued and running tasks.
  // Threads still busy after that are detached (their state is shared, so
  // nothing they touch is freed under them); returns how many were left.
  std::size_t Shutdown(std::chrono::milliseconds bound);
  std::size_t threads() const { return threads_.size(); }
  std::size_t exceptions() const;

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv, idle;
    std::deque<std::function<void()>> queue;
    std::size_t running = 0;
    std::size_t exceptions = 0;
    bool stopping = false;
  };
  std::shared_ptr<State> state_;
  std::vector<std::thread> threads_;
  bool shut_ = false;
};

}  // namespace spotvisor
