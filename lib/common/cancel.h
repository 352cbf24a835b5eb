// One operation's deadline and cancellation, passed explicitly down every
// call that can block (the sync engine, the object stores, each HTTP request
// and each backoff wait), so a stop or a closing Spot window cuts work short
// instead of waiting for it.
//
// A CancelSource is owned by whoever may cancel (the supervisor); a
// CallContext is what callees receive: the source (may be null: never
// cancelled), an absolute deadline (may be unset: none) and the clock that
// deadline is read against.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/status.h"

namespace spotvisor {

class CancelSource {
 public:
  // Idempotent; wakes every WaitFor and runs every registered callback once.
  void Cancel();
  bool cancelled() const;
  // Waits up to `d` (a real wait); false when cancelled before or meanwhile.
  bool WaitFor(std::chrono::milliseconds d) const;
  // Runs `fn` on Cancel (at once if already cancelled). Returns an id for
  // Unsubscribe. Callbacks must not block.
  std::uint64_t Subscribe(std::function<void()> fn);
  void Unsubscribe(std::uint64_t id);

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool cancelled_ = false;
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, std::function<void()>> callbacks_;
};

struct CallContext {
  std::shared_ptr<CancelSource> cancel;  // null: cannot be cancelled
  std::optional<SteadyTime> deadline;    // unset: no deadline
  const Clock* clock = nullptr;          // required when deadline is set
  // The caller is short of time (the final sync inside a Spot window):
  // retry quickly within the deadline instead of Google's full backoff.
  bool urgent = false;
  // Told of bytes moved to or from a store as they are confirmed (a chunk
  // the server kept, a range written to disk); a negative count takes back
  // bytes of an attempt that is being redone. Called from any thread; must
  // not block. Null: nobody is counting.
  std::function<void(std::int64_t)> on_bytes;

  void Moved(std::int64_t n) const {
    if (on_bytes && n != 0) on_bytes(n);
  }
  bool cancelled() const { return cancel && cancel->cancelled(); }
  bool expired() const { return deadline && clock && clock->Now() >= *deadline; }
  // min(cap, time left); zero once expired.
  std::chrono::milliseconds Remaining(std::chrono::milliseconds cap) const;
  // OkStatus, or kCancelled / kDeadlineExceeded naming `what`.
  Status Check(const std::string& what) const;
  // Waits up to `d`, but never past the deadline; false when cancelled or
  // when the wait would end at or past the deadline (nothing left to retry in).
  bool SleepFor(std::chrono::milliseconds d) const;
  // The same context with a deadline no later than `at`.
  CallContext WithDeadline(SteadyTime at) const;
};

// For callers with nothing to cancel and no deadline.
inline const CallContext& Background() {
  static const CallContext ctx;
  return ctx;
}

}  // namespace spotvisor
