#include "common/duration.h"

#include <catch2/catch.hpp>

namespace spotvisor {
namespace {

using std::chrono::milliseconds;

TEST_CASE("durations in the forms users write") {
  CHECK(*ParseDuration("90") == milliseconds(90'000));
  CHECK(*ParseDuration("90s") == milliseconds(90'000));
  CHECK(*ParseDuration("15m") == milliseconds(900'000));
  CHECK(*ParseDuration("1h30m") == milliseconds(5'400'000));
  CHECK(*ParseDuration("500ms") == milliseconds(500));
  CHECK(*ParseDuration("1.5s") == milliseconds(1500));
  CHECK(*ParseDuration("0") == milliseconds(0));
  CHECK(*ParseDuration("2d") == milliseconds(172'800'000));
}

TEST_CASE("bad durations are rejected with a hint") {
  for (auto bad : {"", "20 sec", "sec", "1h30", "-5s", "1..5s", "5x", "s5", "1e5s"}) {
    auto d = ParseDuration(bad);
    INFO(bad);
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == StatusCode::kInvalidArgument);
  }
  CHECK(ParseDuration("20 sec").status().message() == "\"20 sec\" is not a duration (try 20s, 15m or 1h30m)");
}

TEST_CASE("numbers too large for a double are an error, not an exception") {
  // std::stod threw std::out_of_range here, and the daemon died of SIGABRT.
  std::string huge(400, '9');
  for (auto text : {huge, huge + "s", "1" + huge + "ms", "0." + huge + "h" + huge}) {
    auto d = ParseDuration(text);
    INFO(text.size());
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == StatusCode::kInvalidArgument);
    CHECK(d.status().message().size() < 200);  // the value is not quoted whole
  }
  CHECK(ParseDuration(huge).status().message().find("too long a duration") != std::string::npos);
  CHECK(*ParseDuration("0." + std::string(400, '0') + "1s") == milliseconds(0));
  CHECK(*ParseDuration("10000d") == milliseconds(864'000'000'000));
  CHECK_FALSE(ParseDuration("10001d").ok());
  CHECK_FALSE(ParseDuration("\xff\xfe").ok());
}

TEST_CASE("durations format back the way they are written") {
  CHECK(FormatDuration(milliseconds(5'400'000)) == "1h30m");
  CHECK(FormatDuration(milliseconds(20'000)) == "20s");
  CHECK(FormatDuration(milliseconds(1500)) == "1.5s");
  CHECK(FormatDuration(milliseconds(250)) == "250ms");
  CHECK(FormatDuration(milliseconds(0)) == "0s");
}

}  // namespace
}  // namespace spotvisor
