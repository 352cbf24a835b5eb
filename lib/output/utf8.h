// UTF-8 checks for trainer output. Log entries are serialized as JSON, and
// the JSON library rejects invalid UTF-8, so anything a trainer writes must be
// made valid before it reaches the logger.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace spotvisor::output {

// Validity follows Unicode's well-formed table (no overlongs, no surrogates,
// nothing above U+10FFFF), which is what strict JSON encoders enforce.
bool IsValidUtf8(std::string_view s);

// Valid input comes back unchanged. Otherwise each byte that is not part of a
// well-formed sequence becomes the four ASCII characters "\xNN" (lowercase
// hex), so the bytes stay visible for debugging and the result is always
// valid. A literal "\x41" in the input is left alone: the output is for
// humans, not meant to be reversible.
std::string EscapeInvalidUtf8(std::string_view s);

// The largest k <= n such that cutting s at k does not split a well-formed
// sequence. Ill-formed bytes are not sequences, so a cut may fall next to
// them; they are escaped later anyway.
std::size_t Utf8SafePrefixLength(std::string_view s, std::size_t n);

}  // namespace spotvisor::output
