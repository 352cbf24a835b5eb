// Watches one metadata key for changes on its own thread, forever: 503s,
// refused connections, resets and hangs are retried with a jittered backoff
// and logged once per failure streak. The ETag only advances on a successful
// answer, so a change made while a request was failing or between two polls
// is still seen: the next long-poll carries the old ETag and is answered at
// once.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/status.h"
#include "metadata/metadata_client.h"
#include "retry/backoff_policy.h"
#include "retry/sleeper.h"

namespace spotvisor {

struct WatcherCallbacks {
  // A new value (only when it differs from the last one delivered).
  std::function<void(const std::string& value)> on_change;
  // First failure of a streak, and the recovery that ends it.
  std::function<void(const Status& first_error)> on_failing;
  std::function<void(int failed_attempts)> on_recovered;
};

struct WatcherOptions {
  std::chrono::seconds timeout_sec{60};
  std::unique_ptr<BackoffPolicy> backoff;
  // Answers that mean "no value" rather than a failure (a key that is only
  // defined while something is scheduled): delivered as `absent_value`,
  // not logged, and asked again every `absent_poll` (there is no ETag to
  // wait on). Null: every error is a failure, retried with the backoff.
  std::function<bool(const Status&)> absent;
  std::string absent_value;
  std::chrono::milliseconds absent_poll{30'000};
};

class MetadataWatcher {
 public:
  // `initial` is the value and ETag read at startup.
  MetadataWatcher(std::unique_ptr<MetadataClient> client, std::string path, MetadataValue initial,
                  WatcherOptions options, WatcherCallbacks callbacks);
  ~MetadataWatcher();  // stops and joins

  void Start();
  void Stop();
  const std::string& path() const { return path_; }

 private:
  void Run();

  std::unique_ptr<MetadataClient> client_;
  std::string path_;
  MetadataValue current_;
  WatcherOptions options_;
  WatcherCallbacks callbacks_;
  CancellableSleeper sleeper_;
  std::thread thread_;
};

}  // namespace spotvisor
