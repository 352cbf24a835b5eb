#include "compute/group.h"

#include <catch2/catch.hpp>

namespace spotvisor {
namespace {

TEST_CASE("a MIG is read from created-by, zonal or regional, partial or full URL") {
  auto z = ParseMigUrl("projects/123456789/zones/us-central1-a/instanceGroupManagers/trainers");
  REQUIRE(z.ok());
  CHECK(z->kind == InstanceGroup::Kind::kZonalMig);
  CHECK(z->project == "123456789");
  CHECK(z->location == "us-central1-a");
  CHECK(z->name == "trainers");
  CHECK(z->Path() == "projects/123456789/zones/us-central1-a/instanceGroupManagers/trainers");
  CHECK(z->KindName() == "zonal-mig");
  auto r = ParseMigUrl(" https://www.googleapis.com/compute/v1/projects/my-proj/regions/europe-west4/instanceGroupManagers/g-1\n");
  REQUIRE(r.ok());
  CHECK(r->kind == InstanceGroup::Kind::kRegionalMig);
  CHECK(r->project == "my-proj");
  CHECK(r->location == "europe-west4");
  CHECK(r->Describe() == "regional managed instance group g-1 (europe-west4)");
  CHECK(ParseMigUrl("https://compute.googleapis.com/compute/v1/projects/example.com:p/zones/a-b1-c/instanceGroupManagers/n").ok());
}

TEST_CASE("anything else is not a group, and the error names the value and the form") {
  for (const char* bad : {"", "trainers", "projects/1/zones/us-central1-a/instances/vm-1",
                          "projects/1/zones/us-central1-a/instanceGroupManagers/", "projects/1/global/instanceGroupManagers/x",
                          "projects/1/zones/US-CENTRAL1/instanceGroupManagers/x",
                          "projects/1/zones/us-central1-a/instanceGroupManagers/x/extra",
                          "projects/1/zones/us-central1-a/instanceGroupManagers/Bad_Name",
                          "projects/1/zones/us-central1-a/instanceGroupManagers/x\x01"}) {
    auto g = ParseMigUrl(bad);
    INFO(bad);
    REQUIRE_FALSE(g.ok());
    CHECK(g.status().code() == StatusCode::kInvalidArgument);
    CHECK(g.status().message().find("instanceGroupManagers/NAME") != std::string::npos);
  }
}

TEST_CASE("an Auto Scaling group's name is 1-255 printable characters") {
  auto g = ParseAsgName("my-asg 1", "eu-west-1");
  REQUIRE(g.ok());
  CHECK(g->kind == InstanceGroup::Kind::kAsg);
  CHECK(g->Path() == "my-asg 1");
  CHECK(g->Describe() == "Auto Scaling group my-asg 1 (eu-west-1)");
  CHECK_FALSE(ParseAsgName("", "r").ok());
  CHECK_FALSE(ParseAsgName(std::string(256, 'a'), "r").ok());
  CHECK_FALSE(ParseAsgName("a\nb", "r").ok());
  CHECK_FALSE(ParseAsgName("a\xff", "r").ok());
}

}  // namespace
}  // namespace spotvisor
