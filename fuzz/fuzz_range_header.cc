// ParsePersistedRange: any header gives a byte count or nullopt, never a
// wrapped or negative number; what it accepts reads back as itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "storage/range_header.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view header(reinterpret_cast<const char*>(data), size);
  auto n = spotvisor::ParsePersistedRange(header);
  if (!n) return 0;
  if (header.empty()) return *n == 0 ? 0 : (std::abort(), 0);
  if (*n == 0) std::abort();  // "bytes=0-N" persists at least one byte
  auto back = spotvisor::ParsePersistedRange("bytes=0-" + std::to_string(*n - 1));
  if (!back || *back != *n) std::abort();
  return 0;
}
