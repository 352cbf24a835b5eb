#include "compute/ec2_client.h"

#include <catch2/catch.hpp>

namespace spotvisor {
namespace {

TEST_CASE("RegionOfZone: availability zones, local zones, and what is not a zone", "[ec2]") {
  CHECK(RegionOfZone("us-east-1a") == "us-east-1");
  CHECK(RegionOfZone("eu-central-1b") == "eu-central-1");
  CHECK(RegionOfZone("ap-northeast-1c") == "ap-northeast-1");
  CHECK(RegionOfZone("us-west-2-lax-1a") == "us-west-2");
  CHECK(RegionOfZone("") == "");
  CHECK(RegionOfZone("us-east") == "");
  CHECK(RegionOfZone("us-east-a") == "");
}

}  // namespace
}  // namespace spotvisor
