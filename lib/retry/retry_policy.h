#pragma once

#include <chrono>
#include <memory>

#include "common/clock.h"
#include "common/status.h"

namespace spotvisor {

// The one place that decides which errors are worth retrying. Configuration
// mistakes, missing keys and permission problems do not fix themselves.
bool IsPermanentFailure(const Status& s);

class RetryPolicy {
 public:
  virtual ~RetryPolicy() = default;
  // Records a failure; true when another attempt is allowed.
  virtual bool OnFailure(const Status& s) = 0;
  virtual std::unique_ptr<RetryPolicy> clone() const = 0;
};

class LimitedErrorCountRetryPolicy final : public RetryPolicy {
 public:
  explicit LimitedErrorCountRetryPolicy(int max_failures) : max_failures_(max_failures) {}
  bool OnFailure(const Status& s) override;
  std::unique_ptr<RetryPolicy> clone() const override;

 private:
  int max_failures_;
  int failures_ = 0;
};

// Gives up once `budget` has passed since the first failure.
class LimitedTimeRetryPolicy final : public RetryPolicy {
 public:
  LimitedTimeRetryPolicy(std::chrono::milliseconds budget, const Clock& clock)
      : budget_(budget), clock_(clock) {}
  bool OnFailure(const Status& s) override;
  std::unique_ptr<RetryPolicy> clone() const override;

 private:
  std::chrono::milliseconds budget_;
  const Clock& clock_;
  std::optional<SteadyTime> first_failure_;
};

// For things that must never give up (the daemon's wait for the metadata
// server): retries every transient error, forever.
class RetryForeverPolicy final : public RetryPolicy {
 public:
  bool OnFailure(const Status& s) override { return !IsPermanentFailure(s); }
  std::unique_ptr<RetryPolicy> clone() const override { return std::make_unique<RetryForeverPolicy>(); }
};

}  // namespace spotvisor
