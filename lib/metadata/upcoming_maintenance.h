// instance/upcoming-maintenance: what the metadata server says about host
// maintenance ahead (compute v1 UpcomingMaintenance). Parsed from bytes that
// can be anything: keys in camelCase or snake_case, booleans as JSON or as
// "true"/"false", the object itself possibly wrapped in a JSON string (what
// ?alt=json makes of a leaf). Errors are values, never a throw.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace spotvisor {

struct UpcomingMaintenance {
  std::string type;                  // SCHEDULED, UNSCHEDULED, MULTIPLE, ... ("" if not given)
  std::optional<bool> can_reschedule;
  std::string window_start_text, window_end_text, latest_window_start_text;  // as sent
  std::optional<WallTime> window_start, window_end, latest_window_start;     // parsed
  std::string status;                // PENDING, ONGOING
  std::vector<std::string> reasons;  // e.g. FAILURE_GPU_XID
};

// nullopt: nothing scheduled ("", "NONE", {}, null). kInvalidArgument for an
// answer that is neither (the message quotes it, escaped and cut short).
StatusOr<std::optional<UpcomingMaintenance>> ParseUpcomingMaintenance(std::string_view body);

// How servers answer "nothing scheduled" besides NONE: 404, or 503 with a
// body saying no notifications have been received (Google's sapagent).
bool IsNoMaintenanceAnswer(const Status& s);

}  // namespace spotvisor
