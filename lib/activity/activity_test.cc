#include "activity/activity.h"

#include <catch2/catch.hpp>

namespace spotvisor {
namespace {

using namespace std::chrono_literals;

TEST_CASE("idle time grows while CPU stays under the threshold, and resets on activity") {
  IdleDetector d(/*cpu_percent=*/5, /*gpu_percent=*/5);
  SteadyTime t{std::chrono::hours(1)};
  CHECK(d.Observe(t, {10.0, std::nullopt, 0}) == 0ms);
  CHECK(d.Observe(t + 10s, {10.2, std::nullopt, 0}) == 10s);   // 2% of a core: idle
  CHECK(d.Observe(t + 20s, {10.3, std::nullopt, 0}) == 20s);
  CHECK(d.Observe(t + 30s, {13.3, std::nullopt, 0}) == 0ms);   // 30%: active
  CHECK(d.Observe(t + 40s, {13.3, std::nullopt, 0}) == 10s);
}

TEST_CASE("a busy GPU or an incoming connection counts as activity, an exited process never makes CPU negative") {
  IdleDetector d(5, 5);
  SteadyTime t{};
  d.Observe(t, {100, 0.0, 0});
  CHECK(d.Observe(t + 10s, {100, 80.0, 0}) == 0ms);  // GPU busy
  CHECK(d.Observe(t + 20s, {100, 0.0, 1}) == 0ms);   // someone is connected
  CHECK(d.Observe(t + 30s, {40, 0.0, 0}) == 10s);    // a child exited with 60 s of CPU
}

TEST_CASE("the /proc sampler sees this process's own CPU time") {
  auto s = MakeProcActivitySampler();
  auto a = s->Sample(getpid());
  volatile double x = 0;
  for (int i = 0; i < 50'000'000; ++i) x = x + i * 0.5;
  auto b = s->Sample(getpid());
  CHECK(b.cpu_seconds > a.cpu_seconds);
  CHECK(s->Sample(999'999'999).cpu_seconds == 0);  // no such process
}

}  // namespace
}  // namespace spotvisor
