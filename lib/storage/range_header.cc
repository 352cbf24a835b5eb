#include "storage/range_header.h"

#include "common/strings.h"

namespace spotvisor {

std::optional<std::uint64_t> ParsePersistedRange(std::string_view header) {
  if (header.empty()) return std::uint64_t{0};
  constexpr std::string_view kPrefix = "bytes=0-";
  if (header.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  auto last = ParseUint64(header.substr(kPrefix.size()));
  if (!last || *last == UINT64_MAX) return std::nullopt;  // +1 must not wrap
  return *last + 1;
}

}  // namespace spotvisor
