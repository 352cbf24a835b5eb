// CRC-32C (Castagnoli), the checksum Cloud Storage keeps for every object.
// Uses the SSE4.2 crc32 instruction when the CPU has it (three chains at
// once), a table otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace spotvisor {

// Extends `crc` (0 for a fresh checksum) with `data`.
std::uint32_t Crc32cExtend(std::uint32_t crc, std::string_view data);
inline std::uint32_t Crc32c(std::string_view data) { return Crc32cExtend(0, data); }

// Which implementation Crc32cExtend uses on this machine: "sse4.2, 3 chains"
// or "table".
const char* Crc32cImplementation();

// The crc32c of A followed by B, from crc32c(A), crc32c(B) and B's length:
// for parts hashed separately (parallel reads and uploads).
std::uint32_t Crc32cCombine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b);

// The form GCS uses in object resources and x-goog-hash: base64 of the four
// big-endian bytes, e.g. "yZRlqg==".
std::string Crc32cToBase64(std::uint32_t crc);

std::string Base64Encode(std::string_view bytes);
// kInvalidArgument on malformed input.
StatusOr<std::string> Base64Decode(std::string_view text);
// The inverse of Crc32cToBase64.
StatusOr<std::uint32_t> Crc32cFromBase64(std::string_view text);

namespace internal {
std::uint32_t Crc32cExtendTable(std::uint32_t crc, std::string_view data);
std::uint32_t Crc32cExtendSse42(std::uint32_t crc, std::string_view data);
// Three interleaved chains over 3 x 4 KiB blocks; what Crc32cExtend uses.
std::uint32_t Crc32cExtendSse42x3(std::uint32_t crc, std::string_view data);
bool CpuHasSse42();
}  // namespace internal

}  // namespace spotvisor
