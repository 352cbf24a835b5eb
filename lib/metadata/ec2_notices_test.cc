#include "metadata/ec2_notices.h"

#include <catch2/catch.hpp>

#include "app/engine.h"
#include "log/logger.h"

namespace spotvisor {
namespace {

TEST_CASE("ParseInstanceAction reads AWS's notice and refuses anything else", "[ec2]") {
  auto n = ParseInstanceAction(R"({"action": "terminate", "time": "2026-11-25T10:02:00Z"})");
  REQUIRE(n.ok());
  CHECK(n->action == "terminate");
  CHECK(n->time == *ParseRfc3339("2026-11-25T10:02:00Z"));
  CHECK(ParseInstanceAction(R"({"action":"stop","time":"2026-11-25T10:02:00Z"})").ok());
  CHECK(ParseInstanceAction(R"({"action":"hibernate","time":"2026-11-25T10:02:00Z"})").ok());
  CHECK(!ParseInstanceAction(R"({"action":"reboot","time":"2026-11-25T10:02:00Z"})").ok());
  CHECK(!ParseInstanceAction(R"({"action":"terminate"})").ok());
  CHECK(!ParseInstanceAction(R"({"action":"terminate","time":"soon"})").ok());
  CHECK(!ParseInstanceAction("[]").ok());
  CHECK(!ParseInstanceAction("").ok());
  auto bad = ParseInstanceAction("\xff\xfe not json");
  REQUIRE(!bad.ok());
  CHECK(bad.status().message().find('\xff') == std::string::npos);
}

TEST_CASE("ParseUserDataSection takes the [spotvisor] section only", "[ec2]") {
  auto m = ParseUserDataSection("#!/bin/bash\nrun-id = not-ours\n[spotvisor]\nrun-id = r1\ncommand = \"python train.py\"\n"
                                "[other]\nmax-restarts = 9\n");
  REQUIRE(m.ok());
  CHECK(m->size() == 2);
  CHECK(m->at("spotvisor-run-id") == "r1");
  CHECK(m->at("spotvisor-command") == "python train.py");
  auto none = ParseUserDataSection("#cloud-config\npackages: [git]\n");
  REQUIRE(none.ok());
  CHECK(none->empty());
  auto bad = ParseUserDataSection("[spotvisor]\nno equals sign here\n");
  REQUIRE(!bad.ok());
  CHECK(bad.status().message().find("user data [spotvisor]") != std::string::npos);
  CHECK(bad.status().message().find(":2") != std::string::npos);  // the user data's own line number
}

}  // namespace
}  // namespace spotvisor
