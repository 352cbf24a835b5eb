#include "retry/backoff_policy.h"

#include <algorithm>

namespace spotvisor {

ExponentialBackoffPolicy::ExponentialBackoffPolicy(std::chrono::milliseconds initial,
                                                   std::chrono::milliseconds maximum,
                                                   double scaling, double jitter,
                                                   std::uint64_t seed)
    : initial_(initial),
      maximum_(std::max(initial, maximum)),
      scaling_(std::max(1.0, scaling)),
      jitter_(std::clamp(jitter, 0.0, 1.0)),
      seed_(seed),
      current_ms_(static_cast<double>(initial.count())),
      rng_(seed) {}

std::chrono::milliseconds ExponentialBackoffPolicy::OnCompletion() {
  double upper = current_ms_;
  double lower = upper * (1.0 - jitter_);
  double delay = lower;
  if (upper > lower) delay = std::uniform_real_distribution<double>(lower, upper)(rng_);
  current_ms_ = std::min(current_ms_ * scaling_, static_cast<double>(maximum_.count()));
  return std::chrono::milliseconds(static_cast<long long>(delay));
}

void ExponentialBackoffPolicy::Reset() { current_ms_ = static_cast<double>(initial_.count()); }

std::unique_ptr<BackoffPolicy> ExponentialBackoffPolicy::clone() const {
  return std::make_unique<ExponentialBackoffPolicy>(initial_, maximum_, scaling_, jitter_, seed_);
}

}  // namespace spotvisor
