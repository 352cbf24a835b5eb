#include "common/strings.h"

#include <catch2/catch.hpp>

namespace spotvisor {
namespace {

TEST_CASE("did-you-mean finds close keys and nothing for unrelated words") {
  std::vector<std::string> keys = {"stop-timeout", "kill-timeout", "command", "checkpoint-dir"};
  CHECK(ClosestMatch("stop-timout", keys) == "stop-timeout");
  CHECK(ClosestMatch("comand", keys) == "command");
  CHECK(ClosestMatch("checkpoint_dir", keys) == "checkpoint-dir");
  CHECK(ClosestMatch("bucket", keys).empty());
}

TEST_CASE("edit distance and line splitting") {
  CHECK(EditDistance("kitten", "sitting") == 3);
  CHECK(EditDistance("", "abc") == 3);
  CHECK(SplitLines("a\nb\n\nc") == std::vector<std::string>{"a", "b", "", "c"});
  CHECK(SplitLines("a\n") == std::vector<std::string>{"a"});
  CHECK(Trim("  x \t") == "x");
}

}  // namespace
}  // namespace spotvisor
