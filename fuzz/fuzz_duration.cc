// ParseDuration: any bytes give a duration or an error, never a throw; a
// duration is within [0, 10000d] and reads back from FormatDuration as itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/duration.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto d = spotvisor::ParseDuration(text);
  if (!d.ok()) {
    if (d.status().code() != spotvisor::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  if (d->count() < 0 || *d > std::chrono::hours(24 * 10'000)) std::abort();
  auto again = spotvisor::ParseDuration(spotvisor::FormatDuration(*d));
  if (!again.ok() || *again != *d) std::abort();
  return 0;
}
