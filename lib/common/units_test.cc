#include "common/units.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>

namespace spotvisor {
namespace {

TEST_CASE("sizes in messages are decimal, one decimal place, whatever their size") {
  CHECK(FormatBytes(0) == "0 bytes");
  CHECK(FormatBytes(999) == "999 bytes");
  CHECK(FormatBytes(1000) == "1.0 kB");
  CHECK(FormatBytes(1500) == "1.5 kB");
  CHECK(FormatBytes(999'960) == "1.0 MB");  // not "1000.0 kB"
  CHECK(FormatBytes(1'610'612'736) == "1.6 GB");
  CHECK(FormatBytes(2'500'000'000) == "2.5 GB");
  CHECK(FormatBytes(UINT64_MAX) == "18.4 EB");
}

TEST_CASE("rates read like sizes, a second") {
  CHECK(FormatRate(0) == "0 bytes/s");
  CHECK(FormatRate(-5) == "0 bytes/s");
  CHECK(FormatRate(std::numeric_limits<double>::quiet_NaN()) == "0 bytes/s");
  CHECK(FormatRate(16'137.4) == "16.1 kB/s");
  CHECK(FormatRate(45'200'000) == "45.2 MB/s");
  CHECK(FormatRate(1e30) == "more than 18.0 EB/s");
}

TEST_CASE("an argv reads as a shell line that gives the same words back") {
  CHECK(ShellJoin({"python3", "train.py", "--lr", "0.1"}) == "python3 train.py --lr 0.1");
  CHECK(ShellJoin({"/bin/sh", "-c", "echo hi > /tmp/x"}) == "/bin/sh -c 'echo hi > /tmp/x'");
  CHECK(ShellJoin({"a", "", "it's"}) == "a '' 'it'\\''s'");
  CHECK(ShellJoin({"$HOME", "a*b"}) == "'$HOME' 'a*b'");
  CHECK(ShellJoin({}).empty());
}

}  // namespace
}  // namespace spotvisor
