#include "retry/retry_loop.h"

#include <catch2/catch.hpp>

namespace spotvisor {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

// Records the delays asked for instead of waiting.
class RecordingSleeper final : public Sleeper {
 public:
  bool SleepFor(milliseconds d) override {
    delays.push_back(d);
    return !cancel_after || delays.size() < *cancel_after;
  }
  std::vector<milliseconds> delays;
  std::optional<std::size_t> cancel_after;
};

class FakeClock final : public Clock {
 public:
  SteadyTime Now() const override { return now; }
  WallTime WallNow() const override { return {}; }
  SteadyTime now{};
};

TEST_CASE("the retry loop sleeps exactly the backoff delays between attempts") {
  ExponentialBackoffPolicy backoff(100ms, 1s, 2.0, /*jitter=*/0.0);
  LimitedErrorCountRetryPolicy retry(10);
  RecordingSleeper sleeper;
  int calls = 0;
  auto r = RetryLoop(retry, backoff, Idempotency::kIdempotent, sleeper, [&]() -> StatusOr<int> {
    if (++calls < 6) return UnavailableError("503");
    return 42;
  });
  REQUIRE(r.ok());
  CHECK(*r == 42);
  CHECK(sleeper.delays == std::vector<milliseconds>{100ms, 200ms, 400ms, 800ms, 1000ms});
}

TEST_CASE("permanent errors are not retried") {
  ExponentialBackoffPolicy backoff(100ms, 1s, 2.0, 0.0);
  RetryForeverPolicy retry;
  RecordingSleeper sleeper;
  int calls = 0;
  auto s = RetryLoop(retry, backoff, Idempotency::kIdempotent, sleeper, [&] {
    ++calls;
    return NotFoundError("404");
  });
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK(calls == 1);
  CHECK(sleeper.delays.empty());
}

TEST_CASE("the error count limit gives up with the last error, and the observer sees each retry") {
  ExponentialBackoffPolicy backoff(10ms, 1s, 2.0, 0.0);
  LimitedErrorCountRetryPolicy retry(2);
  RecordingSleeper sleeper;
  std::vector<int> attempts;
  auto s = RetryLoop(retry, backoff, Idempotency::kIdempotent, sleeper, [] { return UnavailableError("down"); },
                     [&](const Status&, int n, milliseconds) { attempts.push_back(n); });
  CHECK(s.message() == "down");
  CHECK(attempts == std::vector<int>{1, 2});
}

TEST_CASE("a cancelled sleeper ends the loop as cancelled") {
  ExponentialBackoffPolicy backoff(10ms, 1s, 2.0, 0.0);
  RetryForeverPolicy retry;
  RecordingSleeper sleeper;
  sleeper.cancel_after = 3;
  auto s = RetryLoop(retry, backoff, Idempotency::kIdempotent, sleeper, [] { return UnavailableError("down"); });
  CHECK(s.code() == StatusCode::kCancelled);
  CHECK(sleeper.delays.size() == 3);
}

TEST_CASE("the time-limited policy gives up once its budget has passed since the first failure") {
  FakeClock clock;
  LimitedTimeRetryPolicy retry(10s, clock);
  CHECK(retry.OnFailure(UnavailableError("x")));
  clock.now += 9s;
  CHECK(retry.OnFailure(UnavailableError("x")));
  clock.now += 1s;
  CHECK_FALSE(retry.OnFailure(UnavailableError("x")));
}

TEST_CASE("jittered backoff stays within [d*(1-jitter), d], grows to the cap, and resets") {
  ExponentialBackoffPolicy backoff(100ms, 400ms, 2.0, 0.5, /*seed=*/7);
  std::vector<std::pair<long, long>> bounds = {{50, 100}, {100, 200}, {200, 400}, {200, 400}, {200, 400}};
  for (auto [lo, hi] : bounds) {
    auto d = backoff.OnCompletion().count();
    CHECK(d >= lo);
    CHECK(d <= hi);
  }
  backoff.Reset();
  auto d = backoff.OnCompletion().count();
  CHECK(d >= 50);
  CHECK(d <= 100);
  // Same seed, same sequence: jitter is reproducible.
  ExponentialBackoffPolicy a(100ms, 10s, 2.0, 0.5, 3), b(100ms, 10s, 2.0, 0.5, 3);
  for (int i = 0; i < 5; ++i) CHECK(a.OnCompletion() == b.OnCompletion());
}

TEST_CASE("a non-idempotent call is tried once: a failure may hide a change a retry would make twice") {
  ExponentialBackoffPolicy backoff(100ms, 1s, 2.0, /*jitter=*/0.0);
  LimitedErrorCountRetryPolicy retry(10);
  RecordingSleeper sleeper;
  int calls = 0;
  auto s = RetryLoop(retry, backoff, Idempotency::kNonIdempotent, sleeper, [&] {
    ++calls;
    return UnavailableError("the answer was lost");
  });
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK(calls == 1);
  CHECK(sleeper.delays.empty());
}

}  // namespace
}  // namespace spotvisor
