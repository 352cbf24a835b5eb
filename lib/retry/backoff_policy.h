#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <random>

#include "common/random.h"

namespace spotvisor {

class BackoffPolicy {
 public:
  virtual ~BackoffPolicy() = default;
  // The delay before the next attempt; each call moves the policy along.
  virtual std::chrono::milliseconds OnCompletion() = 0;
  // Back to the initial delay (after a success ends a failure streak).
  virtual void Reset() = 0;
  virtual std::unique_ptr<BackoffPolicy> clone() const = 0;
};

// Exponential backoff with jitter: the n-th delay is drawn uniformly from
// [d*(1-jitter), d] where d = min(initial * scaling^n, maximum). jitter = 0
// gives exact delays (what unit tests assert); the seed makes jitter
// reproducible.
class ExponentialBackoffPolicy final : public BackoffPolicy {
 public:
  ExponentialBackoffPolicy(std::chrono::milliseconds initial,
                           std::chrono::milliseconds maximum, double scaling,
                           double jitter = 0.5, std::uint64_t seed = RandomSeed());

  std::chrono::milliseconds OnCompletion() override;
  void Reset() override;
  std::unique_ptr<BackoffPolicy> clone() const override;

 private:
  std::chrono::milliseconds initial_, maximum_;
  double scaling_, jitter_;
  std::uint64_t seed_;
  double current_ms_;
  std::mt19937_64 rng_;
};

}  // namespace spotvisor
