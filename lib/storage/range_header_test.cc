#include "storage/range_header.h"

#include <catch2/catch.hpp>

namespace spotvisor {
namespace {

TEST_CASE("the persisted range of a resumable upload is parsed with checks") {
  CHECK(ParsePersistedRange("") == std::optional<std::uint64_t>(0));
  CHECK(ParsePersistedRange("bytes=0-0") == std::optional<std::uint64_t>(1));
  CHECK(ParsePersistedRange("bytes=0-262143") == std::optional<std::uint64_t>(262144));
  for (auto bad : {"bytes=0--5", "bytes=0-", "bytes=5-9", "bytes=0-1x", "bytes=0- 1", "0-5", "bytes=0-18446744073709551615",
                   "bytes=0-99999999999999999999999"}) {
    INFO(bad);
    CHECK_FALSE(ParsePersistedRange(bad));
  }
}

}  // namespace
}  // namespace spotvisor
