// Every wait in a retry loop goes through a Sleeper, so tests can record the
// delays asked for instead of waiting, and shutdown can cut a wait short.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace spotvisor {

class Sleeper {
 public:
  virtual ~Sleeper() = default;
  // Returns false when the wait was cancelled: the caller must stop retrying.
  virtual bool SleepFor(std::chrono::milliseconds d) = 0;
};

// Real sleeper; Cancel() wakes any current and all future waits at once.
class CancellableSleeper final : public Sleeper {
 public:
  bool SleepFor(std::chrono::milliseconds d) override;
  void Cancel();
  bool cancelled() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;
};

}  // namespace spotvisor
