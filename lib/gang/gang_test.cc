#include "gang/gang.h"

#include <catch2/catch.hpp>

namespace spotvisor {
namespace {

GangMember M(std::string instance, std::string ip, int size = 3, std::string hash = "h1") {
  GangMember m;
  m.instance = std::move(instance);
  m.ip = std::move(ip);
  m.zone = "us-central1-a";
  m.boot_id = "boot-" + m.instance;
  m.command_hash = std::move(hash);
  m.gpus = 1;
  m.size = size;
  return m;
}

std::vector<std::string> Names(const std::vector<RankedMember>& r) {
  std::vector<std::string> out;
  for (const auto& m : r) out.push_back(m.instance);
  return out;
}

using Names_ = std::vector<std::string>;

TEST_CASE("AssignRanks without a previous generation: by IPv4 as a number, lowest is rank 0", "[gang]") {
  auto r = AssignRanks({M("c", "10.0.0.3"), M("a10", "10.0.0.10"), M("b", "10.0.0.9"), M("z", "10.0.0.1")}, 4, std::nullopt);
  REQUIRE(r.size() == 4);
  CHECK(Names(r) == Names_{"z", "c", "b", "a10"});  // 10.0.0.10 after 10.0.0.9: numbers, not strings
  for (int i = 0; i < 4; ++i) CHECK(r[i].rank == i);
  CHECK(r[0].ip == "10.0.0.1");
}

TEST_CASE("AssignRanks: non-IPv4 addresses after IPv4 ones, by string, then instance name", "[gang]") {
  auto r = AssignRanks({M("v6", "fd00::1"), M("host", "node-b"), M("y", "192.168.1.1"), M("x", "192.168.1.1"), M("p", "10.1.2.3")}, 5,
                       std::nullopt);
  CHECK(Names(r) == Names_{"p", "x", "y", "v6", "host"});
}

TEST_CASE("AssignRanks keeps the previous ranks of live instances and fills gaps by IP", "[gang]") {
  Generation prev{1, "t", {{"c", "10.0.0.3", 0}, {"a", "10.0.0.1", 1}, {"b", "10.0.0.2", 2}}};
  SECTION("the same members come back, one with a new IP: same ranks, the new IP") {
    auto r = AssignRanks({M("a", "10.0.0.1"), M("b", "10.0.0.2"), M("c", "10.0.0.99")}, 3, prev);
    CHECK(Names(r) == Names_{"c", "a", "b"});
    CHECK(r[0].ip == "10.0.0.99");
  }
  SECTION("a gap is filled by the lowest-IP newcomer; the rest are standbys") {
    auto r = AssignRanks({M("a", "10.0.0.1"), M("c", "10.0.0.3"), M("e", "10.0.0.8"), M("d", "10.0.0.7")}, 3, prev);
    REQUIRE(r.size() == 3);
    CHECK(Names(r) == Names_{"c", "a", "d"});
    CHECK(r[2].rank == 2);
  }
  SECTION("an extra member with the lowest IP does not take a kept rank") {
    auto r = AssignRanks({M("a", "10.0.0.1"), M("b", "10.0.0.2"), M("c", "10.0.0.3"), M("zero", "10.0.0.0")}, 3, prev);
    CHECK(Names(r) == Names_{"c", "a", "b"});
  }
  SECTION("fewer live than size: the ranks that can be given, gaps and all") {
    auto r = AssignRanks({M("b", "10.0.0.2")}, 3, prev);
    REQUIRE(r.size() == 1);
    CHECK(r[0].rank == 2);
  }
  SECTION("a smaller gang: ranks beyond it are given again") {
    auto r = AssignRanks({M("a", "10.0.0.1"), M("b", "10.0.0.2"), M("c", "10.0.0.3")}, 2, prev);
    CHECK(Names(r) == Names_{"c", "a"});
  }
  SECTION("a hostile previous record (bad ranks, duplicates) does not break it") {
    Generation odd{2, "t", {{"a", "x", 7}, {"b", "x", -1}, {"c", "x", 1}, {"c", "x", 0}}};
    auto r = AssignRanks({M("a", "10.0.0.1"), M("b", "10.0.0.2"), M("c", "10.0.0.3")}, 3, odd);
    CHECK(Names(r) == Names_{"a", "c", "b"});
  }
  CHECK(AssignRanks({M("a", "10.0.0.1")}, 0, prev).empty());
}

TEST_CASE("CheckAgreement names both sides and both values", "[gang]") {
  auto self = M("vm-a", "10.0.0.1", 3, "h1");
  CHECK(CheckAgreement("g", self, {self, M("vm-b", "10.0.0.2", 3, "h1")}).ok());
  Status size = CheckAgreement("g", self, {self, M("vm-b", "10.0.0.2", 4, "h1")});
  CHECK(size.code() == StatusCode::kFailedPrecondition);
  INFO(size.message());
  CHECK(size.message().find("\"vm-a\" (\"10.0.0.1\") has 3") != std::string::npos);
  CHECK(size.message().find("\"vm-b\" (\"10.0.0.2\") has 4") != std::string::npos);
  Status cmd = CheckAgreement("g", self, {M("vm-c", "10.0.0.3", 3, "other")});
  CHECK(cmd.code() == StatusCode::kFailedPrecondition);
  INFO(cmd.message());
  CHECK(cmd.message().find("\"vm-a\"") != std::string::npos);
  CHECK(cmd.message().find("\"vm-c\"") != std::string::npos);
  CHECK(cmd.message().find("\"h1\"") != std::string::npos);
  CHECK(cmd.message().find("\"other\"") != std::string::npos);
  // Bytes that are not text are shown, not thrown on.
  CHECK_FALSE(CheckAgreement("g", self, {M(std::string("v\xff", 2), "10.0.0.3", 3, std::string("\xc0", 1))}).ok());
}

TEST_CASE("member records round-trip and are checked", "[gang]") {
  auto m = M("vm-a", "10.0.0.1");
  auto back = ParseMember(MemberJson(m));
  REQUIRE(back.ok());
  CHECK(*back == m);
  for (const char* bad : {"", "null", "[]", "{", R"({"ip":"1","size":3,"gpus":0})", R"({"instance":"","ip":"1","size":3,"gpus":0})",
                          R"({"instance":"a","ip":"1","size":"3","gpus":0})", R"({"instance":"a","ip":"1","size":0,"gpus":0})",
                          R"({"instance":"a","ip":"1","size":3,"gpus":-1})", R"({"instance":"a","ip":"1","size":3.5,"gpus":0})",
                          R"({"instance":"a","ip":"1","size":99999999999999999999,"gpus":0})",
                          R"({"instance":7,"ip":"1","size":3,"gpus":0})", R"({"instance":"a","ip":"1","size":3})"}) {
    INFO(bad);
    CHECK(ParseMember(bad).status().code() == StatusCode::kInvalidArgument);
  }
  CHECK_FALSE(ParseMember(std::string(70000, ' ') + "{}").ok());
  CHECK_FALSE(ParseMember(std::string("{\"instance\":\"\xff\"}")).ok());
}

TEST_CASE("generation records round-trip and are checked", "[gang]") {
  Generation g{7, "2026-11-25T08:00:00.000Z", {{"a", "10.0.0.1", 0}, {"b", "10.0.0.2", 1}}};
  auto back = ParseGeneration(GenerationJson(g));
  REQUIRE(back.ok());
  CHECK(*back == g);
  for (const char* bad : {
           R"({"generation":0,"members":[{"instance":"a","ip":"1","rank":0}]})",
           R"({"generation":"1","members":[{"instance":"a","ip":"1","rank":0}]})",
           R"({"generation":1,"members":[]})",
           R"({"generation":1})",
           R"({"generation":1,"members":{}})",
           R"({"generation":1,"members":[{"instance":"a","ip":"1","rank":1}]})",
           R"({"generation":1,"members":[{"instance":"a","ip":"1","rank":0},{"instance":"a","ip":"2","rank":1}]})",
           R"({"generation":1,"members":[{"instance":"a","ip":"1","rank":0},{"instance":"b","ip":"2","rank":0}]})",
           R"({"generation":1,"members":[7]})",
           R"({"generation":1,"members":[{"instance":"a","rank":0}]})",
           R"({"generation":1,"formed_at":5,"members":[{"instance":"a","ip":"1","rank":0}]})",
           "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
       }) {
    INFO(bad);
    CHECK(ParseGeneration(bad).status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("end records round-trip and are checked", "[gang]") {
  auto e = ParseEnd(EndJson({"vm-a", "preempted", "2026-11-25T08:00:00Z"}));
  REQUIRE(e.ok());
  CHECK(e->by == "vm-a");
  CHECK(e->reason == "preempted");
  CHECK_FALSE(ParseEnd(R"({"by":"a"})").ok());
  CHECK_FALSE(ParseEnd(R"({"reason":5})").ok());
  CHECK_FALSE(ParseEnd("garbage").ok());
  // Our own reason with invalid UTF-8 is written (replaced), never thrown on.
  auto odd = ParseEnd(EndJson({"vm-a", std::string("bad \xff byte", 10), ""}));
  REQUIRE(odd.ok());
  CHECK(odd->reason.find("bad") == 0);
}

TEST_CASE("the gang prefix", "[gang]") { CHECK(GangPrefix("train") == "/spotvisor/gang/train/"); }

}  // namespace
}  // namespace spotvisor
