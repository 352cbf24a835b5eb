#pragma once

#include <functional>
#include <utility>

#include "retry/backoff_policy.h"
#include "retry/retry_policy.h"
#include "retry/sleeper.h"

namespace spotvisor {

// Called after each failed attempt that will be retried, with the delay that
// follows, so callers can log once per failure streak.
using RetryObserver = std::function<void(const Status&, int attempt, std::chrono::milliseconds delay)>;

// Whether repeating a call that may have been applied is safe. Said
// explicitly at every call site, with the reason (google-cloud-cpp passes
// the same into its RetryLoop): a non-idempotent call is tried once, since a
// failure (a lost answer) may hide a change that a retry would make twice.
enum class Idempotency { kIdempotent, kNonIdempotent };

namespace internal {
inline const Status& StatusOf(const Status& s) { return s; }
template <typename T>
Status StatusOf(const StatusOr<T>& s) { return s.status(); }
}  // namespace internal

// Calls `attempt` until it succeeds, the retry policy gives up, or the sleeper
// is cancelled; a non-idempotent `attempt` only once. Returns the last result.
template <typename Fn>
auto RetryLoop(RetryPolicy& retry, BackoffPolicy& backoff, Idempotency idempotency, Sleeper& sleeper, Fn&& attempt,
               const RetryObserver& observer = {}) -> decltype(attempt()) {
  for (int n = 1;; ++n) {
    auto result = attempt();
    Status s = internal::StatusOf(result);
    if (s.ok() || idempotency == Idempotency::kNonIdempotent || !retry.OnFailure(s)) return result;
    auto delay = backoff.OnCompletion();
    if (observer) observer(s, n, delay);
    if (!sleeper.SleepFor(delay)) {
      return decltype(attempt())(CancelledError("retry cancelled after: " + s.message()));
    }
  }
}

}  // namespace spotvisor
