// The Range header of a resumable upload's 308 answer: "bytes=0-N" means the
// server has persisted N+1 bytes; no header means none. Anything else is not
// a number to trust: nullopt.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace spotvisor {

std::optional<std::uint64_t> ParsePersistedRange(std::string_view header);

}  // namespace spotvisor
