// Time is injected: deadlines read a steady Clock, wall time is only used for
// timestamps. Tests substitute a clock they advance by hand.
#pragma once

#include <chrono>

namespace spotvisor {

using SteadyTime = std::chrono::steady_clock::time_point;
using WallTime = std::chrono::system_clock::time_point;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual SteadyTime Now() const = 0;
  virtual WallTime WallNow() const = 0;
};

class SystemClock final : public Clock {
 public:
  SteadyTime Now() const override { return std::chrono::steady_clock::now(); }
  WallTime WallNow() const override { return std::chrono::system_clock::now(); }
};

}  // namespace spotvisor
