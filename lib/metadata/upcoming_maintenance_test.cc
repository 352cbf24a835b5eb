#include "metadata/upcoming_maintenance.h"

#include <catch2/catch.hpp>

#include "log/logger.h"
#include "metadata/metadata_client.h"

namespace spotvisor {
namespace {

TEST_CASE("upcoming-maintenance: every way of saying nothing is scheduled is none") {
  for (const char* none : {"", "NONE", " NONE\n", "{}", "null", "\"NONE\"", "\"\"", "\"{}\"",
                           R"({"maintenanceStatus":"NONE"})"}) {
    CAPTURE(none);
    auto m = ParseUpcomingMaintenance(none);
    REQUIRE(m.ok());
    CHECK_FALSE(m->has_value());
  }
  // 404, and sapagent's 503 "no notifications", are answers too, not failures.
  CHECK(IsNoMaintenanceAnswer(NotFoundError("metadata instance/upcoming-maintenance: not defined (HTTP 404)")));
  CHECK(IsNoMaintenanceAnswer(UnavailableError(
      R"(metadata instance/upcoming-maintenance?alt=json: HTTP 503: {"error": "no notifications have been received yet, try again later"})")));
  CHECK_FALSE(IsNoMaintenanceAnswer(UnavailableError("metadata instance/upcoming-maintenance: HTTP 503")));
  CHECK_FALSE(IsNoMaintenanceAnswer(PermissionDeniedError("forbidden")));
}

TEST_CASE("upcoming-maintenance: camelCase or snake_case, booleans as JSON or text, wrapped in a JSON string or not") {
  auto camel = ParseUpcomingMaintenance(R"({"type":"SCHEDULED","canReschedule":true,
      "windowStartTime":"2026-11-25T10:00:00Z","windowEndTime":"2026-11-25T14:00:00Z",
      "latestWindowStartTime":"2026-11-27T10:00:00Z","maintenanceStatus":"PENDING",
      "maintenanceReasons":["FAILURE_GPU_XID","FAILURE_GPU_TEMPERATURE"]})");
  REQUIRE(camel.ok());
  REQUIRE(camel->has_value());
  auto const& m = **camel;
  CHECK(m.type == "SCHEDULED");
  CHECK(m.can_reschedule == true);
  CHECK(m.window_start == ParseRfc3339("2026-11-25T10:00:00Z"));
  CHECK(m.window_end == ParseRfc3339("2026-11-25T14:00:00Z"));
  CHECK(m.latest_window_start == ParseRfc3339("2026-11-27T10:00:00Z"));
  CHECK(m.window_start_text == "2026-11-25T10:00:00Z");
  CHECK(m.status == "PENDING");
  CHECK(m.reasons == std::vector<std::string>{"FAILURE_GPU_XID", "FAILURE_GPU_TEMPERATURE"});

  auto snake = ParseUpcomingMaintenance(
      R"("{\"can_reschedule\":\"false\",\"window_start_time\":\"2026-11-25T10:00:00+01:00\",\"maintenance_status\":\"ONGOING\",\"type\":\"UNSCHEDULED\"}")");
  REQUIRE(snake.ok());
  REQUIRE(snake->has_value());
  CHECK((*snake)->can_reschedule == false);
  CHECK((*snake)->status == "ONGOING");
  CHECK((*snake)->window_start == ParseRfc3339("2026-11-25T09:00:00Z"));
  CHECK((*snake)->reasons.empty());
}

TEST_CASE("upcoming-maintenance: anything else is an error that quotes it, never a throw") {
  for (const char* bad : {"garbage", "[1,2]", "42", R"({"type":7})", R"({"windowStartTime":"tomorrow"})",
                          R"({"type":"SCHEDULED","canReschedule":"maybe"})", R"({"type":"SCHEDULED","maintenanceReasons":[1]})",
                          R"({"type":"SCHEDULED","maintenanceReasons":{}})", "\"\xff\xfe\"", "{\"type\":\"SCHED"}) {
    CAPTURE(bad);
    auto m = ParseUpcomingMaintenance(bad);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().code() == StatusCode::kInvalidArgument);
    CHECK(m.status().message().rfind("upcoming-maintenance: ", 0) == 0);
  }
  CHECK_FALSE(ParseUpcomingMaintenance(std::string(70000, ' ') + "{}").ok());
}

}  // namespace
}  // namespace spotvisor
