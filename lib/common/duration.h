#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "common/status.h"

namespace spotvisor {

// Accepts "90" (seconds), "90s", "15m", "1h30m", "500ms", "2d"; the units
// follow Go's time.ParseDuration so users coming from gcloud find them
// familiar. Negative values are rejected.
StatusOr<std::chrono::milliseconds> ParseDuration(std::string_view text);

// The inverse for display: 5400000ms -> "1h30m", 1500ms -> "1.5s", 0 -> "0s".
std::string FormatDuration(std::chrono::milliseconds d);

}  // namespace spotvisor
