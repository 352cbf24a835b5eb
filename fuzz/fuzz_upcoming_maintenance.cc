// instance/upcoming-maintenance's answer (and ParseRfc3339 under it): any
// bytes give "nothing scheduled", a maintenance, or kInvalidArgument, never a
// throw; a parsed window start reads back through FormatRfc3339 as itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "log/logger.h"
#include "metadata/upcoming_maintenance.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto m = spotvisor::ParseUpcomingMaintenance(text);
  if (!m.ok()) {
    if (m.status().code() != spotvisor::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  if (*m && (*m)->window_start) {
    auto again = spotvisor::ParseRfc3339(spotvisor::FormatRfc3339(*(*m)->window_start));
    if (!again || *again != *(*m)->window_start) std::abort();
  }
  // The bytes as a time on their own.
  if (auto t = spotvisor::ParseRfc3339(text)) {
    auto again = spotvisor::ParseRfc3339(spotvisor::FormatRfc3339(*t));
    if (!again || *again != *t) std::abort();
  }
  return 0;
}
