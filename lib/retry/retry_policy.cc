#include "retry/retry_policy.h"

namespace spotvisor {

bool IsPermanentFailure(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kPermissionDenied:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kCancelled:
      return true;
    default:
      return false;
  }
}

bool LimitedErrorCountRetryPolicy::OnFailure(const Status& s) {
  if (IsPermanentFailure(s)) return false;
  return ++failures_ <= max_failures_;
}

std::unique_ptr<RetryPolicy> LimitedErrorCountRetryPolicy::clone() const {
  return std::make_unique<LimitedErrorCountRetryPolicy>(max_failures_);
}

bool LimitedTimeRetryPolicy::OnFailure(const Status& s) {
  if (IsPermanentFailure(s)) return false;
  auto now = clock_.Now();
  if (!first_failure_) first_failure_ = now;
  return now - *first_failure_ < budget_;
}

std::unique_ptr<RetryPolicy> LimitedTimeRetryPolicy::clone() const {
  return std::make_unique<LimitedTimeRetryPolicy>(budget_, clock_);
}

}  // namespace spotvisor
