// The pieces of S3's XML answers spotvisor reads, parsed with checks:
// whatever the bytes, an answer or an error, never a throw. S3's answers
// are flat enough for a tag scanner; nothing here trusts their shape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace spotvisor {

// The text of the first <TAG>...</TAG> in `xml` at or after `from`, XML
// entities decoded (numeric ones as UTF-8); nullopt when absent.
std::optional<std::string> XmlText(std::string_view xml, std::string_view tag, std::size_t from = 0);
std::string XmlEscape(std::string_view s);
// Percent-decoding of encoding-type=url keys ('+' is a space); a malformed
// escape is kept as it is.
std::string PercentDecode(std::string_view s);
// An ETag without its quotes.
std::string Unquote(std::string_view etag);

// ListObjectsV2's answer, keys decoded (spotvisor asks encoding-type=url).
struct S3ListPage {
  struct Item {
    std::string key;
    std::string etag;  // unquoted
    std::uint64_t size = 0;
  };
  std::vector<Item> items;
  std::string next_token;  // empty: last page
};
StatusOr<S3ListPage> ParseListObjectsV2(std::string_view xml);

// The 63-bit generation spotvisor derives from an ETag (quotes ignored;
// never 0): S3 has no generation numbers.
std::int64_t S3GenerationOf(std::string_view etag);

}  // namespace spotvisor
