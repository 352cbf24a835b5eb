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


TEST_CASE("PathIsUnder compares whole path components") {
  CHECK(PathIsUnder("/mnt/scratch/ckpt", "/mnt/scratch"));
  CHECK(PathIsUnder("/mnt/scratch", "/mnt/scratch"));
  CHECK(PathIsUnder("/mnt/scratch/x", "/mnt/scratch/"));
  CHECK_FALSE(PathIsUnder("/mnt/scratch2", "/mnt/scratch"));
  CHECK_FALSE(PathIsUnder("/mnt", "/mnt/scratch"));
  CHECK_FALSE(PathIsUnder("/mnt/x", ""));
  CHECK(PathIsUnder("/anything", "/"));
}

TEST_CASE("SplitOn keeps empty fields") {
  CHECK(SplitOn("a,,b", ',') == std::vector<std::string>{"a", "", "b"});
  CHECK(SplitOn("", ',') == std::vector<std::string>{""});
}
}  // namespace
}  // namespace spotvisor
