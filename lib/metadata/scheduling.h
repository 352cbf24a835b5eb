// What instance/scheduling/ may say about GCE's own limits on this VM:
// the preemption notice (--preemption-notice-duration), --max-run-duration and
// --termination-time. Whether the metadata server exposes these is not
// confirmed (REFERENCE.md lists preemptible, on-host-maintenance and
// automatic-restart); when it does, under either spelling (camelCase from a
// recursive read, kebab-case as keys), they are used. Values are bytes from
// outside: checked, never thrown on.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "common/clock.h"

namespace spotvisor {

struct GceLimits {
  std::optional<std::chrono::milliseconds> preemption_notice;
  std::optional<std::chrono::milliseconds> max_run_duration;  // from the VM's start
  std::optional<WallTime> termination_time;
  std::string termination_time_text;
};

// `scheduling`: instance/scheduling/?recursive=true as ParseAttributes gives
// it. Durations as "120s", "120" (seconds) or {"seconds": N}.
GceLimits ReadGceLimits(const std::map<std::string, std::string>& scheduling);

// When GCE itself ends the VM (the earlier of termination-time and start +
// max-run-duration), if it does.
std::optional<WallTime> GceEnd(const GceLimits& limits, WallTime vm_started);

// The warning to log when GCE's end could cut the trainer off without a
// save: spotvisor's own max-runtime (from `started`; 0: none) must stop it at
// least `stop_budget` (the stop ladder and a final sync) before `gce_end`.
// Empty when max-runtime already does.
std::string GceLimitWarning(WallTime gce_end, WallTime started, std::chrono::milliseconds max_runtime,
                            std::chrono::milliseconds stop_budget, const std::string& source);

}  // namespace spotvisor
