#include "metadata/scheduling.h"

#include <catch2/catch.hpp>

#include "log/logger.h"

namespace spotvisor {
namespace {

using namespace std::chrono_literals;

TEST_CASE("GCE's limits from instance/scheduling/, in either spelling and any duration form, junk is ignored") {
  auto l = ReadGceLimits({{"preemptionNoticeDuration", "120s"}, {"maxRunDuration", R"({"seconds":"86400","nanos":0})"},
                          {"terminationTime", "2026-11-25T10:00:00Z"}, {"onHostMaintenance", "TERMINATE"}});
  CHECK(l.preemption_notice == 120s);
  CHECK(l.max_run_duration == 24h);
  CHECK(l.termination_time == ParseRfc3339("2026-11-25T10:00:00Z"));
  auto k = ReadGceLimits({{"preemption-notice-duration", "120"}, {"max-run-duration", R"({"seconds":3600})"}});
  CHECK(k.preemption_notice == 120s);
  CHECK(k.max_run_duration == 1h);
  CHECK_FALSE(k.termination_time);
  auto junk = ReadGceLimits({{"preemptionNoticeDuration", "soon"}, {"maxRunDuration", "{\"seconds\":-5}"},
                             {"terminationTime", "tomorrow"}, {"max-run-duration", "99999999999999999999"}});
  CHECK_FALSE(junk.preemption_notice);
  CHECK_FALSE(junk.max_run_duration);
  CHECK_FALSE(junk.termination_time);
  CHECK_FALSE(ReadGceLimits({}).max_run_duration);
}

TEST_CASE("GCE's end is the earlier limit, max-runtime must stop the trainer a stop budget before it") {
  auto boot = *ParseRfc3339("2026-11-24T10:00:00Z");
  GceLimits l;
  l.max_run_duration = 24h;
  CHECK(GceEnd(l, boot) == boot + 24h);
  l.termination_time = boot + 10h;
  CHECK(GceEnd(l, boot) == boot + 10h);
  CHECK_FALSE(GceEnd(GceLimits{}, boot));

  auto start = boot + 1min;
  auto end = boot + 24h;
  auto none = GceLimitWarning(end, start, 0ms, 5min, "--max-run-duration 24h");
  CHECK(none.find("max-runtime is not set") != std::string::npos);
  CHECK(none.find("at most 23h54m") != std::string::npos);
  CHECK(GceLimitWarning(end, start, 25h, 5min, "x").find("max-runtime 25h ends later") != std::string::npos);
  CHECK(GceLimitWarning(end, start, 23h, 5min, "x").empty());
  CHECK(GceLimitWarning(end, start, 23h + 54min, 5min, "x").empty());
  CHECK_FALSE(GceLimitWarning(end, start, 23h + 56min, 5min, "x").empty());
  CHECK(GceLimitWarning(start + 2min, start, 0ms, 5min, "x").find("too soon") != std::string::npos);
}

}  // namespace
}  // namespace spotvisor
